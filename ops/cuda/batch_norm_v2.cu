// Batch norm's CUDA kernels at memory speed (issue 46), chosen by
// LOOM_CUDA_BATCH_NORM=v2 (ops/batch_norm_cuda_kernels.h); v1
// (ops/cuda/batch_norm.cu) stays the default and checks the arguments. NOT YET
// RUN ON A GPU: written and compiled without one.
//
// Each pass reads 16-byte vectors (V = 4 f32 or 8 f16 / bf16 elements) when
// every pointer is 16-byte aligned and a vector never straddles channels, else
// single elements (V = 1). No element's channel takes a division:
//   (N, C, S) contiguous: block (c, split) of (lanes, planes) threads; thread
//     (lane, plane) reads vectors lane, lane + lanes, ... of planes (n, c),
//     n = split * planes + plane, stepping planes * splits. An input with S = 1
//     is (N, C) channels-last.
//   (M, C) channels-last: block (channel group, split) of (lanes, rows)
//     threads; a thread owns the V channels of one vector and reads them in
//     rows m = split * rows + row, stepping rows * splits.
// Per-channel coefficients are computed in f64 by math:: (ops/batch_norm_math.h)
// once per block into shared memory and applied in f32, as v1 does, so the
// fused ReLU's mask is v1's bit for bit. Sums accumulate in f32 per thread, are
// added in a fixed tree inside the block, written as per-block partials and
// added over blocks in f64 by one warp per channel in a fixed order:
// deterministic, no atomics. The statistics sum x - K and (x - K)^2, K the
// channel's first element, so that a mean far from zero does not cancel the
// variance in f32; backward sums g and g * (x - mean). Expected agreement with
// v1 (f64 sums): the variance within ~1e-6 * (var + (mean - K)^2), so ~1e-6
// relative when K is a few standard deviations from the mean.
// Launches: forward stats + finish, (v1's gather_stats), apply; backward
// reduce + finish, apply (with batch_norm_add_relu's masked gradient written by
// the reduce pass).
#include <loom/ops/batch_norm_cuda_kernels.h>
#include <loom/ops/cuda/batch_norm_internal.cuh>
#include <loom/ops/elementwise_math.h>

#include <initializer_list>

namespace loom::ops::cuda::batch_norm_v2 {
using namespace cuda_detail;

namespace {
namespace math = batch_norm_math;
using math::with_flag;

constexpr int kBlockThreads = 256;
// At least 4 resident blocks (half the SM's threads) of every pass: its
// registers capped at 64, so that enough 16-byte loads are in flight.
constexpr int kMinBlocksPerSm = 4;
constexpr int kMaxCoefficients = 6;

// V elements of T in 16 bytes (or one element when V = 1).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T lane[V];
};
template <class T>
constexpr int kVector = 16 / static_cast<int>(sizeof(T));

template <int V, class T>
__device__ __forceinline__ Pack<T, V> load(const T* p, int64_t vector) {
  return reinterpret_cast<const Pack<T, V>*>(p)[vector];
}
template <int V, class T>
__device__ __forceinline__ void store(T* p, int64_t vector, const Pack<T, V>& value) {
  reinterpret_cast<Pack<T, V>*>(p)[vector] = value;
}

// Where a kernel's threads find their vectors; set by plan().
struct Layout {
  int64_t channels;    // C
  int64_t rows;        // N planes (N, C, S), N * H * W rows (M, C)
  int64_t row_stride;  // vectors from one row of a channel to the next: C * columns, or C / V
  int64_t columns;     // vectors per row of one channel: S / V, or 1
  int64_t pivot_stride;  // element offset of channel c's first element is c * pivot_stride
};

// One thread's place: the first channel of its vector and, NCHW, the block's channel.
template <bool ChannelsLast, int V>
struct Place {
  static constexpr int kChannels = ChannelsLast ? V : 1;  // distinct channels per vector
  int64_t first_channel;
  int64_t base;  // vector index of the thread's channel (group) in row 0
  bool active;
  __device__ explicit Place(const Layout& l) {
    if constexpr (ChannelsLast) {
      const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
      first_channel = group * V;
      base = group;
      active = first_channel < l.channels;
    } else {
      first_channel = blockIdx.x;
      base = static_cast<int64_t>(blockIdx.x) * l.columns;
      active = true;
    }
  }
  // The slot of vector lane e among the thread's channels.
  static __device__ __forceinline__ int slot(int e) { return ChannelsLast ? e : 0; }
};

// Calls body(vector index) for each of the thread's vectors.
template <bool ChannelsLast, int V, class Body>
__device__ __forceinline__ void for_each_vector(const Layout& l, const Place<ChannelsLast, V>& p, Body&& body) {
  if (!p.active) return;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < l.rows; row += step) {
    const int64_t start = row * l.row_stride + p.base;
    if constexpr (ChannelsLast) {
      body(start);
    } else {
      for (int64_t column = threadIdx.x; column < l.columns; column += blockDim.x) body(start + column);
    }
  }
}

