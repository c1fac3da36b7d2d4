// DistributedDataParallel: bucket assignment (hand-computed and ResNet-18
// shaped), and training on 2 and 4 ranks checked against one process training
// on the whole batch: same parameters after several SGD steps, gradients
// averaged when backward() returns (end-of-backward callback), no_sync
// accumulation, unused parameters, buffer broadcast, fp16 / bf16 compression,
// bucket all-reduces overlapping backward, gradients computed straight into
// the buckets (no copy), and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include <loom/core/autograd.h>
#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/core/memory_format.h>
#include <loom/dist/ddp.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include <loom/ops/loss.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<ProcessGroup> group_from_environment() { return testing::group_from_environment(20s); }

// DDP's options with buckets of at most `first` bytes first and `later` bytes after.
DistributedDataParallelOptions bucket_caps(size_t first, size_t later) {
  return DistributedDataParallelOptions().first_bucket_bytes_cap(first).bucket_bytes_cap(later);
}

// A scenario's group, and tiny_model(seed) under DDP in buckets of 64 bytes
// first and 128 after (the MLP's parameters span several).
struct TinyDdp {
  explicit TinyDdp(uint64_t seed)
      : model(tiny_model(seed)), ddp(model, group, bucket_caps(64, 128)) {}
  std::shared_ptr<ProcessGroup> group = group_from_environment();
  int rank = group->rank(), world = group->size();
  std::shared_ptr<nn::Module> model;
  DistributedDataParallel ddp;
};

// Forward and backward of a rank's two micro-batches of kSamples / world / 2
// rows (rank r's are the 2r-th and the (2r + 1)-th), each loss times
// `loss_scale`, the first under no_sync; `under_no_sync` runs before that
// guard ends.
void backward_two_micro_batches(TinyDdp& run, double loss_scale, const std::function<void()>& under_no_sync = [] {}) {
  const int64_t micro = kSamples / run.world / 2, first = run.rank * 2 * micro;
  {
    auto guard = run.ddp.no_sync();
    (mse(run.ddp.forward(inputs(first, micro)), targets(first, micro)) * loss_scale).backward();
    under_no_sync();
  }
  (mse(run.ddp.forward(inputs(first + micro, micro)), targets(first + micro, micro)) * loss_scale).backward();
}

// A module with a branch forward never uses.
class TwoHeads : public nn::Module {
 public:
  TwoHeads() {
    used = register_module("used", std::make_shared<nn::Linear>(6, 3));
    unused = register_module("unused", std::make_shared<nn::Linear>(6, 3));
    to(DType::f64);
  }
  Tensor forward(const Tensor& input) override { return used->forward(input); }
  std::string type_name() const override { return "TwoHeads"; }
  std::shared_ptr<nn::Linear> used, unused;
};

// ResNet-18's parameter shapes in registration order (conv, bn weight, bn bias, ...).
std::vector<std::pair<std::string, Shape>> resnet18_parameter_shapes() {
  std::vector<std::pair<std::string, Shape>> shapes = {
      {"conv1.weight", {64, 3, 7, 7}}, {"bn1.weight", {64}}, {"bn1.bias", {64}}};
  int64_t in = 64;
  for (int layer = 1; layer <= 4; ++layer) {
    int64_t out = 64 << (layer - 1);
    for (int block = 0; block < 2; ++block) {
      std::string prefix = str("layer", layer, ".", block, ".");
      int64_t block_in = block == 0 ? in : out;
      shapes.push_back({prefix + "conv1.weight", {out, block_in, 3, 3}});
      shapes.push_back({prefix + "bn1.weight", {out}});
      shapes.push_back({prefix + "bn1.bias", {out}});
      shapes.push_back({prefix + "conv2.weight", {out, out, 3, 3}});
      shapes.push_back({prefix + "bn2.weight", {out}});
      shapes.push_back({prefix + "bn2.bias", {out}});
      if (block == 0 && layer > 1) {
        shapes.push_back({prefix + "downsample.0.weight", {out, block_in, 1, 1}});
        shapes.push_back({prefix + "downsample.1.weight", {out}});
        shapes.push_back({prefix + "downsample.1.bias", {out}});
      }
    }
    in = out;
  }
  shapes.push_back({"fc.weight", {1000, 512}});
  shapes.push_back({"fc.bias", {1000}});
  return shapes;
}

