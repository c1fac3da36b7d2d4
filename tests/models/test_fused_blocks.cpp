// ResNet blocks with each batch norm, ReLU and the convolution after them as
// one op (batch_norm_relu_conv2d, issue 47; on CUDA under LOOM_CUDNN_GRAPH=1,
// here inside an ops::FuseBatchNormConv scope): which modules fuse, and that
// on the CPU, where the op runs the kernels of the ops apart, training steps
// of ResNet-18 and ResNet-50 (NCHW, channels-last, amp O2) and an eval
// forward equal the unfused model's bit for bit, with the statistics each
// fused convolution hands to the next batch norm. (The CUDA graphs: tests/gpu.)
#include <doctest/doctest.h>

#include <cstring>
#include <optional>
#include <set>
#include <string>

#include <loom/core/generator.h>
#include <loom/core/memory_format.h>
#include <loom/dist/sync_batch_norm.h>
#include <loom/nn/resnet.h>
#include <loom/ops/batch_norm_conv2d.h>
#include <loom/ops/loss.h>
#include <loom/optim/amp.h>
#include <loom/optim/optimizer.h>

using namespace loom;

namespace {

std::shared_ptr<nn::ResNet> model_of(const std::string& name, uint64_t seed) {
  manual_seed(seed);
  // ResNet-50 at width 8 (bottlenecks of 8..64 planes, 256 channels out): its structure, cheap.
  return nn::make_resnet(name, nn::ResNetOptions().num_classes(10).stem(nn::ResNetStem::cifar).width(
                                   name == "resnet50" ? 8 : 64));
}

Tensor batch_images(DType dtype = DType::f32) {
  Generator generator(5);
  Tensor images = Tensor::empty({4, 3, 16, 16});
  generator.normal_(images, 0.0, 1.0);
  return images.to(dtype);
}
Tensor batch_labels() { return Tensor::from_vector<int64_t>({3, 7, 0, 9}, {4}); }

// The nodes named `name` in the autograd graph behind `root`.
int count_nodes(const Tensor& root, const std::string& name) {
  std::set<const Node*> seen;
  std::vector<const Node*> stack{root.grad_fn().get()};
  int count = 0;
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    count += node->name() == name ? 1 : 0;
    for (const Edge& edge : node->next_edges) stack.push_back(edge.node.get());
  }
  return count;
}

// Every value a run produced, as f64 bits in logical order.
void append(std::vector<double>& out, const Tensor& t) {
  for (double v : t.to_vector<double>()) out.push_back(v);
}
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Two SGD steps (momentum, weight decay) of `name` in `format`, fused or
// not: the losses, every state_dict value (running stats included) and every
// gradient; the fused ops of the first step's graph into `fused_ops`.
std::vector<double> train(const std::string& name, bool fused, MemoryFormat format, int* fused_ops = nullptr) {
  auto model = model_of(name, 11);
  model->to(format);
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4));
  const Tensor images = in_memory_format(batch_images(), format);
  std::vector<double> out;
  for (int step = 0; step < 2; ++step) {
    sgd.zero_grad();
    Tensor loss;
    {
      std::optional<ops::FuseBatchNormConv> fuse;
      if (fused) fuse.emplace();
      loss = cross_entropy((*model)(images), batch_labels());
    }
    if (step == 0 && fused_ops != nullptr) *fused_ops = count_nodes(loss, "batch_norm_relu_conv2d");
    loss.backward();
    sgd.step();
    append(out, loss);
  }
  for (auto& [key, t] : model->state_dict()) append(out, t);
  for (const Tensor& p : model->parameters()) append(out, p.grad());
  return out;
}

}  // namespace

