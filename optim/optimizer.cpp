#include <loom/optim/optimizer.h>

#include <cmath>
#include <type_traits>

#include <loom/core/autograd.h>
#include <loom/core/memory_format.h>
#include <loom/core/parallel.h>
#include <loom/ops/cpu/simd.h>
#include <loom/optim/cuda/fused_update.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::optim {
namespace {
constexpr int64_t kGrain = 1 << 13;

void check_param(const Tensor& p) {
  LOOM_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "optimizer: parameters must be leaf tensors that require grad");
  LOOM_CHECK(in_a_memory_format(p), "optimizer: parameter ", p.str(),
             " is neither contiguous nor channels-last");
}

// A new state tensor (momentum, moments) laid out as `param` is, so that the
// update walks the parameter, its gradient and its state in one memory order.
Tensor empty_state_like(const Tensor& param) {
  return empty_with_format(param.sizes(), param.dtype(), param.device(), memory_format_of(param));
}

// Throws unless `state` (made for `param`) is still laid out as `param` is:
// Module::to(MemoryFormat) after the state was made would have the update
// pair up elements of different positions.
void check_state_layout(const Tensor& state, const Tensor& param) {
  LOOM_CHECK(same_dense_layout(state, param), "optimizer: parameter ", param.str(),
             " changed its memory format after the optimizer's state for it was made; call "
             "Module::to(MemoryFormat) before building the optimizer");
}

// SGD's update of elements [begin, end), one case (momentum, first step,
// Nesterov) per instantiation, so that the loop has no branch and vectorises:
//   step = d + wd * w; with momentum b = first ? step : m * b + damp * step,
//   step = nesterov ? step + m * b : b;  w -= rate * step.
template <class T, bool kMomentum, bool kFirst, bool kNesterov>
__attribute__((always_inline)) inline void sgd_update(T* __restrict w, const T* __restrict d, T* __restrict b,
                                                      int64_t begin, int64_t end, T wd, T m, T damp, T rate) {
  for (int64_t i = begin; i < end; ++i) {
    T step = d[i] + wd * w[i];
    if constexpr (kMomentum) {
      const T buffer = kFirst ? step : m * b[i] + damp * step;
      b[i] = buffer;
      step = kNesterov ? step + m * buffer : buffer;
    }
    w[i] -= rate * step;
  }
}

// The same loop compiled for AVX2 (the default build targets any x86-64, so
// the loop above runs 4 floats per instruction at most): ResNet-50 has 25.6 M
// parameters, and the scalar update was 12% of a CPU training step's
// instructions (callgrind, batch 32).
template <bool kMomentum, bool kFirst, bool kNesterov>
__attribute__((target("avx2"))) void sgd_update_avx2(float* __restrict w, const float* __restrict d,
                                                          float* __restrict b, int64_t begin, int64_t end, float wd,
                                                          float m, float damp, float rate) {
  sgd_update<float, kMomentum, kFirst, kNesterov>(w, d, b, begin, end, wd, m, damp, rate);
}

// Adam's update of elements [begin, end), with decoupled weight decay (AdamW)
// or L2 added to the gradient as a template argument (no branch in the loop):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   w -= step_size * m / (sqrt(v) / sqrt_bc2 + eps).
template <class T, bool kDecoupled>
__attribute__((always_inline)) inline void adam_update(T* __restrict w, const T* __restrict d, T* __restrict m,
                                                       T* __restrict v, int64_t begin, int64_t end, T b1, T b2,
                                                       T wd, T decay, T eps, T step_size, T sqrt_bc2) {
  for (int64_t i = begin; i < end; ++i) {
    T grad = d[i];
    if constexpr (kDecoupled) {
      w[i] *= decay;
    } else {
      grad += wd * w[i];
    }
    m[i] = b1 * m[i] + (T(1) - b1) * grad;
    v[i] = b2 * v[i] + (T(1) - b2) * grad * grad;
    const T denom = std::sqrt(v[i]) / sqrt_bc2 + eps;
    w[i] -= step_size * m[i] / denom;
  }
}