// The block's per-channel coefficients: compute(c, float* out) fills Count
// values once per channel of the block (into shared memory); each thread then
// takes its own channels' (out[k][slot]). Every thread of the block must call it.
template <int Count, bool ChannelsLast, int V, class Compute>
__device__ __forceinline__ void channel_coefficients(const Layout& l, const Place<ChannelsLast, V>& p, Compute&& compute,
                                                     float (&out)[Count][Place<ChannelsLast, V>::kChannels]) {
  static_assert(Count <= kMaxCoefficients);
  __shared__ float shared[kBlockThreads][kMaxCoefficients];
  const int block_channels = ChannelsLast ? static_cast<int>(blockDim.x) * V : 1;
  const int64_t block_first = ChannelsLast ? static_cast<int64_t>(blockIdx.x) * blockDim.x * V : blockIdx.x;
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  if (t < block_channels && block_first + t < l.channels) compute(block_first + t, shared[t]);
  __syncthreads();
  const int local = ChannelsLast ? threadIdx.x * V : 0;
#pragma unroll
  for (int e = 0; e < Place<ChannelsLast, V>::kChannels; ++e) {
    const bool valid = p.active && (!ChannelsLast || p.first_channel + e < l.channels);
#pragma unroll
    for (int k = 0; k < Count; ++k) out[k][e] = valid ? shared[local + e][k] : 0.0f;
  }
}

// Adds each thread's (a, b) over the block's threads of one channel (all of
// them NCHW, one column of threads channels-last) in a fixed tree and writes
// partial[blockIdx.y][c] (a) and partial[gridDim.y + blockIdx.y][c] (b).
template <bool ChannelsLast, int V>
__device__ __forceinline__ void write_block_sums(const Layout& l, const Place<ChannelsLast, V>& p,
                                                 const float (&a)[Place<ChannelsLast, V>::kChannels],
                                                 const float (&b)[Place<ChannelsLast, V>::kChannels], float* partial) {
  constexpr int kChannels = Place<ChannelsLast, V>::kChannels;
  __shared__ float scratch[2][kBlockThreads * kChannels];
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int e = 0; e < kChannels; ++e) {
    scratch[0][t * kChannels + e] = a[e];
    scratch[1][t * kChannels + e] = b[e];
  }
  const int count = ChannelsLast ? blockDim.y : blockDim.x * blockDim.y;  // threads summed together
  const int index = ChannelsLast ? threadIdx.y : t;
  const int unit = ChannelsLast ? blockDim.x * kChannels : kChannels;  // scratch distance of index + 1
  int half = 1;
  while (half < count) half *= 2;
  for (half /= 2; half > 0; half /= 2) {
    __syncthreads();
    if (index < half && index + half < count) {
#pragma unroll
      for (int e = 0; e < kChannels; ++e) {
        scratch[0][t * kChannels + e] += scratch[0][t * kChannels + e + half * unit];
        scratch[1][t * kChannels + e] += scratch[1][t * kChannels + e + half * unit];
      }
    }
  }
  __syncthreads();
  if (index != 0 || !p.active) return;
#pragma unroll
  for (int e = 0; e < kChannels; ++e) {
    const int64_t c = p.first_channel + e;
    if (c >= l.channels) continue;
    partial[static_cast<int64_t>(blockIdx.y) * l.channels + c] = scratch[0][t * kChannels + e];
    partial[static_cast<int64_t>(gridDim.y + blockIdx.y) * l.channels + c] = scratch[1][t * kChannels + e];
  }
}

