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
#include <optional>
#include <thread>

#include <loom/core/autograd.h>
#include <loom/core/cuda/check.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/error.h>
#include <loom/core/log.h>
#include <loom/core/profiler.h>
#include <loom/core/storage.h>
#include <loom/dist/nccl_watchdog.h>
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

// A non-blocking NCCL communicator (ncclCommInitRankConfig with blocking =
// 0): every call returns at once, ncclInProgress while NCCL completes it in
// the background. The handle's mutex (AbortableHandle) is never held across
// an NCCL call that can block: abort() from the watchdog takes the handle and
// calls ncclCommAbort while an enqueuing thread may still be inside a call on
// it (which then returns), and state() never waits behind such a call.
class NcclCommunicator final : public nccl::Communicator {
 public:
  explicit NcclCommunicator(int device) : device_(device) {}
  ~NcclCommunicator() override { abort(); }

  // Starts the initialisation; the watchdog waits for it under the timeout.
  void start_init(const ncclUniqueId& id, int size, int rank) {
    cuda::DeviceGuard guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    LOOM_CHECK_NCCL(ncclCommInitRankConfig(&comm, size, id, rank, &config));
    handle_.set(comm);
  }

  State state(std::string& reason) override {
    // ncclCommGetAsyncError and ncclGetLastError never block: under the
    // handle's mutex, so that abort() cannot free the communicator meanwhile.
    return handle_.query([&](ncclComm_t comm) {
      if (comm == nullptr) {
        reason = "the NCCL communicator was aborted";
        return State::failed;
      }
      ncclResult_t result = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm, &result);
      if (query != ncclSuccess) {
        reason = str("ncclCommGetAsyncError failed: ", ncclGetErrorString(query));
        return State::failed;
      }
      if (result == ncclSuccess) return State::ready;
      if (result == ncclInProgress) return State::in_progress;
      const char* detail = ncclGetLastError(comm);
      reason = str(ncclGetErrorString(result), detail != nullptr && *detail != '\0' ? str(" (", detail, ")") : "");
      return State::failed;
    });
  }

  void abort() noexcept override {
    ncclComm_t comm = handle_.take();
    if (comm == nullptr) return;
    // Without the mutex: a call blocked in the communicator returns.
    const ncclResult_t result = ncclCommAbort(comm);
    if (result != ncclSuccess && result != ncclInProgress)
      log_warn("cuda:", device_, ": aborting the NCCL communicator failed: ", ncclGetErrorString(result));
  }

  void bind_watchdog_thread() override { cuda::set_device(device_); }

  // Makes non-blocking NCCL calls on the communicator; throws once it was
  // aborted. Enqueuing threads are serialised by the Watchdog.
  void call(const std::function<void(ncclComm_t)>& calls) { handle_.call(calls); }

 private:
  int device_;
  nccl::AbortableHandle<ncclComm> handle_;  // null until initialised and once aborted
};

}  // namespace

