// Work bookkeeping, and init_process_group: launch environment -> rendezvous
// store -> backend process group, kept as the default group.
#include <loom/dist/process_group.h>

#include <algorithm>
#include <cstdlib>

#include <loom/core/error.h>
#include <loom/core/log.h>
#include <loom/core/profiler.h>
#include <loom/dist/debug_process_group.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group_gloo.h>
#include <loom/dist/process_group_nccl.h>
#include <loom/dist/process_group_shm.h>

namespace loom::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "unknown";
}

// ---- Work ----

Work::Work(std::string description) : description_(std::move(description)), enqueue_time_(Clock::now()) {}

void Work::wait() {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [&] { return completed_; });
  if (error_) std::rethrow_exception(error_);
}

void Work::synchronize() { Work::wait(); }

bool Work::wait_for(Milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return finished_.wait_for(lock, timeout, [&] { return completed_; });
}

bool Work::completed() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

bool Work::succeeded() const {
  std::lock_guard lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

std::string Work::error_message() const {
  std::exception_ptr error = this->error();
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

Work::Clock::time_point Work::start_time() const {
  std::lock_guard lock(mutex_);
  return start_time_;
}

Work::Clock::time_point Work::end_time() const {
  std::lock_guard lock(mutex_);
  return end_time_;
}

void Work::mark_started() {
  std::lock_guard lock(mutex_);
  start_time_ = Clock::now();
}

int Work::thread_id() const {
  std::lock_guard lock(mutex_);
  return thread_id_;
}

void Work::finish(std::exception_ptr error) {
  Clock::time_point start, end;
  int thread = 0;
  {
    std::lock_guard lock(mutex_);
    if (start_time_ == Clock::time_point{}) start_time_ = Clock::now();
    end_time_ = Clock::now();
    thread_id_ = profiler::current_thread_id();
    error_ = std::move(error);
    completed_ = true;
    start = start_time_;
    end = end_time_;
    thread = thread_id_;
  }
  finished_.notify_all();
  // The collective on the thread that ran it (a Chrome trace's "collective" events).
  profiler::record_complete(description_, "collective", start, end, thread);
}

// ---- ProcessGroup ----

ProcessGroup::ProcessGroup(int rank, int size) : rank_(rank), size_(size) {
  LOOM_CHECK(size >= 1, "ProcessGroup: world size ", size, " must be at least 1");
  LOOM_CHECK(rank >= 0 && rank < size, "ProcessGroup: rank ", rank, " must be in [0, ", size, ")");
}

// ---- init_process_group ----

namespace {

std::mutex default_group_mutex;
std::shared_ptr<ProcessGroup> default_group;

// Splits "host:port" or "[v6]:port" (the part after "tcp://").
std::pair<std::string, int> parse_host_port(const std::string& init_method, const std::string& text) {
  std::string host;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      LOOM_FAIL("init_method '", init_method, "' is not tcp://HOST:PORT");
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) LOOM_FAIL("init_method '", init_method, "' is not tcp://HOST:PORT");
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port < 0 || port > 65535)
    LOOM_FAIL("init_method '", init_method, "': port '", port_text, "' is not a number from 0 to 65535");
  return {host, static_cast<int>(port)};
}

// Why detect_launcher() chose `launcher`, for the rendezvous debug lines.
const char* launcher_evidence(Launcher launcher) {
  switch (launcher) {
    case Launcher::none: return "no RANK / WORLD_SIZE, OMPI_COMM_WORLD_* or srun-task SLURM_PROCID variables";
    case Launcher::torchrun: return "RANK / WORLD_SIZE are set (torchrun, loomrun, or by hand)";
    case Launcher::slurm: return "SLURM_PROCID and SLURM_STEP_ID are set (an srun task)";
    case Launcher::open_mpi: return "OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE are set (mpirun)";
  }
  return "";
}

}  // namespace

