// DistributedDataParallel: parameter verification and broadcast, gradient
// buckets whose flat buffers back every parameter's .grad, per-parameter
// ready hooks that launch bucket reductions (through a communication hook) in
// order, the end-of-backward callback that waits for them, and the join hook
// that shadows all of it on a rank whose data ran out (dist/join.h).
#include <loom/dist/ddp.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_set>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/memory_format.h>
#include <loom/core/profiler.h>

namespace loom::dist {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<Tensor>& parameters,
                                                size_t first_bucket_bytes_cap, size_t bucket_bytes_cap) {
  LOOM_CHECK(first_bucket_bytes_cap > 0 && bucket_bytes_cap > 0, "assign_buckets: bucket caps must be positive");
  struct OpenBucket {
    std::vector<size_t> members;
    size_t bytes = 0;
    bool first = true;  // the group's first bucket uses first_bucket_bytes_cap
  };
  // One open bucket per (dtype, device); closed buckets in the order they closed.
  std::map<std::tuple<int, int, int>, OpenBucket> open;
  std::vector<std::vector<size_t>> closed;
  for (size_t k = parameters.size(); k-- > 0;) {
    const Tensor& parameter = parameters[k];
    auto key = std::make_tuple(static_cast<int>(parameter.dtype()), static_cast<int>(parameter.device().kind),
                               parameter.device().index);
    OpenBucket& bucket = open[key];
    size_t cap = bucket.first ? first_bucket_bytes_cap : bucket_bytes_cap;
    if (!bucket.members.empty() && bucket.bytes + parameter.nbytes() > cap) {
      closed.push_back(std::move(bucket.members));
      bucket.members.clear();
      bucket.bytes = 0;
      bucket.first = false;
    }
    bucket.members.push_back(k);
    bucket.bytes += parameter.nbytes();
  }
  for (auto& [key, bucket] : open)
    if (!bucket.members.empty()) closed.push_back(std::move(bucket.members));
  // Members are in reverse registration order, so a bucket's first member is
  // its highest index: order buckets by it, highest first.
  std::sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.front() > b.front(); });
  return closed;
}

CommunicationHook allreduce_hook() {
  return [](ProcessGroup& group, const Tensor& bucket) -> BucketReduction {
    if (group.size() == 1) return {};
    // The average of the ranks' gradients. Each backend divides where it is
    // cheapest and safe: gloo scales the inputs first (as PyTorch's DDP
    // pre-divides), shm divides the float accumulator, nccl uses ncclAvg; so
    // no extra pass over the bucket.
    return {group.all_reduce(bucket, ReduceOp::avg), nullptr, bucket.nbytes()};
  };
}

CommunicationHook compress_hook(DType wire_dtype) {
  LOOM_CHECK(wire_dtype == DType::f16 || wire_dtype == DType::bf16, "compress_hook: the wire dtype must be f16 or bf16, got ",
             dtype_name(wire_dtype));
  return [wire_dtype](ProcessGroup& group, const Tensor& bucket) -> BucketReduction {
    if (group.size() == 1) return {};
    Tensor(bucket).mul_(1.0 / group.size());
    Tensor compressed = bucket.to(wire_dtype);
    WorkHandle work = group.all_reduce(compressed, ReduceOp::sum);
    return {work, [bucket, compressed] { Tensor(bucket).copy_(compressed); }, compressed.nbytes()};
  };
}

namespace {

uint64_t fnv1a(uint64_t hash, const void* data, size_t size) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

// Hash of one tensor's name, dtype and shape; equal on every rank for the same model.
int64_t signature(const std::string& name, const Tensor& tensor) {
  uint64_t hash = 14695981039346656037ull;
  hash = fnv1a(hash, name.data(), name.size());
  uint8_t dtype = static_cast<uint8_t>(tensor.dtype());
  hash = fnv1a(hash, &dtype, 1);
  for (int64_t size : tensor.sizes()) hash = fnv1a(hash, &size, sizeof(size));
  return static_cast<int64_t>(hash);
}

std::string quoted_list(const std::vector<std::string>& names, size_t limit = 8) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < limit; ++i) text += str(i ? ", '" : "'", names[i], "'");
  if (names.size() > limit) text += str(" and ", names.size() - limit, " more");
  return text;
}

}  // namespace

