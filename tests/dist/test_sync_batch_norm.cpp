// SyncBatchNorm against BatchNorm2d on the whole batch: without a group it is
// BatchNorm2d; on 2 ranks with uneven shares of a batch it gives the full
// batch's output, input gradient, summed parameter gradients and running
// stats; the tutorial's ConvNet converted to SyncBatchNorm and trained with DDP
// on 2 ranks x 50 images ends where one process on 100 images does, and so
// does a small ResNet-18 (CIFAR stem) whose blocks call their batch norms
// through typed members. forward_relu (also called through a BatchNorm2d&) is
// relu of the synchronized forward, never rank-local statistics.
// convert_sync_batchnorm keeps names and tensors. Also the distributed
// evaluation helpers (ShardSampler, all_reduce_accuracy).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include <loom/core/autograd.h>
#include <loom/core/generator.h>
#include <loom/core/memory_format.h>
#include <loom/data/sampler.h>
#include <loom/dist/ddp.h>
#include <loom/dist/metrics.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/convnet.h>
#include <loom/nn/resnet.h>
#include <loom/ops/batch_norm.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>
#include "tests/dist/multiprocess.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

// A block whose forward calls its batch norm through a typed member, as
// torchvision-style ResNet blocks do.
class MemberBatchNorm : public nn::Module {
 public:
  MemberBatchNorm() { bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(3)); }
  Tensor forward(const Tensor& input) override { return bn->forward(input); }
  std::string type_name() const override { return "MemberBatchNorm"; }
  std::shared_ptr<nn::BatchNorm2d> bn;
};

