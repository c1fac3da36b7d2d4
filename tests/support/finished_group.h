// A process group of one rank whose every collective has finished when it
// returns, for tests and benchmarks of what wraps a group (DebugProcessGroup):
// with no failure message each one succeeds at once (what is left to time is
// the caller's side); with one, each fails with it, as a backend's timed-out
// collective does. allow_capture() makes it say that CUDA graphs can hold
// its collectives, as nccl does (for the logic that asks).
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.h>
#include <loom/dist/process_group.h>
#include <loom/dist/store.h>  // Milliseconds

namespace loom::testing {

class FinishedGroup final : public dist::ProcessGroup {
 public:
  explicit FinishedGroup(std::optional<std::string> failure = std::nullopt)
      : ProcessGroup(0, 1), failure_(std::move(failure)) {}
  const char* backend_name() const override { return failure_ ? "failing" : "no-op"; }
  dist::WorkHandle all_reduce(const std::vector<Tensor>&, dist::ReduceOp) override { return finished("all_reduce"); }
  dist::WorkHandle broadcast(const Tensor&, int) override { return finished("broadcast"); }
  dist::WorkHandle all_gather(const std::vector<Tensor>&, const Tensor&) override { return finished("all_gather"); }
  dist::WorkHandle all_gather_into(const Tensor&, const Tensor&) override { return finished("all_gather"); }
  dist::WorkHandle reduce_scatter(const Tensor&, const std::vector<Tensor>&, dist::ReduceOp) override {
    return finished("reduce_scatter");
  }
  dist::WorkHandle reduce_scatter_from(const Tensor&, const Tensor&, dist::ReduceOp) override {
    return finished("reduce_scatter");
  }
  dist::WorkHandle barrier() override { return finished("barrier"); }
  void set_timeout(dist::Milliseconds) override {}
  dist::Milliseconds timeout() const override { return std::chrono::seconds(1); }
  std::optional<std::string> capture_refusal() const override {
    return capturable_ ? std::nullopt : ProcessGroup::capture_refusal();
  }
  void allow_capture() { capturable_ = true; }

 private:
  dist::WorkHandle finished(const char* name) {
    auto work = std::make_shared<dist::Work>(name);
    if (failure_) {
      work->mark_started();
      work->finish(std::make_exception_ptr(Error(*failure_)));
    } else {
      work->finish();
    }
    return work;
  }
  std::optional<std::string> failure_;
  bool capturable_ = false;
};

}  // namespace loom::testing