// The reducer: bucket state shared between the module, its gradient hooks and
// end-of-backward callbacks (which hold it weakly). All members are guarded by
// `mutex`.
struct DistributedDataParallel::Reducer {
  struct Parameter {
    std::string name;
    Tensor tensor;     // the module's parameter (same TensorImpl)
    Tensor grad_view;  // its slice of the bucket buffer, shaped like the parameter
    // The parameter's AccumulateGrad, whose gradient buffer is grad_view:
    // backward computes the gradient there (held, or its buffer would go).
    std::shared_ptr<AccumulateGrad> accumulator;
    size_t bucket = 0;
  };
  struct Bucket {
    std::vector<size_t> parameters;  // indices into Reducer::parameters
    Tensor buffer;                   // flat, one dtype and device
    size_t pending = 0;              // parameters not yet ready in this backward
    BucketReduction reduction;       // what the communication hook launched
    BucketTiming timing;
  };
  // collecting: a synchronized forward ran, gradients are arriving.
  // reduced: this backward's gradients were averaged; a second ready is an error.
  // idle: no reduction expected (no_sync, no grad mode, or before any forward).
  enum class Round { idle, collecting, reduced };

  std::shared_ptr<ProcessGroup> group;
  CommunicationHook hook = allreduce_hook();
  std::weak_ptr<Reducer> self;  // for the end-of-backward callback
  bool find_unused_parameters = false;
  std::vector<Parameter> parameters;
  std::vector<Bucket> buckets;
  std::vector<bool> ready;
  size_t ready_count = 0;
  size_t gradients_arrived = 0;  // hooks that fired in this round
  size_t next_bucket_to_launch = 0;
  bool end_of_backward_queued = false;  // in this round
  // What the reduced buckets are multiplied by in this round: 1, or under a
  // Join with divide_by_initial_world_size(false) world / contributing ranks
  // (the hook averaged over the world; this makes it the contributors' mean).
  double gradient_scale = 1.0;
  // A backward ran outside a synchronized round (no_sync) since the last
  // reduction: the buckets hold gradients no all-reduce has seen yet.
  bool unreduced_accumulation = false;
  IterationTiming timing;               // buckets are kept in Bucket::timing
  Round round = Round::idle;
  std::mutex mutex;

  // Makes the parameter's .grad its bucket view again when someone replaced or
  // dropped it (zero_grad(set_to_none), set_grad), keeping the values.
  void keep_grad_in_bucket(Parameter& parameter) {
    const Tensor& grad = parameter.tensor.grad();
    if (grad.defined() && grad.raw_data() == parameter.grad_view.raw_data() &&
        grad.strides() == parameter.grad_view.strides())
      return;
    if (grad.defined()) {
      parameter.grad_view.copy_(grad);
    } else {
      parameter.grad_view.zero_();
    }
    parameter.tensor.set_grad(parameter.grad_view);
  }

  // Called by a parameter's hook after its gradient was accumulated.
  void on_gradient_ready(size_t index) {
    std::lock_guard lock(mutex);
    Parameter& parameter = parameters[index];
    keep_grad_in_bucket(parameter);
    if (round == Round::idle) {
      unreduced_accumulation = true;
      return;
    }
    if (round == Round::reduced || ready[index]) {
      LOOM_FAIL("DistributedDataParallel: parameter '", parameter.name,
                "' was marked ready twice in one iteration: its gradient arrived again after it had been reduced. "
                "This happens when backward runs twice after one forward (retain_graph) or a parameter is shared "
                "between modules in a way autograd sees twice; run forward again before each backward, or use "
                "no_sync() for the extra backward passes");
    }
    ++gradients_arrived;
    if (!end_of_backward_queued) {
      // The first gradient of this backward: finish the round once autograd
      // has run every node, so .grad holds the average when backward() returns.
      end_of_backward_queued = true;
      timing.first_gradient = std::chrono::steady_clock::now();
      queue_end_of_backward_callback([weak = self] {
        if (auto live = weak.lock()) live->on_backward_end();
      });
    }
    mark_ready(index);
  }

