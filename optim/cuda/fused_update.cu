// Fused SGD and Adam updates and GradScaler's unscale for CUDA tensors (fused_update.h). The
// tensors of one dtype and device go to the kernel in lists of up to
// kMaxTensors, passed by value as the kernel's parameters (no copy of
// pointers to the device); each block updates one chunk of one tensor.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <loom/ops/cuda/common.cuh>
#include <loom/optim/clip_grad_math.h>
#include <loom/optim/cuda/fused_update.h>

namespace loom::optim::cuda {
using namespace ops::cuda_detail;

namespace {

constexpr int kMaxTensors = 36;
constexpr int64_t kChunk = 4096;  // elements per block

// Which blocks belong to which tensor: blocks [first_block[t], first_block[t + 1]).
struct Chunks {
  int count = 0;
  int64_t numel[kMaxTensors] = {};
  int64_t first_block[kMaxTensors + 1] = {};
};

// This block's tensor and element range [begin, end).
__device__ __forceinline__ int block_tensor(const Chunks& c, int64_t& begin, int64_t& end) {
  const int64_t block = blockIdx.x;
  int t = 0;
  while (t + 1 < c.count && c.first_block[t + 1] <= block) ++t;
  begin = (block - c.first_block[t]) * kChunk;
  end = begin + kChunk < c.numel[t] ? begin + kChunk : c.numel[t];
  return t;
}

struct SgdList {
  void* param[kMaxTensors];
  const void* grad[kMaxTensors];
  void* buffer[kMaxTensors];
  bool first[kMaxTensors];
  Chunks chunks;
};

template <class T>
static __global__ void sgd_kernel(SgdList list, acc_t<T> lr, acc_t<T> momentum, acc_t<T> damp, acc_t<T> weight_decay,
                                  bool use_momentum, bool nesterov, const int* skip, const double* device_lr) {
  using A = acc_t<T>;
  if (skip != nullptr && *skip != 0) return;  // an overflowed step (GradScaler's flag)
  if (device_lr != nullptr) lr = static_cast<A>(*device_lr);  // as the host converts it
  int64_t begin, end;
  const int t = block_tensor(list.chunks, begin, end);
  T* p = static_cast<T*>(list.param[t]);
  const T* g = static_cast<const T*>(list.grad[t]);
  T* buf = static_cast<T*>(list.buffer[t]);
  const bool first = list.first[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const A w = to_acc(p[i]);
    A step = to_acc(g[i]) + weight_decay * w;
    if (use_momentum) {
      const A b = first ? step : momentum * to_acc(buf[i]) + damp * step;
      buf[i] = from_acc<T>(b);
      step = nesterov ? step + momentum * b : b;
    }
    p[i] = from_acc<T>(w - lr * step);
  }
}

struct AdamList {
  void* param[kMaxTensors];
  const void* grad[kMaxTensors];
  void* exp_avg[kMaxTensors];
  void* exp_avg_sq[kMaxTensors];
  double step_size[kMaxTensors];       // lr / (1 - beta1^step)
  double sqrt_correction[kMaxTensors];  // sqrt(1 - beta2^step)
  double* device_step[kMaxTensors];     // the count on the device, or null: step_size and sqrt_correction hold
  Chunks chunks;
};

// What the kernels need to compute the bias corrections of a count on the
// device, as the host does (in f64), and the rate there.
struct AdamDevice {
  const int* skip;         // GradScaler's flag, or null
  const double* lr;        // the rate on the device, or null: host_lr
  double host_lr, beta1, beta2, weight_decay;
};

// One thread per tensor of the list: its device count + 1, unless skipped.
static __global__ void advance_steps_kernel(AdamList list, const int* skip) {
  if (skip != nullptr && *skip != 0) return;
  const int t = static_cast<int>(threadIdx.x);
  if (t < list.chunks.count && list.device_step[t] != nullptr) *list.device_step[t] += 1;
}

template <class T>
static __global__ void adam_kernel(AdamList list, acc_t<T> beta1, acc_t<T> beta2, acc_t<T> eps, acc_t<T> weight_decay,
                                   acc_t<T> decay, bool decoupled, AdamDevice device) {
  using A = acc_t<T>;
  if (device.skip != nullptr && *device.skip != 0) return;  // an overflowed step (GradScaler's flag)
  int64_t begin, end;
  const int t = block_tensor(list.chunks, begin, end);
  if (device.lr != nullptr) decay = static_cast<A>(1 - *device.lr * device.weight_decay);
  double step_size_f64 = list.step_size[t], sqrt_correction_f64 = list.sqrt_correction[t];
  if (list.device_step[t] != nullptr) {  // the host's formulas (adam_step) on the device's count
    const double step = *list.device_step[t], lr = device.lr != nullptr ? *device.lr : device.host_lr;
    step_size_f64 = lr / (1 - pow(device.beta1, step));
    sqrt_correction_f64 = sqrt(1 - pow(device.beta2, step));
  }
  T* p = static_cast<T*>(list.param[t]);
  const T* g = static_cast<const T*>(list.grad[t]);
  T* m = static_cast<T*>(list.exp_avg[t]);
  T* v = static_cast<T*>(list.exp_avg_sq[t]);
  const A step_size = static_cast<A>(step_size_f64), sqrt_correction = static_cast<A>(sqrt_correction_f64);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    A w = to_acc(p[i]);
    A grad = to_acc(g[i]);
    if (decoupled) {
      w *= decay;
    } else {
      grad += weight_decay * w;
    }
    const A m_new = beta1 * to_acc(m[i]) + (A(1) - beta1) * grad;
    const A v_new = beta2 * to_acc(v[i]) + (A(1) - beta2) * grad * grad;
    m[i] = from_acc<T>(m_new);
    v[i] = from_acc<T>(v_new);
    const A denom = sqrt(v_new) / sqrt_correction + eps;
    p[i] = from_acc<T>(w - step_size * m_new / denom);
  }
}

struct UnscaleList {
  const void* source[kMaxTensors];
  void* destination[kMaxTensors];
  Chunks chunks;
};

// destination = source * factor in the accumulation type, the factor being
// 1 / *scale when `scale` is given; *found = 1 when a product is not finite
// (only ever written with 1, so no atomics are needed).
template <class S, class D>
static __global__ void unscale_kernel(UnscaleList list, acc_t<S> factor, const double* scale, int* found) {
  if (scale != nullptr) factor = static_cast<acc_t<S>>(1.0 / *scale);  // as the host computes it
  int64_t begin, end;
  const int t = block_tensor(list.chunks, begin, end);
  const S* in = static_cast<const S*>(list.source[t]);
  D* out = static_cast<D*>(list.destination[t]);
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const acc_t<S> v = to_acc(in[i]) * factor;
    bad |= !isfinite(v);
    out[i] = from_acc<D>(static_cast<acc_t<D>>(v));
  }
  if (bad) *found = 1;
}

