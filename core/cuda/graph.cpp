// cuda::Graph (graph.h) over the CUDA runtime's stream capture.
#include <loom/core/cuda/graph.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <string>

#include <loom/core/cuda/check.h>
#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/handles.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/error.h>

namespace loom::cuda {
namespace {
std::atomic<uint64_t> g_next_pool{1};
// cuBLAS's recommended workspace on Hopper (32 MiB; 4 MiB suffices before it).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Ends the capture on `stream` whatever state it is in; returns the graph
// (null when the capture was invalidated).
cudaGraph_t end_capture(cudaStream_t stream, cudaError_t& status) {
  cudaGraph_t graph = nullptr;
  status = cudaStreamEndCapture(stream, &graph);
  if (status != cudaSuccess) (void)cudaGetLastError();  // an invalidated capture's error is not sticky
  return graph;
}
}  // namespace

struct Graph::Captured {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DeviceBuffer cublas_workspace;  // what the captured matrix products use, as long as they may run
  ~Captured() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

Graph::Graph(int device) : device_(device), pool_(g_next_pool.fetch_add(1)) { require_device(device); }

Graph::~Graph() {
  // Replays may still run: the pool's memory goes back only after them.
  try {
    if (captured_) synchronize(device_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: waiting for a CUDA graph's replays on cuda:%d failed: %s\n", device_, e.what());
  }
  captured_.reset();
  release_private_pool(device_, pool_);
}

bool Graph::captured() const { return captured_ != nullptr; }

void Graph::capture(const std::function<void()>& work) {
  if (captured_) {
    synchronize(device_);  // the old graph's replays done before its memory is captured into again
    captured_.reset();
  }
  const DeviceGuard device_guard(device_);
  const StreamView side = pooled_stream(device_);
  Event ready(device_);
  ready.record(current_stream(device_));
  side.wait(ready);  // the capture's work comes after what is queued already
  const StreamGuard on_side(side);
  const cudaStream_t stream = static_cast<cudaStream_t>(side.handle());
  // This thread's cuBLAS and cuDNN handles made and bound to the side stream
  // now: making or binding one inside the capture could allocate or wait.
  // cuBLAS gets a workspace of the graph's own (its default pool may
  // allocate inside the capture); binding a stream resets it, so it holds
  // for the capture, during which the handle stays on the side stream.
  auto made = std::make_unique<Captured>();
  made->cublas_workspace = DeviceBuffer(kCublasWorkspaceBytes, device_);
  LOOM_CHECK_CUBLAS(
      cublasSetWorkspace(cublas_handle(side), made->cublas_workspace.data(), made->cublas_workspace.size()));
  (void)cudnn_handle(side);
  begin_private_pool(device_, pool_, side);
  try {
    LOOM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  } catch (...) {
    end_private_pool(device_, side);
    throw;
  }
  detail::set_capturing(true);
  std::string failure;
  try {
    work();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "the captured work threw an exception that is not a std::exception";
  }
  const CaptureSyncs syncs = detail::set_capturing(false);
  cudaError_t status = cudaSuccess;
  cudaGraph_t graph = end_capture(stream, status);
  end_private_pool(device_, side);
  made->graph = graph;
  if (syncs.count > 0) {
    LOOM_FAIL("this step cannot be captured as a CUDA graph: it waits for the device ", syncs.count, " time(s), first by ",
              host_sync_name(syncs.first), " (a .item(), a copy to the host or a synchronize inside the step)",
              failure.empty() ? "" : "; ", failure);
  }
  LOOM_CHECK(failure.empty(), "this step cannot be captured as a CUDA graph: ", failure);
  LOOM_CHECK(status == cudaSuccess && graph != nullptr, "this step cannot be captured as a CUDA graph: ",
             cudaGetErrorString(status), " (a CUDA call that a capture forbids, or work on another stream)");
  LOOM_CHECK_CUDA(cudaGraphInstantiate(&made->exec, graph, 0));
  captured_ = std::move(made);
}

void Graph::replay() {
  LOOM_CHECK(captured_ != nullptr, "cuda::Graph::replay: nothing was captured");
  const DeviceGuard device_guard(device_);
  LOOM_CHECK_CUDA(
      cudaGraphLaunch(captured_->exec, static_cast<cudaStream_t>(current_stream(device_).handle())));
  detail::count_kernel_launch();  // one launch from the host
}

}  // namespace loom::cuda