// Deterministic values in [-1, 1) from an integer hash: the same on every rank.
double hashed(uint64_t i, uint64_t salt) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (salt * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

// Rows [first, first + count) of a fixed (N, 3, 4, 5) f64 batch: channels with
// different means and scales.
Tensor batch_rows(int64_t first, int64_t count) {
  std::vector<double> values;
  for (int64_t n = first; n < first + count; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t k = 0; k < 20; ++k) values.push_back((c + 1.0) * hashed(n * 60 + c * 20 + k, 1) + 0.5 * c);
  return Tensor::from_vector_as(values, {count, 3, 4, 5}, DType::f64);
}
// Weights for the loss sum(output * weights), same layout.
Tensor loss_weights(int64_t first, int64_t count) {
  std::vector<double> values;
  for (int64_t i = first * 60; i < (first + count) * 60; ++i) values.push_back(hashed(i, 2));
  return Tensor::from_vector_as(values, {count, 3, 4, 5}, DType::f64);
}

void expect_near(const Tensor& actual, const Tensor& expected, double tolerance, const std::string& what) {
  expect(actual.defined() && expected.defined(), what, ": undefined tensor");
  std::vector<double> a = actual.to_vector<double>(), b = expected.to_vector<double>();
  expect(a.size() == b.size(), what, ": ", a.size(), " values vs ", b.size());
  for (size_t i = 0; i < a.size(); ++i)
    expect(std::abs(a[i] - b[i]) <= tolerance * (1 + std::abs(b[i])), what, "[", i, "] is ", a[i], ", expected ", b[i]);
}

// A BatchNorm2d-like module (BatchNorm2d itself or SyncBatchNorm) with
// non-trivial affine parameters, in f64.
template <class BatchNorm, class... Args>
std::shared_ptr<BatchNorm> make_batch_norm(Args&&... args) {
  auto module = std::make_shared<BatchNorm>(nn::BatchNormOptions(3).momentum(0.3), std::forward<Args>(args)...);
  module->to(DType::f64);
  NoGradGuard no_grad;
  module->weight.copy_(Tensor::from_vector<double>({0.5, -1.5, 2.0}, {3}));
  module->bias.copy_(Tensor::from_vector<double>({0.1, 0.2, -0.3}, {3}));
  module->running_mean.copy_(Tensor::from_vector<double>({0.2, -0.1, 0.4}, {3}));
  return module;
}

// A fixed synthetic MNIST-shaped set: (count, 1, 28, 28) f64 images, labels i % 10.
constexpr int64_t kImages = 300;
Tensor synthetic_images(const std::vector<int64_t>& indices) {
  std::vector<double> values;
  values.reserve(indices.size() * 784);
  for (int64_t index : indices) {
    const int64_t label = index % 10;
    for (int64_t p = 0; p < 784; ++p) {
      const double row = static_cast<double>(p / 28), col = static_cast<double>(p % 28);
      // A class-dependent stripe pattern plus noise.
      values.push_back(std::sin(0.2 * (label + 1) * row + 0.1 * col) + 0.5 * hashed(index * 784 + p, 3));
    }
  }
  return Tensor::from_vector_as(values, {static_cast<int64_t>(indices.size()), 1, 28, 28}, DType::f64);
}
Tensor synthetic_labels(const std::vector<int64_t>& indices) {
  std::vector<int64_t> labels;
  for (int64_t index : indices) labels.push_back(index % 10);
  return Tensor::from_vector<int64_t>(labels, {static_cast<int64_t>(labels.size())});
}

// The images of a set's samples, by index (labels are synthetic_labels).
using ImagesOf = std::function<Tensor(const std::vector<int64_t>& indices)>;

// How the equivalence scenarios train: `steps` SGD steps with `sgd` on
// batches of `global_batch` images, in the epoch-0 order of a
// DistributedSampler of `set_size` indices shuffled with `sampler_seed`.
struct Training {
  int64_t set_size, global_batch;
  int steps;
  uint64_t sampler_seed;
  optim::SGDOptions sgd;
  ImagesOf images;
};

// Trains `model` (through `trained`, the model or its DDP wrapper) on
// `batch` images a step from `sampler`.
void train(nn::Module& trained, nn::Module& model, data::Sampler& sampler, int64_t batch, const Training& training) {
  optim::SGD sgd(model.parameters(), training.sgd);
  sampler.set_epoch(0);
  const std::vector<int64_t> order = sampler.indices();
  for (int step = 0; step < training.steps; ++step) {
    std::vector<int64_t> indices(order.begin() + step * batch, order.begin() + (step + 1) * batch);
    Tensor loss = cross_entropy(trained(training.images(indices)), synthetic_labels(indices));
    sgd.zero_grad();
    loss.backward();
    sgd.step();
  }
}

// Throws unless `model` has the state_dict names of `reference` and every
// tensor is within 1e-9 of the reference's, relative to that tensor's largest
// magnitude (f64 runs that differ only in summation order).
void expect_same_state(nn::Module& model, nn::Module& reference, int steps) {
  auto actual = model.state_dict(), expected = reference.state_dict();
  expect(actual.size() == expected.size(), "state_dict sizes differ");
  double worst = 0;
  std::string worst_name;
  for (size_t k = 0; k < actual.size(); ++k) {
    expect(actual[k].first == expected[k].first, "name ", actual[k].first, " vs ", expected[k].first);
    std::vector<double> a = actual[k].second.to_vector<double>(), b = expected[k].second.to_vector<double>();
    double difference = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      difference = std::max(difference, std::abs(a[i] - b[i]));
      norm = std::max(norm, std::abs(b[i]));
    }
    const double relative = difference / std::max(norm, 1e-30);
    if (relative > worst) worst = relative, worst_name = actual[k].first;
  }
  expect(worst < 1e-9, "after ", steps, " steps '", worst_name, "' differs from one process by ", worst,
         " (relative to its largest value)");
}

// Trains `model` under DDP on this rank's share of every batch and
// `reference` alone on the whole batches; throws unless both end in the same
// state (f64 throughout: only the summation order differs).
void expect_ddp_equals_one_process(const std::shared_ptr<ProcessGroup>& group, const std::shared_ptr<nn::Module>& model,
                                   nn::Module& reference, const Training& training) {
  DistributedDataParallel ddp(model, group);
  data::DistributedSampler sampler(training.set_size, group->size(), group->rank(), /*shuffle=*/true,
                                   training.sampler_seed);
  train(ddp, *model, sampler, training.global_batch / group->size(), training);
  data::DistributedSampler whole(training.set_size, 1, 0, /*shuffle=*/true, training.sampler_seed);
  train(reference, reference, whole, training.global_batch, training);
  expect_same_state(*model, reference, training.steps);
}

