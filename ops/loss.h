// Classification losses and metrics: log_softmax, nll_loss, cross_entropy
// (mean reduction, as nn.CrossEntropyLoss), argmax and accuracy counts.
//
// Backward rules (x logits (N, C), t targets (N), mean over N):
//   log_softmax: dx = g - softmax(x) * Σ_c g
//   nll_loss:    dlogp[n, t_n] = -g / N
//   cross_entropy (fused): dx = g * (softmax(x) - onehot(t)) / N
//
// Under autocast (ops/autocast.h) log_softmax and cross_entropy compute in f32.
#pragma once

#include <cstdint>

#include <loom/core/tensor.h>

namespace loom {

Tensor log_softmax(const Tensor& logits);                         // over dim 1 of (N, C)
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets);  // targets i64 (N); 0-d mean
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);

Tensor argmax(const Tensor& x);  // over dim 1 of (N, C) → i64 (N)
// Number of rows whose argmax equals the target.
int64_t count_correct(const Tensor& logits, const Tensor& targets);

namespace ops::cpu {
Tensor log_softmax_forward(const Tensor& logits);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& output);
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& targets);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& log_probs, const Tensor& targets);
// Returns the 0-d loss; writes softmax probabilities (N, C) for backward.
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& probabilities);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& probabilities, const Tensor& targets);
Tensor argmax(const Tensor& x);
}  // namespace ops::cpu

namespace ops::cuda {
Tensor log_softmax_forward(const Tensor& logits);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& output);
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& targets);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& log_probs, const Tensor& targets);
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& probabilities);
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& probabilities, const Tensor& targets);
Tensor argmax(const Tensor& x);
}  // namespace ops::cuda

}  // namespace loom
