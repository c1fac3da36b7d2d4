// Elastic resume through the Trainer with real processes on loopback, shared
// by the CPU tests (tests/dist/test_elastic.cpp) and the CUDA ones
// (tests/gpu/test_elastic_cuda.cpp): the scenario "elastic_phase" trains a
// small MLP for a few steps at some world size, checkpointing every step and
// resuming with --resume auto; a test runs phases one after another at other
// world sizes in one directory and reads what the ranks logged: the dataset
// index of each sample trained on, rank 0's loss per step, the checkpoints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace loom::dist::testing {

inline constexpr int64_t kElasticRows = 36;  // divisible by 1, 2, 3 and 6: no padding in these runs
inline constexpr int64_t kElasticEpochs = 2;

// What every phase of a run shares.
struct ElasticSetting {
  std::string device = "cpu";    // cpu, or cuda: every rank on cuda:0
  std::string backend = "gloo";  // gloo or shm; CUDA tensors go through host memory (dist/host_staging.h)
  std::string amp = "O0";        // O0 trains f32 weights; O2 f16 weights, f32 masters and a dynamic loss scale
  std::string describe() const;
};

// One phase: `world` fresh processes; max_steps ends the run there (0: run to
// the end), stop_at has rank 0 raise SIGTERM after that step (0: never), zero
// shards the momentum (ZeroRedundancyOptimizer) at world > 1.
struct Phase {
  int world;
  int64_t max_steps = 0, stop_at = 0;
  bool zero = false;
};

// Runs the phases one after the other in `dir`, each with a fresh set of
// processes; `batch_variable` is LOOM_TEST_GLOBAL_BATCH (split over the
// ranks, train_resnet50_cifar's -b) or LOOM_TEST_BATCH (per process,
// train_mnist's). Returns rank 0's output of each phase.
std::vector<std::string> run_phases(const std::filesystem::path& dir, const std::vector<Phase>& phases,
                                    const std::string& batch_variable, int64_t batch,
                                    const ElasticSetting& setting = {});

// Rank 0's loss at each step, and the world size that ran the step.
struct StepLoss {
  int world = 0;
  double loss = 0;
  bool operator==(const StepLoss&) const = default;
};
std::map<int64_t, StepLoss> losses_in(const std::filesystem::path& dir);

// The model's values in the checkpoint `world` processes wrote at the end of the run.
std::vector<double> final_parameters(const std::filesystem::path& dir, int world);

double largest_difference(const std::vector<double>& a, const std::vector<double>& b);

// Each epoch's logged samples, over all ranks and phases, are the dataset once each.
void check_each_epoch_once(const std::filesystem::path& dir);

// How close an elastic run must end to uninterrupted ones.
struct ElasticTolerance {
  // The largest parameter difference allowed between uninterrupted runs at
  // worlds 1, 2 and 3: the rounding of the weights' dtype, not another trajectory.
  double noise_limit;
  // The elastic run may differ from world 2's uninterrupted run by
  // max(noise_factor x that spread, floor) in its parameters, and by ten
  // times that in rank 0's loss at each step.
  double noise_factor = 4;
  double floor = 0;
};

// World 2 -> 1 -> 3 with global batch 6 (2 steps at world 2, to step 4 at
// world 1 stopped by SIGTERM, the rest at world 3): each resume says where it
// came from; each epoch trains each sample once; the losses and the final
// parameters follow uninterrupted runs within `tolerance`; and a stop and
// resume at world 2 ends bit for bit as the uninterrupted world-2 run.
void expect_world_changes_as_uninterrupted(const ElasticSetting& setting, const ElasticTolerance& tolerance);

}  // namespace loom::dist::testing