// Rank 0 holds rows [0, 2), rank 1 rows [2, 6) of one batch of 6.
struct UnevenShare {
  int64_t first, count;
};
UnevenShare uneven_share(int rank) { return rank == 0 ? UnevenShare{0, 2} : UnevenShare{2, 4}; }

// Backward of the loss sum(out * weights) over this rank's rows.
void backward_share(const Tensor& out, UnevenShare share) {
  sum(out * loss_weights(share.first, share.count)).backward();
}

// Throws unless `sync`'s step on this rank's rows (`x` in, `out` out, the
// loss backward_share's) is one BatchNorm2d's on all 6 rows, followed by
// `activation`: the output and input-gradient rows are this rank's of the
// whole batch's, the running stats the same, and the parameter gradients
// (this rank's share) summed over ranks the whole batch's.
void expect_whole_batch(ProcessGroup& group, SyncBatchNorm& sync, const Tensor& x, const Tensor& out,
                        UnevenShare share, Activation activation) {
  auto reference = make_batch_norm<nn::BatchNorm2d>();
  Tensor x_all = batch_rows(0, 6).set_requires_grad(true);
  Tensor out_all = reference->forward(x_all);
  if (activation == Activation::relu) out_all = relu(out_all);
  backward_share(out_all, {0, 6});

  const int64_t end = share.first + share.count;
  expect_near(out, out_all.slice(0, share.first, end), 1e-12, "output rows");
  expect_near(x.grad(), x_all.grad().slice(0, share.first, end), 1e-12, "input gradient rows");
  expect_near(sync.running_mean, reference->running_mean, 1e-12, "running_mean");
  expect_near(sync.running_var, reference->running_var, 1e-12, "running_var (unbiased over 6 x 20 values)");
  Tensor weight_grad = sync.weight.grad().clone(), bias_grad = sync.bias.grad().clone();
  group.all_reduce({weight_grad, bias_grad})->wait();
  expect_near(weight_grad, reference->weight.grad(), 1e-12, "weight gradient summed over ranks");
  expect_near(bias_grad, reference->bias.grad(), 1e-12, "bias gradient summed over ranks");
}

}  // namespace