// GradScaler::update (optim/grad_scaler_math.h) by one thread.
static __global__ void update_scale_kernel(double* scale, float* loss_scale, int64_t* growth_tracker,
                                           int64_t* skipped_steps, const int* found_inf, ScaleSchedule schedule) {
  schedule.advance(*scale, *growth_tracker, *skipped_steps, *found_inf != 0);
  *loss_scale = static_cast<float>(*scale);
}

// destination = source in the destination's dtype (copy_tensors), through
// the destination's accumulation type: the rounding of Tensor::copy_.
template <class S, class D>
static __global__ void copy_kernel(UnscaleList list) {
  int64_t begin, end;
  const int t = block_tensor(list.chunks, begin, end);
  const S* in = static_cast<const S*>(list.source[t]);
  D* out = static_cast<D*>(list.destination[t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    out[i] = from_acc<D>(static_cast<acc_t<D>>(to_acc(in[i])));
  }
}

struct GradientList {
  void* grad[kMaxTensors];
  Chunks chunks;
};

// partials[block] = this block's norm terms folded (optim/clip_grad_math.h),
// by a fixed tree over the block's threads.
template <class T>
static __global__ void norm_terms_kernel(GradientList list, NormTerms terms, double* partials) {
  __shared__ double folded[kThreads];
  int64_t begin, end;
  const int t = block_tensor(list.chunks, begin, end);
  const T* g = static_cast<const T*>(list.grad[t]);
  double total = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    total = terms.combine(total, terms.term(static_cast<double>(to_acc(g[i]))));
  }
  folded[threadIdx.x] = total;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) folded[threadIdx.x] = terms.combine(folded[threadIdx.x], folded[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = folded[0];
}

// g = clamp(g, -limit, limit) in place; NaN stays NaN.
template <class T>
static __global__ void clamp_kernel(GradientList list, acc_t<T> limit) {
  int64_t begin, end;
  const int t = block_tensor(list.chunks, begin, end);
  T* g = static_cast<T*>(list.grad[t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const acc_t<T> v = to_acc(g[i]);
    if (v < -limit) g[i] = from_acc<T>(-limit);
    else if (v > limit) g[i] = from_acc<T>(limit);
  }
}

void check_update_tensor(const char* what, const Tensor& t, const Tensor& param) {
  // Both contiguous, or both channels-last (Module::to(MemoryFormat)): one memory order.
  LOOM_CHECK(t.defined() && t.device() == param.device() && t.dtype() == param.dtype() &&
                 t.numel() == param.numel() &&
                 ((t.is_contiguous() && param.is_contiguous()) || same_dense_layout(t, param)),
             "fused optimizer update: ", what, " ", t.defined() ? t.str() : "undefined", " does not match parameter ",
             param.str(), " (same dtype, device, size; both contiguous or both channels-last)");
}

// Throws unless `t` is a one-element CUDA tensor of `dtype` on `device`.
void check_scalar(const char* what, const Tensor& t, DType dtype, Device device) {
  LOOM_CHECK(t.defined() && t.numel() == 1 && t.dtype() == dtype && t.device() == device, "fused update: ", what,
             " must be a one-element ", dtype_name(dtype), " tensor on ", device.str(), ", got ",
             t.defined() ? t.str() : "an undefined tensor");
}

// Indices of `params` grouped by (device, dtype), each group in order and cut
// into lists of at most kMaxTensors non-empty tensors.
std::vector<std::vector<size_t>> batches(const std::vector<Tensor>& params) {
  std::map<std::pair<int, int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() == 0) continue;
    groups[{params[i].device().index, static_cast<int>(params[i].dtype())}].push_back(i);
  }
  std::vector<std::vector<size_t>> out;
  for (auto& [key, indices] : groups) {
    for (size_t start = 0; start < indices.size(); start += kMaxTensors) {
      out.emplace_back(indices.begin() + start, indices.begin() + std::min(indices.size(), start + kMaxTensors));
    }
  }
  return out;
}