// The per-channel inputs of every pass (undefined ones null).
struct ChannelInputs {
  ChannelArray mean, var, weight, bias;  // bias: the forward's, for the fused ReLU's mask
  ChannelArray mask_weight;              // the fused ReLU's weight (FusedRelu::weight)
  double eps = 0;
};

// The fused ReLU's (scale, shift) of channel c into out[0], out[1]: the
// forward's coefficients, rounded to f32 as the forward applies them.
__device__ __forceinline__ void mask_coefficients(const ChannelInputs& in, int64_t c, float* out) {
  const math::Affine affine = math::affine(
      channel_value(in.mean.data, in.mean.dtype, c, 0.0), channel_value(in.var.data, in.var.dtype, c, 1.0),
      channel_value(in.mask_weight.data, in.mask_weight.dtype, c, 1.0),
      channel_value(in.bias.data, in.bias.dtype, c, 0.0), in.eps);
  out[0] = static_cast<float>(affine.scale);
  out[1] = static_cast<float>(affine.shift);
}

// ---- per-channel sums ----

enum class Reduction {
  statistics,            // x - K, (x - K)^2
  gradient,              // g = dy: g, g (x - mean)
  gradient_relu,         // g = dy where x * scale + shift > 0 (FusedRelu)
  gradient_relu_output,  // g = dy where output > 0, written to `masked`
};

template <class T, int V, bool ChannelsLast, Reduction R>
static __global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    reduce_kernel(const T* x, const T* dy, const T* output, T* masked, ChannelInputs in, Layout l, float* partial) {
  using P = Place<ChannelsLast, V>;
  const P p(l);
  // statistics: {K}; gradient: {mean, mask scale, mask shift}.
  constexpr int kCount = R == Reduction::statistics ? 1 : 3;
  float k[kCount][P::kChannels];
  channel_coefficients<kCount>(l, p,
                               [&](int64_t c, float* out) {
                                 if constexpr (R == Reduction::statistics) {
                                   out[0] = to_acc(x[c * l.pivot_stride]);
                                 } else {
                                   out[0] = static_cast<float>(load_as_double(in.mean.data, in.mean.dtype, c));
                                   if constexpr (R == Reduction::gradient_relu) mask_coefficients(in, c, out + 1);
                                 }
                               },
                               k);
  float a[P::kChannels] = {}, b[P::kChannels] = {};
  for_each_vector(l, p, [&](int64_t at) {
    const Pack<T, V> xv = load<V>(x, at);
    if constexpr (R == Reduction::statistics) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int s = P::slot(e);
        const float d = to_acc(xv.lane[e]) - k[0][s];
        a[s] += d;
        b[s] += d * d;
      }
    } else {
      const Pack<T, V> dyv = load<V>(dy, at);
      Pack<T, V> outv, gv;
      if constexpr (R == Reduction::gradient_relu_output) outv = load<V>(output, at);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int s = P::slot(e);
        const float xe = to_acc(xv.lane[e]);
        float g = to_acc(dyv.lane[e]);
        if constexpr (R == Reduction::gradient_relu) g = math::relu_masked(g, xe, k[1][s], k[2][s]);
        if constexpr (R == Reduction::gradient_relu_output) {
          g = Relu::backward(g, to_acc(outv.lane[e]));
          gv.lane[e] = from_acc<T>(g);
        }
        a[s] += g;
        b[s] += g * (xe - k[0][s]);
      }
      if constexpr (R == Reduction::gradient_relu_output) store<V>(masked, at, gv);
    }
  });
  write_block_sums(l, p, a, b, partial);
}

// out (2, C) f64: the partials added over `splits` blocks by one warp per
// channel (lane j adds splits j, j + 32, ... in order, then a fixed shuffle
// tree). Statistics (pivot != null): shifted back, sum = n K + S1, sum of
// squares = S2 + 2 K S1 + n K^2. Backward: the second row scaled by
// 1 / sqrt(var + eps).
static __global__ void finish_kernel(const float* partial, int64_t channels, int splits, const void* pivot,
                                     DType pivot_dtype, int64_t pivot_stride, double count, ChannelArray var,
                                     double eps, double* out) {
  const int lane = threadIdx.x % 32;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (c >= channels) return;  // the whole warp: c is the warp's
  double a = 0, b = 0;
  for (int s = lane; s < splits; s += 32) {
    a += partial[static_cast<int64_t>(s) * channels + c];
    b += partial[static_cast<int64_t>(splits + s) * channels + c];
  }
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane != 0) return;
  if (pivot != nullptr) {
    const double k = load_as_double(pivot, pivot_dtype, c * pivot_stride);
    b += 2 * k * a + count * k * k;
    a += count * k;
  } else {
    b *= math::inverse_std(load_as_double(var.data, var.dtype, c), eps);
  }
  out[c] = a;
  out[channels + c] = b;
}