#if defined(__x86_64__)
// adam_update in 8-float AVX2 vectors (the compiler does not vectorise
// std::sqrt, which may set errno), the same operations in the same order
// without FMA, so the results are the scalar loop's; the tail runs that loop.
template <bool kDecoupled>
__attribute__((target("avx2"))) void adam_update_avx2(float* __restrict w, const float* __restrict d,
                                                      float* __restrict m, float* __restrict v, int64_t begin,
                                                      int64_t end, float b1, float b2, float wd, float decay,
                                                      float eps, float step_size, float sqrt_bc2) {
  const __m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2), one_b1 = _mm256_set1_ps(1.0f - b1);
  const __m256 one_b2 = _mm256_set1_ps(1.0f - b2), vwd = _mm256_set1_ps(wd), vdecay = _mm256_set1_ps(decay);
  const __m256 veps = _mm256_set1_ps(eps), vstep = _mm256_set1_ps(step_size), vbc2 = _mm256_set1_ps(sqrt_bc2);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 wi = _mm256_loadu_ps(w + i), grad = _mm256_loadu_ps(d + i);
    if constexpr (kDecoupled) {
      wi = _mm256_mul_ps(wi, vdecay);
    } else {
      grad = _mm256_add_ps(grad, _mm256_mul_ps(vwd, wi));
    }
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(one_b1, grad));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(_mm256_mul_ps(one_b2, grad), grad));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc2), veps);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(w + i, _mm256_sub_ps(wi, _mm256_div_ps(_mm256_mul_ps(vstep, mi), denom)));
  }
  adam_update<float, kDecoupled>(w, d, m, v, i, end, b1, b2, wd, decay, eps, step_size, sqrt_bc2);
}
#endif

// The gradient in the parameter's dtype and layout (contiguous or channels-last).
Tensor grad_of(const Tensor& p) {
  Tensor g = p.grad();
  if (g.dtype() != p.dtype()) g = g.to(p.dtype());
  return in_memory_format(g, memory_format_of(p));
}

const Tensor* find_state(const nn::NamedTensors& state, const std::string& name) {
  for (auto& [key, t] : state) {
    if (key == name) return &t;
  }
  return nullptr;
}

// Saved state tensor `saved` (named `name`) as a new tensor on `param`'s
// device and dtype; its shape must be the parameter's.
Tensor restore_like(const Tensor& saved, const std::string& name, const Tensor& param) {
  LOOM_CHECK(saved.sizes() == param.sizes(), "optimizer state '", name, "' has shape ", shape_str(saved.sizes()),
             ", parameter has ", shape_str(param.sizes()));
  return empty_state_like(param).copy_(saved);
}
}  // namespace

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        Tensor(p).set_grad(Tensor());
      } else {
        Tensor(p).mutable_grad().zero_();
      }
    }
  }
}

void Optimizer::set_lr(size_t group, double lr) {
  Group& g = groups_.at(group);
  g.lr = lr;
  if (g.lr_tensor.defined()) g.lr_tensor.fill_(lr);
}

void Optimizer::keep_lr_on_device(Device device) {
  for (Group& g : groups_) {
    if (!g.lr_tensor.defined() || g.lr_tensor.device() != device) g.lr_tensor = Tensor::full({}, g.lr, DType::f64, device);
  }
}

void Optimizer::step_if_finite(const Tensor& found_inf) {
  if (!found_inf.defined() || found_inf.item() == 0) step();
}

void Optimizer::add_group(std::vector<Tensor> params, double lr) {
  LOOM_CHECK(lr >= 0, "optimizer: learning rate must be >= 0, got ", lr);
  for (auto& p : params) check_param(p);
  groups_.push_back({std::move(params), lr});
}

// ---- SGD ----

void SGDOptions::check() const {
  LOOM_CHECK(momentum() >= 0 && weight_decay() >= 0, "SGD: momentum and weight_decay must be >= 0");
  LOOM_CHECK(!nesterov() || (momentum() > 0 && dampening() == 0), "SGD: nesterov needs momentum > 0 and dampening 0");
}

bool Optimizer::flag_on_parameters_gpu(const Tensor& found_inf) const {
  if (!found_inf.defined() || !found_inf.device().is_cuda()) return false;
  for (const Group& group : groups_) {
    for (const Tensor& p : group.params) {
      if (p.grad().defined() && p.device() != found_inf.device()) return false;
    }
  }
  return true;
}

std::optional<std::string> Optimizer::rates_capture_refusal(const char* who) const {
  for (const Group& group : groups_) {
    if (!group.lr_tensor.defined() || !group.lr_tensor.device().is_cuda()) {
      return str(who, " keeps its learning rate on the host (Optimizer::keep_lr_on_device makes a device copy)");
    }
    for (const Tensor& p : group.params) {
      if (p.grad().defined() && p.device() != group.lr_tensor.device())
        return "parameter " + p.str() + " is not on the learning rate's GPU";
    }
  }
  return std::nullopt;
}

Tensor Optimizer::gpu_lr(size_t group) const {
  const Tensor& lr = groups_.at(group).lr_tensor;
  return lr.defined() && lr.device().is_cuda() ? lr : Tensor();
}