Backend parse_backend(const std::string& name) {
  for (Backend backend : {Backend::automatic, Backend::gloo, Backend::shm, Backend::nccl}) {
    if (name == backend_name(backend)) return backend;
  }
  LOOM_FAIL("unknown backend '", name,
            "'; expected \"gloo\" or \"shm\" (CPU tensors), \"auto\" (shm when every rank is on this host, "
            "else gloo) or \"nccl\" (CUDA tensors)");
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::gloo: return "gloo";
    case Backend::shm: return "shm";
    case Backend::nccl: return "nccl";
  }
  return "unknown";
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  if (options.backend() == Backend::nccl) require_nccl();  // fails here, before any rendezvous, with the reason
  // Bad values of the debugging variables fail here, before any rendezvous.
  log_level();
  const DistributedDebugLevel debug_level = distributed_debug_level_from_environment();

  LaunchOverrides overrides;
  if (options.rank() >= 0) overrides.rank = options.rank();
  if (options.world_size() >= 0) overrides.world_size = options.world_size();

  std::shared_ptr<Store> store = options.store();
  std::string master_addr;
  int rank, world_size;
  if (store) {
    LOOM_CHECK(options.rank() >= 0 && options.world_size() >= 1,
               "init_process_group: with an explicit store, give rank and world_size too");
    rank = options.rank();
    world_size = options.world_size();
    LOOM_CHECK(rank < world_size, "init_process_group: rank ", rank, " must be smaller than world_size ", world_size);
    if (world_size > 1) set_log_rank(rank);
    log_debug("rendezvous: rank ", rank, " of ", world_size, " from the caller, in the store it gave");
  } else if (options.init_method() == "env://" || options.init_method().rfind("tcp://", 0) == 0) {
    if (options.init_method() != "env://") {
      auto [host, port] = parse_host_port(options.init_method(), options.init_method().substr(6));
      overrides.master_addr = host;
      overrides.master_port = port;
    }
    LaunchEnvironment environment = resolve_launch_environment(overrides);
    rank = environment.rank;
    world_size = environment.world_size;
    master_addr = environment.master_addr;
    if (world_size > 1) set_log_rank(rank);
    log_debug("rendezvous: launcher ", launcher_name(environment.launcher), " detected: ",
              launcher_evidence(environment.launcher), "; rank ", rank, " of ", world_size, ", local rank ",
              environment.local_rank, " of ", environment.local_world_size, ", node ", environment.node_rank);
    log_debug("rendezvous: init_method ", options.init_method(), ": the store is at ",
              host_port(environment.master_addr, environment.master_port));
    store = connect_rendezvous_store(environment, options.timeout());
  } else if (options.init_method().rfind("file://", 0) == 0) {
    std::string path = options.init_method().substr(7);
    LOOM_CHECK(!path.empty() && path.front() == '/', "init_method '", options.init_method(),
               "' must name an absolute path: file:///shared/dir/rendezvous");
    LaunchEnvironment environment = resolve_launch_environment(overrides);
    rank = environment.rank;
    world_size = environment.world_size;
    if (world_size > 1) set_log_rank(rank);
    log_debug("rendezvous: launcher ", launcher_name(environment.launcher), " detected: ",
              launcher_evidence(environment.launcher), "; rank ", rank, " of ", world_size);
    log_debug("rendezvous: init_method ", options.init_method(), ": a FileStore at ", path);
    store = std::make_shared<FileStore>(path, options.timeout());
  } else {
    LOOM_FAIL("init_process_group: init_method '", options.init_method(),
              "' is not one of env://, tcp://HOST:PORT, file:///PATH");
  }

  auto group_store = std::make_shared<PrefixStore>(options.group_name(), store);
  std::shared_ptr<ProcessGroup> group;
  auto make_gloo = [&](const std::shared_ptr<Store>& gloo_store) {
    auto gloo = GlooOptions().timeout(options.timeout());
    if (!master_addr.empty()) gloo.hostname(local_address_towards(master_addr));
    return std::make_shared<ProcessGroupGloo>(gloo_store, rank, world_size, gloo);
  };
  if (options.backend() == Backend::gloo) {
    log_debug("rendezvous: backend gloo, as asked; connecting the mesh of ", world_size, " ranks");
    group = make_gloo(group_store);
  } else if (options.backend() == Backend::shm) {
    log_debug("rendezvous: backend shm, as asked; mapping the shared segment of ", world_size, " ranks");
    group = std::make_shared<ProcessGroupShm>(group_store, rank, world_size, ShmOptions().timeout(options.timeout()));
  } else if (options.backend() == Backend::automatic) {
    // Every rank reads the same verdicts, so all of them pick the same backend.
    std::string why_not;
    group = ProcessGroupShm::try_create(group_store, rank, world_size, ShmOptions().timeout(options.timeout()),
                                        &why_not);
    if (group) {
      log_debug("rendezvous: backend auto chose shm: every rank mapped the shared segment (all on this host)");
    } else {
      if (rank == 0) log_info("init_process_group: backend auto uses gloo (", why_not, ")");
      log_debug("rendezvous: backend auto chose gloo: ", why_not, "; connecting the mesh of ", world_size, " ranks");
      group = make_gloo(group_store);
    }
  } else {
    log_debug("rendezvous: backend nccl, as asked");
    group = make_process_group_nccl(group_store, rank, world_size,
                                    NcclOptions().timeout(options.timeout()).device_index(options.device_index()));
  }
  // Every group gets the desync report; DETAIL adds a gloo group of its own
  // (on the CPU, whatever the backend) for the fingerprint exchange.
  std::shared_ptr<ProcessGroup> checker;
  if (debug_level == DistributedDebugLevel::detail)
    checker = make_gloo(std::make_shared<PrefixStore>("debug_checker", group_store));
  const char* backend = group->backend_name();
  group = std::make_shared<DebugProcessGroup>(
      std::move(group), group_store, DebugOptions().level(debug_level).group_name(options.group_name()), checker);
  log_at(debug_level >= DistributedDebugLevel::info ? LogLevel::info : LogLevel::debug, "process group '",
         options.group_name(), "': backend ", backend, ", rank ", rank, " of ", world_size, ", collective timeout ",
         std::chrono::duration<double>(options.timeout()).count(), " s, LOOM_DISTRIBUTED_DEBUG=",
         distributed_debug_level_name(debug_level));
  // The default group is destroyed at exit before the CUDA runtime tears down
  // what an NCCL group uses (its stream, events, communicator), which the
  // static's own destructor would be too late for.
  static std::once_flag release_at_exit;
  std::call_once(release_at_exit, [] { std::atexit([] { destroy_process_group(); }); });
  std::lock_guard lock(default_group_mutex);
  default_group = group;
  return group;
}