// conv -> batch norm -> relu -> linear in f64, initialised from `seed`: every
// op whose backward writes parameter gradients into their buckets. With
// `front_channels` > 0, a 3x3 conv (1 -> front_channels, padding 1) and a
// relu come first, so that the second conv's weight (2, front_channels, 3, 3)
// lies differently in NCHW and channels-last.
std::shared_ptr<nn::Module> tiny_conv_model(uint64_t seed, int64_t front_channels = 0) {
  manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>();
  if (front_channels > 0) {
    model->push_back(std::make_shared<nn::Conv2d>(1, front_channels, 3, 1, 1));
    model->push_back(std::make_shared<nn::ReLU>());
  }
  model->push_back(std::make_shared<nn::Conv2d>(std::max<int64_t>(front_channels, 1), 2, 3));
  model->push_back(std::make_shared<nn::BatchNorm2d>(2));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(2 * 4 * 4, 3));
  model->to(DType::f64);
  return model;
}

// Images [first, first + count) of a fixed (8, 1, 6, 6) set.
Tensor images(int64_t first, int64_t count) {
  std::vector<double> values;
  for (int64_t i = first * 36; i < (first + count) * 36; ++i) values.push_back(std::sin(0.41 * static_cast<double>(i)));
  return Tensor::from_vector_as(values, {count, 1, 6, 6}, DType::f64);
}

// Registers, ahead of DDP's own hooks, a hook recording per parameter whether
// autograd left .grad as the parameter's gradient buffer (the bucket view):
// then backward computed it there and DDP had nothing to copy.
std::shared_ptr<std::vector<int>> watch_gradients_in_place(nn::Module& model) {
  auto in_place = std::make_shared<std::vector<int>>();
  auto parameters = model.parameters();
  in_place->assign(parameters.size(), -1);
  for (size_t i = 0; i < parameters.size(); ++i) {
    parameters[i].register_post_accumulate_grad_hook([in_place, i](Tensor& parameter) {
      const Tensor& buffer = grad_accumulator(parameter)->gradient_buffer();
      (*in_place)[i] = buffer.defined() && parameter.grad().is_same(buffer);
    });
  }
  return in_place;
}

// Every parameter's .grad lies in its bucket: the parameters of a bucket share
// one storage, back to back in bucket order.
void expect_gradients_in_buckets(const DistributedDataParallel& ddp, nn::Module& model) {
  std::map<std::string, Tensor> by_name;
  for (auto& [name, parameter] : model.named_parameters()) by_name[name] = parameter;
  for (const auto& bucket : ddp.bucket_parameter_names()) {
    const Tensor first = by_name.at(bucket.front()).grad();
    const char* next = static_cast<const char*>(first.raw_data());
    for (const std::string& name : bucket) {
      const Tensor grad = by_name.at(name).grad();
      expect(grad.storage() == first.storage(), "'", name, "'s gradient is not in its bucket");
      expect(grad.raw_data() == next, "'", name, "'s gradient is not where its bucket puts it");
      next += grad.nbytes();
    }
  }
}
}  // namespace

