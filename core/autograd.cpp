#include <loom/core/autograd.h>

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include <loom/core/memory_format.h>
#include <loom/core/profiler.h>

namespace loom {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
thread_local bool t_grad_mode = true;
// The callbacks of the backward pass running on this thread, if any.
thread_local std::vector<std::function<void()>>* t_end_of_backward = nullptr;

// Whether the sum so far may be added to in place: nothing else can see it
// (no other tensor or view shares it), loom allocated its memory, and no
// graph of the gradients is being built. Otherwise it may alias a tensor
// someone else holds.
bool addable_in_place(const Tensor& total) {
  return !grad_mode_enabled() && total.impl_ptr().use_count() == 1 && total.storage().use_count() == 1 &&
         total.storage()->owns_memory() && total.is_contiguous() && !total.requires_grad();
}

void accumulate(Tensor& total, Tensor&& gradient) {
  if (!gradient.defined()) return;
  if (!total.defined()) {
    total = std::move(gradient);
    return;
  }
  // Added in place where it may be, else into a fresh tensor. (A residual
  // connection's gradient is such a sum: the in-place add saves a copy of it.)
  if (addable_in_place(total) && total.dtype() == gradient.dtype()) {
    total.add_(gradient);
    return;
  }
  Tensor sum = total.clone();
  sum.add_(gradient);
  total = std::move(sum);
}
}  // namespace

Node::Node(std::string name, uint32_t num_outputs)
    : sequence_nr_(g_next_sequence_nr.fetch_add(1)), name_(std::move(name)), num_outputs_(num_outputs) {}

const Tensor& Node::gradient_destination(size_t i) const {
  static const Tensor none;
  return i < gradient_destinations_.size() ? gradient_destinations_[i] : none;
}

const Tensor& Node::gradient_sum(size_t i) const {
  static const Tensor none;
  return i < gradient_sums_.size() ? gradient_sums_[i] : none;
}

Tensor Node::gradient_buffer(uint32_t) const { return {}; }

FunctionNode::FunctionNode(std::string name, uint32_t num_outputs, BackwardFunction backward)
    : Node(std::move(name), num_outputs), backward_(std::move(backward)) {}

TensorList FunctionNode::apply(TensorList&& grad_outputs) {
  LOOM_CHECK(backward_, "backward through ", name(),
             " a second time: its saved tensors were freed; pass retain_graph=true to the first backward");
  TensorList grads = backward_(grad_outputs, *this);
  LOOM_CHECK(grads.size() == next_edges.size(), name(), " backward returned ", grads.size(), " gradients for ",
             next_edges.size(), " inputs");
  return grads;
}

AccumulateGrad::AccumulateGrad(Tensor variable) : Node("AccumulateGrad"), variable_(std::move(variable)) {
  // Leaves accumulate as soon as they are ready, ahead of any other node.
  sequence_nr_ = UINT64_MAX;
}

bool AccumulateGrad::buffer_fits() const {
  const TensorImpl& leaf = *variable_.impl();
  return buffer_.defined() && buffer_.sizes() == leaf.sizes && buffer_.dtype() == leaf.dtype &&
         buffer_.device() == variable_.device() && is_in_memory_format(buffer_, memory_format_of(variable_));
}

void AccumulateGrad::set_gradient_buffer(const Tensor& buffer) {
  if (buffer.defined()) {
    LOOM_CHECK(buffer.sizes() == variable_.sizes() && buffer.dtype() == variable_.dtype() &&
                   buffer.device() == variable_.device(),
               "set_gradient_buffer: buffer ", buffer.str(), " for tensor ", variable_.str(),
               "; it must have the tensor's shape, dtype and device");
    const MemoryFormat format = memory_format_of(variable_);
    LOOM_CHECK(is_in_memory_format(buffer, format), "set_gradient_buffer: buffer ", buffer.str(), " is not ",
               format == MemoryFormat::nchw ? "contiguous" : "channels-last", ", as the tensor is");
    LOOM_CHECK(!buffer.requires_grad(), "set_gradient_buffer: the buffer must not require grad");
  }
  buffer_ = buffer;
}