TEST_SUITE("sync_batch_norm") {
  TEST_CASE("without a group, and in a world of one, SyncBatchNorm is BatchNorm2d") {
    for (bool with_group : {false, true}) {
      auto reference = make_batch_norm<nn::BatchNorm2d>();
      auto sync = with_group ? make_batch_norm<SyncBatchNorm>(world_of_one()) : make_batch_norm<SyncBatchNorm>();
      CHECK(sync->type_name() == "SyncBatchNorm");
      Tensor x = batch_rows(0, 6).set_requires_grad(true);
      Tensor x_reference = batch_rows(0, 6).set_requires_grad(true);
      sum(sync->forward(x) * loss_weights(0, 6)).backward();
      sum(reference->forward(x_reference) * loss_weights(0, 6)).backward();
      expect_near(x.grad(), x_reference.grad(), 0, "input gradient");
      expect_near(sync->weight.grad(), reference->weight.grad(), 0, "weight gradient");
      expect_near(sync->bias.grad(), reference->bias.grad(), 0, "bias gradient");
      expect_near(sync->running_mean, reference->running_mean, 0, "running_mean");
      expect_near(sync->running_var, reference->running_var, 0, "running_var");
      CHECK(sync->num_batches_tracked.item() == 1);
      sync->eval();
      reference->eval();
      expect_near(sync->forward(batch_rows(6, 2)), reference->forward(batch_rows(6, 2)), 0, "eval output");
    }
  }

  TEST_CASE("without a group, and in a world of one, forward_relu is BatchNorm2d's fused forward_relu") {
    for (bool with_group : {false, true}) {
      auto reference = make_batch_norm<nn::BatchNorm2d>();
      auto sync = with_group ? make_batch_norm<SyncBatchNorm>(world_of_one()) : make_batch_norm<SyncBatchNorm>();
      nn::BatchNorm2d& base = *sync;  // the override runs through the base class too
      Tensor x = batch_rows(0, 6).set_requires_grad(true);
      Tensor x_reference = batch_rows(0, 6).set_requires_grad(true);
      Tensor out = base.forward_relu(x), expected = reference->forward_relu(x_reference);
      expect_near(out, expected, 0, "output");
      sum(out * loss_weights(0, 6)).backward();
      sum(expected * loss_weights(0, 6)).backward();
      expect_near(x.grad(), x_reference.grad(), 0, "input gradient");
      expect_near(sync->weight.grad(), reference->weight.grad(), 0, "weight gradient");
      expect_near(sync->running_var, reference->running_var, 0, "running_var");
      CHECK(sync->num_batches_tracked.item() == 1);
      sync->eval();
      reference->eval();
      expect_near(base.forward_relu(batch_rows(6, 2)), reference->forward_relu(batch_rows(6, 2)), 0, "eval output");
    }
  }

  TEST_CASE("sync_batch_norm in a world of one runs the collectives and equals batch_norm") {
    auto group = world_of_one();
    auto a = make_batch_norm<nn::BatchNorm2d>(), b = make_batch_norm<nn::BatchNorm2d>();
    Tensor x = batch_rows(0, 5).set_requires_grad(true), y = batch_rows(0, 5).set_requires_grad(true);
    Tensor out = sync_batch_norm(x, a->weight, a->bias, a->running_mean, a->running_var, 0.3, 1e-5, group);
    Tensor expected = batch_norm(y, b->weight, b->bias, b->running_mean, b->running_var, true, 0.3, 1e-5);
    expect_near(out, expected, 1e-14, "output");
    sum(out * loss_weights(0, 5)).backward();
    sum(expected * loss_weights(0, 5)).backward();
    expect_near(x.grad(), y.grad(), 1e-12, "input gradient");
    expect_near(a->weight.grad(), b->weight.grad(), 1e-12, "weight gradient");
    expect_near(a->running_var, b->running_var, 1e-14, "running_var");
  }

  TEST_CASE("all_reduce_statistics leaves the total count on the device unless the host needs it") {
    // The kernels read a device total; the host reads it only when its own
    // count cannot show that the total is more than one (batch norm's check).
    BatchStatisticsReduction reduction = all_reduce_statistics(world_of_one());
    const StatisticsCount many = reduction.forward(Tensor::zeros({2, 3}, DType::f64), 12);
    CHECK(many.known == 12);
    REQUIRE(many.total.defined());
    CHECK(many.total.dtype() == DType::f64);
    CHECK(many.total.to_vector<double>() == std::vector<double>{12.0});
    const StatisticsCount one = reduction.forward(Tensor::zeros({2, 3}, DType::f64), 1);
    CHECK(one.known == 1);
    CHECK(!one.total.defined());
  }

  TEST_CASE("convert_sync_batchnorm keeps names, tensors and mode") {
    auto model = std::make_shared<nn::ConvNet>();
    auto before = model->state_dict();
    model->eval();
    auto converted = convert_sync_batchnorm(model);
    CHECK(converted.get() == model.get());
    auto after = model->state_dict();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      CHECK(after[i].first == before[i].first);
      CHECK(after[i].second.impl() == before[i].second.impl());  // the same tensors: an optimizer keeps working
    }
    int sync_layers = 0;
    for (auto& [name, module] : model->named_modules()) {
      CHECK(module->type_name() != "BatchNorm2d");
      if (module->type_name() == "SyncBatchNorm") {
        ++sync_layers;
        CHECK(!module->is_training());
      }
    }
    CHECK(sync_layers == 2);
    CHECK(convert_sync_batchnorm(std::make_shared<nn::BatchNorm2d>(4))->type_name() == "SyncBatchNorm");
  }

  TEST_CASE("convert_sync_batchnorm refuses a model whose forward calls batch norms through members") {
    auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::BatchNorm2d>(3), std::make_shared<MemberBatchNorm>()});
    std::string message;
    try {
      convert_sync_batchnorm(model);
    } catch (const Error& error) {
      message = error.what();
    }
    CHECK(contains(message, "BatchNorm2d '1.bn' of MemberBatchNorm is also held outside the module tree"));
    // Nothing changed, not even the first batch norm, which could be converted.
    for (auto& [name, module] : model->named_modules()) CHECK(module->type_name() != "SyncBatchNorm");
  }
}

