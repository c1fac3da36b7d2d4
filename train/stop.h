// Stopping a run on a signal at the same step on every rank: SIGTERM, SIGINT
// and one more signal (SIGUSR1 by default, SLURM's warning before the end of
// a job) set a flag; the ranks agree on it after each step and stop together.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/tensor.h>
#include <loom/dist/process_group.h>

namespace loom::train {

// Stop requests by signal. install() makes SIGTERM, SIGINT and `extra` (e.g.
// SIGUSR1; 0 for none) set a flag instead of ending the process; SIGINT does
// so once (a second Ctrl-C ends the process at once). SIGXFSZ is ignored, so
// a file size limit turns into a write error instead of a kill.
class StopSignals {
 public:
  static void install(int extra);
  // The first stop signal received, 0 for none.
  static int received();
  // Forgets the signal received, so that a later run in this process starts
  // afresh (a program that runs fit() again, a test).
  static void reset();
};

// The line when every rank stopped for `signal` after `step` steps. Rank 0,
// on stdout and stderr: "Preempted by SIGTERM after step 137: checkpoint
// ./checkpoint/2GPU_step137.checkpoint written; resume with --resume auto
// (exit code 143)"; the others on stderr: "rank 1: stopped by SIGTERM after step 137".
void print_preempted(int rank, int signal, int64_t step, const std::optional<std::filesystem::path>& checkpoint);

// Parses --checkpoint-signal: USR1, SIGUSR1, USR2, TERM, HUP, ... -> number; none -> 0.
int parse_signal_name(const std::string& name);

// Makes every rank stop after the same step: poll() after each step shares
// each rank's flag through an all-reduce (max) issued at that step and read
// `depth` polls later, so its latency hides behind the steps between. Every
// rank must call poll() equally often. With a CUDA flag (NCCL) the depth is
// 2 and the agreed flag comes back through pinned memory on a side stream:
// reading it waits, at most, for the all-reduce issued two steps ago, never
// for the steps queued since on the compute stream (a .item() would), and
// not at all (no host sync) once that copy is done, as it is whenever the
// host runs less than two steps ahead of the GPU. A CPU flag's depth is 1.
class StopAgreement {
 public:
  // depth: 0 chooses 2 for a CUDA group, 1 otherwise; a rank stops `depth`
  // polls after the poll that first saw its signal, at most.
  explicit StopAgreement(std::shared_ptr<dist::ProcessGroup> group, int depth = 0);
  ~StopAgreement();
  // The signal every rank agrees to stop for now, or 0 to continue.
  int poll();
  // Waits for the outstanding all-reduces (before other collectives).
  void finish();
  int depth() const { return static_cast<int>(slots_.size()); }

 private:
  struct HostCopy;  // a CUDA flag's copy in pinned memory
  // One all-reduce in flight: polls take the slots in turn.
  struct Slot {
    Tensor flag;
    std::shared_ptr<dist::Work> pending;
    std::unique_ptr<HostCopy> host_copy;
  };
  std::shared_ptr<dist::ProcessGroup> group_;
  std::vector<Slot> slots_;
  size_t next_ = 0;  // the slot of the next poll
};

}  // namespace loom::train
