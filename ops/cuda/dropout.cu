// CUDA kernel of dropout's and stochastic depth's mask (ops/dropout.h): the
// same (seed, index) draw as the CPU's, so both backends give one mask.
#include <loom/ops/cuda/common.cuh>
#include <loom/ops/dropout.h>
#include <loom/ops/dropout_math.h>

namespace loom::ops::cuda {
using namespace cuda_detail;

namespace {

// out[i] = 1 / (1 - p) where dropout_keep(seed, i, p), else 0 (ops/dropout_math.h).
template <class T>
static __global__ void dropout_mask_kernel(T* out, int64_t n, double p, uint64_t seed) {
  const double kept = dropout_scale(p);
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    out[i] = from_acc<T>(static_cast<acc_t<T>>(dropout_keep(seed, static_cast<uint64_t>(i), p) ? kept : 0.0));
  }
}

}  // namespace

void dropout_mask(const Tensor& out, double p, uint64_t seed) {
  const auto device_guard = on_device_of("dropout", out);
  LOOM_CHECK(out.is_contiguous(), "dropout_mask: expected a contiguous tensor, got ", out.str());
  visit_float(out.dtype(), "dropout", [&]<class T>() {
    dropout_mask_kernel<T><<<blocks_for(out.numel()), kThreads, 0, stream_of(out)>>>(out.data<T>(), out.numel(), p,
                                                                                     seed);
    LOOM_CHECK_LAUNCH();
  });
}

}  // namespace loom::ops::cuda