// SyncBatchNorm on each rank's uneven share equals BatchNorm2d on all 6 rows.
LOOM_DIST_SCENARIO("sync_bn_uneven_shares") {
  auto group = group_from_environment(20s);
  const UnevenShare share = uneven_share(group->rank());
  auto sync = make_batch_norm<SyncBatchNorm>(group);
  Tensor x = batch_rows(share.first, share.count).set_requires_grad(true);
  Tensor out = sync->forward(x);
  backward_share(out, share);
  expect_whole_batch(*group, *sync, x, out, share, Activation::none);
  group->barrier()->wait();
}

// forward_relu on 2 ranks with uneven shares, called through a BatchNorm2d&
// (as Sequential's and ResNet's fusion would): relu of the whole batch's
// BatchNorm2d output, and of SyncBatchNorm's own synchronized forward; its
// input gradient, running stats and summed parameter gradients are the whole
// batch's too. The inherited, rank-local BatchNorm2d::forward_relu fails this.
LOOM_DIST_SCENARIO("sync_bn_forward_relu") {
  auto group = group_from_environment(20s);
  const UnevenShare share = uneven_share(group->rank());
  auto sync = make_batch_norm<SyncBatchNorm>(group);
  nn::BatchNorm2d& base = *sync;
  Tensor x = batch_rows(share.first, share.count).set_requires_grad(true);
  Tensor out = base.forward_relu(x);
  backward_share(out, share);
  expect(sync->num_batches_tracked.item() == 1, "num_batches_tracked is ", sync->num_batches_tracked.item());

  // The same module's synchronized forward, then relu (a second module: the
  // running stats above must see one update).
  auto composed = make_batch_norm<SyncBatchNorm>(group);
  Tensor x_composed = batch_rows(share.first, share.count).set_requires_grad(true);
  Tensor out_composed = relu(composed->forward(x_composed));
  backward_share(out_composed, share);

  for (double value : out.to_vector<double>()) expect(value >= 0, "forward_relu gave ", value);
  expect_near(out, out_composed, 0, "forward_relu vs relu(forward)");
  expect_near(x.grad(), x_composed.grad(), 0, "input gradient vs relu(forward)'s");
  expect_whole_batch(*group, *sync, x, out, share, Activation::relu);
  group->barrier()->wait();
}

// The tutorial's ConvNet with SyncBatchNorm under DDP, 2 ranks x 50 images per
// step, ends with the parameters and statistics of one process stepping on
// the same 100 images (DistributedSampler deals the epoch's permutation out).
LOOM_DIST_SCENARIO("sync_bn_convnet_equivalence") {
  auto group = group_from_environment(30s);
  manual_seed(11 + group->rank());  // different on every rank until DDP broadcasts rank 0's
  std::shared_ptr<nn::Module> model = std::make_shared<nn::ConvNet>();
  model->to(DType::f64);
  model = convert_sync_batchnorm(model, group);

  manual_seed(11);
  auto reference = std::make_shared<nn::ConvNet>();
  reference->to(DType::f64);
  expect_ddp_equals_one_process(group, model, *reference,
                                {.set_size = kImages,
                                 .global_batch = 100,
                                 .steps = 3,
                                 .sampler_seed = 7,
                                 .sgd = optim::SGDOptions(0.05).momentum(0.9),
                                 .images = synthetic_images});
  group->barrier()->wait();
}