TEST_SUITE("ddp") {
  TEST_CASE("options: PyTorch's defaults, set by chained calls") {
    const DistributedDataParallelOptions defaults;
    CHECK(defaults.first_bucket_bytes_cap() == size_t{1} << 20);
    CHECK(defaults.bucket_bytes_cap() == size_t{25} << 20);
    CHECK(!defaults.find_unused_parameters());
    CHECK(defaults.broadcast_buffers());
    const auto set = DistributedDataParallelOptions()
                         .first_bucket_bytes_cap(3)
                         .bucket_bytes_cap(5)
                         .find_unused_parameters(true)
                         .broadcast_buffers(false);
    CHECK(set.first_bucket_bytes_cap() == 3);
    CHECK(set.bucket_bytes_cap() == 5);
    CHECK(set.find_unused_parameters());
    CHECK(!set.broadcast_buffers());
  }

  TEST_CASE("bucket assignment, hand-computed") {
    // f32 parameters of 400, 800, 1200 and 200 bytes, then an f64 one of 80 bytes;
    // caps: first bucket 1000 bytes, later ones 2000.
    std::vector<Tensor> parameters = {Tensor::zeros({100}), Tensor::zeros({200}), Tensor::zeros({300}),
                                      Tensor::zeros({50}), Tensor::zeros({10}, DType::f64)};
    auto buckets = assign_buckets(parameters, 1000, 2000);
    // Reverse order: p4 opens the f64 bucket; p3 (200 B) the first f32 bucket,
    // which p2 (1200 B) would overflow; p2 + p1 fill 2000 B exactly; p0 starts another.
    std::vector<std::vector<size_t>> expected = {{4}, {3}, {2, 1}, {0}};
    CHECK(buckets == expected);
  }

  TEST_CASE("bucket assignment, ResNet-18 parameters") {
    auto shapes = resnet18_parameter_shapes();
    std::vector<Tensor> parameters;
    for (auto& [name, shape] : shapes) parameters.push_back(Tensor::empty(shape));
    CHECK(parameters.size() == 62);
    constexpr size_t first_cap = size_t{1} << 20, cap = size_t{25} << 20;
    auto buckets = assign_buckets(parameters, first_cap, cap);

    // fc.bias (4000 B) opens the first bucket; fc.weight (2 MB) does not fit in 1 MiB.
    REQUIRE(buckets.size() >= 2);
    CHECK(buckets[0] == std::vector<size_t>{61});
    CHECK(buckets[1].front() == 60);
    // Every parameter exactly once, buckets are consecutive runs in reverse order,
    // each bucket is within its cap and as full as the greedy rule makes it.
    size_t next = parameters.size();
    for (size_t b = 0; b < buckets.size(); ++b) {
      size_t bytes = 0;
      for (size_t index : buckets[b]) {
        CHECK(index == --next);
        bytes += parameters[index].nbytes();
      }
      size_t bucket_cap = b == 0 ? first_cap : cap;
      CHECK((bytes <= bucket_cap || buckets[b].size() == 1));
      if (b + 1 < buckets.size()) CHECK(bytes + parameters[buckets[b + 1].front()].nbytes() > bucket_cap);
    }
    CHECK(next == 0);
    // 11.7M f32 parameters (46.8 MB): the 1 MiB bucket plus two of at most 25 MiB.
    int64_t total = 0;
    for (auto& p : parameters) total += p.numel();
    CHECK(total == 11689512);
    CHECK(buckets.size() == 3);
  }

  TEST_CASE("world of one: buckets back the gradients, timings, errors") {
    auto group = world_of_one();
    auto model = tiny_model(7);
    DistributedDataParallel ddp(model, group, bucket_caps(64, 128));
    // 2.bias 24 B | 2.weight 120 B | 0.bias 40 B | 0.weight 240 B (f64).
    std::vector<std::vector<std::string>> expected = {{"2.bias"}, {"2.weight"}, {"0.bias"}, {"0.weight"}};
    CHECK(ddp.bucket_parameter_names() == expected);

    Tensor loss = mse(ddp.forward(inputs(0, 4)), targets(0, 4));
    loss.backward();  // the end-of-backward callback finishes the reduction
    auto timings = ddp.bucket_timings();
    REQUIRE(timings.size() == 4);
    for (size_t b = 0; b < timings.size(); ++b) {
      CHECK(timings[b].ready <= timings[b].launched);
      CHECK(timings[b].launched <= timings[b].done);
      CHECK(timings[b].done != std::chrono::steady_clock::time_point{});
      if (b > 0) CHECK(timings[b - 1].launched <= timings[b].launched);
    }
    IterationTiming iteration = ddp.last_iteration_timing();
    CHECK(iteration.forward_end <= iteration.first_gradient);
    CHECK(iteration.first_gradient <= timings[0].ready);
    CHECK(timings.back().launched <= iteration.backward_end);
    CHECK(iteration.backward_end <= iteration.reduced);
    ddp.wait_for_gradients();  // kept for older code: a no-op now
    // Gradients equal those of the bare model.
    auto reference = tiny_model(7);
    mse(reference->forward(inputs(0, 4)), targets(0, 4)).backward();
    expect_close(model->named_parameters(), reference->named_parameters(), "world-1 gradients", true);

    // zero_grad(set_to_none) drops the views; the hooks restore them.
    model->zero_grad(true);
    Tensor again = mse(ddp.forward(inputs(0, 4)), targets(0, 4));
    again.backward(Tensor(), true);
    expect_close(model->named_parameters(), reference->named_parameters(), "gradients after set_to_none", true);
    // A second backward after one forward marks parameters ready twice.
    std::string twice = error_of([&] { again.backward(); });
    CHECK(contains(twice, "was marked ready twice"));
    CHECK(contains(twice, "parameter '2."));  // the last layer's gradients arrive first
  }

  TEST_CASE("world of one: backward writes the gradients into the buckets, no copy") {
    auto group = world_of_one();
    auto model = tiny_conv_model(11);
    auto in_place = watch_gradients_in_place(*model);
    auto reference = tiny_conv_model(11);
    {
      DistributedDataParallel ddp(model, group, bucket_caps(64, 256));
      for (auto& named : model->named_parameters())
        CHECK_MESSAGE(grad_accumulator(named.second)->gradient_buffer().defined(), named.first);
      for (int step = 0; step < 2; ++step) {
        model->zero_grad(true);  // PyTorch 2's default: .grad undefined at every backward
        reference->zero_grad(true);
        std::fill(in_place->begin(), in_place->end(), -1);
        mse(ddp.forward(images(0, 4)), targets(0, 4)).backward();
        mse(reference->forward(images(0, 4)), targets(0, 4)).backward();
        for (size_t i = 0; i < in_place->size(); ++i) CHECK_MESSAGE((*in_place)[i] == 1, "parameter ", i);
        expect_gradients_in_buckets(ddp, *model);
        expect_close(model->named_parameters(), reference->named_parameters(), "in-place gradients", true);
      }
      // Accumulation without zero_grad adds in the buckets.
      mse(ddp.forward(images(4, 4)), targets(4, 4)).backward();
      mse(reference->forward(images(4, 4)), targets(4, 4)).backward();
      expect_gradients_in_buckets(ddp, *model);
      expect_close(model->named_parameters(), reference->named_parameters(), "accumulated gradients", true);
    }
    // Without DDP the buckets are no longer where gradients go.
    for (auto& named : model->named_parameters())
      CHECK_MESSAGE(!grad_accumulator(named.second)->gradient_buffer().defined(), named.first);
  }

  TEST_CASE("world of one: channels-last parameters have channels-last bucket views; to() after DDP is refused") {
    auto group = world_of_one();
    auto model = tiny_conv_model(11, 3);
    model->to(MemoryFormat::nhwc);  // before DDP, as PyTorch asks
    auto reference = tiny_conv_model(11, 3);
    DistributedDataParallel ddp(model, group, bucket_caps(64, 256));
    for (int step = 0; step < 2; ++step) {
      model->zero_grad(true);
      reference->zero_grad(true);
      mse(ddp.forward(images(0, 4)), targets(0, 4)).backward();
      mse(reference->forward(images(0, 4)), targets(0, 4)).backward();
      expect_gradients_in_buckets(ddp, *model);
      expect_close(model->named_parameters(), reference->named_parameters(), "channels-last gradients", true);
    }
    int channels_last = 0;
    for (auto& [name, parameter] : model->named_parameters()) {
      CHECK_MESSAGE(same_dense_layout(parameter.grad(), parameter), name);
      channels_last += memory_format_of(parameter) == MemoryFormat::nhwc;
    }
    CHECK(channels_last == 1);  // the second conv's (2, 3, 3, 3) weight; the first's (3, 1, 3, 3) lies alike in both
    CHECK_THROWS_WITH_AS(model->to(MemoryFormat::nchw), doctest::Contains("change the memory format before wrapping"),
                         Error);
  }

  TEST_CASE("world of one: unused parameters") {
    auto group = world_of_one();
    auto strict_model = std::make_shared<TwoHeads>();
    DistributedDataParallel strict(strict_model, group);
    Tensor loss = mse(strict.forward(inputs(0, 4)), targets(0, 4));
    std::string message = error_of([&] { loss.backward(); });  // thrown by the end-of-backward callback
    CHECK(contains(message, "parameters 'unused.weight', 'unused.bias' received no gradient"));
    CHECK(contains(message, "find_unused_parameters"));

    auto model = std::make_shared<TwoHeads>();
    DistributedDataParallel tolerant(model, group, DistributedDataParallelOptions().find_unused_parameters(true));
    mse(tolerant.forward(inputs(0, 4)), targets(0, 4)).backward();
    CHECK(model->unused->weight.grad().defined());
    for (double g : model->unused->weight.grad().to_vector<double>()) CHECK(g == 0.0);
  }
}

