// Classification losses and metrics: log_softmax, nll_loss, cross_entropy
// (mean reduction, as nn.CrossEntropyLoss, with its label_smoothing and
// ignore_index), argmax and accuracy counts.
//
// Backward rules (x logits (N, C), t targets (N), mean over N):
//   log_softmax: dx = g - softmax(x) * Σ_c g
//   nll_loss:    dlogp[n, t_n] = -g / N
//   cross_entropy (fused), ε the label smoothing, M the rows whose target is
//   not ignore_index, q_n = (1 - ε) onehot(t_n) + ε / C the target distribution:
//     loss = (1 / |M|) Σ_{n in M} -Σ_c q_n[c] log softmax(x_n)[c]
//          = (1 / |M|) Σ_{n in M} (logsumexp(x_n) - (1 - ε) x_n[t_n] - (ε / C) Σ_c x_n[c])
//     dx_n = g * (softmax(x_n) - q_n) / |M| for n in M, 0 for ignored rows.
//   With every row ignored the loss is NaN (0 / 0), as PyTorch's; no rows: 0.
//
// Under autocast (ops/autocast.h) log_softmax and cross_entropy compute in f32.
#pragma once

#include <cstdint>

#include <loom/core/options.h>
#include <loom/core/tensor.h>

namespace loom {

// CrossEntropyOptions().label_smoothing(0.1).ignore_index(-1), PyTorch's
// nn.CrossEntropyLoss arguments (reduction mean, no class weights).
class CrossEntropyOptions {
  // Rows whose target is this value add neither loss nor gradient, and the
  // mean is over the other rows (default -100, PyTorch's).
  LOOM_OPTION(int64_t, ignore_index) = -100;
  // ε in [0, 1]: the target distribution is (1 - ε) onehot + ε / C (default 0).
  LOOM_OPTION(double, label_smoothing) = 0;
};

Tensor log_softmax(const Tensor& logits);                         // over dim 1 of (N, C)
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets);  // targets i64 (N); 0-d mean
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});

Tensor argmax(const Tensor& x);  // over dim 1 of (N, C) → i64 (N)
// Number of rows whose argmax equals the target.
int64_t count_correct(const Tensor& logits, const Tensor& targets);

// The kernels, CPU and CUDA twins declared once (ops/loss_kernels.def).
namespace ops::cpu {
#include <loom/ops/loss_kernels.def>
}  // namespace ops::cpu

namespace ops::cuda {
#include <loom/ops/loss_kernels.def>
}  // namespace ops::cuda

}  // namespace loom
