// The per-channel coefficients the fused convolution graphs take of a batch
// norm (ops/cuda/conv2d_graph.h, graph_batch_norm), in one launch.
#include <loom/ops/cuda/common.cuh>
#include <loom/ops/cuda/conv2d_graph.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// A (C) tensor's element c as f64, of any floating dtype; `fallback` where it is undefined.
struct PerChannel {
  const void* data = nullptr;
  DType dtype = DType::f32;
  double fallback = 0;
  __device__ double operator[](int64_t c) const { return data ? load_as_double(data, dtype, c) : fallback; }
};

PerChannel per_channel(const Tensor& t, double fallback) {
  return t.defined() ? PerChannel{t.raw_data(), t.dtype(), fallback} : PerChannel{nullptr, DType::f32, fallback};
}

__global__ void graph_batch_norm_kernel(PerChannel mean, PerChannel var, PerChannel weight, PerChannel bias, double eps,
                                        int64_t channels, void* scale, void* shift, DType dtype, float* mean_out,
                                        float* invstd_out, float* gamma_out, float* beta_out) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    const double invstd = 1.0 / sqrt(var[c] + eps);
    const double gamma = weight[c], beta = bias[c];
    store_from_double(scale, dtype, c, gamma * invstd);
    store_from_double(shift, dtype, c, beta - mean[c] * gamma * invstd);
    mean_out[c] = static_cast<float>(mean[c]);
    invstd_out[c] = static_cast<float>(invstd);
    gamma_out[c] = static_cast<float>(gamma);
    beta_out[c] = static_cast<float>(beta);
  }
}

}  // namespace

GraphBatchNorm graph_batch_norm(const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                                double eps, DType dtype) {
  const auto device_guard = on_device_of("graph_batch_norm", mean);
  const int64_t channels = mean.numel();
  // Contiguous (C) views (rows of a (2, C) tensor are); a strided one is copied.
  const Tensor m = mean.contiguous(), v = var.contiguous();
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor(), b = bias.defined() ? bias.contiguous() : Tensor();
  for (const Tensor* t : {&m, &v, &w, &b}) {
    LOOM_CHECK(!t->defined() || (t->numel() == channels && t->device() == mean.device() && is_floating(t->dtype())),
               "graph_batch_norm: expected (", channels, ") floating-point tensors on ", mean.device().str(), ", got ",
               t->str());
  }
  const Device device = mean.device();
  GraphBatchNorm out{Tensor::empty({channels}, dtype, device), Tensor::empty({channels}, dtype, device),
                     BatchNormSaved{Tensor::empty({channels}, DType::f32, device),
                                    Tensor::empty({channels}, DType::f32, device),
                                    Tensor::empty({channels}, DType::f32, device),
                                    Tensor::empty({channels}, DType::f32, device)}};
  graph_batch_norm_kernel<<<blocks_for(channels), kThreads, 0, stream_of(m)>>>(
      per_channel(m, 0), per_channel(v, 1), per_channel(w, 1), per_channel(b, 0), eps, channels, out.scale.raw_data(),
      out.shift.raw_data(), dtype, out.saved.mean.data<float>(), out.saved.invstd.data<float>(),
      out.saved.gamma.data<float>(), out.saved.beta.data<float>());
  LOOM_CHECK_LAUNCH();
  return out;
}

}  // namespace loom::ops::cuda
