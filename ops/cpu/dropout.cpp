// CPU kernel of dropout's and stochastic depth's mask (ops/dropout.h).
#include <loom/ops/dropout.h>

#include <loom/core/parallel.h>
#include <loom/ops/dropout_math.h>

namespace loom::ops::cpu {

void dropout_mask(const Tensor& out, double p, uint64_t seed) {
  LOOM_CHECK(out.is_contiguous(), "dropout_mask: expected a contiguous tensor, got ", out.str());
  const double kept = dropout_scale(p);
  const int64_t n = out.numel();
  auto fill = [&]<class T>(T* o) {
    parallel_for(0, n, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        o[i] = static_cast<T>(dropout_keep(seed, static_cast<uint64_t>(i), p) ? kept : 0.0);
      }
    });
  };
  switch (out.dtype()) {
    case DType::f32: fill(out.data<float>()); return;
    case DType::f64: fill(out.data<double>()); return;
    default: {
      Tensor mask = Tensor::empty(out.sizes(), DType::f32);
      fill(mask.data<float>());
      Tensor target = out;
      target.copy_(mask);  // f16 / bf16: 0 and 1 / (1 - p) rounded once
    }
  }
}

}  // namespace loom::ops::cpu
