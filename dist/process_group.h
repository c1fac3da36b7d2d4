// ProcessGroup: asynchronous collectives over a fixed set of ranks, each call
// returning a Work to wait on; init_process_group() builds one from the launch
// environment and a rendezvous store, and keeps it as the default group.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/options.h>
#include <loom/core/tensor.h>
#include <loom/dist/store.h>

namespace loom::dist {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// Default timeout of one collective (PyTorch's, for Gloo and NCCL).
inline constexpr Milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(30);

// One enqueued collective. The backend marks it started and finished; callers
// wait on it. Thread-safe.
class Work {
 public:
  using Clock = std::chrono::steady_clock;

  // `description` names the collective for errors: "all_reduce #7 (f32[1000], sum)".
  explicit Work(std::string description);
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Orders what the caller does next after the collective; throws its
  // loom::Error if it failed. Host-side backends (gloo) block until it
  // finished. Stream-ordered backends (nccl) do not block the host: they make
  // the caller's current CUDA stream wait for the collective, so kernels
  // queued afterwards see its result (as in PyTorch); a failure found later
  // is raised by the next collective or synchronize().
  virtual void wait();
  // Blocks the host until the collective finished, on the device too; throws
  // its loom::Error if it failed.
  virtual void synchronize();
  // Like synchronize() but gives up after `timeout`; returns whether it
  // finished. Never throws the collective's error.
  [[nodiscard]] virtual bool wait_for(Milliseconds timeout);

  // True once the collective finished (successfully or not); never blocks.
  [[nodiscard]] virtual bool completed() const;
  [[nodiscard]] virtual bool succeeded() const;
  // The failure (a loom::Error), or null while running or after success.
  [[nodiscard]] virtual std::exception_ptr error() const;
  std::string error_message() const;  // "" when there is no error

  const std::string& description() const { return description_; }
  // When the work was enqueued, started running, and finished (success or not);
  // a time point is Clock::time_point{} until it happens.
  virtual Clock::time_point enqueue_time() const { return enqueue_time_; }
  virtual Clock::time_point start_time() const;
  virtual Clock::time_point end_time() const;
  // The thread that finished it (its backend's communication thread), as
  // profiler::current_thread_id() names it; 0 until then.
  virtual int thread_id() const;

  // For backends. (A Work that forwards to another, as DebugProcessGroup's
  // does, overrides every virtual accessor instead.)
  void mark_started();
  void finish(std::exception_ptr error = nullptr);

 private:
  std::string description_;
  Clock::time_point enqueue_time_;
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  Clock::time_point start_time_{};
  Clock::time_point end_time_{};
  int thread_id_ = 0;
  bool completed_ = false;
  std::exception_ptr error_;
};

using WorkHandle = std::shared_ptr<Work>;

// Collectives over `size()` ranks. Every rank must issue the same collectives
// in the same order with matching shapes and dtypes. Calls return at once;
// tensors must stay untouched until the Work completes. In-place collectives
// write their result into the given tensors.
class ProcessGroup {
 public:
  ProcessGroup(int rank, int size);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend_name() const = 0;
  // Where this group's tensors must live: the CPU (gloo) or the CUDA device
  // of this rank (nccl).
  virtual Device device() const { return Device::cpu(); }

  // Reduces each tensor elementwise across ranks, in place; several tensors
  // are reduced in one operation (each independently, like PyTorch's
  // all_reduce_coalesced). avg needs floating-point tensors.
  virtual WorkHandle all_reduce(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum) = 0;
  WorkHandle all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) {
    return all_reduce(std::vector<Tensor>{tensor}, op);
  }

  // Copies root's tensor into every rank's tensor.
  virtual WorkHandle broadcast(const Tensor& tensor, int root = 0) = 0;

  // outputs[r] receives rank r's input; size() outputs, each shaped like input.
  virtual WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // Flat variant: output holds size() * input.numel() elements, rank r's
  // input at [r * numel, (r + 1) * numel).
  virtual WorkHandle all_gather_into(const Tensor& output, const Tensor& input) = 0;

  // output = reduction over ranks of inputs[rank()]; size() inputs, each
  // shaped like output.
  virtual WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                    ReduceOp op = ReduceOp::sum) = 0;
  // Flat variant: input holds size() * output.numel() elements.
  virtual WorkHandle reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum) = 0;

  // Completes once every rank has entered the barrier.
  virtual WorkHandle barrier() = 0;

  // A zero-filled flat tensor of `numel` elements for this group's
  // collectives to work on in place, as DDP's gradient buckets do. Every rank
  // calls it in the same order with the same numel, dtype and device (it may
  // be a collective). The shm backend hands out memory every rank maps, so an
  // all_reduce of one contiguous tensor inside it reduces straight between
  // the ranks' buffers, without copies; the others return Tensor::zeros.
  virtual Tensor new_buffer(int64_t numel, DType dtype, Device device);

  // Timeout of collectives enqueued from now on.
  virtual void set_timeout(Milliseconds timeout) = 0;
  virtual Milliseconds timeout() const = 0;

  // CUDA graphs (cuda::Graph, the Trainer's --cuda-graph): why this group's
  // collectives cannot be captured into one; nothing where they can. A group
  // that can (nccl) records a collective called while the caller's stream
  // captures into the graph (it runs at each replay, not at the call); its
  // Work's wait() joins the capture back at once, and the Work completes
  // without the device (its events are the graph's). gloo and shm run their
  // collectives on the host: they cannot.
  virtual std::optional<std::string> capture_refusal() const;
  // After each replay of a graph that holds this group's collectives: watches
  // the work queued so far on the caller's stream as one more collective
  // under the group's timeout, so that a replay stuck in a captured
  // collective (a peer died) fails the group and aborts its communicator as
  // an eager collective would; the next collective or watch then throws. The
  // Work completes when the replay has run. Null where nothing is captured.
  virtual WorkHandle watch_replay(const std::string& description);

 protected:
  int rank_;
  int size_;
};