// Several SGD steps on `world` ranks, each on its share of the batch, equal
// one process stepping on the whole batch.
LOOM_DIST_SCENARIO("ddp_equivalence") {
  auto group = group_from_environment();
  expect_ddp_steps_equal_one_process(group, Device::cpu(), bucket_caps(64, 128), [](DistributedDataParallel& ddp) {
    expect(ddp.bucket_parameter_names().size() == 4, "expected 4 buckets");
    for (const auto& timing : ddp.bucket_timings())
      expect(timing.ready <= timing.launched && timing.launched <= timing.started && timing.started <= timing.done,
             "bucket ", timing.bucket, " timestamps out of order");
  });
  group->barrier()->wait();
}

// Accumulating two micro-batches under no_sync, then reducing, equals one
// process accumulating every micro-batch.
LOOM_DIST_SCENARIO("ddp_no_sync") {
  TinyDdp run(200);
  backward_two_micro_batches(run, 1.0, [&] {
    run.ddp.wait_for_gradients();  // returns at once: nothing to reduce
    for (const auto& timing : run.ddp.bucket_timings())
      expect(timing.launched == std::chrono::steady_clock::time_point{}, "a bucket was launched under no_sync");
  });

  auto reference = tiny_model(200);
  const int64_t micro = kSamples / run.world / 2;
  for (int64_t m = 0; m < 2 * run.world; ++m)
    mse(reference->forward(inputs(m * micro, micro)), targets(m * micro, micro)).backward();
  for (auto& [name, parameter] : reference->named_parameters()) parameter.mutable_grad().mul_(1.0 / run.world);
  expect_close(run.model->named_parameters(), reference->named_parameters(), "accumulated gradients", true);
  run.group->barrier()->wait();
}