TEST_SUITE("fused_blocks") {
  TEST_CASE("ResNet-18 and ResNet-50 fuse every batch norm + ReLU before a block's convolution") {
    for (auto [name, expected] : {std::pair<std::string, int>{"resnet18", 8}, {"resnet50", 32}}) {
      INFO(name);
      int fused_ops = -1;
      train(name, true, MemoryFormat::nchw, &fused_ops);
      CHECK(fused_ops == expected);  // BasicBlock: bn1 -> conv2; Bottleneck: bn1 -> conv2, bn2 -> conv3
      train(name, false, MemoryFormat::nchw, &fused_ops);
      CHECK(fused_ops == 0);
    }
  }

  TEST_CASE("fused ResNet-18 and ResNet-50 SGD steps equal the unfused ones bit for bit, NCHW and channels-last") {
    for (const std::string name : {"resnet18", "resnet50"}) {
      for (MemoryFormat format : {MemoryFormat::nchw, MemoryFormat::nhwc}) {
        if (name == "resnet18" && format == MemoryFormat::nhwc) continue;  // the NCHW case covers its blocks
        INFO(name, std::string(format == MemoryFormat::nhwc ? " channels-last" : " NCHW"));
        CHECK(same_bits(train(name, true, format), train(name, false, format)));
      }
    }
  }

  TEST_CASE("amp O2 ResNet-50 (f16 convolutions, f32 batch norms): fused steps equal unfused ones bit for bit") {
    const auto run = [](bool fused) {
      auto model = model_of("resnet50", 7);
      model->to(MemoryFormat::nhwc);
      auto optimizer = amp::initialize(
          *model,
          [](std::vector<Tensor> parameters) -> std::unique_ptr<optim::Optimizer> {
            return std::make_unique<optim::SGD>(std::move(parameters), optim::SGDOptions(0.05).momentum(0.9));
          },
          amp::OptLevel::O2, optim::GradScalerOptions().init_scale(128));
      const Tensor images = in_memory_format(batch_images(DType::f16), MemoryFormat::nhwc);
      std::vector<double> out;
      int fused_ops = 0;
      for (int step = 0; step < 2; ++step) {
        optimizer->zero_grad();
        Tensor loss;
        {
          auto autocast = optimizer->autocast();
          std::optional<ops::FuseBatchNormConv> fuse;
          if (fused) fuse.emplace();
          loss = cross_entropy((*model)(images), batch_labels());
        }
        fused_ops += count_nodes(loss, "batch_norm_relu_conv2d");
        optimizer->scale_loss(loss).backward();
        optimizer->step();
        append(out, loss);
      }
      CHECK(fused_ops == (fused ? 64 : 0));
      CHECK(optimizer->scaler().skipped_steps() == 0);
      for (auto& [key, t] : model->state_dict()) append(out, t);
      return out;
    };
    CHECK(same_bits(run(true), run(false)));
  }

  TEST_CASE("in eval mode a fused ResNet-50 gives the unfused outputs and leaves the running stats") {
    auto model = model_of("resnet50", 13);
    const Tensor images = batch_images();
    {
      NoGradGuard no_grad;
      (*model)(images);  // a training forward: running stats away from their initial values
    }
    model->eval();
    std::vector<double> stats_before;
    for (auto& [key, t] : model->state_dict()) append(stats_before, t);
    Tensor fused_out;
    {
      ops::FuseBatchNormConv fuse;
      NoGradGuard no_grad;
      fused_out = (*model)(images);
    }
    NoGradGuard no_grad;
    std::vector<double> a, b;
    append(a, fused_out);
    append(b, (*model)(images));
    CHECK(same_bits(a, b));
    std::vector<double> stats_after;
    for (auto& [key, t] : model->state_dict()) append(stats_after, t);
    CHECK(same_bits(stats_after, stats_before));
  }

  TEST_CASE("a ResNet with SyncBatchNorm does not fuse: its batch norms synchronize their statistics") {
    auto model = model_of("resnet50", 17);
    auto converted = dist::convert_sync_batchnorm(model);
    ops::FuseBatchNormConv fuse;
    const Tensor loss = cross_entropy((*converted)(batch_images()), batch_labels());
    CHECK(count_nodes(loss, "batch_norm_relu_conv2d") == 0);
  }
}