// ---- element-wise passes ----

template <class T, int V, bool ChannelsLast, bool Relu, bool Residual>
static __global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    apply_kernel(const T* x, const T* residual, T* y, ChannelInputs in, Layout l) {
  using P = Place<ChannelsLast, V>;
  const P p(l);
  float k[2][P::kChannels];  // scale, shift
  channel_coefficients<2>(l, p,
                          [&](int64_t c, float* out) { mask_coefficients(in, c, out); },
                          k);
  for_each_vector(l, p, [&](int64_t at) {
    const Pack<T, V> xv = load<V>(x, at);
    Pack<T, V> rv, yv;
    if constexpr (Residual) rv = load<V>(residual, at);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int s = P::slot(e);
      const float r = Residual ? to_acc(rv.lane[e]) : 0.0f;
      yv.lane[e] = from_acc<T>(math::epilogue<Relu, Residual>(to_acc(xv.lane[e]), r, k[0][s], k[1][s]));
    }
    store<V>(y, at, yv);
  });
}

// Training: dx = k (g - mean_dy) - p (x - mean); eval: dx = k g (math::backward).
template <class T, int V, bool ChannelsLast, bool Masked, bool Training>
static __global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    backward_apply_kernel(const T* dy, const T* x, T* dx, ChannelInputs in, const double* sums, ElementCount count,
                          Layout l) {
  using P = Place<ChannelsLast, V>;
  const P p(l);
  float k[6][P::kChannels];  // k, mean_dy, mean, p, mask scale, mask shift
  channel_coefficients<6>(l, p,
                          [&](int64_t c, float* out) {
                            const double var_c = channel_value(in.var.data, in.var.dtype, c, 1.0);
                            const double weight_c = channel_value(in.weight.data, in.weight.dtype, c, 1.0);
                            if constexpr (Training) {
                              const math::Backward b =
                                  math::backward(var_c, weight_c, in.eps, sums[c], sums[l.channels + c],
                                                 count.value());
                              out[0] = static_cast<float>(b.k);
                              out[1] = static_cast<float>(b.mean_dy);
                              out[2] = static_cast<float>(channel_value(in.mean.data, in.mean.dtype, c, 0.0));
                              out[3] = static_cast<float>(b.p);
                            } else {
                              out[0] = static_cast<float>(math::eval_backward_scale(var_c, weight_c, in.eps));
                            }
                            if constexpr (Masked) mask_coefficients(in, c, out + 4);
                          },
                          k);
  for_each_vector(l, p, [&](int64_t at) {
    const Pack<T, V> dyv = load<V>(dy, at);
    Pack<T, V> xv, dxv;
    if constexpr (Masked || Training) xv = load<V>(x, at);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int s = P::slot(e);
      float g = to_acc(dyv.lane[e]);
      if constexpr (Masked) g = math::relu_masked(g, to_acc(xv.lane[e]), k[4][s], k[5][s]);
      if constexpr (Training) {
        dxv.lane[e] = from_acc<T>(k[0][s] * (g - k[1][s]) - k[3][s] * (to_acc(xv.lane[e]) - k[2][s]));
      } else {
        dxv.lane[e] = from_acc<T>(g * k[0][s]);
      }
    }
    store<V>(dx, at, dxv);
  });
}

// ---- host side ----

// A pass's launch: vectors of V elements (kVector<T> or 1), its layout and grid.
struct Plan {
  bool channels_last;
  bool vectors;  // V = kVector<T>, else 1
  Layout layout;
  dim3 grid, block;
  int splits() const { return static_cast<int>(grid.y); }
};

bool aligned(const Tensor& t) { return !t.defined() || reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

int device_blocks(const Tensor& t) {
  int sms = 0;
  LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, t.device().index));
  return sms * (2048 / kBlockThreads);  // one full wave of resident blocks
}

