// ProcessGroupNCCL (see process_group_nccl.h): the communicator, its stream,
// the collectives as NCCL calls ordered with events, and the watchdog thread
// that completes Work objects and aborts the communicator on a timeout or an
// asynchronous NCCL error.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include <loom/core/autograd.h>
#include <loom/core/cuda/check.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/error.h>
#include <loom/core/log.h>
#include <loom/core/profiler.h>
#include <loom/core/storage.h>
#include <loom/dist/process_group_nccl.h>

namespace loom::dist {

namespace {

using detail::summarize;
using detail::view_into;

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0),
              "loom needs NCCL 2.14 or newer (ncclAvg, ncclBfloat16, ncclGetLastError, ncclInProgress)");

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    case DType::i32: return ncclInt32;
    case DType::u8: break;
  }
  LOOM_FAIL("NCCL collectives take f32, f64, f16, bf16, i64 or i32 tensors, not ", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // divides by the world size inside the collective
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  LOOM_FAIL("unknown reduce op");
}

// A reduce-scatter of `source` (size() chunks laid end to end) into `target`,
// both staged on the group's device; nothing for an empty target.
std::function<void(ncclComm_t, cudaStream_t)> reduce_scatter_launch(Tensor source, Tensor target, ReduceOp op) {
  return [source = std::move(source), target = std::move(target), op](ncclComm_t comm, cudaStream_t stream) {
    if (target.numel() == 0) return;
    LOOM_CHECK_NCCL(ncclReduceScatter(source.raw_data(), target.raw_data(), static_cast<size_t>(target.numel()),
                                      nccl_dtype(target.dtype()), nccl_op(op), comm, stream));
  };
}

double seconds(Milliseconds duration) { return static_cast<double>(duration.count()) / 1000.0; }

// State shared by the group, its Work objects and the watchdog.
struct Communicator {
  int rank = 0;
  int size = 1;
  int device = 0;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed; guarded by `mutex`
  std::mutex mutex;           // NCCL calls on `comm` (one thread at a time) and `failure`
  std::string failure;        // the first failure; the group is unusable once set

  std::string prefix() const { return str("ProcessGroupNCCL rank ", rank, " of ", size, " (cuda:", device, "): "); }

  std::string failure_message() {
    std::lock_guard lock(mutex);
    return failure;
  }
};

// One collective: events on the NCCL stream around it, and a deadline.
class NcclWork final : public Work {
 public:
  // Host-blocking works (barrier) wait on the host in wait(), as a barrier must.
  enum class WaitMode { stream, host };

  NcclWork(std::string description, std::shared_ptr<Communicator> communicator, Milliseconds timeout, WaitMode mode)
      : Work(std::move(description)),
        communicator_(std::move(communicator)),
        started_(communicator_->device),
        done_(communicator_->device),
        deadline_(Clock::now() + timeout),
        timeout_(timeout),
        mode_(mode) {}

  cuda::Event& started_event() { return started_; }
  cuda::Event& done_event() { return done_; }
  Clock::time_point deadline() const { return deadline_; }
  Milliseconds timeout() const { return timeout_; }

  void wait() override {
    if (mode_ == WaitMode::host) {
      synchronize();
      return;
    }
    if (Work::completed()) {
      if (std::exception_ptr failure = error()) std::rethrow_exception(failure);
      return;
    }
    std::string failure = communicator_->failure_message();
    if (!failure.empty()) throw Error(failure);
    // The caller's later work on this device runs after the collective.
    cuda::current_stream(communicator_->device).wait(done_);
  }

  void synchronize() override {
    // Completes normally, or because the watchdog aborted the communicator,
    // which ends NCCL's kernels; the watchdog fails the work before aborting.
    while (!poll()) {
      if (Work::wait_for(Milliseconds(1))) break;
    }
    Work::wait();  // rethrows the error, if any
  }

  bool completed() const override { return const_cast<NcclWork*>(this)->poll(); }

  // Finishes the work when its events say so; returns whether it is complete.
  bool poll() {
    if (Work::completed()) return true;
    if (!started_noted_ && started_.query()) {
      started_noted_ = true;
      mark_started();
    }
    if (!done_.query()) return false;
    // A communicator aborted by the watchdog also completes the events: the
    // failure, set before the abort, wins.
    std::string failure = communicator_->failure_message();
    complete(failure.empty() ? nullptr : std::make_exception_ptr(Error(failure)));
    return true;
  }