// Fills `chunks` for the tensors `batch` of `params`; returns the block count.
int64_t plan_chunks(const std::vector<Tensor>& params, const std::vector<size_t>& batch, Chunks& chunks) {
  chunks.count = static_cast<int>(batch.size());
  int64_t blocks = 0;
  for (size_t k = 0; k < batch.size(); ++k) {
    chunks.numel[k] = params[batch[k]].numel();
    chunks.first_block[k] = blocks;
    blocks += (chunks.numel[k] + kChunk - 1) / kChunk;
  }
  chunks.first_block[batch.size()] = blocks;
  return blocks;
}

// One launch per batch of `params` (batches()), on the batch's GPU and
// stream: a List with the batch's chunk plan, fill(list, k, i) for member k
// (parameter i), then launch.template operator()<T>(list, blocks, stream) in
// the batch's dtype T.
template <class List, class Fill, class Launch>
void for_each_batch(const char* op, const std::vector<Tensor>& params, Fill&& fill, Launch&& launch) {
  for (const auto& batch : batches(params)) {
    const ::loom::cuda::DeviceGuard device_guard(params[batch.front()].device().index);  // launch on its GPU
    List list{};
    const int64_t blocks = plan_chunks(params, batch, list.chunks);
    for (size_t k = 0; k < batch.size(); ++k) fill(list, k, batch[k]);
    const Tensor& like = params[batch.front()];
    visit_float(like.dtype(), op, [&]<class T>() {
      launch.template operator()<T>(list, static_cast<unsigned>(blocks), stream_of(like));
      LOOM_CHECK_LAUNCH();
    });
  }
}

}  // namespace

