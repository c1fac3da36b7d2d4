// DebugProcessGroup: a process group wrapped with the distributed-debugging
// aids (as PyTorch's ProcessGroupWrapper and its desync debug): every rank
// publishes how far it got, so that a failed collective's error says which
// ranks are behind; under LOOM_DISTRIBUTED_DEBUG=DETAIL every collective's
// fingerprint is compared across ranks before it runs. init_process_group
// wraps every group it makes.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <loom/dist/environment.h>
#include <loom/dist/process_group.h>

namespace loom::dist {

// LOOM_DISTRIBUTED_DEBUG, as TORCH_DISTRIBUTED_DEBUG:
enum class DistributedDebugLevel {
  off,     // the desync report on a failed collective (always on: it costs a few atomics per collective)
  info,    // and a line per process group made and destroyed (collectives run, the last one)
  detail,  // and every collective's fingerprint checked across ranks before it runs
};

const char* distributed_debug_level_name(DistributedDebugLevel level);

// The level LOOM_DISTRIBUTED_DEBUG asks for (OFF, INFO or DETAIL, any case);
// off when unset. Throws loom::Error naming the variable and the accepted
// values for anything else.
DistributedDebugLevel distributed_debug_level_from_environment(
    const EnvironmentLookup& environment = process_environment());

// What one collective call is, in the terms that must agree across ranks: its
// place in the group's order, the operation, the dtype and element count of
// what each rank contributes, the root or reduce op, and the shapes.
struct CollectiveFingerprint {
  enum class Op : int64_t { all_reduce, broadcast, all_gather, reduce_scatter, barrier };
  static constexpr int kMaxDims = 6;  // dims of the first tensor kept for the message

  uint64_t sequence = 0;     // the group's count of collectives before this one
  Op op = Op::barrier;
  int64_t dtype = -1;        // the first tensor's DType, -1 for none (barrier)
  int64_t numel = 0;         // elements each rank contributes, over all its tensors
  int64_t tensors = 0;       // how many tensors (all_reduce takes several)
  int64_t root = -1;         // broadcast's root, else -1
  int64_t reduce_op = -1;    // ReduceOp for all_reduce / reduce_scatter, else -1
  int64_t dims = 0;          // the first tensor's number of dimensions
  std::array<int64_t, kMaxDims> shape{};  // its first kMaxDims sizes
  uint64_t shapes_hash = 0;  // every tensor's dtype and shape

  // Fixed-size encoding exchanged between ranks.
  static constexpr int kWords = 9 + kMaxDims;
  std::array<int64_t, kWords> encode() const;
  static CollectiveFingerprint decode(const int64_t* words);

  // Whether two calls may meet in one collective (the sequence numbers too).
  bool operator==(const CollectiveFingerprint& other) const = default;

  // "all_reduce(f32, 1000 elems, sum) #7", "broadcast(f32 [10], root 0) #7".
  std::string describe() const;

  static CollectiveFingerprint of_all_reduce(const std::vector<Tensor>& tensors, ReduceOp op);
  static CollectiveFingerprint of_broadcast(const Tensor& tensor, int root);
  static CollectiveFingerprint of_all_gather(const Tensor& input);
  static CollectiveFingerprint of_reduce_scatter(const Tensor& output, ReduceOp op);
  static CollectiveFingerprint of_barrier();
};

class DebugOptions {
  // What the group checks and logs (see DistributedDebugLevel); off: only the
  // desync report on a failed collective.
  LOOM_OPTION(DistributedDebugLevel, level) = DistributedDebugLevel::off;
  // Name of the group in log lines.
  LOOM_OPTION(std::string, group_name) = "default";
  // How often each rank publishes its progress to the store (when it moved):
  // the desync report is at most this old.
  LOOM_OPTION(Milliseconds, publish_interval) = std::chrono::milliseconds(100);
};

// Forwards every call to `inner`, numbering the collectives. Each rank's
// latest collective (its number and fingerprint) is published to `store`
// by a background thread, so the hot path costs a few atomic stores; when a
// collective fails (a timeout, a peer that died), the error the caller sees
// ends with a desync report read from the store: which collective every rank
// last entered, and which ranks have not reached the failed one.
//
// At DETAIL, every call first exchanges its fingerprint with the other ranks
// through `checker` (a CPU process group over the same ranks, e.g. gloo,
// used only for this) and throws loom::Error on every rank, before anything
// runs, when the ranks called different collectives: "rank 0 called
// all_reduce(f32, 1000 elems, sum) #7 but rank 1 called broadcast(f32, 10
// elems, root 0) #7". This makes every collective wait for all ranks to call it.
class DebugProcessGroup final : public ProcessGroup {
 public:
  DebugProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store, DebugOptions options = {},
                    std::shared_ptr<ProcessGroup> checker = nullptr);
  ~DebugProcessGroup() override;