  // Finishes once; later calls do nothing.
  void complete(std::exception_ptr failure) {
    if (finishing_.exchange(true)) return;
    finish(std::move(failure));
  }

 private:
  std::shared_ptr<Communicator> communicator_;
  cuda::Event started_;  // recorded on the NCCL stream before the collective
  cuda::Event done_;     // recorded on the NCCL stream after it
  Clock::time_point deadline_;
  Milliseconds timeout_;
  WaitMode mode_;
  std::atomic<bool> started_noted_{false};
  std::atomic<bool> finishing_{false};
};

}  // namespace

bool nccl_available() { return true; }

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, const NcclOptions& options)
      : ProcessGroup(rank, size),
        store_(store),
        communicator_(std::make_shared<Communicator>()),
        timeout_(options.timeout()),
        stream_(cuda::pooled_stream(select_device(options.device_index()), cuda::StreamPriority::high)) {
    LOOM_CHECK(store != nullptr, "ProcessGroupNCCL: the rendezvous store is null");
    LOOM_CHECK(options.timeout().count() > 0, "ProcessGroupNCCL: timeout must be positive, got ",
               options.timeout().count(),
               " ms");
    Communicator& c = *communicator_;
    c.rank = rank;
    c.size = size;
    c.device = stream_.device();

    ncclUniqueId id;
    const std::string key = "nccl_unique_id";
    if (rank == 0) {
      LOOM_CHECK_NCCL(ncclGetUniqueId(&id));
      store->set(key, Bytes(reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + sizeof(id)));
    } else {
      Bytes bytes;
      try {
        bytes = store->get(key, options.timeout());
      } catch (const std::exception& error) {
        LOOM_FAIL(c.prefix(), "did not receive the NCCL unique id from rank 0 through the store: ", error.what());
      }
      LOOM_CHECK(bytes.size() == sizeof(id), c.prefix(), "the NCCL unique id from the store has ", bytes.size(),
                 " bytes; expected ", sizeof(id), " (do all ranks run the same NCCL?)");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    {
      cuda::DeviceGuard device(c.device);
      try {
        LOOM_CHECK_NCCL(ncclCommInitRank(&c.comm, size, id, rank));
      } catch (const Error& error) {
        LOOM_FAIL(c.prefix(), "creating the NCCL communicator failed (every rank needs its own GPU; ", size,
                  " ranks): ", error.what());
      }
    }
    watchdog_ = std::thread([this, device = c.device] {
      profiler::set_thread_name("nccl watchdog");  // where collectives end in a trace
      // Its event queries would otherwise create a context on GPU 0 (the
      // thread's default device): hundreds of MiB there for every rank.
      try {
        cuda::set_device(device);
      } catch (const std::exception&) {
      }
      run_watchdog();
    });
  }

  // Waits (at most the timeout) for pending collectives, fails those that
  // did not finish, then frees the communicator. Never throws.
  ~ProcessGroupNCCL() override {
    {
      std::lock_guard lock(pending_mutex_);
      stopping_ = true;
    }
    pending_changed_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    bool clean = communicator_->failure_message().empty();  // else the watchdog failed them all
    for (auto& work : pending_) {
      try {
        while (clean && !work->poll()) {
          if (Work::Clock::now() > work->deadline()) clean = false;
          std::this_thread::sleep_for(Milliseconds(1));
        }
      } catch (...) {
        clean = false;
      }
    }
    std::string reason = communicator_->prefix() + "the process group was destroyed before this collective finished";
    for (auto& work : pending_) work->complete(std::make_exception_ptr(Error(reason)));
    // Aborting (as PyTorch does) rather than ncclCommDestroy: with nothing
    // pending it only frees this rank's resources, and it cannot block on a
    // peer that is gone.
    std::lock_guard lock(communicator_->mutex);
    if (communicator_->comm != nullptr) {
      ncclResult_t result = ncclCommAbort(communicator_->comm);
      if (result != ncclSuccess)
        log_warn(communicator_->prefix(), "freeing the NCCL communicator failed: ", ncclGetErrorString(result));
      communicator_->comm = nullptr;
    }
  }

  const char* backend_name() const override { return "nccl"; }
  // check_nccl_tensor for this rank's device, for the shared argument checks (detail::check_*).
  detail::TensorCheck tensor_check() const {
    return [device = device_index()](const char* collective, const Tensor& tensor, const std::string& role) {
      check_nccl_tensor(collective, tensor, role, device);
    };
  }
  Device device() const override { return Device::cuda(communicator_->device); }

  using ProcessGroup::all_reduce;
  WorkHandle all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    detail::check_all_reduce(tensors, op, tensor_check());
    Collective collective("all_reduce", str(summarize(tensors), ", ", reduce_op_name(op)), device_index());
    std::vector<Tensor> buffers;
    for (const Tensor& t : tensors) buffers.push_back(collective.stage(t, t.is_contiguous(), /*copy_in=*/true));
    collective.launch = [buffers, op](ncclComm_t comm, cudaStream_t stream) {
      for (const Tensor& b : buffers) {
        if (b.numel() == 0) continue;
        LOOM_CHECK_NCCL(ncclAllReduce(b.raw_data(), b.raw_data(), static_cast<size_t>(b.numel()), nccl_dtype(b.dtype()),
                                      nccl_op(op), comm, stream));
      }
    };
    return run(std::move(collective));
  }

  WorkHandle broadcast(const Tensor& tensor, int root) override {
    detail::check_broadcast(tensor, root, size(), tensor_check());
    Collective collective("broadcast", str(summarize({tensor}), ", root ", root), device_index());
    Tensor buffer = collective.stage(tensor, tensor.is_contiguous(), /*copy_in=*/rank() == root);
    collective.launch = [buffer, root](ncclComm_t comm, cudaStream_t stream) {
      if (buffer.numel() == 0) return;
      LOOM_CHECK_NCCL(ncclBroadcast(buffer.raw_data(), buffer.raw_data(), static_cast<size_t>(buffer.numel()),
                                    nccl_dtype(buffer.dtype()), root, comm, stream));
    };
    return run(std::move(collective));
  }

  WorkHandle all_gather_into(const Tensor& output, const Tensor& input) override {
    detail::check_all_gather_into(output, input, size(), tensor_check());
    Collective collective("all_gather", summarize({input}), device_index());
    Tensor source = collective.stage(input, input.is_contiguous(), /*copy_in=*/true);
    Tensor target = collective.stage(output, output.is_contiguous(), /*copy_in=*/false);
    collective.launch = [source, target](ncclComm_t comm, cudaStream_t stream) {
      if (source.numel() == 0) return;
      LOOM_CHECK_NCCL(ncclAllGather(source.raw_data(), target.raw_data(), static_cast<size_t>(source.numel()),
                                    nccl_dtype(source.dtype()), comm, stream));
    };
    return run(std::move(collective));
  }

  WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input) override {
    detail::check_all_gather(outputs, input, size(), tensor_check());
    Collective collective("all_gather", summarize({input}), device_index());
    Tensor source = collective.stage(input, input.is_contiguous(), /*copy_in=*/true);
    Tensor flat = collective.scratch({input.numel() * size()}, input.dtype());
    for (int r = 0; r < size(); ++r) collective.copy_out(outputs[r], view_into(flat, outputs[r].sizes(), r * input.numel()));
    collective.launch = [source, flat](ncclComm_t comm, cudaStream_t stream) {
      if (source.numel() == 0) return;
      LOOM_CHECK_NCCL(ncclAllGather(source.raw_data(), flat.raw_data(), static_cast<size_t>(source.numel()),
                                    nccl_dtype(source.dtype()), comm, stream));
    };
    return run(std::move(collective));
  }

  WorkHandle reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op) override {
    detail::check_reduce_scatter_from(output, input, op, size(), tensor_check());
    Collective collective("reduce_scatter", str(summarize({input}), ", ", reduce_op_name(op)), device_index());
    Tensor source = collective.stage(input, input.is_contiguous(), /*copy_in=*/true);
    Tensor target = collective.stage(output, output.is_contiguous(), /*copy_in=*/false);
    collective.launch = reduce_scatter_launch(source, target, op);
    return run(std::move(collective));
  }

  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) override {
    detail::check_reduce_scatter(output, inputs, op, size(), tensor_check());
    Collective collective("reduce_scatter", str(summarize(inputs), ", ", reduce_op_name(op)), device_index());
    Tensor flat = collective.scratch({output.numel() * size()}, output.dtype());
    for (int r = 0; r < size(); ++r) view_into(flat, inputs[r].sizes(), r * output.numel()).copy_(inputs[r]);
    Tensor target = collective.stage(output, output.is_contiguous(), /*copy_in=*/false);
    collective.launch = reduce_scatter_launch(flat, target, op);
    return run(std::move(collective));
  }

  // An all-reduce of one element whose wait() blocks the host, as PyTorch's
  // NCCL barrier does.
  WorkHandle barrier() override {
    Collective collective("barrier", str(size(), " ranks"), device_index());
    collective.wait_mode = NcclWork::WaitMode::host;
    Tensor token = collective.scratch({1}, DType::f32);
    collective.launch = [token](ncclComm_t comm, cudaStream_t stream) {
      LOOM_CHECK_NCCL(ncclAllReduce(token.raw_data(), token.raw_data(), 1, ncclFloat32, ncclSum, comm, stream));
    };
    return run(std::move(collective));
  }

  void set_timeout(Milliseconds timeout) override {
    LOOM_CHECK(timeout.count() > 0, "ProcessGroupNCCL: timeout must be positive, got ", timeout.count(), " ms");
    timeout_ = timeout;
  }
  Milliseconds timeout() const override { return timeout_.load(); }

 private:
  // One collective being prepared on the caller's thread: the tensors the
  // NCCL call reads and writes (the caller's own when contiguous, else
  // contiguous copies), copies back into the caller's tensors, and the call.
  struct Collective {
    Collective(std::string name_, std::string details_, int device_)
        : name(std::move(name_)), details(std::move(details_)), device(device_) {}
    std::string name, details;
    int device;
    std::vector<Tensor> used;                          // by the NCCL stream: record_stream'd
    std::vector<std::pair<Tensor, Tensor>> copy_backs;  // (destination, source) after the collective
    std::function<void(ncclComm_t, cudaStream_t)> launch;
    NcclWork::WaitMode wait_mode = NcclWork::WaitMode::stream;

    // `tensor` itself when usable in place, else a contiguous buffer (filled
    // from the tensor when `copy_in`) whose result is copied back.
    Tensor stage(const Tensor& tensor, bool in_place, bool copy_in) {
      if (in_place) {
        used.push_back(tensor);
        return tensor;
      }
      Tensor buffer = copy_in ? tensor.contiguous() : Tensor::empty(tensor.sizes(), tensor.dtype(), tensor.device());
      used.push_back(buffer);
      copy_backs.emplace_back(tensor, buffer);
      return buffer;
    }
    Tensor scratch(const Shape& shape, DType dtype) {
      Tensor buffer = Tensor::empty(shape, dtype, Device::cuda(device));
      used.push_back(buffer);
      return buffer;
    }
    void copy_out(const Tensor& destination, const Tensor& source) { copy_backs.emplace_back(destination, source); }
  };

  static int select_device(int requested) {
    require_nccl();
    int device = requested >= 0 ? requested : cuda::local_rank_device();
    // One rank per GPU: from here on this rank's GPU is the calling thread's
    // current device (as torch.cuda.set_device), so the model's kernels run there.
    cuda::set_device(device);
    return device;
  }

  int device_index() const { return communicator_->device; }

  // Orders the collective after the caller's current stream, runs it on the
  // NCCL stream, and hands the work to the watchdog.
  WorkHandle run(Collective collective) {
    Communicator& c = *communicator_;
    std::string failure = c.failure_message();
    if (!failure.empty())
      LOOM_FAIL(c.prefix(), collective.name, " called on a process group that failed earlier: ", failure);
    cuda::DeviceGuard device_guard(c.device);
    NoGradGuard no_grad;  // staging copies are not differentiable
    const cuda::StreamView caller = cuda::current_stream(c.device);
    auto work = std::make_shared<NcclWork>(str(collective.name, " #", sequence_++, " (", collective.details, ")"),
                                           communicator_, timeout_.load(), collective.wait_mode);
    {
      cuda::Event inputs_ready(c.device);  // destroying it after the wait is enqueued is allowed
      inputs_ready.record(caller);
      stream_.wait(inputs_ready);
    }
    work->started_event().record(stream_);
    {
      std::lock_guard lock(c.mutex);
      if (c.comm == nullptr) LOOM_FAIL(c.prefix(), collective.name, " called after the communicator was aborted: ", c.failure);
      LOOM_CHECK_NCCL(ncclGroupStart());
      try {
        collective.launch(c.comm, stream_.handle());
      } catch (...) {
        ncclGroupEnd();
        throw;
      }
      LOOM_CHECK_NCCL(ncclGroupEnd());
    }
    work->done_event().record(stream_);
    // The caching allocator must not reuse this memory before the NCCL stream is done with it.
    for (const Tensor& t : collective.used) cuda::record_stream(t.storage()->data(), c.device, stream_);
    if (!collective.copy_backs.empty()) {
      // Results that went through a staging buffer are copied on the caller's stream.
      caller.wait(work->done_event());
      for (auto& [destination, source] : collective.copy_backs) Tensor(destination).copy_(source);
    }
    {
      std::lock_guard lock(pending_mutex_);
      pending_.push_back(work);
    }
    pending_changed_.notify_one();
    return work;
  }

  // Completes works whose events have fired; on a timeout or an asynchronous
  // NCCL error, fails every pending work and aborts the communicator.
  void run_watchdog() {
    auto last_error_check = Work::Clock::now();
    std::unique_lock lock(pending_mutex_);
    while (!stopping_) {
      pending_changed_.wait_for(lock, pending_.empty() ? Milliseconds(100) : Milliseconds(1));
      if (stopping_) break;
      std::string failure;
      while (!pending_.empty()) {
        const std::shared_ptr<NcclWork>& work = pending_.front();
        bool done = false;
        try {
          done = work->poll();
        } catch (const std::exception& error) {  // a CUDA error while querying its events
          failure = str(communicator_->prefix(), work->description(), " failed: ", error.what(),
                        "; the NCCL communicator was aborted and this process group is unusable from now on");
          break;
        }
        if (done) {
          pending_.pop_front();
          continue;
        }
        if (Work::Clock::now() > work->deadline()) {
          failure = str(communicator_->prefix(), work->description(), " did not finish within the timeout of ",
                        seconds(work->timeout()), " s. A peer process may have died or stopped calling "
                        "collectives (or called them in a different order); the NCCL communicator was aborted and "
                        "this process group is unusable from now on");
        }
        break;  // works finish in order on the one NCCL stream
      }
      const auto now = Work::Clock::now();
      if (failure.empty() && now - last_error_check > Milliseconds(100)) {
        last_error_check = now;
        failure = asynchronous_error();
      }
      if (!failure.empty()) {
        fail_all(failure);
        break;
      }
    }
  }

  // NCCL's asynchronous error of the communicator (a peer's connection
  // lost, ...) as a message, or "".
  std::string asynchronous_error() {
    Communicator& c = *communicator_;
    std::lock_guard lock(c.mutex);
    if (c.comm == nullptr) return "";
    ncclResult_t result = ncclSuccess;
    if (ncclCommGetAsyncError(c.comm, &result) != ncclSuccess) return "";
    if (result == ncclSuccess || result == ncclInProgress) return "";
    std::string detail = ncclGetLastError(c.comm) ? ncclGetLastError(c.comm) : "";
    std::string pending = pending_.empty() ? std::string("no collective") : pending_.front()->description();
    return str(c.prefix(), "NCCL reported an asynchronous error while running ", pending, ": ",
               ncclGetErrorString(result), detail.empty() ? "" : " (" + detail + ")",
               ". A peer process may have died; the NCCL communicator was aborted and this process group is "
               "unusable from now on");
  }

  // Fails every pending work with `message` (first), then aborts the
  // communicator, which ends NCCL's kernels so that waiting streams go on.
  // pending_mutex_ is held.
  void fail_all(const std::string& message) {
    Communicator& c = *communicator_;
    {
      std::lock_guard lock(c.mutex);
      if (c.failure.empty()) c.failure = message;
    }
    log_error(message);
    for (auto& work : pending_) work->complete(std::make_exception_ptr(Error(message)));
    pending_.clear();
    std::lock_guard comm_lock(c.mutex);
    if (c.comm != nullptr) {
      ncclCommAbort(c.comm);
      c.comm = nullptr;
    }
  }

  std::shared_ptr<Store> store_;  // kept for the group's lifetime, as the Gloo group keeps its own
  std::shared_ptr<Communicator> communicator_;
  std::atomic<Milliseconds> timeout_;
  cuda::StreamView stream_;  // the group's NCCL stream, high priority; pooled: it outlives the tensors used on it
  std::atomic<uint64_t> sequence_{0};

  std::mutex pending_mutex_;
  std::condition_variable pending_changed_;
  std::deque<std::shared_ptr<NcclWork>> pending_;  // enqueue order
  bool stopping_ = false;
  std::thread watchdog_;
};

std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      const NcclOptions& options) {
  return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options);
}

}  // namespace loom::dist