  // The end-of-backward callback: waits for every bucket (or throws why not).
  void on_backward_end() {
    std::lock_guard lock(mutex);
    timing.backward_end = std::chrono::steady_clock::now();
    if (round == Round::collecting) finish();
  }

  void mark_ready(size_t index) {
    ready[index] = true;
    ++ready_count;
    Bucket& bucket = buckets[parameters[index].bucket];
    if (--bucket.pending == 0) {
      bucket.timing.ready = std::chrono::steady_clock::now();
      if (profiler::tracing())
        profiler::record_instant(str("bucket ", bucket.timing.bucket, " ready"), "ddp", bucket.timing.ready,
                                 profiler::current_thread_id(), str("\"bytes\": ", bucket.timing.bytes));
      launch_ready_buckets();
    }
  }

  // Launches buckets strictly in order, so every rank issues the same sequence.
  void launch_ready_buckets() {
    while (next_bucket_to_launch < buckets.size() && buckets[next_bucket_to_launch].pending == 0) {
      Bucket& bucket = buckets[next_bucket_to_launch++];
      bucket.timing.launched = std::chrono::steady_clock::now();
      bucket.reduction = hook(*group, bucket.buffer);
      bucket.timing.wire_bytes = bucket.reduction.wire_bytes;
      if (profiler::tracing())
        profiler::record_instant(str("bucket ", bucket.timing.bucket, " launched"), "ddp", bucket.timing.launched,
                                 profiler::current_thread_id());
    }
  }

  // Starts a round at forward. `output` is the forward's result, searched for
  // unused parameters when asked to; `scale` multiplies the reduced buckets.
  void prepare(bool synchronize, const Tensor& output, double scale) {
    std::lock_guard lock(mutex);
    if (round == Round::collecting) {
      // A forward without backward (evaluation in grad mode) is fine; a
      // backward that stopped before its end-of-backward callback (an error
      // inside backward) left gradients unreduced. Either way, finish what
      // was launched.
      std::vector<std::string> missing = unready_names();
      bool backward_ran = gradients_arrived > 0;
      wait_launched();
      round = Round::idle;
      if (backward_ran)
        LOOM_FAIL("DistributedDataParallel: the previous backward stopped before it finished (no gradient for ",
                  quoted_list(missing), "), so its gradients were not averaged; if some parameters are unused in "
                  "forward, pass DistributedDataParallelOptions().find_unused_parameters(true)");
    }
    round = synchronize ? Round::collecting : Round::idle;
    gradient_scale = scale;
    std::fill(ready.begin(), ready.end(), false);
    ready_count = 0;
    gradients_arrived = 0;
    next_bucket_to_launch = 0;
    end_of_backward_queued = false;
    timing = {};
    timing.forward_end = std::chrono::steady_clock::now();
    for (auto& bucket : buckets) {
      bucket.pending = bucket.parameters.size();
      bucket.reduction = {};
      bucket.timing.ready = bucket.timing.launched = bucket.timing.started = bucket.timing.done = {};
      bucket.timing.wire_bytes = 0;
    }
    if (round != Round::collecting || !find_unused_parameters) return;
    // Parameters whose AccumulateGrad node the output cannot reach get no gradient.
    std::unordered_set<const Node*> reached;  // among them the used parameters' AccumulateGrad nodes
    if (output.defined() && output.requires_grad()) {
      std::vector<Node*> stack;
      Edge root = gradient_edge(output);
      if (root.valid()) stack.push_back(root.node.get());
      while (!stack.empty()) {
        Node* node = stack.back();
        stack.pop_back();
        if (!reached.insert(node).second) continue;
        for (const Edge& edge : node->next_edges)
          if (edge.valid()) stack.push_back(edge.node.get());
      }
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (reached.contains(parameters[i].accumulator.get())) continue;
      keep_grad_in_bucket(parameters[i]);
      parameters[i].grad_view.zero_();  // this rank contributes nothing for an unused parameter
      mark_ready(i);
    }
  }

  std::vector<std::string> unready_names() const {
    std::vector<std::string> names;
    for (size_t i = 0; i < parameters.size(); ++i)
      if (!ready[i]) names.push_back(parameters[i].name);
    return names;
  }

