// Join: training when ranks have different numbers of batches (PyTorch's
// torch.distributed.algorithms.Join with DDP's join hook). A rank whose data
// ran out "joins": it shadows the collectives the others still issue (DDP's
// buffer broadcast, its gradient all-reduces with zeros) until every rank has
// joined, and then every rank takes the model of the last to join. The
// contract, with what differs from PyTorch, is in docs/ARCHITECTURE.md.
//
//   dist::DistributedDataParallel ddp(model, group);
//   dist::ShadowStep shadow_step(group, [&] { optimizer.step(); });  // optional, see below
//   dist::Join join({ddp, shadow_step});         // PyTorch: with Join([ddp]):
//   for (auto& batch : loader.epoch(epoch)) {     //   this rank's batches, however many
//     optimizer.zero_grad();
//     loss_fn(ddp.forward(batch.images), batch.labels).backward();
//     optimizer.step();
//   }
//   join.join();                                  // the end of PyTorch's with block
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <loom/core/options.h>
#include <loom/dist/process_group.h>

namespace loom::dist {

class JoinOptions {
  // false: the Join does nothing (no announce per iteration, join() returns
  // at once), for inputs known to be even (PyTorch's `enable`).
  LOOM_OPTION(bool, enable) = true;
  // Every rank throws loom::Error at the first iteration after any rank's
  // inputs ran out, instead of shadowing (PyTorch's throw_on_early_termination):
  // the ranks still running from that forward, the joined ones from join().
  LOOM_OPTION(bool, throw_on_early_termination) = false;
  // What DDP divides a synchronized iteration's summed gradients by once some
  // ranks have joined. true (PyTorch's default): the initial world size, so
  // a joined rank counts as a zero gradient and a step of the uneven tail is
  // active / world as large. false: the number of ranks that contributed to
  // that all-reduce (the active ones, and a joined one whose last backward
  // ran under no_sync and is contributed here), so the step is the mean of
  // the gradients that exist. Applies under any communication hook.
  LOOM_OPTION(bool, divide_by_initial_world_size) = true;
};

// One iteration as every rank saw its announce: computed from one all-reduce
// that every rank, running or joined, takes part in, so all agree on it.
struct JoinIteration {
  int64_t index = 0;            // iterations announced in this Join, from 0
  int active_ranks = 0;         // ranks that have not joined
  int first_active_rank = -1;   // the lowest of them: DDP broadcasts buffers from it (-1: none)
  bool synchronize = false;     // whether this iteration's backward all-reduces gradients (not under no_sync)
  int contributing_ranks = 0;   // with synchronize: the active ranks, and joined ones contributing a no_sync accumulation
};

// What a joinable does on a rank that has joined (PyTorch's JoinHook).
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // On a joined rank, once per iteration that some rank still runs, after
  // its announce: issues the collectives the running ranks issue in it.
  virtual void main_hook(const JoinIteration& iteration);
  // On every rank once all have joined. `authoritative_rank` is the lowest of
  // the ranks that joined last (those that ran the last iteration), whose
  // state every rank takes.
  virtual void post_hook(int authoritative_rank);
  // Whether this joined rank still holds gradients for the next synchronized
  // all-reduce (a no_sync accumulation its data ended in); announced, so the
  // divisor counts it.
  virtual bool holds_contribution() const;
};

class Join;

// Something whose per-iteration collectives a Join shadows (PyTorch's Joinable).
class Joinable {
 public:
  virtual ~Joinable();
  Joinable(const Joinable&) = delete;
  Joinable& operator=(const Joinable&) = delete;

  // The hook a Join runs for this joinable; may refuse, throwing why.
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // The group every joinable of one Join shares; the announce runs over it.
  virtual const std::shared_ptr<ProcessGroup>& join_process_group() const = 0;

 protected:
  Joinable() = default;
  // PyTorch's Join.notify_join_context: a joinable calls it at the start of
  // each iteration, before its own collectives (DDP: in forward), saying
  // whether this iteration's backward will all-reduce. The first joinable of
  // the Join it is in announces that this rank has not joined (one small
  // all-reduce that the joined ranks match) and returns what every rank
  // announced; outside a Join, and for the other joinables, nullopt.
  // Throws on every rank alike when the running ranks disagree on
  // `synchronize`, and under throw_on_early_termination once a rank joined.
  std::optional<JoinIteration> notify_join_context(bool synchronize);
  // The options of the Join this joinable is in; null outside one.
  const JoinOptions* join_options() const;

 private:
  friend class Join;
  Join* join_ = nullptr;
  bool first_ = false;
};

// The scope of one pass over uneven inputs. The constructor attaches the
// joinables (each to one Join at a time) and takes their hooks; the
// joinables must share one process group and outlive the Join (one destroyed
// first detaches itself). Not collective.
class Join {
 public:
  explicit Join(std::vector<std::reference_wrapper<Joinable>> joinables, JoinOptions options = {});
  // Detaches the joinables. join() must have run on every rank before the
  // Join ends normally (without it, and without an exception on its way,
  // it logs a warning: the running ranks will wait for this one).
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank's inputs ran out (PyTorch's __exit__): runs the joinables'
  // main hooks once per iteration the other ranks still run, until every
  // rank has joined, then detaches them and runs their post hooks (DDP: the
  // model and buffers of the authoritative rank on every rank). Collective.
  // A second call does nothing.
  void join();

  // Whether no rank had joined at the last iteration announced (true before any).
  bool all_ranks_active() const;
  // The last iteration announced, if any.
  const std::optional<JoinIteration>& last_iteration() const { return last_iteration_; }
  // Iterations this rank shadowed in join().
  int64_t shadowed_iterations() const { return shadowed_iterations_; }
  const JoinOptions& options() const { return options_; }

 private:
  friend class Joinable;
  // What a rank says of itself in an iteration's announce.
  enum class RankState { joined = 0, joined_holding_gradients = 1, running_without_sync = 2, running_with_sync = 3 };
  JoinIteration announce(RankState state);
  void forget(Joinable& joinable) noexcept;
  void detach() noexcept;

  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;  // one per joinable
  JoinOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  std::optional<JoinIteration> last_iteration_;
  int authoritative_rank_ = -1;  // the lowest running rank of the last iteration some rank ran
  int64_t shadowed_iterations_ = 0;
  bool joined_ = false;
  bool failed_ = false;  // an announce threw on every rank (disagreement, early termination)
  int uncaught_exceptions_ = std::uncaught_exceptions();  // at construction
};

// A joinable that keeps a joined rank's optimizer in step: after each
// synchronized iteration the rank shadowed, once DDP (listed before it in the
// Join) has put that iteration's averaged gradients into .grad, it runs
// `step`, the step the running ranks take. Optimizer state (momentum, Adam's
// moments, a loss scale) and schedules then stay equal on every rank, which
// PyTorch's Join leaves to the user (its final sync covers the model only).
class ShadowStep final : public Joinable {
 public:
  ShadowStep(std::shared_ptr<ProcessGroup> group, std::function<void()> step);
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  const std::shared_ptr<ProcessGroup>& join_process_group() const override { return group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::function<void()> step_;
};

}  // namespace loom::dist