// Whether every parameter with a gradient has its momentum buffer (or needs none).
bool SGD::buffers_made() const {
  return !any_with_gradient(
      [&](const MomentumBuffer& state, size_t gi) { return options_[gi].momentum() != 0 && !state.buffer.defined(); });
}

void SGD::step_if_finite(const Tensor& found_inf) {
  if (flag_on_parameters_gpu(found_inf) && buffers_made()) {
    update(found_inf);
  } else {
    Optimizer::step_if_finite(found_inf);
  }
}

std::optional<std::string> SGD::capture_refusal() const {
  if (auto why = rates_capture_refusal("SGD")) return why;
  if (!buffers_made()) {
    return std::string("SGD's momentum buffers are made by its first step, on the host's decision: take one step "
                       "before the capture");
  }
  return std::nullopt;
}

void SGD::update(const Tensor& skip_if) {
  NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const SGDOptions& o = options_[gi];
    const double lr = groups_[gi].lr;
    std::vector<Tensor> cuda_params, cuda_grads, cuda_buffers;  // updated by one fused kernel per dtype
    std::vector<bool> cuda_first;
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      Tensor& p = groups_[gi].params[pi];
      if (!p.grad().defined()) continue;
      Tensor g = grad_of(p);
      Tensor& buffer = param_states_[gi][pi].buffer;
      const bool first = !buffer.defined();
      if (o.momentum() != 0 && first) buffer = empty_state_like(p);
      if (buffer.defined()) check_state_layout(buffer, p);
      if (p.device().is_cuda()) {
        cuda_params.push_back(p);
        cuda_grads.push_back(g);
        if (o.momentum() != 0) cuda_buffers.push_back(buffer);
        cuda_first.push_back(first);
        continue;
      }
      visit_compute_dtype(p.dtype(), "SGD step", [&]<class T>() {
        T* w = p.data<T>();
        const T* d = g.data<T>();
        T* b = o.momentum() != 0 ? buffer.data<T>() : nullptr;
        const T wd = T(o.weight_decay()), m = T(o.momentum()), damp = T(1 - o.dampening()), rate = T(lr);
        const auto update = [&]<bool kMomentum, bool kFirst, bool kNesterov>() {
          parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
            if constexpr (std::is_same_v<T, float>) {
              if (ops::cpu::cpu_has_avx2())
                return sgd_update_avx2<kMomentum, kFirst, kNesterov>(w, d, b, begin, end, wd, m, damp, rate);
            }
            sgd_update<T, kMomentum, kFirst, kNesterov>(w, d, b, begin, end, wd, m, damp, rate);
          });
        };
        if (b == nullptr) {
          update.template operator()<false, false, false>();
        } else if (first) {
          o.nesterov() ? update.template operator()<true, true, true>() : update.template operator()<true, true, false>();
        } else {
          o.nesterov() ? update.template operator()<true, false, true>()
                      : update.template operator()<true, false, false>();
        }
      });
    }
    if (!cuda_params.empty()) {
      cuda::sgd_step(cuda_params, cuda_grads, cuda_buffers, cuda_first,
                     {lr, o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()}, skip_if, gpu_lr(gi));
    }
  }
}

void MomentumBuffer::save(const std::string& prefix, nn::NamedTensors& out) const {
  if (buffer.defined()) out.emplace_back(prefix + "momentum_buffer", buffer);
}

void MomentumBuffer::load(const nn::NamedTensors& state, const std::string& prefix, const Tensor& param) {
  const std::string name = prefix + "momentum_buffer";
  const Tensor* t = find_state(state, name);
  buffer = t == nullptr ? Tensor() : restore_like(*t, name, param);
}

// ---- Adam / AdamW ----

void AdamOptions::check() const {
  LOOM_CHECK(beta1() >= 0 && beta1() < 1 && beta2() >= 0 && beta2() < 1, "Adam: betas must be in [0, 1), got (",
             beta1(), ", ", beta2(), ")");
  LOOM_CHECK(eps() >= 0 && weight_decay() >= 0, "Adam: eps and weight_decay must be >= 0");
}

void Adam::step_if_finite(const Tensor& found_inf) {
  if (flag_on_parameters_gpu(found_inf)) {
    update(found_inf);
  } else {
    Optimizer::step_if_finite(found_inf);
  }
}

std::optional<std::string> Adam::capture_refusal() const {
  if (auto why = rates_capture_refusal("Adam")) return why;
  if (any_with_gradient([](const AdamMoments& s, size_t) { return !s.exp_avg.defined() || !s.device_step.defined(); })) {
    return std::string("Adam's moments and step counts are made by its first step: take one step before the capture");
  }
  return std::nullopt;
}