void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffers, const std::vector<bool>& first_step, const SgdHyper& hyper,
              const Tensor& skip_if, const Tensor& lr) {
  const bool use_momentum = hyper.momentum != 0;
  LOOM_CHECK(grads.size() == params.size() && (!use_momentum || (momentum_buffers.size() == params.size() &&
                                                                 first_step.size() == params.size())),
             "fused SGD: ", params.size(), " parameters but ", grads.size(), " gradients and ",
             momentum_buffers.size(), " momentum buffers");
  for (size_t i = 0; i < params.size(); ++i) {
    check_cuda("fused SGD", params[i]);
    check_update_tensor("gradient", grads[i], params[i]);
    if (use_momentum) check_update_tensor("momentum buffer", momentum_buffers[i], params[i]);
    if (skip_if.defined()) check_scalar("the skip flag", skip_if, DType::i32, params[i].device());
    if (lr.defined()) check_scalar("the learning rate", lr, DType::f64, params[i].device());
  }
  const int* skip = skip_if.defined() ? skip_if.data<int32_t>() : nullptr;
  const double* device_lr = lr.defined() ? lr.data<double>() : nullptr;
  for_each_batch<SgdList>(
      "fused SGD", params,
      [&](SgdList& list, size_t k, size_t i) {
        list.param[k] = params[i].raw_data();
        list.grad[k] = grads[i].raw_data();
        list.buffer[k] = use_momentum ? momentum_buffers[i].raw_data() : nullptr;
        list.first[k] = use_momentum && first_step[i];
      },
      [&]<class T>(const SgdList& list, unsigned blocks, cudaStream_t stream) {
        using A = acc_t<T>;
        sgd_kernel<T><<<blocks, kThreads, 0, stream>>>(list, static_cast<A>(hyper.lr), static_cast<A>(hyper.momentum),
                                                       static_cast<A>(1 - hyper.dampening),
                                                       static_cast<A>(hyper.weight_decay), use_momentum, hyper.nesterov,
                                                       skip, device_lr);
      });
}

void adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avgs,
               const std::vector<Tensor>& exp_avg_sqs, const std::vector<int64_t>& steps, const AdamHyper& hyper,
               const std::vector<Tensor>& device_steps, const Tensor& skip_if, const Tensor& lr) {
  LOOM_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size() &&
                 steps.size() == params.size() && (device_steps.empty() || device_steps.size() == params.size()),
             "fused Adam: ", params.size(), " parameters but ", grads.size(), " gradients");
  for (size_t i = 0; i < params.size(); ++i) {
    check_cuda("fused Adam", params[i]);
    check_update_tensor("gradient", grads[i], params[i]);
    check_update_tensor("exp_avg", exp_avgs[i], params[i]);
    check_update_tensor("exp_avg_sq", exp_avg_sqs[i], params[i]);
    if (!device_steps.empty() && device_steps[i].defined())
      check_scalar("the step count", device_steps[i], DType::f64, params[i].device());
    if (skip_if.defined()) check_scalar("the skip flag", skip_if, DType::i32, params[i].device());
    if (lr.defined()) check_scalar("the learning rate", lr, DType::f64, params[i].device());
  }
  const AdamDevice device{skip_if.defined() ? skip_if.data<int32_t>() : nullptr,
                          lr.defined() ? lr.data<double>() : nullptr, hyper.lr, hyper.beta1, hyper.beta2,
                          hyper.weight_decay};
  for_each_batch<AdamList>(
      "fused Adam", params,
      [&](AdamList& list, size_t k, size_t i) {
        list.param[k] = params[i].raw_data();
        list.grad[k] = grads[i].raw_data();
        list.exp_avg[k] = exp_avgs[i].raw_data();
        list.exp_avg_sq[k] = exp_avg_sqs[i].raw_data();
        const double step = static_cast<double>(steps[i]);
        list.step_size[k] = hyper.lr / (1 - std::pow(hyper.beta1, step));
        list.sqrt_correction[k] = std::sqrt(1 - std::pow(hyper.beta2, step));
        list.device_step[k] =
            !device_steps.empty() && device_steps[i].defined() ? device_steps[i].data<double>() : nullptr;
      },
      [&]<class T>(const AdamList& list, unsigned blocks, cudaStream_t stream) {
        using A = acc_t<T>;
        bool counts_on_device = false;
        for (int k = 0; k < list.chunks.count; ++k) counts_on_device |= list.device_step[k] != nullptr;
        if (counts_on_device) {
          advance_steps_kernel<<<1, kMaxTensors, 0, stream>>>(list, device.skip);
          LOOM_CHECK_LAUNCH();
        }
        adam_kernel<T><<<blocks, kThreads, 0, stream>>>(
            list, static_cast<A>(hyper.beta1), static_cast<A>(hyper.beta2), static_cast<A>(hyper.eps),
            static_cast<A>(hyper.weight_decay), static_cast<A>(1 - hyper.lr * hyper.weight_decay), hyper.decoupled,
            device);
      });
}

namespace {
// Queues GradScaler's unscale kernels: one list per (device, source dtype,
// destination dtype) of up to kMaxTensors pairs, multiplying by `factor` or,
// with `scale`, by 1 / *scale; an inf or NaN sets the int at
// flag_on(device, stream), which the caller zeroed.
template <class FlagOn>
void queue_unscale(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations, double factor,
                   const double* scale, FlagOn&& flag_on) {
  LOOM_CHECK(sources.size() == destinations.size(), "unscale: ", sources.size(), " gradients but ",
             destinations.size(), " destinations");
  std::vector<Tensor> inputs;  // sources in their destinations' memory order
  for (size_t i = 0; i < sources.size(); ++i) {
    check_cuda("unscale", sources[i]);
    const Tensor& d = destinations[i];
    LOOM_CHECK(d.defined() && d.device() == sources[i].device() && in_a_memory_format(d) &&
                   d.numel() == sources[i].numel() && (d.dtype() == DType::f32 || d.dtype() == sources[i].dtype()),
               "unscale: destination ", d.defined() ? d.str() : "undefined", " does not match gradient ",
               sources[i].str(), " (same device and size, contiguous or channels-last, f32 or the gradient's dtype)");
    // The source in the destination's memory order (a channels-last gradient unscaled in place stays so).
    inputs.push_back(in_memory_format(sources[i], memory_format_of(d)));
  }
  std::map<std::tuple<int, int, int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].numel() == 0) continue;
    groups[{inputs[i].device().index, static_cast<int>(inputs[i].dtype()), static_cast<int>(destinations[i].dtype())}]
        .push_back(i);
  }
  for (auto& [key, indices] : groups) {
    const int device = std::get<0>(key);
    const ::loom::cuda::DeviceGuard device_guard(device);  // the memset and kernels run on the current device
    int* found = flag_on(device, stream_of(inputs[indices.front()]));
    for (size_t start = 0; start < indices.size(); start += kMaxTensors) {
      const std::vector<size_t> batch(indices.begin() + start,
                                      indices.begin() + std::min(indices.size(), start + kMaxTensors));
      UnscaleList list{};
      const int64_t blocks = plan_chunks(inputs, batch, list.chunks);
      for (size_t k = 0; k < batch.size(); ++k) {
        list.source[k] = inputs[batch[k]].raw_data();
        list.destination[k] = destinations[batch[k]].raw_data();
      }
      const Tensor& like = inputs[batch.front()];
      const bool to_f32 = destinations[batch.front()].dtype() == DType::f32;
      visit_float(like.dtype(), "unscale", [&]<class S>() {
        if (to_f32) {
          unscale_kernel<S, float><<<static_cast<unsigned>(blocks), kThreads, 0, stream_of(like)>>>(
              list, static_cast<acc_t<S>>(factor), scale, found);
        } else {
          unscale_kernel<S, S><<<static_cast<unsigned>(blocks), kThreads, 0, stream_of(like)>>>(
              list, static_cast<acc_t<S>>(factor), scale, found);
        }
        LOOM_CHECK_LAUNCH();
      });
    }
  }
}
}  // namespace