// A small ResNet-18 with the CIFAR stem (width 4, 8x8 images, so layer4 sees
// 1x1 maps) converted to SyncBatchNorm, under DDP on 2 ranks x 4 images per
// step, ends with the parameters and running statistics of one plain
// process stepping on the same 8 images. Every batch norm, the blocks'
// typed members and the downsample Sequentials' alike, must be synchronized:
// layer4's batch norms see one value per channel and image, so a rank-local
// one would give clearly different statistics.
namespace {
// (count, 3, 8, 8) f64 images with a class-dependent offset (labels n % 10).
Tensor small_rgb_images(const std::vector<int64_t>& indices) {
  constexpr int64_t kSide = 8;
  std::vector<double> values;
  for (int64_t n : indices)
    for (int64_t k = 0; k < 3 * kSide * kSide; ++k) values.push_back(0.1 * (n % 10) + hashed(n * 192 + k, 5));
  return Tensor::from_vector_as(values, {static_cast<int64_t>(indices.size()), 3, kSide, kSide}, DType::f64);
}
}  // namespace

LOOM_DIST_SCENARIO("sync_bn_resnet_equivalence") {
  auto group = group_from_environment(30s);
  constexpr int kSteps = 3;
  constexpr int64_t kGlobalBatch = 8;
  const auto options = nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(4);
  const ImagesOf images = small_rgb_images;

  manual_seed(21 + group->rank());  // different on every rank until DDP broadcasts rank 0's
  std::shared_ptr<nn::ResNet> resnet = nn::resnet18(options);
  resnet->to(DType::f64);
  std::shared_ptr<nn::Module> model = convert_sync_batchnorm(resnet, group);
  int sync_layers = 0;
  for (auto& [name, module] : model->named_modules()) {
    expect(module->type_name() != "BatchNorm2d", "'", name, "' is still a BatchNorm2d");
    sync_layers += module->type_name() == "SyncBatchNorm";
  }
  expect(sync_layers == 20, sync_layers, " SyncBatchNorm layers; ResNet-18 has 20 batch norms");
  expect(resnet->layer2->named_children().size() == 2, "layer2 lost a block");

  manual_seed(21);
  auto reference = nn::resnet18(options);
  reference->to(DType::f64);
  expect_ddp_equals_one_process(group, model, *reference,
                                {.set_size = kGlobalBatch * kSteps,
                                 .global_batch = kGlobalBatch,
                                 .steps = kSteps,
                                 .sampler_seed = 9,
                                 .sgd = optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4),
                                 .images = images});
  group->barrier()->wait();
}

// DDP over a channels-last ResNet-18 (Module::to(MemoryFormat::nhwc), PyTorch's
// model.to(memory_format=torch.channels_last)) with SyncBatchNorm (so that 2
// ranks x 4 images see the 8 images' statistics): its convolution weights'
// bucket views are channels-last, and it ends where one NCHW process on the
// 8 images does (f64: only the summation order differs), with the weights and
// their gradients still channels-last.
LOOM_DIST_SCENARIO("ddp_channels_last_resnet_equivalence") {
  auto group = group_from_environment(30s);
  const auto options = nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(4);
  manual_seed(21 + group->rank());  // different on every rank until DDP broadcasts rank 0's
  std::shared_ptr<nn::ResNet> model = nn::resnet18(options);
  model->to(DType::f64);
  model->to(MemoryFormat::nhwc);
  manual_seed(21);
  auto reference = nn::resnet18(options);
  reference->to(DType::f64);
  expect_ddp_equals_one_process(group, convert_sync_batchnorm(model, group), *reference,
                                {.set_size = 16,
                                 .global_batch = 8,
                                 .steps = 2,
                                 .sampler_seed = 9,
                                 .sgd = optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4),
                                 .images = small_rgb_images});
  // The stem's and the blocks' 3x3 weights (a 1x1 one is both contiguous and channels-last).
  int channels_last = 0;
  for (auto& [name, parameter] : model->named_parameters()) {
    if (parameter.dim() != 4 || parameter.size(2) == 1) continue;
    expect(memory_format_of(parameter) == MemoryFormat::nhwc, "'", name, "' is no longer channels-last");
    expect(memory_format_of(parameter.grad()) == MemoryFormat::nhwc, "'", name, "'s gradient is not channels-last");
    ++channels_last;
  }
  expect(channels_last == 17, channels_last, " channels-last 3x3 weights; ResNet-18 has 17");
  group->barrier()->wait();
}