Tensor ProcessGroup::new_buffer(int64_t numel, DType dtype, Device device) {
  return Tensor::zeros({numel}, dtype, device);
}

std::optional<std::string> ProcessGroup::capture_refusal() const {
  return str("the ", backend_name(), " process group runs its collectives on the host, which a CUDA graph cannot "
             "capture (the nccl backend's can be)");
}

WorkHandle ProcessGroup::watch_replay(const std::string&) { return nullptr; }

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard lock(default_group_mutex);
  LOOM_CHECK(default_group != nullptr, "no default process group: call loom::dist::init_process_group() first");
  return default_group;
}

bool is_initialized() {
  std::lock_guard lock(default_group_mutex);
  return default_group != nullptr;
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard lock(default_group_mutex);
    group.swap(default_group);
  }
  // `group` is released outside the lock: its destructor may wait for a collective.
}

std::vector<int64_t> all_reduce_values(ProcessGroup& group, const std::vector<int64_t>& values, ReduceOp op) {
  Tensor reduced = Tensor::from_vector<int64_t>(values, {static_cast<int64_t>(values.size())}).to(group.device());
  group.all_reduce(reduced, op)->wait();
  return reduced.to(Device::cpu()).to_vector<int64_t>();
}

void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root) {
  if (group.size() == 1 || tensors.empty()) return;
  std::vector<std::pair<DType, Device>> kinds;
  for (const Tensor& t : tensors) {
    const std::pair<DType, Device> kind{t.dtype(), t.device()};
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  for (auto [dtype, device] : kinds) {
    std::vector<Tensor> members;
    int64_t total = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype || t.device() != device) continue;
      members.push_back(t);
      total += t.numel();
    }
    Tensor flat = Tensor::empty({total}, dtype, device);
    int64_t offset = 0;
    if (group.rank() == root) {
      for (const Tensor& t : members) {
        detail::view_into(flat, t.sizes(), offset).copy_(t);
        offset += t.numel();
      }
    }
    group.broadcast(flat, root)->wait();
    if (group.rank() == root) continue;
    offset = 0;
    for (Tensor t : members) {
      t.copy_(detail::view_into(flat, t.sizes(), offset));
      offset += t.numel();
    }
  }
}

namespace detail {

std::string summarize(const std::vector<Tensor>& tensors) {
  auto one = [](const Tensor& t) { return str(dtype_name(t.dtype()), shape_str(t.sizes())); };
  if (tensors.size() == 1) return one(tensors[0]);
  std::string text = str(tensors.size(), " tensors: ");
  for (size_t i = 0; i < tensors.size() && i < 4; ++i) text += (i ? ", " : "") + one(tensors[i]);
  if (tensors.size() > 4) text += ", ...";
  return text;
}

Tensor view_into(const Tensor& buffer, const Shape& shape, int64_t offset) {
  return make_view(buffer, shape, contiguous_strides(shape), buffer.offset() + offset);
}

std::vector<std::vector<Tensor>> by_dtype(const std::vector<Tensor>& tensors) {
  std::vector<std::vector<Tensor>> groups;
  for (const Tensor& t : tensors) {
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g[0].dtype() == t.dtype(); });
    if (group == groups.end()) {
      groups.push_back({t});
    } else {
      group->push_back(t);
    }
  }
  return groups;
}