bool unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations, double factor) {
  std::vector<std::pair<int, ::loom::cuda::DeviceBuffer>> flags;  // (device, int flag)
  queue_unscale(sources, destinations, factor, nullptr, [&](int device, cudaStream_t stream) {
    auto flag = std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == device; });
    if (flag == flags.end()) {
      flags.emplace_back(device, ::loom::cuda::DeviceBuffer(sizeof(int), device));
      flag = flags.end() - 1;
      LOOM_CHECK_CUDA(cudaMemsetAsync(flag->second.data(), 0, sizeof(int), stream));
    }
    return static_cast<int*>(flag->second.data());
  });
  bool any = false;
  for (auto& [device, buffer] : flags) {
    int value = 0;
    ::loom::cuda::copy_bytes(&value, false, buffer.data(), true, sizeof(int), device);  // waits for the kernels
    any |= value != 0;
  }
  return any;
}

void unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations,
                       const Tensor& scale, const Tensor& found_inf) {
  check_cuda("unscale", scale);
  check_scalar("scale", scale, DType::f64, scale.device());
  check_scalar("found_inf", found_inf, DType::i32, scale.device());
  queue_unscale(sources, destinations, 1.0, scale.data<double>(), [&](int device, cudaStream_t) {
    LOOM_CHECK(device == scale.device().index, "unscale: a gradient is on cuda:", device, ", the loss scale on ",
               scale.device().str());
    return found_inf.data<int32_t>();
  });
}

void update_scale(const Tensor& scale, const Tensor& loss_scale, const Tensor& growth_tracker,
                  const Tensor& skipped_steps, const Tensor& found_inf, const ScaleSchedule& schedule) {
  check_cuda("loss scale update", scale);
  const Device device = scale.device();
  check_scalar("scale", scale, DType::f64, device);
  check_scalar("loss_scale", loss_scale, DType::f32, device);
  check_scalar("growth_tracker", growth_tracker, DType::i64, device);
  check_scalar("skipped_steps", skipped_steps, DType::i64, device);
  check_scalar("found_inf", found_inf, DType::i32, device);
  const ::loom::cuda::DeviceGuard device_guard(device.index);
  update_scale_kernel<<<1, 1, 0, stream_of(scale)>>>(scale.data<double>(), loss_scale.data<float>(),
                                                     growth_tracker.data<int64_t>(), skipped_steps.data<int64_t>(),
                                                     found_inf.data<int32_t>(), schedule);
  LOOM_CHECK_LAUNCH();
}

