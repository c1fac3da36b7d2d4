#include <loom/optim/grad_scaler.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include <loom/core/autograd.h>
#include <loom/core/environment.h>
#include <loom/core/memory_format.h>
#include <loom/core/parallel.h>
#include <loom/ops/elementwise.h>
#include <loom/optim/cuda/fused_update.h>
#include <loom/optim/grad_scaler_math.h>

namespace loom::optim {
namespace {
constexpr int64_t kGrain = 1 << 14;

// The type a gradient element is unscaled in: f64 for f64, f32 otherwise.
template <class S>
using Compute = std::conditional_t<std::is_same_v<S, double>, double, float>;

// One pass over `source`: destination = source * factor, and whether any
// product is not finite. S and D are floating-point element types.
template <class S, class D>
bool scale_and_check(const S* source, D* destination, int64_t n, double factor) {
  using C = Compute<S>;
  const C f = static_cast<C>(factor);
  std::atomic<bool> found{false};
  parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    bool bad = false;
    for (int64_t i = begin; i < end; ++i) {
      const C v = static_cast<C>(source[i]) * f;
      bad |= !std::isfinite(v);
      if constexpr (std::is_floating_point_v<D>) {
        destination[i] = static_cast<D>(v);
      } else {
        destination[i] = D(static_cast<float>(v));  // Half, BFloat16: round to nearest even
      }
    }
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

const Tensor& find_entry(const nn::NamedTensors& state, const std::string& name) {
  for (auto& [key, t] : state) {
    if (key == name) return t;
  }
  LOOM_FAIL("GradScaler state has no '", name, "' entry");
}
}  // namespace

bool unscale_and_check(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations, double factor) {
  LOOM_CHECK(sources.size() == destinations.size(), "unscale: ", sources.size(), " gradients but ",
             destinations.size(), " destinations");
  // The factor is applied in f32 (f64 for f64 gradients); 1/scale is a power
  // of two for the default schedule, so the division is exact.
  bool found = false;
  std::vector<Tensor> cuda_sources, cuda_destinations;  // unscaled by one fused kernel per dtype pair
  for (size_t k = 0; k < sources.size(); ++k) {
    const Tensor& source = sources[k];
    if (!source.defined()) continue;
    const Tensor& destination = destinations[k];
    LOOM_CHECK(destination.defined() && destination.numel() == source.numel(), "unscale: destination ", k, " (",
               destination.str(), ") does not match gradient ", source.str());
    if (source.device().is_cuda()) {
      cuda_sources.push_back(source);
      cuda_destinations.push_back(destination);
      continue;
    }
    LOOM_CHECK(destination.device().is_cpu(), "unscale: gradient ", source.str(), " and destination ",
               destination.str(), " are on different devices");
    LOOM_CHECK(is_floating(source.dtype()), "unscale: gradient ", source.str(), " is not floating-point");
    LOOM_CHECK(destination.dtype() == DType::f32 || destination.dtype() == source.dtype(), "unscale: destination ",
               destination.str(), " must be f32 or the gradient's dtype (", dtype_name(source.dtype()), ")");
    LOOM_CHECK(in_a_memory_format(destination), "unscale: destination ", destination.str(),
               " is neither contiguous nor channels-last");
    // The source in the destination's memory order (a channels-last gradient unscaled in place stays so).
    const Tensor input = in_memory_format(source, memory_format_of(destination));
    visit_dtype(input.dtype(), [&]<class S>() {
      if constexpr (std::is_integral_v<S>) {
        LOOM_FAIL("unreachable: integer gradient");
      } else {
        const S* in = static_cast<const S*>(input.raw_data());
        if (destination.dtype() == DType::f32) {
          found |= scale_and_check(in, static_cast<float*>(destination.raw_data()), input.numel(), factor);
        } else {
          found |= scale_and_check(in, static_cast<S*>(destination.raw_data()), input.numel(), factor);
        }
      }
    });
  }
  if (!cuda_sources.empty()) found |= cuda::unscale_and_check(cuda_sources, cuda_destinations, factor);
  return found;
}

LossScaleState loss_scale_state_from_environment() {
  return environment_switch("LOOM_CUDA_LOSS_SCALE", {"host", "the default: the overflow flag read back every step"},
                            LossScaleState::host,
                            {"device", "scale, schedule and skip on the GPU, not yet proven on a GPU"},
                            LossScaleState::device);
}

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options),
      scale_(Tensor::scalar(options.init_scale(), DType::f64)),
      loss_scale_(Tensor::scalar(options.init_scale(), DType::f32)),
      growth_tracker_(Tensor::scalar(0, DType::i64)),
      skipped_steps_(Tensor::scalar(0, DType::i64)) {
  const GradScalerOptions& o = options_;
  LOOM_CHECK(o.min_scale() > 0 && o.min_scale() <= o.max_scale(), "GradScaler: need 0 < min_scale <= max_scale, got [",
             o.min_scale(), ", ", o.max_scale(), "]");
  LOOM_CHECK(o.init_scale() >= o.min_scale() && o.init_scale() <= o.max_scale(), "GradScaler: init_scale ", o.init_scale(),
             " is outside [min_scale, max_scale] = [", o.min_scale(), ", ", o.max_scale(), "]");
  LOOM_CHECK(o.growth_factor() > 1, "GradScaler: growth_factor must be > 1, got ", o.growth_factor());
  LOOM_CHECK(o.backoff_factor() > 0 && o.backoff_factor() < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
             o.backoff_factor());
  LOOM_CHECK(o.growth_interval() > 0, "GradScaler: growth_interval must be positive, got ", o.growth_interval());
}

void GradScaler::to(Device device) {
  if (device == this->device()) return;
  for (Tensor* t : {&scale_, &loss_scale_, &growth_tracker_, &skipped_steps_}) *t = t->to(device);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!enabled()) return loss;
  const Tensor wide = loss.dtype() == DType::f64 ? loss : loss.to(DType::f32);
  if (device().is_cpu()) return ::loom::scale(wide, get_scale());
  // On the device: a product with the scale tensor, nothing read back.
  return wide * (wide.dtype() == DType::f64 ? scale_ : loss_scale_);
}

