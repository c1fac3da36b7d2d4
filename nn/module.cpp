#include <loom/nn/module.h>

#include <map>
#include <set>

#include <loom/core/autograd.h>

namespace loom::nn {

Tensor Module::forward_fused(const Tensor& input, FusedTail tail, const Tensor& residual) {
  LOOM_FAIL(type_name(), " declares no fused op (fuses() is false): a container must call forward()");
}

Tensor& Module::register_parameter(const std::string& name, Tensor& member, bool requires_grad) {
  LOOM_CHECK(member.defined(), type_name(), ": parameter '", name, "' is undefined");
  if (requires_grad) member.set_requires_grad(true);
  parameters_.emplace_back(name, &member);
  return member;
}

Tensor& Module::register_buffer(const std::string& name, Tensor& member) {
  buffers_.emplace_back(name, &member);
  return member;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module, MemberSetter set_member) {
  LOOM_CHECK(module != nullptr, type_name(), ": child module '", name, "' is null");
  for (auto& child : children_) LOOM_CHECK(child.name != name, type_name(), ": child '", name, "' registered twice");
  children_.push_back({name, std::move(module), std::move(set_member)});
}

std::shared_ptr<Module> Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  LOOM_CHECK(module != nullptr, type_name(), ": cannot replace child module '", name, "' by null");
  for (auto& child : children_) {
    if (child.name != name) continue;
    LOOM_CHECK(!child.set_member || child.set_member(module), type_name(), ": child '", name, "' is a ",
               child.module->type_name(), " that ", type_name(), "::forward() calls through a typed member; a ",
               module->type_name(), " cannot take its place");
    std::swap(child.module, module);
    return module;
  }
  LOOM_FAIL(type_name(), " has no child module '", name, "'");
}

void Module::collect(const std::string& prefix, bool parameters, bool buffers, NamedTensors& out) const {
  if (parameters) {
    for (auto& [name, t] : parameters_) out.emplace_back(prefix + name, *t);
  }
  if (buffers) {
    for (auto& [name, t] : buffers_) {
      if (t->defined()) out.emplace_back(prefix + name, *t);
    }
  }
  for (auto& child : children_) child.module->collect(prefix + child.name + ".", parameters, buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, true, out);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect("", true, true, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& child : children_) out.emplace_back(child.name, child.module.get());
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& child : children_) {
    for (auto& [sub, module] : child.module->named_modules())
      out.emplace_back(sub.empty() ? child.name : child.name + "." + sub, module);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::all_tensor_slots(bool parameters, bool buffers) {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [prefix, module] : named_modules()) {
    const std::string dotted = prefix.empty() ? "" : prefix + ".";
    if (parameters) {
      for (auto& [name, t] : module->parameters_) out.emplace_back(dotted + name, t);
    }
    if (buffers) {
      for (auto& [name, t] : module->buffers_) {
        if (t->defined()) out.emplace_back(dotted + name, t);
      }
    }
  }
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (auto& [name, t] : state) given[name] = &t;
  std::vector<std::string> missing;
  std::set<std::string> used;
  NoGradGuard no_grad;
  for (auto& [name, slot] : all_tensor_slots(true, true)) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& source = *it->second;
    LOOM_CHECK(source.sizes() == slot->sizes(), "state_dict: '", name, "' has shape ", shape_str(source.sizes()),
               " but the model expects ", shape_str(slot->sizes()));
    slot->copy_(source);
    used.insert(name);
  }
  if (!strict) return;
  std::string problems;
  for (auto& name : missing) problems += " missing '" + name + "';";
  for (auto& [name, t] : given) {
    if (!used.count(name)) problems += " unexpected '" + name + "';";
  }
  LOOM_CHECK(problems.empty(), "state_dict does not match the model:", problems);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& child : children_) child.module->train(on);
}

void Module::zero_grad(bool set_to_none) {
  for (auto& [name, t] : named_parameters()) {
    if (!t.grad().defined()) continue;
    if (set_to_none) {
      t.set_grad(Tensor());
    } else {
      t.mutable_grad().zero_();
    }
  }
}

namespace {
// Converts `t` in place (Tensor::set_data: every handle to it, e.g. an
// optimizer's, sees the converted data, as with PyTorch's module.to()); its
// gradient is converted with it. A channels-last tensor stays so (PyTorch's
// preserve_format): to(MemoryFormat) may come before to(DType).
void convert(Tensor& t, Device device, DType dtype) {
  if (!t.defined() || (t.device() == device && t.dtype() == dtype)) return;
  NoGradGuard no_grad;
  const Tensor grad = t.grad();
  const MemoryFormat format = memory_format_of(t);
  t.set_data(in_memory_format(t.to(device).to(dtype), format));
  if (grad.defined()) t.set_grad(in_memory_format(grad.to(device).to(dtype), memory_format_of(grad)));
}
}  // namespace

void Module::to(Device device) {
  for (auto& [name, slot] : all_tensor_slots(true, true)) convert(*slot, device, slot->dtype());
}

void Module::to(DType dtype, const std::vector<std::string>& keep) {
  LOOM_CHECK(is_floating(dtype), "Module::to: ", dtype_name(dtype), " is not a floating-point dtype");
  for (auto& [prefix, module] : named_modules()) {
    bool kept = false;
    for (auto& k : keep) kept = kept || module->type_name() == k;
    if (kept) continue;
    for (auto* list : {&module->parameters_, &module->buffers_}) {
      for (auto& [name, slot] : *list) {
        if (slot->defined() && is_floating(slot->dtype())) convert(*slot, slot->device(), dtype);
      }
    }
  }
}

void Module::to(MemoryFormat format) {
  for (auto& [name, slot] : all_tensor_slots(true, true)) {
    Tensor& t = *slot;
    if (!t.defined() || t.dim() != 4 || is_in_memory_format(t, format)) continue;
    // DDP set this parameter's gradient buffer to a view of its bucket in the old layout.
    if (auto node = t.impl()->grad_accumulator.lock()) {
      LOOM_CHECK(!std::static_pointer_cast<AccumulateGrad>(node)->gradient_buffer().defined(), "Module::to(",
                 format == MemoryFormat::nhwc ? "channels-last" : "NCHW", "): parameter '", name,
                 "' already has a gradient buffer (a DistributedDataParallel wraps this module); change the "
                 "memory format before wrapping the module");
    }
    const Tensor grad = t.grad();
    t.set_data(copy_in_memory_format(t, format));
    if (grad.defined()) t.set_grad(copy_in_memory_format(grad, format));
  }
}

int64_t count_parameters(const Module& module) {
  int64_t total = 0;
  for (auto& [name, t] : module.named_parameters()) total += t.numel();
  return total;
}

}  // namespace loom::nn