  const char* backend_name() const override { return inner_->backend_name(); }
  Device device() const override { return inner_->device(); }

  // Each collective is inner's, through run().
  using ProcessGroup::all_reduce;
  WorkHandle all_reduce(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum) override {
    return run(CollectiveFingerprint::of_all_reduce(tensors, op), [&] { return inner_->all_reduce(tensors, op); });
  }
  WorkHandle broadcast(const Tensor& tensor, int root = 0) override {
    return run(CollectiveFingerprint::of_broadcast(tensor, root), [&] { return inner_->broadcast(tensor, root); });
  }
  WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    return run(CollectiveFingerprint::of_all_gather(input), [&] { return inner_->all_gather(outputs, input); });
  }
  WorkHandle all_gather_into(const Tensor& output, const Tensor& input) override {
    return run(CollectiveFingerprint::of_all_gather(input), [&] { return inner_->all_gather_into(output, input); });
  }
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op = ReduceOp::sum) override {
    return run(CollectiveFingerprint::of_reduce_scatter(output, op),
               [&] { return inner_->reduce_scatter(output, inputs, op); });
  }
  WorkHandle reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum) override {
    return run(CollectiveFingerprint::of_reduce_scatter(output, op),
               [&] { return inner_->reduce_scatter_from(output, input, op); });
  }
  WorkHandle barrier() override {
    return run(CollectiveFingerprint::of_barrier(), [&] { return inner_->barrier(); });
  }
  Tensor new_buffer(int64_t numel, DType dtype, Device device) override;

  void set_timeout(Milliseconds timeout) override;
  Milliseconds timeout() const override { return inner_->timeout(); }
  // inner's: at DETAIL the fingerprints are checked on the host once, at the capture.
  std::optional<std::string> capture_refusal() const override { return inner_->capture_refusal(); }
  WorkHandle watch_replay(const std::string& description) override { return inner_->watch_replay(description); }

  const std::shared_ptr<ProcessGroup>& inner() const { return inner_; }
  DistributedDebugLevel level() const;
  // Collectives called on this group so far.
  uint64_t collectives_called() const;

  // The desync report for a failure of collective `sequence`: every rank's
  // last collective, read from the store, and the ranks that have not reached
  // `sequence`. Never throws (says so when the store cannot be read).
  std::string desync_report(uint64_t sequence) const;

 private:
  struct State;
  class TracedWork;

  // A collective entered on this group: its number, and the group's call
  // lock, held until inner's call has returned, so that the numbers follow
  // the order of the calls.
  struct Entered {
    std::unique_lock<std::mutex> lock;
    uint64_t sequence = 0;
  };
  // Numbers the collective and publishes it; at DETAIL, first checks it
  // across ranks (throws when they differ).
  Entered enter(const CollectiveFingerprint& fingerprint);
  // The exception being handled, from inner's call of collective `sequence`,
  // with the desync report, when the group has failed (a backend that reports
  // an earlier failure when the next collective is called: nccl); null
  // otherwise: argument errors pass unchanged.
  std::exception_ptr reported_failure(uint64_t sequence) const;
  // inner's Work for collective `sequence`, seen through the wrapper.
  WorkHandle traced(WorkHandle work, uint64_t sequence) const;

  // Runs `call`, the collective on inner, entered and with its Work traced.
  template <class Call>
  WorkHandle run(const CollectiveFingerprint& fingerprint, Call&& call) {
    Entered entered = enter(fingerprint);
    WorkHandle work;
    try {
      work = call();
    } catch (...) {
      if (std::exception_ptr reported = reported_failure(entered.sequence)) std::rethrow_exception(reported);
      throw;
    }
    return traced(std::move(work), entered.sequence);
  }

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<State> state_;  // shared with the Works, which may outlive the group
};

}  // namespace loom::dist