// How passes over tensors of geometry l walk them; `tensors` are every tensor
// the pass reads or writes (their alignment decides the vector width).
Plan plan(const ChannelGeometry& l, std::initializer_list<Tensor> tensors, DType dtype, int device_blocks) {
  Plan plan;
  // (N, C, 1) is (N, C) channels-last.
  plan.channels_last = l.channels_last || l.inner == 1;
  const int64_t vector = 16 / static_cast<int64_t>(element_size(dtype));
  const int64_t run = plan.channels_last ? l.channels : l.inner;  // elements of one channel in a row
  plan.vectors = run % vector == 0;
  for (const Tensor& t : tensors) plan.vectors = plan.vectors && aligned(t);
  const int64_t v = plan.vectors ? vector : 1;
  Layout& layout = plan.layout;
  layout.channels = l.channels;
  int64_t channel_blocks = 0;
  if (plan.channels_last) {
    const int64_t groups = l.channels / v;
    int lanes = 1;
    while (lanes < 32 && lanes < groups) lanes *= 2;
    plan.block = dim3(lanes, kBlockThreads / lanes);
    channel_blocks = (groups + lanes - 1) / lanes;
    layout.rows = l.batch * l.inner;
    layout.row_stride = groups;
    layout.columns = 1;
    layout.pivot_stride = 1;
  } else {
    layout.columns = l.inner / v;
    const int lanes = static_cast<int>(std::min<int64_t>(layout.columns, kBlockThreads));
    plan.block = dim3(lanes, kBlockThreads / lanes);
    channel_blocks = l.channels;
    layout.rows = l.batch;
    layout.row_stride = l.channels * layout.columns;
    layout.pivot_stride = l.inner;
  }
  // Enough blocks for two waves, each thread with at least ~4 vectors.
  const int64_t per_row = plan.channels_last ? 1 : (layout.columns + plan.block.x - 1) / plan.block.x;
  const int64_t rows_per_thread = std::max<int64_t>(1, 4 / per_row);
  const int64_t most = (layout.rows + plan.block.y * rows_per_thread - 1) / (plan.block.y * rows_per_thread);
  const int64_t wanted = (2 * static_cast<int64_t>(device_blocks) + channel_blocks - 1) / channel_blocks;
  plan.grid = dim3(static_cast<unsigned>(channel_blocks),
                   static_cast<unsigned>(std::clamp<int64_t>(std::min(most, wanted), 1, 65535)));
  return plan;
}

// Calls fn.template operator()<T, V, ChannelsLast>() for the plan and dtype.
template <class Fn>
void visit_plan(DType dtype, const Plan& plan, Fn&& fn) {
  visit_float(dtype, "batch_norm", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      LOOM_FAIL("batch_norm: LOOM_CUDA_BATCH_NORM=v2 has no f64 kernels (v1 runs them)");
    } else {
      with_flag(plan.vectors, [&]<bool Vectors>() {
        with_flag(plan.channels_last, [&]<bool ChannelsLast>() {
          fn.template operator()<T, Vectors ? kVector<T> : 1, ChannelsLast>();
        });
      });
    }
  });
}

// The reduction pass then the finishing kernel: (2, C) f64.
template <Reduction R>
Tensor channel_sums(const Tensor& x, const Tensor& dy, const Tensor& output, const Tensor& masked,
                    const ChannelGeometry& l, const ChannelInputs& in) {
  Tensor out = Tensor::empty({2, l.channels}, DType::f64, x.device());
  if (l.channels == 0) return out;
  if (l.per_channel() == 0) return Tensor::zeros({2, l.channels}, DType::f64, x.device());
  const cudaStream_t stream = stream_of(x);
  const Plan p = plan(l, {x, dy, output, masked}, x.dtype(), device_blocks(x));
  const Tensor partial = Tensor::empty({2, p.splits(), l.channels}, DType::f32, x.device());
  visit_plan(x.dtype(), p, [&]<class T, int V, bool ChannelsLast>() {
    reduce_kernel<T, V, ChannelsLast, R><<<p.grid, p.block, 0, stream>>>(
        x.data<T>(), dy.defined() ? dy.data<T>() : nullptr, output.defined() ? output.data<T>() : nullptr,
        masked.defined() ? const_cast<T*>(masked.data<T>()) : nullptr, in, p.layout, partial.data<float>());
    LOOM_CHECK_LAUNCH();
  });
  const bool statistics = R == Reduction::statistics;
  finish_kernel<<<static_cast<unsigned>((l.channels * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partial.data<float>(), l.channels, p.splits(), statistics ? x.raw_data() : nullptr, x.dtype(),
      p.layout.pivot_stride, static_cast<double>(l.per_channel()), in.var, in.eps, out.data<double>());
  LOOM_CHECK_LAUNCH();
  return out;
}

}  // namespace