LOOM_DIST_SCENARIO("accuracy_all_reduce") {
  auto group = group_from_environment(20s);
  const int rank = group->rank(), world = group->size();
  ShardSampler shard(10, world, rank);
  AccuracyCounts mine{.correct = rank + 1, .total = shard.size()};
  AccuracyCounts all = all_reduce_accuracy(mine, group.get());
  expect(all.correct == world * (world + 1) / 2 && all.total == 10, "summed counts ", all.correct, "/", all.total);
  group->barrier()->wait();
}

TEST_SUITE("sync_batch_norm") {
  TEST_CASE("2 ranks with uneven shares equal BatchNorm2d on the whole batch") {
    expect_all_ok(spawn_ranks("sync_bn_uneven_shares", 2));
  }
  TEST_CASE("forward_relu on 2 ranks is relu of the synchronized forward (the whole batch's)") {
    expect_all_ok(spawn_ranks("sync_bn_forward_relu", 2));
  }
  TEST_CASE("ConvNet + SyncBatchNorm + DDP, 2 x 50 images, equals 1 process x 100 images") {
    expect_all_ok(spawn_ranks("sync_bn_convnet_equivalence", 2, {.deadline = std::chrono::seconds(50)}));
  }
  TEST_CASE("shm: ConvNet + SyncBatchNorm + DDP, 2 x 50 images, equals 1 process x 100 images") {
    expect_all_ok(spawn_ranks("sync_bn_convnet_equivalence", 2,
                              on_shm(std::chrono::seconds(50))));
  }
  TEST_CASE("ResNet-18 (CIFAR stem) + SyncBatchNorm + DDP, 2 x 4 images, equals 1 process x 8 images") {
    expect_all_ok(spawn_ranks("sync_bn_resnet_equivalence", 2, {.deadline = std::chrono::seconds(50)}));
  }
}

TEST_SUITE("metrics") {
  TEST_CASE("ShardSampler: every index once, in order, no padding") {
    std::vector<int64_t> seen;
    int64_t total = 0;
    for (int64_t rank = 0; rank < 3; ++rank) {
      ShardSampler shard(10, 3, rank);
      auto indices = shard.indices();
      CHECK(static_cast<int64_t>(indices.size()) == shard.size());
      total += shard.size();
      for (size_t i = 0; i < indices.size(); ++i) CHECK(indices[i] == rank + 3 * static_cast<int64_t>(i));
    }
    CHECK(total == 10);
    CHECK(ShardSampler(2, 4, 3).size() == 0);
  }
  TEST_CASE("all_reduce_accuracy sums (correct, total) over 3 ranks") {
    expect_all_ok(spawn_ranks("accuracy_all_reduce", 3));
  }
  TEST_CASE("all_reduce_accuracy without a group returns the local counts") {
    AccuracyCounts local{.correct = 3, .total = 4};
    CHECK(all_reduce_accuracy(local, nullptr).correct == 3);
    CHECK(all_reduce_accuracy(local, nullptr).accuracy() == doctest::Approx(0.75));
  }
}

// DDP's buckets for channels-last parameters; beside the scenario above for its Training helpers.
TEST_SUITE("ddp") {
  TEST_CASE("channels-last ResNet-18 under DDP, 2 x 4 images, equals 1 NCHW process x 8 images") {
    expect_all_ok(spawn_ranks("ddp_channels_last_resnet_equivalence", 2, {.deadline = std::chrono::seconds(50)}));
  }
}