void Adam::update(const Tensor& skip_if) {
  NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const AdamOptions& o = options_[gi];
    const double lr = groups_[gi].lr;
    const Tensor lr_tensor = gpu_lr(gi);
    std::vector<Tensor> cuda_params, cuda_grads, cuda_exp_avgs, cuda_exp_avg_sqs;  // one fused kernel per dtype
    std::vector<int64_t> cuda_steps;
    std::vector<Tensor> cuda_device_steps;
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      Tensor& p = groups_[gi].params[pi];
      if (!p.grad().defined()) continue;
      Tensor g = grad_of(p);
      AdamMoments& s = param_states_[gi][pi];
      if (!s.exp_avg.defined()) {
        s.exp_avg = empty_state_like(p).zero_();
        s.exp_avg_sq = empty_state_like(p).zero_();
      }
      check_state_layout(s.exp_avg, p);
      check_state_layout(s.exp_avg_sq, p);
      // A skip decided on the GPU, or a rate read there (a captured step):
      // the count moves to the GPU for good, and the kernels advance it.
      if (p.device().is_cuda() && !s.device_step.defined() && (skip_if.defined() || lr_tensor.defined())) {
        s.device_step = Tensor::full({}, static_cast<double>(s.step), DType::f64, p.device());
      }
      if (!s.device_step.defined()) ++s.step;
      if (p.device().is_cuda()) {
        cuda_params.push_back(p);
        cuda_grads.push_back(g);
        cuda_exp_avgs.push_back(s.exp_avg);
        cuda_exp_avg_sqs.push_back(s.exp_avg_sq);
        cuda_steps.push_back(s.step);
        cuda_device_steps.push_back(s.device_step);
        continue;
      }
      const double bias_correction1 = 1 - std::pow(o.beta1(), static_cast<double>(s.step));
      const double bias_correction2 = 1 - std::pow(o.beta2(), static_cast<double>(s.step));
      const double step_size = lr / bias_correction1;
      const double sqrt_bc2 = std::sqrt(bias_correction2);
      visit_compute_dtype(p.dtype(), "Adam step", [&]<class T>() {
        T* w = p.data<T>();
        const T* d = g.data<T>();
        T* m = s.exp_avg.data<T>();
        T* v = s.exp_avg_sq.data<T>();
        const T b1 = T(o.beta1()), b2 = T(o.beta2()), wd = T(o.weight_decay()), eps = T(o.eps());
        const T decay = T(1 - lr * o.weight_decay()), step = T(step_size), bc2 = T(sqrt_bc2);
        const auto update = [&]<bool kDecoupled>() {
          parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
            if constexpr (std::is_same_v<T, float>) {
              if (ops::cpu::cpu_has_avx2()) {
                return adam_update_avx2<kDecoupled>(w, d, m, v, begin, end, b1, b2, wd, decay, eps, step, bc2);
              }
            }
#endif
            adam_update<T, kDecoupled>(w, d, m, v, begin, end, b1, b2, wd, decay, eps, step, bc2);
          });
        };
        o.decoupled_weight_decay() ? update.template operator()<true>() : update.template operator()<false>();
      });
    }
    if (!cuda_params.empty()) {
      cuda::adam_step(cuda_params, cuda_grads, cuda_exp_avgs, cuda_exp_avg_sqs, cuda_steps,
                      {lr, o.beta1(), o.beta2(), o.eps(), o.weight_decay(), o.decoupled_weight_decay()},
                      cuda_device_steps, skip_if, lr_tensor);
    }
  }
}

void AdamMoments::save(const std::string& prefix, nn::NamedTensors& out) const {
  if (!exp_avg.defined()) return;
  out.emplace_back(prefix + "exp_avg", exp_avg);
  out.emplace_back(prefix + "exp_avg_sq", exp_avg_sq);
  out.emplace_back(prefix + "step", Tensor::full({}, static_cast<double>(count()), DType::i64));
}

void AdamMoments::load(const nn::NamedTensors& state, const std::string& prefix, const Tensor& param) {
  const Tensor* m = find_state(state, prefix + "exp_avg");
  const Tensor* v = find_state(state, prefix + "exp_avg_sq");
  const Tensor* saved_step = find_state(state, prefix + "step");
  if (m == nullptr || v == nullptr || saved_step == nullptr) {
    *this = AdamMoments();
    return;
  }
  Tensor restored_avg = restore_like(*m, prefix + "exp_avg", param);  // both checked before either is set
  Tensor restored_avg_sq = restore_like(*v, prefix + "exp_avg_sq", param);
  exp_avg = std::move(restored_avg);
  exp_avg_sq = std::move(restored_avg_sq);
  step = static_cast<int64_t>(saved_step->item());
  if (device_step.defined()) device_step.fill_(static_cast<double>(step));
}

}  // namespace loom::optim