bool runs(DType dtype) { return dtype != DType::f64 && cuda_batch_norm_kernels() == CudaBatchNormKernels::v2; }

Tensor stats(const Tensor& x, const ChannelGeometry& l) {
  return channel_sums<Reduction::statistics>(x, Tensor(), Tensor(), Tensor(), l, {});
}

void apply(const Tensor& x, const Tensor& residual, const Tensor& y, const ChannelGeometry& l, const Tensor& mean,
           const Tensor& var, const Tensor& weight, const Tensor& bias, double eps, Activation activation) {
  const Plan p = plan(l, {x, residual, y}, x.dtype(), device_blocks(x));
  // The forward's (scale, shift) are the fused ReLU's mask coefficients for the same weight.
  const ChannelInputs in{channel_array(mean), channel_array(var), channel_array(weight), channel_array(bias),
                         channel_array(weight), eps};
  visit_plan(x.dtype(), p, [&]<class T, int V, bool ChannelsLast>() {
    with_flag(activation == Activation::relu, [&]<bool Relu>() {
      with_flag(residual.defined(), [&]<bool Residual>() {
        apply_kernel<T, V, ChannelsLast, Relu, Residual><<<p.grid, p.block, 0, stream_of(x)>>>(
            x.data<T>(), Residual ? residual.data<T>() : nullptr, const_cast<T*>(y.data<T>()), in, p.layout);
        LOOM_CHECK_LAUNCH();
      });
    });
  });
}

Tensor backward_reduce(const Tensor& dy, const Tensor& x, const ChannelGeometry& l, const Tensor& mean,
                       const Tensor& var, double eps, const FusedRelu& relu) {
  const ChannelInputs in{channel_array(mean), channel_array(var), {}, channel_array(relu.bias),
                         channel_array(relu.weight), eps};
  if (relu.enabled) return channel_sums<Reduction::gradient_relu>(x, dy, Tensor(), Tensor(), l, in);
  return channel_sums<Reduction::gradient>(x, dy, Tensor(), Tensor(), l, in);
}

std::pair<Tensor, Tensor> backward_reduce_relu_output(const Tensor& dy, const Tensor& output, const Tensor& x,
                                                      const ChannelGeometry& l, const Tensor& mean, const Tensor& var,
                                                      double eps) {
  const Tensor masked = empty_with_format(x.sizes(), x.dtype(), x.device(),
                                          l.channels_last ? MemoryFormat::nhwc : MemoryFormat::nchw);
  const ChannelInputs in{channel_array(mean), channel_array(var), {}, {}, {}, eps};
  Tensor sums = channel_sums<Reduction::gradient_relu_output>(x, dy, output, masked, l, in);
  return {sums, masked};
}

void backward_apply(const Tensor& dy, const Tensor& x, const Tensor& dx, const ChannelGeometry& l, const Tensor& mean,
                    const Tensor& var, const Tensor& weight, const Tensor& grad_sums, ElementCount count,
                    double eps, const FusedRelu& relu) {
  const Plan p = plan(l, {dy, x, dx}, dy.dtype(), device_blocks(dy));
  const ChannelInputs in{channel_array(mean),      channel_array(var),         channel_array(weight),
                         channel_array(relu.bias), channel_array(relu.weight), eps};
  const bool training = grad_sums.defined();
  visit_plan(dy.dtype(), p, [&]<class T, int V, bool ChannelsLast>() {
    with_flag(relu.enabled, [&]<bool Masked>() {
      with_flag(training, [&]<bool Training>() {
        backward_apply_kernel<T, V, ChannelsLast, Masked, Training><<<p.grid, p.block, 0, stream_of(dy)>>>(
            dy.data<T>(), x.defined() ? x.data<T>() : nullptr, const_cast<T*>(dx.data<T>()), in,
            Training ? grad_sums.data<double>() : nullptr, count, p.layout);
        LOOM_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace loom::ops::cuda::batch_norm_v2
