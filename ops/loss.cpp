#include <loom/core/profiler.h>
#include <loom/ops/loss.h>

#include <loom/ops/autocast.h>
#include <loom/ops/dispatch.h>

namespace loom {

namespace {
void check_logits(const char* op, const Tensor& logits) {
  LOOM_CHECK(logits.dim() == 2, op, ": expected (N, C) scores, got ", logits.str());
  LOOM_CHECK(is_floating(logits.dtype()), op, ": expected floating-point scores, got ", logits.str());
}
void check_targets(const char* op, const Tensor& scores, const Tensor& targets) {
  LOOM_CHECK(targets.dim() == 1 && targets.size(0) == scores.size(0) && targets.dtype() == DType::i64, op,
             ": targets must be i64 (", scores.size(0), "), got ", targets.str());
  LOOM_CHECK(targets.device() == scores.device(), op, ": targets on ", targets.device().str(), ", scores on ",
             scores.device().str());
}
}  // namespace

Tensor log_softmax(const Tensor& logits) {
  if (ops::autocast_raises(logits)) return log_softmax(logits.to(DType::f32));  // autocast: losses in f32
  check_logits("log_softmax", logits);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(logits, log_softmax_forward, logits);
  }
  record("log_softmax", {logits}, {&out}, [y = out.detach()](const TensorList& g, const Node&) {
    return TensorList{LOOM_DISPATCH(y, log_softmax_backward, g[0], y)};
  });
  return out;
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets) {
  check_logits("nll_loss", log_probs);
  check_targets("nll_loss", log_probs, targets);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(log_probs, nll_loss_forward, log_probs, targets);
  }
  record("nll_loss", {log_probs}, {&out}, [lp = log_probs.detach(), targets](const TensorList& g, const Node&) {
    return TensorList{LOOM_DISPATCH(lp, nll_loss_backward, g[0], lp, targets)};
  });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  if (ops::autocast_raises(logits)) return cross_entropy(logits.to(DType::f32), targets, options);  // losses in f32
  profiler::Scope profile("cross_entropy", logits);
  check_logits("cross_entropy", logits);
  check_targets("cross_entropy", logits, targets);
  const double smoothing = options.label_smoothing();
  LOOM_CHECK(smoothing >= 0 && smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got ", smoothing);
  Tensor out, probabilities, counted;
  {
    NoGradGuard no_grad;
    out = LOOM_DISPATCH(logits, cross_entropy_forward, logits, targets, options, probabilities, counted);
  }
  record("cross_entropy", {logits}, {&out},
         [probabilities, targets, options, counted, dtype = logits.dtype()](const TensorList& g, const Node&) {
           Tensor dx = LOOM_DISPATCH(probabilities, cross_entropy_backward, g[0], probabilities, targets, options, counted);
           return TensorList{dx.to(dtype)};
         });
  return out;
}

Tensor argmax(const Tensor& x) {
  check_logits("argmax", x);
  NoGradGuard no_grad;
  return LOOM_DISPATCH(x, argmax, x);
}

int64_t count_correct(const Tensor& logits, const Tensor& targets) {
  check_targets("count_correct", logits, targets);
  std::vector<int64_t> predicted = argmax(logits).to_vector<int64_t>();
  std::vector<int64_t> expected = targets.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == expected[i];
  return correct;
}

}  // namespace loom
