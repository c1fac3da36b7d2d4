// The arithmetic of the gradient norm (optim/clip_grad.h), written once for the
// CPU loop and the CUDA kernel (optim/cuda/fused_update.cu): each element
// contributes norm_term(|g|), terms fold with norm_combine, in f64.
#pragma once

#include <math.h>

#include <loom/core/host_device.h>

namespace loom::optim {

// What one element adds: |g|^p for a finite p, |g| for the infinity norm.
struct NormTerms {
  double p;
  bool infinity;

  LOOM_HOST_DEVICE double term(double g) const {
    const double a = fabs(g);
    if (infinity || p == 1) return a;
    return p == 2 ? a * a : pow(a, p);
  }
  // Sum for a finite p; for infinity the maximum, a NaN winning over any number.
  LOOM_HOST_DEVICE double combine(double total, double term) const {
    if (!infinity) return total + term;
    return (term > total || term != term) && total == total ? term : total;
  }
};

}  // namespace loom::optim
