// Host staging (see host_staging.h): host copies of the caller's
// tensors in, the CPU group's collective, copies back in wait().
#include <loom/dist/host_staging.h>

#include <mutex>
#include <utility>

#include <loom/core/autograd.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>

namespace loom::dist {

namespace {

// The host tensors one collective works on, and the results to copy back.
class Staging {
 public:
  explicit Staging(Device device) : device_(device) {}

  // A host copy of `tensor` (its values when `copy_in`); when `copy_out`, the
  // collective's result in it is copied back into `tensor`.
  Tensor stage(const Tensor& tensor, bool copy_in, bool copy_out) {
    LOOM_CHECK(tensor.defined(), "host staging: an undefined tensor");
    LOOM_CHECK(tensor.device() == device_, "host staging: ", tensor.str(), " is not on this group's device ",
               device_.str(), "; move it there first");
    NoGradGuard no_grad;
    Tensor host = Tensor::empty(tensor.sizes(), tensor.dtype(), Device::cpu());
    if (copy_in) host.copy_(tensor);  // from a CUDA tensor: waits for the caller's stream
    if (copy_out) copy_backs_.emplace_back(tensor, host);
    return host;
  }
  std::vector<Tensor> stage(const std::vector<Tensor>& tensors, bool copy_in, bool copy_out) {
    std::vector<Tensor> hosts;
    for (const Tensor& t : tensors) hosts.push_back(stage(t, copy_in, copy_out));
    return hosts;
  }

  WorkHandle finish(WorkHandle inner);

 private:
  Device device_;
  std::vector<std::pair<Tensor, Tensor>> copy_backs_;  // (caller's tensor, host result)
};

// The CPU group's work; the results are copied back once, by the first
// wait(), synchronize() or successful wait_for().
class StagedWork final : public Work {
 public:
  StagedWork(WorkHandle inner, std::vector<std::pair<Tensor, Tensor>> copy_backs, Device device)
      : Work(inner->description()), inner_(std::move(inner)), copy_backs_(std::move(copy_backs)), device_(device) {}

  void wait() override {
    inner_->wait();
    copy_back();
  }
  void synchronize() override {
    inner_->synchronize();
    copy_back();
    if (device_.is_cuda()) cuda::current_stream(device_.index).synchronize();
  }
  bool wait_for(Milliseconds timeout) override {
    if (!inner_->wait_for(timeout)) return false;
    if (inner_->succeeded()) copy_back();
    return true;
  }
  bool completed() const override { return inner_->completed(); }
  bool succeeded() const override { return inner_->succeeded(); }
  std::exception_ptr error() const override { return inner_->error(); }
  Clock::time_point enqueue_time() const override { return inner_->enqueue_time(); }
  Clock::time_point start_time() const override { return inner_->start_time(); }
  Clock::time_point end_time() const override { return inner_->end_time(); }
  int thread_id() const override { return inner_->thread_id(); }

 private:
  // On the caller's current stream: later kernels there see the results.
  void copy_back() {
    std::call_once(copied_, [&] {
      NoGradGuard no_grad;
      for (auto& [destination, host] : copy_backs_) Tensor(destination).copy_(host);
      copy_backs_.clear();
    });
  }

  WorkHandle inner_;
  std::vector<std::pair<Tensor, Tensor>> copy_backs_;
  Device device_;
  std::once_flag copied_;
};

WorkHandle Staging::finish(WorkHandle inner) {
  return std::make_shared<StagedWork>(std::move(inner), std::move(copy_backs_), device_);
}

// Collectives on `device`'s tensors through host copies for a CPU group.
class HostStagedProcessGroup final : public ProcessGroup {
 public:
  HostStagedProcessGroup(std::shared_ptr<ProcessGroup> inner, Device device)
      : ProcessGroup(inner ? inner->rank() : 0, inner ? inner->size() : 1), inner_(std::move(inner)), device_(device) {
    LOOM_CHECK(inner_ != nullptr, "host staging: the process group is null");
    LOOM_CHECK(inner_->device().is_cpu(), "host staging: the ", inner_->backend_name(),
               " process group already works on ", inner_->device().str(), " tensors");
  }

  using ProcessGroup::all_reduce;
  WorkHandle all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    Staging staging(device_);
    std::vector<Tensor> hosts = staging.stage(tensors, /*copy_in=*/true, /*copy_out=*/true);
    return staging.finish(inner_->all_reduce(hosts, op));
  }

  WorkHandle broadcast(const Tensor& tensor, int root) override {
    Staging staging(device_);
    Tensor host = staging.stage(tensor, /*copy_in=*/rank() == root, /*copy_out=*/rank() != root);
    return staging.finish(inner_->broadcast(host, root));
  }

  WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    Staging staging(device_);
    Tensor host_input = staging.stage(input, /*copy_in=*/true, /*copy_out=*/false);
    std::vector<Tensor> host_outputs = staging.stage(outputs, /*copy_in=*/false, /*copy_out=*/true);
    return staging.finish(inner_->all_gather(host_outputs, host_input));
  }

  WorkHandle all_gather_into(const Tensor& output, const Tensor& input) override {
    Staging staging(device_);
    Tensor host_input = staging.stage(input, /*copy_in=*/true, /*copy_out=*/false);
    Tensor host_output = staging.stage(output, /*copy_in=*/false, /*copy_out=*/true);
    return staging.finish(inner_->all_gather_into(host_output, host_input));
  }

  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) override {
    Staging staging(device_);
    std::vector<Tensor> host_inputs = staging.stage(inputs, /*copy_in=*/true, /*copy_out=*/false);
    Tensor host_output = staging.stage(output, /*copy_in=*/false, /*copy_out=*/true);
    return staging.finish(inner_->reduce_scatter(host_output, host_inputs, op));
  }

  WorkHandle reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op) override {
    Staging staging(device_);
    Tensor host_input = staging.stage(input, /*copy_in=*/true, /*copy_out=*/false);
    Tensor host_output = staging.stage(output, /*copy_in=*/false, /*copy_out=*/true);
    return staging.finish(inner_->reduce_scatter_from(host_output, host_input, op));
  }

  const char* backend_name() const override { return inner_->backend_name(); }
  Device device() const override { return device_; }
  WorkHandle barrier() override { return inner_->barrier(); }
  void set_timeout(Milliseconds timeout) override { inner_->set_timeout(timeout); }
  Milliseconds timeout() const override { return inner_->timeout(); }

 private:
  std::shared_ptr<ProcessGroup> inner_;
  Device device_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_host_staged_process_group(std::shared_ptr<ProcessGroup> inner, Device device) {
  return std::make_shared<HostStagedProcessGroup>(std::move(inner), device);
}

std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> group, Device device) {
  if (group == nullptr || group->device() == device) return group;
  return make_host_staged_process_group(std::move(group), device);
}

}  // namespace loom::dist