// Gradients computed straight into the buckets on 2 ranks: no copy into the
// buckets, and .grad holds the average of each rank's gradient (batch norm
// normalises per rank, so the reference runs each rank's share separately).
LOOM_DIST_SCENARIO("ddp_in_place") {
  auto group = group_from_environment();
  int rank = group->rank(), world = group->size();
  auto model = tiny_conv_model(300);
  auto in_place = watch_gradients_in_place(*model);
  DistributedDataParallel ddp(model, group, bucket_caps(64, 256));
  const int64_t share = kSamples / world;
  auto reference = tiny_conv_model(300);
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(true);
    reference->zero_grad(true);
    std::fill(in_place->begin(), in_place->end(), -1);
    mse(ddp.forward(images(rank * share, share)), targets(rank * share, share)).backward();
    for (size_t i = 0; i < in_place->size(); ++i)
      expect((*in_place)[i] == 1, "rank ", rank, ": parameter ", i, "'s gradient was not computed in its bucket");
    expect_gradients_in_buckets(ddp, *model);
    for (int r = 0; r < world; ++r)
      mse(reference->forward(images(r * share, share)), targets(r * share, share)).backward();
    for (auto& [name, parameter] : reference->named_parameters()) parameter.mutable_grad().mul_(1.0 / world);
    expect_close(model->named_parameters(), reference->named_parameters(), str("averaged gradients, rank ", rank),
                 true);
    sgd_step(*model, 0.1);
    sgd_step(*reference, 0.1);
  }
  group->barrier()->wait();
}