Tensor AccumulateGrad::gradient_buffer(uint32_t) const {
  // Only a fresh .grad is computed in place; an existing one is added to.
  if (variable_.impl()->grad.defined() || !buffer_fits()) return {};
  return buffer_;
}

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  Tensor gradient = std::move(grad_outputs.at(0));
  if (!gradient.defined()) return {};
  TensorImpl& impl = *variable_.impl();
  LOOM_CHECK(gradient.sizes() == impl.sizes, "gradient of shape ", shape_str(gradient.sizes()),
             " for a parameter of shape ", shape_str(impl.sizes));
  if (impl.grad.defined()) {
    impl.grad.add_(gradient);
  } else if (buffer_fits()) {
    // The producing op wrote the buffer (gradient_destination), or it is copied there.
    if (!(same_dense_layout(gradient, buffer_) && gradient.raw_data() == buffer_.raw_data()))
      Tensor(buffer_).copy_(gradient);
    impl.grad = buffer_;
  } else {
    // Keep the incoming tensor when nobody else can see it; otherwise copy.
    // .grad is laid out as the leaf is (PyTorch's gradient layout contract):
    // a channels-last parameter's gradient is channels-last.
    if (gradient.dtype() != impl.dtype) gradient = gradient.to(impl.dtype);
    const MemoryFormat format = memory_format_of(variable_);
    if (!is_in_memory_format(gradient, format) || gradient.storage().use_count() > 1 ||
        gradient.impl_ptr().use_count() > 1) {
      gradient = format == MemoryFormat::nchw ? gradient.clone() : copy_in_memory_format(gradient, format);
    }
    impl.grad = gradient.detach();
  }
  for (auto& hook : impl.post_accumulate_grad_hooks) hook(variable_);
  return {};
}

bool fits_result(const Tensor& t, const Shape& sizes, DType dtype, Device device) {
  return t.defined() && t.sizes() == sizes && t.dtype() == dtype && t.device() == device && t.is_contiguous();
}

Tensor gradient_to_destination(const Node& node, size_t i, const Tensor& gradient, DType dtype) {
  const Tensor& destination = node.gradient_destination(i);
  if (!gradient.defined() || !fits_result(destination, gradient.sizes(), dtype, gradient.device()))
    return gradient.to(dtype);
  NoGradGuard no_grad;
  Tensor written = destination;
  written.copy_(gradient);
  return written;
}

bool grad_mode_enabled() { return t_grad_mode; }
void set_grad_mode(bool enabled) { t_grad_mode = enabled; }

bool any_requires_grad(const TensorList& inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& t) {
  LOOM_CHECK(t.defined() && t.requires_grad() && t.is_leaf(), "grad_accumulator: ",
             t.defined() ? t.str() : "an undefined tensor", " is not a leaf that requires grad");
  TensorImpl& impl = *t.impl();
  std::shared_ptr<Node> existing = impl.grad_accumulator.lock();
  if (existing) return std::static_pointer_cast<AccumulateGrad>(existing);
  auto accumulator = std::make_shared<AccumulateGrad>(t);
  impl.grad_accumulator = accumulator;
  return accumulator;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl& impl = *t.impl();
  if (impl.grad_fn) return {impl.grad_fn, impl.output_nr};
  return {grad_accumulator(t), 0};
}

bool record(const char* name, const TensorList& inputs, const std::vector<Tensor*>& outputs,
            BackwardFunction backward) {
  if (!any_requires_grad(inputs)) return false;
  auto node = std::make_shared<FunctionNode>(name, static_cast<uint32_t>(outputs.size()), std::move(backward));
  node->next_edges.reserve(inputs.size());
  for (const Tensor& input : inputs) node->next_edges.push_back(gradient_edge(input));
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& out = *outputs[i]->impl();
    out.requires_grad = true;
    out.grad_fn = node;
    out.output_nr = i;
  }
  return true;
}

void queue_end_of_backward_callback(std::function<void()> callback) {
  LOOM_CHECK(t_end_of_backward != nullptr, "queue_end_of_backward_callback called outside a backward pass");
  t_end_of_backward->push_back(std::move(callback));
}

