// ZeroRedundancyOptimizer: ZeRO stage 1 (Rajbhandari et al.), PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer. The optimizer state
// (momentum buffers, Adam moments) is sharded across the ranks of a process
// group: each rank's local optimizer is built over its shard of the
// parameters only, steps that shard, and broadcasts it, so every rank ends
// each step with the same parameters while holding about 1/world of the state.
//
//   PyTorch                                          loom
//   opt = ZeroRedundancyOptimizer(                   dist::ZeroRedundancyOptimizer opt(
//       ddp.parameters(),                                model->parameters(), group,
//       optimizer_class=torch.optim.AdamW, lr=3e-4)      optim::AdamWOptions(3e-4));
//   loss.backward(); opt.step()                      loss.backward(); opt.step();
//   opt.consolidate_state_dict(to=0)                 opt.consolidate_state_dict(0);   // every rank
//   if rank == 0: torch.save(opt.state_dict(), f)    if (rank == 0) save(opt.state());
//
// It is an optim::Optimizer, so LR schedules, amp and the Trainer take it
// unchanged; under amp::initialize it wraps what the factory is handed (the
// f32 masters at O2 / O3 / bf16):
//   amp::initialize(*model, [&](std::vector<Tensor> masters) -> std::unique_ptr<optim::Optimizer> {
//     return std::make_unique<dist::ZeroRedundancyOptimizer>(std::move(masters), group, optim::SGDOptions(0.1));
//   }, amp::OptLevel::O2);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <loom/core/tensor.h>
#include <loom/dist/process_group.h>
#include <loom/nn/module.h>
#include <loom/optim/optimizer.h>

namespace loom::dist {

// PyTorch's partition of parameters over `world` ranks (its sorted-greedy
// algorithm): the parameters sorted by element count, largest first (equal
// counts in their given order), each given to the rank with the fewest
// elements so far (the lowest such rank). Returns, per rank, indices into
// `numels` in ascending order; every index appears exactly once.
std::vector<std::vector<size_t>> partition_parameters(const std::vector<int64_t>& numels, int world);

// Builds a rank's local optimizer over the parameters of its shard (maybe none).
using LocalOptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> parameters)>;

class ZeroRedundancyOptimizer final : public optim::Optimizer {
 public:
  // Partitions `parameters` (one parameter group: leaves that require grad,
  // all of one dtype and on one device) over `group`'s ranks
  // (partition_parameters) and builds this rank's local optimizer with
  // `make_local` over its shard; the group's learning rate starts as the
  // local optimizer's. Collective: every rank constructs it over the same
  // parameters in the same order (checked: their count and sizes).
  ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          LocalOptimizerFactory make_local);
  // The local optimizer an SGD or Adam with these options (AdamWOptions: AdamW).
  ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          const optim::SGDOptions& options);
  ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          const optim::AdamOptions& options);

  // Hands the group's learning rate to the local optimizer, which steps this
  // rank's shard (a parameter without a gradient is left as it is, and gets
  // no state, as in the unsharded optimizer), then broadcasts every shard
  // from its rank, so that every rank ends with the same parameters: the
  // unsharded optimizer's update of the same (averaged) gradients. Collective.
  void step() override { step_if_finite(Tensor()); }
  // The same, the local optimizer skipping its update when `found_inf` is
  // set (Optimizer::step_if_finite: on the GPU for a local SGD); every rank
  // holds the same flag, so every rank skips, and the broadcasts resend the
  // unchanged shards.
  void step_if_finite(const Tensor& found_inf) override;

  // Every rank sends its shard's state to rank `to`, which keeps it (on the
  // CPU) for state() until the next step() or load_state(). Collective; called
  // again before either, it returns at once on every rank (nothing changed).
  void consolidate_state_dict(int to = 0);
  // consolidate_state_dict(to): what the Trainer calls before a checkpoint.
  void gather_state(int to) override { consolidate_state_dict(to); }
  // On the rank the state was consolidated to: the state the unsharded
  // optimizer would give, with its names ("<group>.<index>.<kind>", the index
  // into the full parameter list), order and values. Elsewhere, or after a
  // step since, throws saying to call consolidate_state_dict() on every rank.
  nn::NamedTensors state() const override;
  // A full optimizer state (state() of this or of the unsharded optimizer, at
  // any world size): this rank keeps its shard's entries. Every rank calls it
  // with the same state; no communication.
  void load_state(const nn::NamedTensors& state) override;

  // Indices into the parameter list of the parameters `rank` steps.
  const std::vector<size_t>& shard(int rank) const { return shards_.at(static_cast<size_t>(rank)); }
  // This rank's optimizer over its shard; its state() is the shard's only,
  // named by positions in the shard.
  optim::Optimizer& local_optimizer() { return *local_; }
  const optim::Optimizer& local_optimizer() const { return *local_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

 private:
  void check_same_parameters_on_every_rank() const;
  // The local optimizer's state under the full list's names.
  nn::NamedTensors local_state_in_full_names() const;

  std::shared_ptr<ProcessGroup> group_;
  std::vector<std::vector<size_t>> shards_;         // per rank, indices into the parameter list
  std::vector<std::vector<Tensor>> shard_tensors_;  // per rank, those parameters
  std::unique_ptr<optim::Optimizer> local_;
  std::optional<int> consolidated_to_;  // the rank holding a consolidated state since the last step
  nn::NamedTensors consolidated_;       // that state, on that rank
};

}  // namespace loom::dist