// find_unused_parameters on several ranks: the used head matches the
// reference, the unused head's gradient is zero everywhere.
LOOM_DIST_SCENARIO("ddp_unused") {
  auto group = group_from_environment();
  int rank = group->rank(), world = group->size();
  auto model = std::make_shared<TwoHeads>();
  DistributedDataParallel ddp(model, group, DistributedDataParallelOptions().find_unused_parameters(true));
  int64_t share = kSamples / world;
  for (int step = 0; step < 2; ++step) {
    mse(ddp.forward(inputs(rank * share, share)), targets(rank * share, share)).backward();
    for (double g : model->unused->weight.grad().to_vector<double>()) expect(g == 0.0, "unused gradient ", g);
    sgd_step(*model, 0.1);
  }
  group->barrier()->wait();
}

// Rank 0's buffers reach every rank at construction and before each forward.
LOOM_DIST_SCENARIO("ddp_buffers") {
  auto group = group_from_environment();
  int rank = group->rank(), world = group->size();
  auto batch_norm = std::make_shared<nn::BatchNorm2d>(2);
  batch_norm->running_mean.fill_(rank + 1.0);
  DistributedDataParallel ddp(batch_norm, group);
  for (float v : batch_norm->running_mean.to_vector<float>()) expect(v == 1.0f, "running_mean after wrapping: ", v);
  ddp.eval();
  batch_norm->running_mean.fill_(10.0 * (rank + 1));
  NoGradGuard no_grad;
  Tensor output = ddp.forward(Tensor::ones({1, 2, 2, 2}));
  for (float v : batch_norm->running_mean.to_vector<float>()) expect(v == 10.0f, "running_mean after forward: ", v);
  expect(output.numel() == 8 && world > 1, "unexpected output");
  group->barrier()->wait();
}

// Different models on different ranks: construction fails on every rank with the reason.
LOOM_DIST_SCENARIO("ddp_mismatch") {
  auto group = group_from_environment();
  int rank = group->rank();
  auto model = std::make_shared<nn::Linear>(6, rank == 1 ? 4 : 5);
  std::string message = error_of([&] { DistributedDataParallel ddp(model, group); });
  expect(contains(message, "parameter 0 differs between rank 0 and rank 1"), "unexpected error: ", message);
  expect(contains(message, "'weight'"), "error does not name the parameter: ", message);
  group->barrier()->wait();
}

// Gradient accumulation: two micro-batches per rank, each loss halved, the
// first under no_sync, equal one process on one batch of all the samples.
LOOM_DIST_SCENARIO("ddp_no_sync_double_batch") {
  TinyDdp run(300);
  for (int step = 0; step < 2; ++step) {
    backward_two_micro_batches(run, 0.5);
    sgd_step(*run.model, 0.1);
  }
  auto reference = tiny_model(300);
  for (int step = 0; step < 2; ++step) {
    mse(reference->forward(inputs(0, kSamples)), targets(0, kSamples)).backward();
    sgd_step(*reference, 0.1);
  }
  expect_close(run.model->named_parameters(), reference->named_parameters(), "parameters after 2 accumulated steps");
  run.group->barrier()->wait();
}