  void wait_launched() noexcept {
    for (size_t b = 0; b < next_bucket_to_launch; ++b) {
      if (buckets[b].reduction.work) static_cast<void>(buckets[b].reduction.work->wait_for(group->timeout()));
    }
  }

  // The bucket's collective and its end on the thread that ran it (this one
  // without a collective); nccl's buckets are not done on the host yet.
  static void trace_bucket_reduced(const BucketTiming& timing, const WorkHandle& work) {
    if (timing.done == std::chrono::steady_clock::time_point{}) return;
    const int thread = work && work->thread_id() != 0 ? work->thread_id() : profiler::current_thread_id();
    if (work && timing.started != std::chrono::steady_clock::time_point{})
      profiler::record_complete(str("bucket ", timing.bucket, " reduce"), "ddp", timing.started, timing.done, thread,
                                str("\"bytes\": ", timing.bytes, ", \"wire_bytes\": ", timing.wire_bytes,
                                    ", \"parameters\": ", timing.parameters));
    profiler::record_instant(str("bucket ", timing.bucket, " done"), "ddp", timing.done, thread);
  }

  // Completes the round: every parameter ready (or an error naming those
  // that are not), every bucket reduced.
  void finish() {
    if (ready_count < parameters.size()) {
      if (!find_unused_parameters) {
        std::vector<std::string> missing = unready_names();
        wait_launched();
        round = Round::idle;
        LOOM_FAIL("DistributedDataParallel: parameters ", quoted_list(missing),
                  " received no gradient in this backward pass. Construct DistributedDataParallel with "
                  "DistributedDataParallelOptions().find_unused_parameters(true) when forward does not use every "
                  "parameter");
      }
      // Reachable from the output but given no gradient by autograd: treat as unused.
      for (size_t i = 0; i < parameters.size(); ++i) {
        if (ready[i]) continue;
        keep_grad_in_bucket(parameters[i]);
        parameters[i].grad_view.zero_();
        mark_ready(i);
      }
    }
    round = Round::reduced;
    for (auto& bucket : buckets) {
      BucketReduction& reduction = bucket.reduction;
      if (reduction.work) {
        reduction.work->wait();
        bucket.timing.started = reduction.work->start_time();
        bucket.timing.done = reduction.work->end_time();
      }
      if (reduction.finish) reduction.finish();
      if (gradient_scale != 1.0) Tensor(bucket.buffer).mul_(gradient_scale);
      if (!reduction.work) bucket.timing.done = std::chrono::steady_clock::now();
      if (profiler::tracing()) trace_bucket_reduced(bucket.timing, reduction.work);
    }
    unreduced_accumulation = false;
    timing.reduced = std::chrono::steady_clock::now();
  }

