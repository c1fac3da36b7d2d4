// CPU kernels of the classification losses and argmax. Rows are independent:
// parallel over N.
#include <loom/ops/loss.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <loom/core/parallel.h>
#include <loom/ops/dispatch.h>

namespace loom::ops::cpu {
namespace {
Tensor back_to(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// Every target in [0, classes), or equal to ignore_index.
void check_target_range(const int64_t* t, int64_t n, int64_t classes,
                        int64_t ignore_index = std::numeric_limits<int64_t>::min()) {
  for (int64_t i = 0; i < n; ++i) {
    LOOM_CHECK((t[i] >= 0 && t[i] < classes) || t[i] == ignore_index, "target ", t[i], " at position ", i, " is out of range for ", classes,
               " classes");
  }
}

// Writes log-softmax of each row of x (N, C) into out.
template <class T>
void log_softmax_rows(const T* x, T* out, int64_t n, int64_t c) {
  parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* row = x + i * c;
      T max = row[0];
      for (int64_t j = 1; j < c; ++j) max = std::max(max, row[j]);
      double total = 0;
      for (int64_t j = 0; j < c; ++j) total += std::exp(static_cast<double>(row[j] - max));
      const T log_total = static_cast<T>(std::log(total)) + max;
      for (int64_t j = 0; j < c; ++j) out[i * c + j] = row[j] - log_total;
    }
  });
}
}  // namespace

Tensor log_softmax_forward(const Tensor& logits_in) {
  Tensor x = cpu_compute_input(logits_in);
  Tensor out = Tensor::empty(x.sizes(), x.dtype());
  visit_compute_dtype(x.dtype(), "log_softmax", [&]<class T>() {
    log_softmax_rows(x.data<T>(), out.data<T>(), x.size(0), x.size(1));
  });
  return back_to(out, logits_in.dtype());
}

Tensor log_softmax_backward(const Tensor& grad_in, const Tensor& output_in) {
  Tensor g = cpu_compute_input(grad_in), y = cpu_compute_input(output_in);
  Tensor dx = Tensor::empty(y.sizes(), y.dtype());
  const int64_t n = y.size(0), c = y.size(1);
  visit_compute_dtype(y.dtype(), "log_softmax backward", [&]<class T>() {
    const T* gp = g.data<T>();
    const T* yp = y.data<T>();
    T* out = dx.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      T total = 0;
      for (int64_t j = 0; j < c; ++j) total += gp[i * c + j];
      for (int64_t j = 0; j < c; ++j) out[i * c + j] = gp[i * c + j] - std::exp(yp[i * c + j]) * total;
    }
  });
  return back_to(dx, output_in.dtype());
}

Tensor nll_loss_forward(const Tensor& log_probs_in, const Tensor& targets_in) {
  Tensor lp = cpu_compute_input(log_probs_in);
  Tensor t = targets_in.contiguous();
  const int64_t n = lp.size(0), c = lp.size(1);
  check_target_range(t.data<int64_t>(), n, c);
  double total = visit_compute_dtype(lp.dtype(), "nll_loss", [&]<class T>() {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s -= static_cast<double>(lp.data<T>()[i * c + t.data<int64_t>()[i]]);
    return s;
  });
  return Tensor::full({}, n > 0 ? total / static_cast<double>(n) : 0.0, log_probs_in.dtype());
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& log_probs, const Tensor& targets_in) {
  const DType compute = cpu_compute_dtype(log_probs.dtype());
  Tensor t = targets_in.contiguous();
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  Tensor dx = Tensor::zeros(log_probs.sizes(), compute);
  const double value = -grad.item() / static_cast<double>(n);
  visit_compute_dtype(compute, "nll_loss backward", [&]<class T>() {
    for (int64_t i = 0; i < n; ++i) dx.data<T>()[i * c + t.data<int64_t>()[i]] = static_cast<T>(value);
  });
  return back_to(dx, log_probs.dtype());
}

Tensor cross_entropy_forward(const Tensor& logits_in, const Tensor& targets_in, const CrossEntropyOptions& options,
                             Tensor& probabilities, Tensor& counted) {
  Tensor x = cpu_compute_input(logits_in);
  Tensor t = targets_in.contiguous();
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t* target = t.data<int64_t>();
  const int64_t ignore = options.ignore_index();
  check_target_range(target, n, c, ignore);
  const double smoothing = options.label_smoothing();
  Tensor log_p = Tensor::empty(x.sizes(), x.dtype());
  int64_t rows = 0;  // not ignored
  double total = visit_compute_dtype(x.dtype(), "cross_entropy", [&]<class T>() {
    T* lp = log_p.data<T>();
    log_softmax_rows(x.data<T>(), lp, n, c);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (target[i] == ignore) continue;
      ++rows;
      // -Σ_c q[c] log p[c], q = (1 - ε) onehot + ε / C
      s -= (1 - smoothing) * static_cast<double>(lp[i * c + target[i]]);
      if (smoothing > 0) {  // (without, a row's -inf log-probability would make 0 * inf = NaN)
        double all = 0;
        for (int64_t j = 0; j < c; ++j) all += static_cast<double>(lp[i * c + j]);
        s -= smoothing / static_cast<double>(c) * all;
      }
    }
    for (int64_t i = 0; i < n * c; ++i) lp[i] = std::exp(lp[i]);  // now the softmax, kept for backward
    return s;
  });
  probabilities = log_p;
  counted = Tensor::scalar(static_cast<double>(rows), DType::f64);
  // PyTorch's mean over the rows not ignored: NaN when every row is; no rows at all: 0.
  return Tensor::full({}, n > 0 ? total / static_cast<double>(rows) : 0.0, logits_in.dtype());
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& probabilities, const Tensor& targets_in,
                              const CrossEntropyOptions& options, const Tensor& counted) {
  Tensor t = targets_in.contiguous();
  const int64_t n = probabilities.size(0), c = probabilities.size(1);
  Tensor dx = Tensor::empty(probabilities.sizes(), probabilities.dtype());
  const double factor = grad.item() / counted.item();
  const double smoothing = options.label_smoothing();
  visit_compute_dtype(probabilities.dtype(), "cross_entropy backward", [&]<class T>() {
    const T* p = probabilities.data<T>();
    T* out = dx.data<T>();
    const T f = static_cast<T>(factor);
    const T spread = static_cast<T>(factor * smoothing / static_cast<double>(c));
    const T hit = static_cast<T>(factor * (1 - smoothing));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t target = t.data<int64_t>()[i];
      if (target == options.ignore_index()) {
        std::fill(out + i * c, out + (i + 1) * c, T(0));
        continue;
      }
      for (int64_t j = 0; j < c; ++j) out[i * c + j] = p[i * c + j] * f - spread;
      out[i * c + target] -= hit;
    }
  });
  return dx;
}

Tensor argmax(const Tensor& x_in) {
  Tensor x = cpu_compute_input(x_in);
  const int64_t n = x.size(0), c = x.size(1);
  Tensor out = Tensor::empty({n}, DType::i64);
  visit_compute_dtype(x.dtype(), "argmax", [&]<class T>() {
    const T* p = x.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < c; ++j) {
        if (p[i * c + j] > p[i * c + best]) best = j;
      }
      out.data<int64_t>()[i] = best;
    }
  });
  return out;
}

}  // namespace loom::ops::cpu