// compress_hook divides before casting: values near f16's limit (65504) on
// every rank average without overflow, and small ones keep f16 precision.
LOOM_DIST_SCENARIO("ddp_compress_hook") {
  auto group = group_from_environment();
  int rank = group->rank(), world = group->size();
  for (DType wire : {DType::f16, DType::bf16}) {
    const double tolerance = wire == DType::f16 ? 2e-3 : 1.6e-2;  // about 2 roundings of 11 / 8 mantissa bits
    std::vector<float> mine = {60000.0f, 1e-3f * (rank + 1), -3.25f, 0.0f, 12.5f * (rank % 2 ? -1 : 1)};
    std::vector<double> average(mine.size(), 0.0);
    for (int r = 0; r < world; ++r) {
      std::vector<double> theirs = {60000.0, 1e-3 * (r + 1), -3.25, 0.0, 12.5 * (r % 2 ? -1 : 1)};
      for (size_t i = 0; i < theirs.size(); ++i) average[i] += theirs[i] / world;
    }
    Tensor bucket = Tensor::from_vector<float>(mine, {static_cast<int64_t>(mine.size())});
    BucketReduction reduction = compress_hook(wire)(*group, bucket);
    expect(reduction.work != nullptr && reduction.wire_bytes == mine.size() * 2, "compress_hook launched nothing");
    reduction.work->wait();
    reduction.finish();
    std::vector<float> result = bucket.to_vector<float>();
    for (size_t i = 0; i < result.size(); ++i)
      expect(std::isfinite(result[i]) && std::abs(result[i] - average[i]) <= tolerance * (std::abs(average[i]) + 1e-3),
             dtype_name(wire), " compression: element ", i, " is ", result[i], ", expected ", average[i]);
  }

  // Through DDP: gradients within f16 precision of the exact average.
  auto model = tiny_model(400);
  auto exact = tiny_model(400);
  DistributedDataParallel ddp(model, group);
  ddp.register_comm_hook(compress_hook(DType::f16));
  const int64_t share = kSamples / world;
  mse(ddp.forward(inputs(rank * share, share)), targets(rank * share, share)).backward();
  mse(exact->forward(inputs(0, kSamples)), targets(0, kSamples)).backward();
  auto actual = model->named_parameters(), expected = exact->named_parameters();
  for (size_t k = 0; k < actual.size(); ++k) {
    std::vector<double> a = actual[k].second.grad().to_vector<double>(), b = expected[k].second.grad().to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i)
      expect(std::abs(a[i] - b[i]) <= 2e-3 * std::abs(b[i]) + 1e-4, "f16-compressed gradient of '", actual[k].first,
             "'[", i, "] is ", a[i], ", expected ", b[i]);
  }
  for (const auto& timing : ddp.bucket_timings())
    expect(timing.wire_bytes * 4 == timing.bytes, "bucket ", timing.bucket, ": ", timing.wire_bytes,
           " bytes on the wire for an f64 bucket of ", timing.bytes, " bytes compressed to f16");
  group->barrier()->wait();
}