// The backend of a process group.
enum class Backend {
  automatic,  // "auto": shm when every rank can map one segment (all on this host), else gloo
  gloo,       // CPU tensors, over TCP
  shm,        // CPU tensors, every rank on this host: shared memory
  nccl,       // CUDA tensors
};
// "auto", "gloo", "shm" or "nccl" as a Backend; throws loom::Error naming
// `name` and the valid names for anything else.
Backend parse_backend(const std::string& name);
// The name parse_backend() reads: "auto", "gloo", "shm" or "nccl".
const char* backend_name(Backend backend);

// What init_process_group() builds, e.g.
// InitOptions().backend(Backend::nccl).timeout(std::chrono::minutes(10)).
class InitOptions {
  // The backend; gloo by default.
  LOOM_OPTION(Backend, backend) = Backend::gloo;
  // "env://" (MASTER_ADDR / MASTER_PORT and friends), "tcp://host:port", or
  // "file:///shared/path"; ignored when a store is given.
  LOOM_OPTION(std::string, init_method) = "env://";
  // Ranks in the group; -1: from the launch environment.
  LOOM_OPTION(int, world_size) = -1;
  // This process's rank; -1: from the launch environment.
  LOOM_OPTION(int, rank) = -1;
  // Timeout of the rendezvous and of collectives.
  LOOM_OPTION(Milliseconds, timeout) = kDefaultCollectiveTimeout;
  // An existing rendezvous store (world_size and rank then required); null: init_method's.
  LOOM_OPTION(std::shared_ptr<Store>, store);
  // Name of the group inside the store; groups sharing a store need distinct names.
  LOOM_OPTION(std::string, group_name) = "default";
  // nccl: the CUDA device this rank drives; -1: cuda::local_rank_device()
  // (LOCAL_RANK, SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK modulo the
  // number of visible devices).
  LOOM_OPTION(int, device_index) = -1;
};

// Builds a process group and makes it the default one: the backend's group
// inside a DebugProcessGroup (debug_process_group.h: the desync report on a
// failed collective, and LOOM_DISTRIBUTED_DEBUG's checks). Sets the log's
// "[rank N]" prefix (core/log.h) for a world of several ranks; LOOM_LOG_LEVEL=
// debug prints the rendezvous steps. Throws loom::Error for nccl where it
// cannot run (no CUDA or NCCL in the build, no visible device), an unknown
// init method, a bad launch environment, a bad LOOM_LOG_LEVEL or
// LOOM_DISTRIBUTED_DEBUG, or a failed rendezvous.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

// The group init_process_group() made; throws when there is none.
std::shared_ptr<ProcessGroup> default_process_group();
bool is_initialized();
// Forgets the default group (it is destroyed once no one else holds it).
void destroy_process_group();

// Copies rank `root`'s `tensors` into every rank's (the same shapes, dtypes
// and devices on every rank, in the same order): one flat broadcast per
// (dtype, device), packed on the root and unpacked on the others (PyTorch's
// _broadcast_coalesced). Returns once the tensors hold the root's values
// (Work::wait: stream-ordered with nccl). Collective; nothing happens in a
// group of one.
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root);

// The elementwise `op` of every rank's `values` (the same count on every
// rank): one all-reduce of an i64 tensor on the group's device, read back by
// the host. For the small agreements between ranks (counts, steps, flags).
// Collective; blocks until the result is on the host.
std::vector<int64_t> all_reduce_values(ProcessGroup& group, const std::vector<int64_t>& values, ReduceOp op);

// For the backends (gloo, nccl).
namespace detail {
// "f32[2, 3]", or "3 tensors: f32[2], f32[3], i64[1]" (at most four listed).
std::string summarize(const std::vector<Tensor>& tensors);
// A contiguous view of `shape` into flat `buffer`, starting `offset` elements
// after the buffer's own offset.
Tensor view_into(const Tensor& buffer, const Shape& shape, int64_t offset);
// The tensors of a coalesced collective grouped by dtype, the groups in the
// order their dtypes first appear and the tensors in their given order (what
// every backend reduces as one stream per dtype).
std::vector<std::vector<Tensor>> by_dtype(const std::vector<Tensor>& tensors);

// The argument checks every backend makes before it queues a collective:
// each tensor goes through the backend's `check` (device and dtype rules,
// naming the collective and the tensor's role: "the input", "output 2"),
// then the sizes, dtypes, root and reduce op the collective needs for a group
// of `size` ranks. Each throws loom::Error naming what is wrong.
using TensorCheck = std::function<void(const char* collective, const Tensor& tensor, const std::string& role)>;
// The TensorCheck of the CPU backends: a defined CPU tensor; `backend`
// ("gloo", "shm") names the backend in the error.
void check_cpu_tensor(const char* backend, const char* collective, const Tensor& tensor, const std::string& role);
void check_all_reduce(const std::vector<Tensor>& tensors, ReduceOp op, const TensorCheck& check);
void check_broadcast(const Tensor& tensor, int root, int size, const TensorCheck& check);
void check_all_gather_into(const Tensor& output, const Tensor& input, int size, const TensorCheck& check);
void check_all_gather(const std::vector<Tensor>& outputs, const Tensor& input, int size, const TensorCheck& check);
void check_reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op, int size,
                               const TensorCheck& check);
void check_reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op, int size,
                          const TensorCheck& check);
}  // namespace detail

}  // namespace loom::dist