Tensor GradScaler::unscale(const std::vector<Tensor>& gradients, const std::vector<Tensor>& destinations) const {
  LOOM_CHECK(gradients.size() == destinations.size(), "unscale: ", gradients.size(), " gradients but ",
             destinations.size(), " destinations");
  if (!enabled()) {
    // Nothing to look for: a converting copy. (unscale_and_check reads its
    // flag back, which on CUDA would stop the host every step at bf16 and O3.)
    NoGradGuard no_grad;
    for (size_t k = 0; k < gradients.size(); ++k) {
      const Tensor& gradient = gradients[k];
      if (!gradient.defined() || gradient.is_same(destinations[k])) continue;
      LOOM_CHECK(destinations[k].defined() && destinations[k].numel() == gradient.numel(), "unscale: destination ",
                 k, " (", destinations[k].str(), ") does not match gradient ", gradient.str());
      Tensor(destinations[k]).copy_(gradient);
    }
    return Tensor();
  }
  if (device().is_cpu()) {
    const bool found = unscale_and_check(gradients, destinations, 1.0 / get_scale());
    return Tensor::scalar(found ? 1 : 0, DType::i32);
  }
  // On the GPU: the kernels read the scale and raise the flag where they run.
  std::vector<Tensor> sources, targets;
  for (size_t k = 0; k < gradients.size(); ++k) {
    if (!gradients[k].defined()) continue;
    LOOM_CHECK(gradients[k].device() == device(), "unscale: gradient ", gradients[k].str(),
               " is not on the loss scaler's device (", device().str(), ")");
    sources.push_back(gradients[k]);
    targets.push_back(destinations[k]);
  }
  Tensor found_inf = Tensor::zeros({}, DType::i32, device());
  if (!sources.empty()) cuda::unscale_and_check(sources, targets, scale_, found_inf);
  return found_inf;
}

void GradScaler::update(const Tensor& found_inf) {
  if (!enabled()) return;
  LOOM_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::i32,
             "GradScaler::update: found_inf must be the i32 flag unscale() returned, got ",
             found_inf.defined() ? found_inf.str() : "an undefined tensor");
  const ScaleSchedule schedule{options_.growth_factor(), options_.backoff_factor(), options_.min_scale(),
                               options_.max_scale(), options_.growth_interval()};
  if (device().is_cuda()) {
    LOOM_CHECK(found_inf.device() == device(), "GradScaler::update: found_inf is on ", found_inf.device().str(),
               ", the scale on ", device().str());
    cuda::update_scale(scale_, loss_scale_, growth_tracker_, skipped_steps_, found_inf, schedule);
    return;
  }
  double scale = get_scale();
  int64_t growth_tracker = this->growth_tracker(), skipped_steps = this->skipped_steps();
  schedule.advance(scale, growth_tracker, skipped_steps, found_inf.item() != 0);
  scale_.fill_(scale);
  loss_scale_.fill_(scale);
  growth_tracker_.fill_(static_cast<double>(growth_tracker));
  skipped_steps_.fill_(static_cast<double>(skipped_steps));
}

double GradScaler::get_scale() const { return enabled() ? scale_.item() : 1.0; }
int64_t GradScaler::growth_tracker() const { return static_cast<int64_t>(growth_tracker_.item()); }
int64_t GradScaler::skipped_steps() const { return static_cast<int64_t>(skipped_steps_.item()); }

nn::NamedTensors GradScaler::state() const {
  return {{"scale", Tensor::scalar(scale_.item(), DType::f64)},
          {"growth_tracker", Tensor::scalar(static_cast<double>(growth_tracker()), DType::i64)},
          {"skipped_steps", Tensor::scalar(static_cast<double>(skipped_steps()), DType::i64)}};
}

void GradScaler::load_state(const nn::NamedTensors& state) {
  const double scale = find_entry(state, "scale").item();
  LOOM_CHECK(std::isfinite(scale) && scale > 0, "GradScaler state: scale ", scale, " is not a positive number");
  const double growth_tracker = find_entry(state, "growth_tracker").item();
  const double skipped_steps = find_entry(state, "skipped_steps").item();
  scale_.fill_(scale);
  loss_scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
  skipped_steps_.fill_(skipped_steps);
}

}  // namespace loom::optim
