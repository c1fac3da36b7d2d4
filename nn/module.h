// Module: a tree of layers with named parameters and buffers, train/eval
// mode, and a state_dict whose names are PyTorch's ("layer1.0.weight").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/memory_format.h>
#include <loom/core/tensor.h>

namespace loom::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class BatchNorm2d;

// What a container may run as one op in place of a module's forward() and
// the modules after it (Module::fuses).
enum class FusedTail {
  relu,               // forward(input), then a module that computes_relu()
  add_relu,           // relu(forward(input) + residual): a residual block's tail
  relu_max_pool_2x2,  // forward(input), a computes_relu() module, a computes_max_pool_2x2() one
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  // Modules own their tensors and hand out pointers to them: no copies.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }
  // The class name PyTorch would print ("Conv2d", "BatchNorm2d").
  virtual std::string type_name() const = 0;

  // ---- Fusion: containers (Sequential, the ResNet blocks) run fused ops by
  // what modules declare here, never by their type. A class that overrides
  // forward() of a module that declares a fusion declares anew (fuses() false,
  // or a forward_fused() of its own); otherwise, where the fusion applies,
  // the declared fused op runs in place of its forward().

  // Whether forward_fused(input, tail, residual) computes forward(input) followed by `tail`. Default: no.
  virtual bool fuses(FusedTail tail) const { return false; }
  // forward(input) followed by `tail` as one op, where fuses(tail); `residual` for add_relu.
  virtual Tensor forward_fused(const Tensor& input, FusedTail tail, const Tensor& residual = {});
  // Whether forward(x) computes relu(x), so that a fused tail may stand in for it (ReLU).
  virtual bool computes_relu() const { return false; }
  // Whether forward(x) computes max_pool2d(x) with 2x2 windows, stride 2, no padding (MaxPool2d(2)).
  virtual bool computes_max_pool_2x2() const { return false; }
  // The batch norm dist::convert_sync_batchnorm() replaces by a SyncBatchNorm:
  // a BatchNorm2d declares itself; every other module, SyncBatchNorm included, null.
  virtual BatchNorm2d* batch_norm_to_synchronize() { return nullptr; }
  // Whether forward() runs collectives across ranks of its own (SyncBatchNorm's
  // statistics all-reduce), which a dist::Join cannot shadow on a rank whose
  // data ran out. Default: no.
  virtual bool runs_collectives_in_forward() const { return false; }

  // Parameters and buffers in registration order, own first, then children's
  // (PyTorch's order). Names are dotted paths.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  // This module ("") and all descendants, depth first.
  std::vector<std::pair<std::string, Module*>> named_modules();

  // Parameters and buffers, each module's own parameters then its own buffers
  // then its children: the order and names of PyTorch's state_dict().
  NamedTensors state_dict() const;
  // Copies values in by name. strict: every key must match both ways. Shape
  // mismatches are errors naming the key; dtypes are converted.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops every parameter's .grad (PyTorch 2's default: the next backward
  // hands its gradient over instead of adding it to zeros; DDP puts its
  // bucket views back), or zeroes them in place with set_to_none = false.
  void zero_grad(bool set_to_none = true);

  // Moves every parameter and buffer (and gradient) in place: the tensors stay
  // the same objects, so handles taken before (an optimizer's) see the moved
  // data, as with PyTorch's module.to(). (DDP must still wrap the model after.)
  void to(Device device);
  // Converts floating-point parameters and buffers to `dtype`, in place as
  // to(Device); modules listed in `keep` (by type name, e.g. "BatchNorm2d")
  // keep theirs (apex O2 keeps BN in f32).
  void to(DType dtype, const std::vector<std::string>& keep = {});
  // Re-lays every 4-d parameter and buffer (and gradient) in `format`, in
  // place as to(Device) (PyTorch's module.to(memory_format=...)): with nhwc
  // the convolution weights are stored channels-last, so the CUDA kernels
  // take them as they are, and each one's .grad is channels-last too. Call
  // it before building the optimizer, MasterWeights and DDP, as PyTorch
  // asks: DDP's buckets are laid out when it is built (a module already
  // wrapped is refused here), and an optimizer's state made before
  // refuses the next step.
  void to(MemoryFormat format);

  // Replaces child `name` (e.g. to convert BatchNorm2d to SyncBatchNorm), and
  // the member it was registered with, if any; returns the module it
  // replaced. Throws, changing nothing, when `module` does not fit that
  // member's type.
  std::shared_ptr<Module> replace_module(const std::string& name, std::shared_ptr<Module> module);

 protected:
  // Registers a member tensor; the module keeps a pointer to it, so moves and
  // dtype changes update the member itself.
  Tensor& register_parameter(const std::string& name, Tensor& member, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor& member);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module, nullptr);
    return module;
  }
  // Registers `module` as child `name` and stores it in `member`, which
  // forward() calls; the module keeps a pointer to the member, so
  // replace_module(name, ...) updates it too (accepting only modules that are
  // an M, e.g. a SyncBatchNorm for a BatchNorm2d member). This is what lets
  // convert_sync_batchnorm() convert blocks that call typed members.
  template <class M>
  void register_module(const std::string& name, std::shared_ptr<M>& member, std::shared_ptr<M> module) {
    member = std::move(module);
    add_child(name, member, [&member](const std::shared_ptr<Module>& replacement) {
      auto typed = std::dynamic_pointer_cast<M>(replacement);
      if (!typed) return false;
      member = std::move(typed);
      return true;
    });
  }

 private:
  // Stores a replacement in the member a child was registered with; false when
  // the replacement has the wrong type (nothing is stored then).
  using MemberSetter = std::function<bool(const std::shared_ptr<Module>&)>;
  struct Child {
    std::string name;
    std::shared_ptr<Module> module;
    MemberSetter set_member;  // empty for children without a member
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module, MemberSetter set_member);
  void collect(const std::string& prefix, bool parameters, bool buffers, NamedTensors& out) const;
  std::vector<std::pair<std::string, Tensor*>> all_tensor_slots(bool parameters, bool buffers);

  std::vector<std::pair<std::string, Tensor*>> parameters_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<Child> children_;
  bool training_ = true;
};

// Total number of parameter elements.
int64_t count_parameters(const Module& module);

}  // namespace loom::nn