  // A joined rank's part in a synchronized iteration of the running ranks:
  // every bucket through the hook, in bucket order as their backward launches
  // them, holding zeros, or the gradients of a no_sync accumulation this
  // rank's data ended in (contributed once). Afterwards .grad holds the same
  // average as on the running ranks.
  void shadow_reduce(double scale) {
    std::lock_guard lock(mutex);
    if (round == Round::collecting) wait_launched();  // a forward whose backward never ran
    round = Round::idle;
    for (Parameter& parameter : parameters) keep_grad_in_bucket(parameter);
    for (Bucket& bucket : buckets) {
      if (!unreduced_accumulation) bucket.buffer.zero_();
      bucket.reduction = hook(*group, bucket.buffer);
    }
    next_bucket_to_launch = buckets.size();  // the destructor waits for them, should a wait below throw
    for (Bucket& bucket : buckets) {
      if (bucket.reduction.work) bucket.reduction.work->wait();
      if (bucket.reduction.finish) bucket.reduction.finish();
      if (scale != 1.0) Tensor(bucket.buffer).mul_(scale);
    }
    unreduced_accumulation = false;
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DistributedDataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  LOOM_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null");
  LOOM_CHECK(group_ != nullptr, "DistributedDataParallel: the process group is null");
  register_module("module", module_);
  NoGradGuard no_grad;

  if (group_->size() > 1) {
    // Every parameter and buffer goes through the group's collectives.
    const Device device = group_->device();
    auto check_device = [&](const std::string& what, const Tensor& tensor) {
      if (tensor.device() == device) return;
      const bool gloo = device.is_cpu();
      LOOM_FAIL("DistributedDataParallel: ", what, " is ", tensor.str(), " but the ", group_->backend_name(),
                " process group of this rank works on ", device.str(),
                gloo ? " tensors; use the nccl backend for CUDA parameters"
                     : str(" tensors; move the module there (module->to(", device.str(), ")) before wrapping it"));
    };
    for (auto& [name, tensor] : module_->named_parameters()) check_device(str("parameter '", name, "'"), tensor);
    for (auto& [name, tensor] : module_->named_buffers()) check_device(str("buffer '", name, "'"), tensor);
  }
  check_same_parameters_on_every_rank();
  std::vector<Tensor> state;
  for (auto& [name, tensor] : module_->named_parameters()) state.push_back(tensor);
  for (auto& [name, tensor] : module_->named_buffers()) state.push_back(tensor);
  broadcast_coalesced(*group_, state, 0);

  reducer_ = std::make_shared<Reducer>();
  Reducer& reducer = *reducer_;
  reducer.group = group_;
  reducer.self = reducer_;
  reducer.find_unused_parameters = options_.find_unused_parameters();
  std::vector<Tensor> trainable;
  for (auto& [name, tensor] : module_->named_parameters()) {
    if (!tensor.requires_grad()) continue;
    reducer.parameters.push_back({name, tensor, Tensor(), grad_accumulator(tensor), 0});
    trainable.push_back(tensor);
  }
  LOOM_CHECK(!trainable.empty(), "DistributedDataParallel: the module has no parameter that requires grad");

  for (auto& members : assign_buckets(trainable, options_.first_bucket_bytes_cap(), options_.bucket_bytes_cap())) {
    Reducer::Bucket bucket;
    const Tensor& first = trainable[members.front()];
    int64_t numel = 0;
    for (size_t index : members) numel += trainable[index].numel();
    // In memory the group reduces fastest in (shm: mapped by every rank).
    bucket.buffer = group_->new_buffer(numel, first.dtype(), first.device());
    bucket.timing.bucket = reducer.buckets.size();
    bucket.timing.bytes = bucket.buffer.nbytes();
    bucket.timing.parameters = members.size();
    int64_t offset = 0;
    for (size_t index : members) {
      Reducer::Parameter& parameter = reducer.parameters[index];
      parameter.bucket = reducer.buckets.size();
      // Laid out as the parameter is (a channels-last weight's view is
      // channels-last), so that its gradient is computed straight into it.
      const Shape& sizes = parameter.tensor.sizes();
      parameter.grad_view = make_view(bucket.buffer, sizes,
                                      strides_for_format(sizes, memory_format_of(parameter.tensor)), offset);
      if (parameter.tensor.grad().defined()) parameter.grad_view.copy_(parameter.tensor.grad());
      parameter.tensor.set_grad(parameter.grad_view);
      // Backward computes a fresh gradient (zero_grad(set_to_none) leaves .grad
      // undefined every step) straight into the bucket, on every backend.
      parameter.accumulator->set_gradient_buffer(parameter.grad_view);
      offset += parameter.tensor.numel();
    }
    bucket.parameters = std::move(members);
    bucket.pending = bucket.parameters.size();
    reducer.buckets.push_back(std::move(bucket));
  }
  reducer.ready.assign(reducer.parameters.size(), false);

  std::weak_ptr<Reducer> weak = reducer_;
  for (size_t i = 0; i < reducer.parameters.size(); ++i) {
    reducer.parameters[i].tensor.register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (auto live = weak.lock()) live->on_gradient_ready(i);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  // Launched all-reduces write into the bucket buffers: let them finish first.
  if (reducer_) {
    std::lock_guard lock(reducer_->mutex);
    reducer_->wait_launched();
    // The buckets stop being where gradients go (unless someone else set a buffer since).
    for (Reducer::Parameter& parameter : reducer_->parameters) {
      if (parameter.accumulator->gradient_buffer().is_same(parameter.grad_view))
        parameter.accumulator->set_gradient_buffer(Tensor());
    }
  }
}

void DistributedDataParallel::check_same_parameters_on_every_rank() {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& entry : module_->named_parameters()) tensors.push_back(entry);
  for (auto& [name, tensor] : module_->named_buffers()) tensors.emplace_back("buffer " + name, tensor);
  int world = group_->size();
  if (world == 1) return;

  // The exchange runs on the group's device (CUDA for nccl); the host reads the results.
  const Device device = group_->device();
  Tensor count = Tensor::full({1}, static_cast<double>(tensors.size()), DType::i64, device);
  Tensor counts = Tensor::zeros({world}, DType::i64, device);
  group_->all_gather_into(counts, count)->wait();
  std::vector<int64_t> all_counts = counts.to(Device::cpu()).to_vector<int64_t>();
  for (int r = 0; r < world; ++r) {
    LOOM_CHECK(all_counts[r] == all_counts[0], "DistributedDataParallel: rank ", r, " has ", all_counts[r],
               " parameters and buffers but rank 0 has ", all_counts[0],
               "; every rank must build the same model before wrapping it");
  }
  Tensor mine = Tensor::zeros({static_cast<int64_t>(tensors.size())}, DType::i64);
  int64_t* hashes = mine.data<int64_t>();
  for (size_t i = 0; i < tensors.size(); ++i) hashes[i] = signature(tensors[i].first, tensors[i].second);
  Tensor everyone = Tensor::zeros({world * static_cast<int64_t>(tensors.size())}, DType::i64, device);
  group_->all_gather_into(everyone, mine.to(device))->wait();
  std::vector<int64_t> all = everyone.to(Device::cpu()).to_vector<int64_t>();
  for (int r = 1; r < world; ++r) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (all[r * tensors.size() + i] == all[i]) continue;
      std::string here = str("'", tensors[i].first, "' ", tensors[i].second.str());
      LOOM_FAIL("DistributedDataParallel: parameter ", i, " differs between rank 0 and rank ", r,
                " (name, shape or dtype; here on rank ", group_->rank(), " it is ", here,
                "). Every rank must build the same model before wrapping it");
    }
  }
}