void run_backward(const TensorList& roots, const TensorList& root_grads, bool retain_graph) {
  LOOM_CHECK(roots.size() == root_grads.size(), "backward: ", roots.size(), " roots but ", root_grads.size(),
             " gradients");
  NoGradGuard no_grad;
  std::vector<std::function<void()>> end_of_backward;
  struct CallbackScope {
    std::vector<std::function<void()>>* previous;
    explicit CallbackScope(std::vector<std::function<void()>>* current) : previous(t_end_of_backward) {
      t_end_of_backward = current;
    }
    ~CallbackScope() { t_end_of_backward = previous; }
  } callback_scope(&end_of_backward);

  // Count, for every reachable node, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  for (const Tensor& root : roots) {
    Edge edge = gradient_edge(root);
    LOOM_CHECK(edge.valid(), "backward: tensor ", root.str(), " does not require grad and has no grad_fn");
    if (dependencies.emplace(edge.node.get(), 0).second) stack.push_back(edge.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges) {
      if (!edge.valid()) continue;
      auto [it, inserted] = dependencies.emplace(edge.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(edge.node.get());
    }
  }

  struct Pending {
    std::shared_ptr<Node> node;
    TensorList grads;
  };
  std::unordered_map<Node*, Pending> pending;
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)> ready(
      later_first);

  // Decided when `node` is about to run (not in advance), input by input (an
  // input twice among the node's is offered to the first only): the sum
  // pending for it when that may be added to in place (gradient_sum), else,
  // with nothing pending, the buffer its node asks for (gradient_destination).
  auto offer_gradient_destinations = [&](Node& node) {
    for (size_t i = 0; i < node.next_edges.size(); ++i) {
      const Edge& edge = node.next_edges[i];
      if (!edge.valid()) continue;
      bool earlier = false;
      for (size_t j = 0; j < i && !earlier; ++j)
        earlier = node.next_edges[j].node == edge.node && node.next_edges[j].input_nr == edge.input_nr;
      if (earlier) continue;
      auto slot = pending.find(edge.node.get());
      if (slot != pending.end() && slot->second.grads.at(edge.input_nr).defined()) {
        const Tensor& sum = slot->second.grads[edge.input_nr];
        if (!addable_in_place(sum)) continue;
        if (node.gradient_sums_.empty()) node.gradient_sums_.resize(node.next_edges.size());
        node.gradient_sums_[i] = sum;
        continue;
      }
      Tensor buffer = edge.node->gradient_buffer(edge.input_nr);
      if (!buffer.defined()) continue;
      if (node.gradient_destinations_.empty()) node.gradient_destinations_.resize(node.next_edges.size());
      node.gradient_destinations_[i] = std::move(buffer);
    }
  };
  auto deliver = [&](const Edge& edge, Tensor&& gradient) {
    Pending& slot = pending[edge.node.get()];
    if (!slot.node) {
      slot.node = edge.node;
      slot.grads.resize(edge.node->num_outputs());
    }
    accumulate(slot.grads.at(edge.input_nr), std::move(gradient));
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    Edge edge = gradient_edge(roots[i]);
    Tensor seed = root_grads[i];
    deliver(edge, std::move(seed));
  }
  for (auto& [node, slot] : pending) {
    if (dependencies[node] == 0) ready.push(slot.node);
  }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    auto found = pending.find(node.get());
    TensorList grads = std::move(found->second.grads);
    pending.erase(found);
    bool any_gradient = false;
    for (const Tensor& g : grads) any_gradient = any_gradient || g.defined();
    // A node that received no gradient at all passes none on.
    TensorList input_grads;
    // Inputs whose gradient the node added into the offered sum (gradient_sum):
    // the pending sum already holds it. Sized only when a sum was offered.
    std::vector<char> summed_in_place;
    if (any_gradient) {
      offer_gradient_destinations(*node);
      struct ClearDestinations {
        Node& node;
        ~ClearDestinations() {
          node.gradient_destinations_.clear();
          node.gradient_sums_.clear();
        }
      } clear_destinations{*node};
      {
        // The scope reads the shape and keeps no reference (no copy of grads[0]
        // here either): AccumulateGrad takes over a gradient only when nothing
        // else holds it.
        profiler::Scope scope(profiler::active() ? node->name() + " backward" : std::string(), grads[0]);
        input_grads = node->apply(std::move(grads));
      }
      summed_in_place.resize(std::min(node->gradient_sums_.size(), input_grads.size()));
      for (size_t i = 0; i < summed_in_place.size(); ++i) {
        const Tensor& sum = node->gradient_sums_[i];
        summed_in_place[i] = sum.defined() && input_grads[i].is_same(sum);
      }
    }
    if (!retain_graph) node->release_saved();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      if (!edge.valid()) continue;
      const bool summed = i < summed_in_place.size() && summed_in_place[i];
      Tensor gradient = i < input_grads.size() && !summed ? std::move(input_grads[i]) : Tensor();
      deliver(edge, std::move(gradient));
      if (--dependencies[edge.node.get()] == 0) ready.push(edge.node);
    }
  }
  // Callbacks may queue further callbacks.
  for (size_t i = 0; i < end_of_backward.size(); ++i) end_of_backward[i]();
}

}  // namespace loom