bool nccl_available() { return true; }

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, const NcclOptions& options)
      : ProcessGroup(rank, size),
        store_(store),
        device_(select_device(options.device_index())),
        communicator_(std::make_shared<NcclCommunicator>(device_)),
        timeout_(options.timeout()),
        stream_(cuda::pooled_stream(device_, cuda::StreamPriority::high)) {
    LOOM_CHECK(store != nullptr, "ProcessGroupNCCL: the rendezvous store is null");
    LOOM_CHECK(options.timeout().count() > 0, "ProcessGroupNCCL: timeout must be positive, got ",
               options.timeout().count(), " ms");

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
        LOOM_FAIL(prefix(), "did not receive the NCCL unique id from rank 0 through the store: ", error.what());
      }
      LOOM_CHECK(bytes.size() == sizeof(id), prefix(), "the NCCL unique id from the store has ", bytes.size(),
                 " bytes; expected ", sizeof(id), " (do all ranks run the same NCCL?)");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    try {
      communicator_->start_init(id, size, rank);
    } catch (const Error& error) {
      LOOM_FAIL(prefix(), "creating the NCCL communicator failed (every rank needs its own GPU; ", size,
                " ranks): ", error.what());
    }
    watchdog_ = std::make_unique<nccl::Watchdog>(
        communicator_, nccl::WatchdogOptions()
                       .rank(rank)
                       .size(size)
                       .prefix(prefix())
                       .store(store)
                       .progress_interval(std::max<Milliseconds>(std::chrono::seconds(1), options.timeout() / 10)));
    watchdog_->wait_until_initialized(options.timeout());
  }

  // Waits (at most the timeout) for pending collectives, fails those that
  // did not finish, then aborts the communicator (as PyTorch does, rather
  // than ncclCommDestroy: with nothing pending it only frees this rank's
  // resources, and it cannot block on a peer that is gone). Never throws.
  ~ProcessGroupNCCL() override = default;

  const char* backend_name() const override { return "nccl"; }
  // check_nccl_tensor for this rank's device, for the shared argument checks (detail::check_*).
  detail::TensorCheck tensor_check() const {
    return [device = device_index()](const char* collective, const Tensor& tensor, const std::string& role) {
      check_nccl_tensor(collective, tensor, role, device);
    };
  }
  Device device() const override { return Device::cuda(device_); }

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
    collective.wait_mode = nccl::WatchedWork::WaitMode::host;
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

  // A collective called while the caller's stream captures is recorded into the graph (run()).
  std::optional<std::string> capture_refusal() const override { return std::nullopt; }

  // The replay's end on the caller's stream, watched as one more collective.
  WorkHandle watch_replay(const std::string& description) override {
    cuda::DeviceGuard device_guard(device_);
    const cuda::StreamView caller = cuda::current_stream(device_);
    LOOM_CHECK(!capturing(caller), prefix(), "watch_replay is called after a replay, not while capturing");
    auto done = std::make_shared<cuda::Event>(device_);
    return watchdog_->run("graph replay", description, timeout_.load(), nccl::WatchedWork::WaitMode::stream, [] {},
                          [&] {
                            done->record(caller);
                            return nccl::WatchedWork::DeviceHooks{
                                nullptr, [done] { return done->query(); },
                                [done, device = device_] { cuda::current_stream(device).wait(*done); }};
                          });
  }

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
    nccl::WatchedWork::WaitMode wait_mode = nccl::WatchedWork::WaitMode::stream;

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

  int device_index() const { return device_; }

  // Whether `stream` captures a CUDA graph now (a capture invalidated by an
  // earlier call is an error: its graph would lack this collective).
  bool capturing(const cuda::StreamView& stream) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    LOOM_CHECK_CUDA(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream.handle()), &status));
    LOOM_CHECK(status != cudaStreamCaptureStatusInvalidated, prefix(),
               "the caller's stream is in a CUDA graph capture that an earlier call invalidated");
    return status == cudaStreamCaptureStatusActive;
  }
  std::string prefix() const { return str("ProcessGroupNCCL rank ", rank(), " of ", size(), " (cuda:", device_, "): "); }

  // Orders the collective after the caller's current stream, runs it on the
  // NCCL stream, and hands the work to the watchdog.
  WorkHandle run(Collective collective) {
    cuda::DeviceGuard device_guard(device_);
    NoGradGuard no_grad;  // staging copies are not differentiable
    const cuda::StreamView caller = cuda::current_stream(device_);
    // Captured into the caller's graph: the NCCL stream joins the capture
    // through the event below and leaves it when the caller waits for `done`.
    const bool captured = capturing(caller);
    LOOM_CHECK(!captured || collective.wait_mode != nccl::WatchedWork::WaitMode::host, prefix(), collective.name,
               " cannot be captured in a CUDA graph: its wait blocks the host");
    auto started = std::make_shared<cuda::Event>(device_);  // on the NCCL stream before the collective
    auto done = std::make_shared<cuda::Event>(device_);     // and after it
    auto enqueue = [&] {
      {
        cuda::Event inputs_ready(device_);  // destroying it after the wait is enqueued is allowed
        inputs_ready.record(caller);
        stream_.wait(inputs_ready);
      }
      started->record(stream_);
      communicator_->call([&](ncclComm_t comm) {
        LOOM_CHECK_NCCL(ncclGroupStart());
        try {
          collective.launch(comm, stream_.handle());
        } catch (...) {
          ncclGroupEnd();
          throw;
        }
        LOOM_CHECK_NCCL(ncclGroupEnd());  // ncclInProgress: the watchdog waits for the group
      });
    };
    auto enqueued = [&] {
      done->record(stream_);
      // The caching allocator must not reuse this memory before the NCCL stream is done with it.
      for (const Tensor& t : collective.used) cuda::record_stream(t.storage()->data(), device_, stream_);
      if (!collective.copy_backs.empty()) {
        // Results that went through a staging buffer are copied on the caller's stream.
        caller.wait(*done);
        for (auto& [destination, source] : collective.copy_backs) Tensor(destination).copy_(source);
      }
      return nccl::WatchedWork::DeviceHooks{
          [started] { return started->query(); }, [done] { return done->query(); },
          [done, device = device_] { cuda::current_stream(device).wait(*done); }};
    };
    return watchdog_->run(collective.name, collective.details, timeout_.load(), collective.wait_mode, enqueue,
                          enqueued, captured);
  }

  std::shared_ptr<Store> store_;  // kept for the group's lifetime, as the Gloo group keeps its own
  int device_;
  std::shared_ptr<NcclCommunicator> communicator_;
  std::atomic<Milliseconds> timeout_;
  cuda::StreamView stream_;  // the group's NCCL stream, high priority; pooled: it outlives the tensors used on it
  std::unique_ptr<nccl::Watchdog> watchdog_;  // destroyed first: drains the pending collectives, then aborts
};

std::shared_ptr<ProcessGroup> make_process_group_nccl(std::shared_ptr<Store> store, int rank, int size,
                                                      const NcclOptions& options) {
  return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options);
}

}  // namespace loom::dist