std::vector<Tensor> DistributedDataParallel::buffers() const {
  std::vector<Tensor> tensors;
  for (auto& [name, tensor] : module_->named_buffers()) tensors.push_back(tensor);
  return tensors;
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  const bool synchronize = synchronize_gradients_ && grad_mode_enabled();
  // Inside a Join: this rank announces itself; buffers come from the lowest
  // running rank (rank 0 may have joined with stale ones), and without
  // divide_by_initial_world_size the average is over the contributors.
  const std::optional<JoinIteration> iteration = notify_join_context(synchronize);
  double gradient_scale = 1.0;
  if (iteration && synchronize && !join_options()->divide_by_initial_world_size())
    gradient_scale = static_cast<double>(group_->size()) / iteration->contributing_ranks;
  if (options_.broadcast_buffers() && group_->size() > 1) {
    NoGradGuard no_grad;
    broadcast_coalesced(*group_, buffers(), iteration ? iteration->first_active_rank : 0);
  }
  Tensor output = module_->forward(input);
  reducer_->prepare(synchronize, output, gradient_scale);
  return output;
}

// DDP's join hook (PyTorch's _DDPJoinHook): per shadowed iteration the
// buffer broadcast, then, if the running ranks all-reduce in it, every
// bucket; at the end the authoritative rank's model (PyTorch's _sync_final_model).
class DistributedDataParallel::JoinHookImpl final : public JoinHook {
 public:
  JoinHookImpl(DistributedDataParallel& ddp, const JoinOptions& options) : ddp_(ddp), options_(options) {}

  void main_hook(const JoinIteration& iteration) override {
    const int world = ddp_.group_->size();
    if (ddp_.options_.broadcast_buffers() && world > 1) {
      NoGradGuard no_grad;
      broadcast_coalesced(*ddp_.group_, ddp_.buffers(), iteration.first_active_rank);
    }
    if (!iteration.synchronize) return;
    const double scale = options_.divide_by_initial_world_size()
                             ? 1.0
                             : static_cast<double>(world) / iteration.contributing_ranks;
    ddp_.reducer_->shadow_reduce(scale);
  }