void copy_tensors(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations) {
  LOOM_CHECK(sources.size() == destinations.size(), "fused copy: ", sources.size(), " sources but ",
             destinations.size(), " destinations");
  // One for_each_batch per destination dtype; it groups the sources by (device, dtype).
  std::map<int, std::pair<std::vector<Tensor>, std::vector<Tensor>>> by_destination_dtype;
  for (size_t i = 0; i < sources.size(); ++i) {
    const Tensor &s = sources[i], &d = destinations[i];
    check_cuda("fused copy", s);
    // Both contiguous, or both channels-last (masters of a channels-last model): one memory order.
    LOOM_CHECK(d.defined() && d.device() == s.device() && d.numel() == s.numel() &&
                   ((d.is_contiguous() && s.is_contiguous()) || same_dense_layout(d, s)) && is_floating(s.dtype()) &&
                   is_floating(d.dtype()),
               "fused copy: destination ", d.defined() ? d.str() : "undefined", " does not match source ", s.str(),
               " (floating dtypes, same device and size, both contiguous or both channels-last)");
    auto& [from, to] = by_destination_dtype[static_cast<int>(d.dtype())];
    from.push_back(s);
    to.push_back(d);
  }
  for (auto& [dtype, pairs] : by_destination_dtype) {
    const auto& [from, to] = pairs;
    for_each_batch<UnscaleList>(
        "fused copy", from,
        [&](UnscaleList& list, size_t k, size_t i) {
          list.source[k] = from[i].raw_data();
          list.destination[k] = to[i].raw_data();
        },
        [&]<class S>(const UnscaleList& list, unsigned blocks, cudaStream_t stream) {
          visit_float(static_cast<DType>(dtype), "fused copy", [&]<class D>() {
            copy_kernel<S, D><<<blocks, kThreads, 0, stream>>>(list);
          });
        });
  }
}

double norm_terms(const std::vector<Tensor>& gradients, double norm_type) {
  const NormTerms terms{norm_type, std::isinf(norm_type)};
  for (const Tensor& g : gradients) {
    check_cuda("clip_grad_norm_", g);
    LOOM_CHECK(in_a_memory_format(g), "clip_grad_norm_: gradient ", g.str(),
               " is neither contiguous nor channels-last");
  }
  // Every batch's kernel is queued before the first partial sums are read
  // back, so the host waits for the device once, not once per batch.
  struct Partials {
    ::loom::cuda::DeviceBuffer sums;
    unsigned blocks;
    int device;
  };
  std::vector<Partials> partials;
  for_each_batch<GradientList>(
      "clip_grad_norm_", gradients, [&](GradientList& list, size_t k, size_t i) { list.grad[k] = gradients[i].raw_data(); },
      [&]<class T>(const GradientList& list, unsigned blocks, cudaStream_t stream) {
        const int device = ::loom::cuda::current_device();
        partials.push_back({::loom::cuda::DeviceBuffer(blocks * sizeof(double), device), blocks, device});
        norm_terms_kernel<T><<<blocks, kThreads, 0, stream>>>(list, terms, static_cast<double*>(partials.back().sums.data()));
      });
  double total = 0;
  for (const Partials& part : partials) {
    std::vector<double> host(part.blocks);
    ::loom::cuda::copy_bytes(host.data(), false, part.sums.data(), true, part.blocks * sizeof(double), part.device);
    for (double v : host) total = terms.combine(total, v);
  }
  return total;
}

void clamp_(const std::vector<Tensor>& gradients, double clip_value) {
  for (const Tensor& g : gradients) {
    check_cuda("clip_grad_value_", g);
    LOOM_CHECK(in_a_memory_format(g), "clip_grad_value_: gradient ", g.str(),
               " is neither contiguous nor channels-last");
  }
  for_each_batch<GradientList>(
      "clip_grad_value_", gradients, [&](GradientList& list, size_t k, size_t i) { list.grad[k] = gradients[i].raw_data(); },
      [&]<class T>(const GradientList& list, unsigned blocks, cudaStream_t stream) {
        clamp_kernel<T><<<blocks, kThreads, 0, stream>>>(list, static_cast<acc_t<T>>(clip_value));
      });
}

}  // namespace loom::optim::cuda
