// Reverse-mode autodiff: Node (the backward of one op), the iterative engine,
// AccumulateGrad for leaves, and grad mode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/tensor.h>

namespace loom {

using TensorList = std::vector<Tensor>;

// Where a gradient flows: input `input_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// The backward of one op. apply() receives one gradient per output of the op
// (undefined where none flowed) and returns one gradient per next_edge
// (undefined where the input needs none).
class Node {
 public:
  explicit Node(std::string name, uint32_t num_outputs = 1);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // Frees what backward saved; called once the node has run unless the graph is retained.
  virtual void release_saved() {}

  const std::string& name() const { return name_; }
  uint32_t num_outputs() const { return num_outputs_; }
  // Order of creation; the engine runs ready nodes latest-first, so backward
  // visits layers in reverse forward order.
  uint64_t sequence_nr() const { return sequence_nr_; }
  bool needs_input_grad(size_t i) const { return i < next_edges.size() && next_edges[i].valid(); }
  // Where apply() may write the gradient for input `i` instead of allocating
  // it, or an undefined tensor: the gradient buffer (below) of the node that
  // input feeds, offered only during apply() and only when no other node has
  // sent a gradient to that input yet in this pass. An op that fills it (its
  // whole extent) returns it as that input's gradient; an op that can't
  // ignores it, and the receiving node copies (AccumulateGrad).
  const Tensor& gradient_destination(size_t i) const;
  // The gradient other nodes have already sent to input `i` in this pass,
  // offered during apply() when it may be added to in place (the sum's only
  // holder is the engine, loom owns its memory, it is contiguous, and no
  // graph of the gradients is being built), or an undefined tensor. An op
  // that adds its gradient for input `i` into it returns it as that
  // gradient, and the engine adds nothing more; an op that doesn't returns
  // its own, which the engine adds. (A residual block's first convolution
  // adds its input gradient to the shortcut's this way, saving a pass.)
  const Tensor& gradient_sum(size_t i) const;
  // The memory this node would like the gradient arriving at its input
  // `input_nr` computed in, or an undefined tensor (the default). The engine
  // asks just before running the node that produces that gradient.
  virtual Tensor gradient_buffer(uint32_t input_nr) const;

  std::vector<Edge> next_edges;

 protected:
  uint64_t sequence_nr_;

 private:
  friend void run_backward(const TensorList& roots, const TensorList& root_grads, bool retain_graph);
  std::string name_;
  uint32_t num_outputs_;
  TensorList gradient_destinations_;  // set by the engine around apply(); empty otherwise
  TensorList gradient_sums_;          // likewise
};

// Backward of an op as a closure over exactly what it saved.
using BackwardFunction = std::function<TensorList(const TensorList& grad_outputs, const Node& node)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, uint32_t num_outputs, BackwardFunction backward);
  TensorList apply(TensorList&& grad_outputs) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  BackwardFunction backward_;
};

// Sums gradients into a leaf's .grad, then runs its post-accumulate hooks.
// With a gradient buffer set (DDP: the parameter's view of its bucket), .grad
// lives there: a backward pass that reaches the leaf with .grad undefined
// offers the buffer to the op producing the gradient (gradient_buffer), and
// .grad becomes the buffer, written by that op or else copied into it;
// later gradients add into .grad in place, as always.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);
  TensorList apply(TensorList&& grad_outputs) override;
  Tensor gradient_buffer(uint32_t input_nr) const override;
  const Tensor& variable() const { return variable_; }
  // `buffer` must have the variable's shape, dtype and device and its
  // layout (contiguous, or channels-last for a channels-last variable:
  // core/memory_format.h); its values are overwritten by the backward passes that fill
  // it. Undefined clears it. A buffer that no longer fits the variable (after
  // Tensor::set_data) is passed over.
  void set_gradient_buffer(const Tensor& buffer);
  const Tensor& gradient_buffer() const { return buffer_; }

 private:
  bool buffer_fits() const;
  Tensor variable_;
  Tensor buffer_;
};

// The node that accumulates gradients into leaf `t`'s .grad, created on first
// use. The leaf holds it weakly (a graph through it holds it strongly), so a
// caller that sets a gradient buffer keeps the returned pointer.
std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& t);

// Whether `t` can hold a result of `sizes` and `dtype` on `device` in place:
// defined, contiguous, of exactly that geometry.
bool fits_result(const Tensor& t, const Shape& sizes, DType dtype, Device device);

// `gradient`, converted to `dtype`, as the gradient for input `i` of `node`:
// copied into the gradient destination offered for that input when it fits,
// else gradient.to(dtype). For small gradients (biases, batch-norm parameters) and
// dtype conversions, where the copy replaces an allocation.
Tensor gradient_to_destination(const Node& node, size_t i, const Tensor& gradient, DType dtype);

// Grad mode is per thread; ops record a graph only while it is on.
bool grad_mode_enabled();
void set_grad_mode(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and some input requires grad: the op must record.
bool any_requires_grad(const TensorList& inputs);

// Records `backward` as the grad_fn of `outputs` when any_requires_grad(inputs).
// Undefined inputs get no edge. Returns whether a node was recorded.
bool record(const char* name, const TensorList& inputs, const std::vector<Tensor*>& outputs,
            BackwardFunction backward);

// The edge a gradient for `t` must flow to: its grad_fn, or its AccumulateGrad.
Edge gradient_edge(const Tensor& t);

// Queues `callback` to run on this thread once the backward pass in progress
// has applied every node (PyTorch's queue_callback). Only valid from inside a
// backward pass, e.g. from a post-accumulate-grad hook: DDP waits for its
// gradient buckets here.
void queue_end_of_backward_callback(std::function<void()> callback);

// Runs backward from `roots` seeded with `root_grads`.
void run_backward(const TensorList& roots, const TensorList& root_grads, bool retain_graph);

}  // namespace loom