void check_all_reduce(const std::vector<Tensor>& tensors, ReduceOp op, const TensorCheck& check) {
  LOOM_CHECK(!tensors.empty(), "all_reduce: no tensors given");
  for (size_t i = 0; i < tensors.size(); ++i) {
    check("all_reduce", tensors[i], str("tensor ", i));
    LOOM_CHECK(op != ReduceOp::avg || is_floating(tensors[i].dtype()), "all_reduce: avg needs floating-point tensors; tensor ",
               i, " is ", tensors[i].str(), " (reduce with sum and divide instead)");
  }
}

void check_cpu_tensor(const char* backend, const char* collective, const Tensor& tensor, const std::string& role) {
  LOOM_CHECK(tensor.defined(), collective, ": ", role, " is an undefined tensor");
  LOOM_CHECK(tensor.device().is_cpu(), collective, ": ", role, " is ", tensor.str(), "; the ", backend,
             " backend works on CPU tensors (use the nccl backend for CUDA tensors)");
}

void check_broadcast(const Tensor& tensor, int root, int size, const TensorCheck& check) {
  check("broadcast", tensor, "the tensor");
  LOOM_CHECK(root >= 0 && root < size, "broadcast: root ", root, " is not a rank of this group of ", size);
}

void check_all_gather_into(const Tensor& output, const Tensor& input, int size, const TensorCheck& check) {
  check("all_gather", input, "the input");
  check("all_gather", output, "the output");
  LOOM_CHECK(output.dtype() == input.dtype(), "all_gather: output is ", output.str(), " but input is ", input.str(),
             "; the dtypes must match");
  LOOM_CHECK(output.numel() == input.numel() * size, "all_gather: output ", output.str(), " must hold ", size, " x ",
             input.numel(), " = ", input.numel() * size, " elements (one input per rank)");
}

void check_all_gather(const std::vector<Tensor>& outputs, const Tensor& input, int size, const TensorCheck& check) {
  check("all_gather", input, "the input");
  LOOM_CHECK(static_cast<int>(outputs.size()) == size, "all_gather: got ", outputs.size(),
             " outputs; expected one per rank (", size, ")");
  for (size_t r = 0; r < outputs.size(); ++r) {
    check("all_gather", outputs[r], str("output ", r));
    LOOM_CHECK(outputs[r].dtype() == input.dtype() && outputs[r].numel() == input.numel(), "all_gather: output ", r,
               " is ", outputs[r].str(), "; expected the input's dtype and size, ", input.str());
  }
}

void check_reduce_scatter_from(const Tensor& output, const Tensor& input, ReduceOp op, int size,
                               const TensorCheck& check) {
  check("reduce_scatter", input, "the input");
  check("reduce_scatter", output, "the output");
  LOOM_CHECK(output.dtype() == input.dtype(), "reduce_scatter: output is ", output.str(), " but input is ",
             input.str(), "; the dtypes must match");
  LOOM_CHECK(input.numel() == output.numel() * size, "reduce_scatter: input ", input.str(), " must hold ", size, " x ",
             output.numel(), " = ", output.numel() * size, " elements (one output per rank)");
  LOOM_CHECK(op != ReduceOp::avg || is_floating(input.dtype()), "reduce_scatter: avg needs floating-point tensors; got ",
             input.str());
}

void check_reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op, int size,
                          const TensorCheck& check) {
  check("reduce_scatter", output, "the output");
  LOOM_CHECK(static_cast<int>(inputs.size()) == size, "reduce_scatter: got ", inputs.size(),
             " inputs; expected one per rank (", size, ")");
  for (size_t r = 0; r < inputs.size(); ++r) {
    check("reduce_scatter", inputs[r], str("input ", r));
    LOOM_CHECK(inputs[r].dtype() == output.dtype() && inputs[r].numel() == output.numel(), "reduce_scatter: input ",
               r, " is ", inputs[r].str(), "; expected the output's dtype and size, ", output.str());
  }
  LOOM_CHECK(op != ReduceOp::avg || is_floating(output.dtype()), "reduce_scatter: avg needs floating-point tensors; got ",
             output.str());
}

}  // namespace detail

}  // namespace loom::dist