  void post_hook(int authoritative_rank) override {
    NoGradGuard no_grad;
    std::vector<Tensor> state;
    for (auto& [name, tensor] : ddp_.module_->named_parameters()) state.push_back(tensor);
    if (ddp_.options_.broadcast_buffers()) {
      for (const Tensor& buffer : ddp_.buffers()) state.push_back(buffer);
    }
    broadcast_coalesced(*ddp_.group_, state, authoritative_rank);
    std::lock_guard lock(ddp_.reducer_->mutex);
    ddp_.reducer_->unreduced_accumulation = false;  // no iteration is left to reduce it: dropped, as without Join
  }

  bool holds_contribution() const override {
    std::lock_guard lock(ddp_.reducer_->mutex);
    return ddp_.reducer_->unreduced_accumulation;
  }

 private:
  DistributedDataParallel& ddp_;
  JoinOptions options_;
};

std::unique_ptr<JoinHook> DistributedDataParallel::join_hook(const JoinOptions& options) {
  for (auto& [name, module] : module_->named_modules()) {
    LOOM_CHECK(!module->runs_collectives_in_forward(), "Join: the model has a ", module->type_name(), " ('", name,
               "'), whose forward runs collectives (SyncBatchNorm: its batch statistics) that a rank whose data ran "
               "out cannot shadow ",
               "(PyTorch's Join does not support it either); train without SyncBatchNorm, or with even inputs ",
               "(DistributedSampler's padding) instead of Join");
  }
  return std::make_unique<JoinHookImpl>(*this, options);
}

void DistributedDataParallel::wait_for_gradients() {
  std::lock_guard lock(reducer_->mutex);
  if (reducer_->round == Reducer::Round::collecting) reducer_->finish();
}

DistributedDataParallel::NoSyncGuard DistributedDataParallel::no_sync() {
  bool previous = synchronize_gradients_;
  synchronize_gradients_ = false;
  return NoSyncGuard(this, previous);
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel* owner, bool previous)
    : owner_(owner), previous_(previous) {}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : owner_(other.owner_), previous_(other.previous_) {
  other.owner_ = nullptr;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  if (owner_) owner_->synchronize_gradients_ = previous_;
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_parameter_names() const {
  std::lock_guard lock(reducer_->mutex);
  std::vector<std::vector<std::string>> names;
  for (const auto& bucket : reducer_->buckets) {
    names.emplace_back();
    for (size_t index : bucket.parameters) names.back().push_back(reducer_->parameters[index].name);
  }
  return names;
}

void DistributedDataParallel::register_comm_hook(CommunicationHook hook) {
  LOOM_CHECK(hook != nullptr, "DistributedDataParallel::register_comm_hook: the hook is empty");
  std::lock_guard lock(reducer_->mutex);
  LOOM_CHECK(reducer_->round != Reducer::Round::collecting,
             "DistributedDataParallel::register_comm_hook: called between forward and backward; register the hook "
             "before the first forward");
  reducer_->hook = std::move(hook);
}

namespace {
// A bucket's timing with `started` / `done` from its collective when the
// reducer has not seen them: a stream-ordered backend (nccl) finishes on the
// device after backward returned.
BucketTiming current_timing(const BucketTiming& timing, const WorkHandle& work) {
  BucketTiming result = timing;
  if (work && result.done == std::chrono::steady_clock::time_point{} && work->completed()) {
    result.started = work->start_time();
    result.done = work->end_time();
  }
  return result;
}
}  // namespace

IterationTiming DistributedDataParallel::last_iteration_timing() const {
  std::lock_guard lock(reducer_->mutex);
  IterationTiming timing = reducer_->timing;
  for (const auto& bucket : reducer_->buckets)
    timing.buckets.push_back(current_timing(bucket.timing, bucket.reduction.work));
  return timing;
}

std::vector<BucketTiming> DistributedDataParallel::bucket_timings() const {
  std::lock_guard lock(reducer_->mutex);
  std::vector<BucketTiming> timings;
  for (const auto& bucket : reducer_->buckets) timings.push_back(current_timing(bucket.timing, bucket.reduction.work));
  return timings;
}

}  // namespace loom::dist