// With one bucket per parameter, the first bucket (the last layer's bias) is
// launched as soon as its gradient exists and its all-reduce starts while the
// convolutions' backward (tens of ms) still runs. Launching is deterministic;
// when the communication thread gets a core is up to the scheduler, so that
// must happen in at least one of three steps.
LOOM_DIST_SCENARIO("ddp_overlap") {
  auto group = group_from_environment();
  manual_seed(5);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 64, 3, 1, 1), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(64, 64, 3, 1, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(64 * 40 * 40, 10)});
  DistributedDataParallel ddp(model, group, bucket_caps(1, 1));
  expect(ddp.bucket_parameter_names().size() == 6, "expected one bucket per parameter");
  std::vector<double> pixels(16 * 3 * 40 * 40);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.001 * static_cast<double>(i) * (group->rank() + 1));
  Tensor images = Tensor::from_vector_as(pixels, {16, 3, 40, 40}, DType::f32);
  Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16});
  int overlapped_steps = 0;
  std::string timelines;
  for (int step = 0; step < 3; ++step) {
    model->zero_grad();
    cross_entropy(ddp.forward(images), labels).backward();
    IterationTiming timing = ddp.last_iteration_timing();
    auto ms = [&](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::milli>(t - timing.forward_end).count();
    };
    std::string timeline = str("\n  step ", step, ": first gradient ", ms(timing.first_gradient), " ms, backward end ",
                               ms(timing.backward_end), " ms, reduced ", ms(timing.reduced), " ms; buckets:");
    for (const auto& bucket : timing.buckets)
      timeline += str(" [", bucket.bucket, ": ", bucket.bytes, " B ready ", ms(bucket.ready), " launched ",
                      ms(bucket.launched), " started ", ms(bucket.started), " done ", ms(bucket.done), "]");
    timelines += timeline;
    const BucketTiming& first = timing.buckets.front();
    expect(first.launched < timing.backward_end, "the first bucket was not launched before backward ended:", timeline);
    expect(timing.buckets.back().launched <= timing.backward_end && timing.backward_end <= timing.reduced,
           "timeline out of order:", timeline);
    for (const auto& bucket : timing.buckets)
      expect(bucket.ready <= bucket.launched && bucket.launched <= bucket.started && bucket.started <= bucket.done,
             "bucket ", bucket.bucket, " out of order:", timeline);
    if (first.started < timing.backward_end) ++overlapped_steps;
  }
  expect(overlapped_steps > 0, "in no step did the first bucket's all-reduce start before backward ended:", timelines);
  group->barrier()->wait();
}

TEST_SUITE("ddp") {
  TEST_CASE("2 ranks equal 1 process on the whole batch") { expect_all_ok(spawn_ranks("ddp_equivalence", 2)); }
  TEST_CASE("4 ranks equal 1 process on the whole batch") { expect_all_ok(spawn_ranks("ddp_equivalence", 4)); }
  TEST_CASE("2 ranks: gradients computed in the buckets") { expect_all_ok(spawn_ranks("ddp_in_place", 2)); }
  TEST_CASE("no_sync accumulates, then one reduction") { expect_all_ok(spawn_ranks("ddp_no_sync", 2)); }
  TEST_CASE("no_sync over 2 micro-batches equals one batch of twice the size") {
    expect_all_ok(spawn_ranks("ddp_no_sync_double_batch", 2));
  }
  TEST_CASE("fp16 / bf16 compression hook") { expect_all_ok(spawn_ranks("ddp_compress_hook", 2)); }
  TEST_CASE("the first bucket's all-reduce starts before backward ends") { expect_all_ok(spawn_ranks("ddp_overlap", 2)); }
  TEST_CASE("find_unused_parameters across ranks") { expect_all_ok(spawn_ranks("ddp_unused", 2)); }
  TEST_CASE("buffers are broadcast from rank 0") { expect_all_ok(spawn_ranks("ddp_buffers", 2)); }
  // The same scenarios over shared memory: collectives that finish inside the
  // backward hooks, before the call returns.
  TEST_CASE("shm: 2 and 4 ranks equal 1 process on the whole batch") {
    expect_all_ok(spawn_ranks("ddp_equivalence", 2, on_shm()));
    expect_all_ok(spawn_ranks("ddp_equivalence", 4, on_shm()));
  }
  TEST_CASE("shm: gradients computed in the buckets; no_sync; unused parameters; buffers") {
    for (const char* scenario : {"ddp_in_place", "ddp_no_sync", "ddp_unused", "ddp_buffers", "ddp_compress_hook"}) {
      CAPTURE(scenario);
      expect_all_ok(spawn_ranks(scenario, 2, on_shm()));
    }
  }
  TEST_CASE("different models on different ranks are rejected") { expect_all_ok(spawn_ranks("ddp_mismatch", 2)); }
}
