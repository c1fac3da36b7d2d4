// Per-rank optimizer state under ZeroRedundancyOptimizer (ZeRO stage 1):
// Adam on ResNet-50's parameters (torchvision's shapes, 1000 classes) at
// worlds 1, 2, 4 and 8. No timing: the partition is computed exactly
// (dist::partition_parameters, what every rank computes), and each rank's
// state is measured by building that rank's local Adam over its shard and
// stepping it once, so the bytes are those the optimizer allocates. The
// peer, measured in the same run, is the unsharded Adam over every
// parameter. Checked before anything is printed: each parameter in exactly
// one shard, the shards' bytes adding up to the unsharded bytes, world 1
// equal to them (also through a ZeroRedundancyOptimizer over a gloo group of
// one), each rank's Adam holding its shard's moments only, and every rank
// within the greedy partition's bound (1/world of the elements plus the
// largest parameter). One JSON line per world, then a summary line.
//   zero_optimizer_state [--arch resnet50] [--worlds 1,2,4,8]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/autograd.h>
#include <loom/dist/process_group_gloo.h>
#include <loom/dist/store.h>
#include <loom/dist/zero_redundancy_optimizer.h>
#include <loom/nn/resnet.h>
#include <loom/optim/optimizer.h>

using namespace loom;

namespace {

const optim::AdamOptions kAdam = optim::AdamOptions(1e-3);

int64_t state_bytes(const nn::NamedTensors& state) {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : state) bytes += static_cast<int64_t>(tensor.nbytes());
  return bytes;
}

// The bytes of an Adam's state over `parameters` once it has stepped (its
// moments exist from the first step; zero gradients, so the weights stay).
int64_t stepped_adam_bytes(const std::vector<Tensor>& parameters) {
  optim::Adam adam(parameters, kAdam);
  for (Tensor p : parameters) p.set_grad(Tensor::zeros(p.sizes(), p.dtype(), p.device()));
  adam.step();
  for (Tensor p : parameters) p.set_grad(Tensor());
  return state_bytes(adam.state());
}

void check(bool condition, const std::string& what) {
  if (!condition) throw Error("zero_optimizer_state: check failed: " + what);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"per-rank Adam state under ZeroRedundancyOptimizer, ResNet-50's parameters, worlds 1-8"};
  std::string arch = "resnet50";
  std::vector<int> worlds = {1, 2, 4, 8};
  app.add_option("--arch", arch, "resnet18 .. resnet152 (torchvision's shapes, 1000 classes)")->capture_default_str();
  app.add_option("--worlds", worlds, "world sizes")->delimiter(',')->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    auto model = nn::make_resnet(arch, nn::ResNetOptions());
    const std::vector<Tensor> parameters = model->parameters();
    std::vector<int64_t> numels;
    int64_t elements = 0, largest = 0;
    for (const Tensor& p : parameters) {
      numels.push_back(p.numel());
      elements += p.numel();
      largest = std::max(largest, p.numel());
    }
    // The peer: unsharded Adam (what every rank of plain DDP holds).
    const int64_t unsharded = stepped_adam_bytes(parameters);
    check(unsharded == 8 * elements + 8 * static_cast<int64_t>(parameters.size()),
          "Adam's state is two f32 moments per element and an i64 step per parameter");

    {  // World 1 through the class itself: its local optimizer holds everything.
      using namespace std::chrono_literals;
      auto store = std::make_shared<dist::TCPStore>("127.0.0.1", 0, dist::TCPStoreOptions().is_server(true).timeout(5s));
      auto group = std::make_shared<dist::ProcessGroupGloo>(store, 0, 1, dist::GlooOptions().timeout(5s));
      dist::ZeroRedundancyOptimizer zero(parameters, group, kAdam);
      for (Tensor p : parameters) p.set_grad(Tensor::zeros(p.sizes(), p.dtype(), p.device()));
      zero.step();
      zero.zero_grad();
      check(state_bytes(zero.local_optimizer().state()) == unsharded, "ZeRO at world 1 holds the unsharded state");
    }

    std::vector<std::pair<int, double>> ratios;
    for (int world : worlds) {
      const std::vector<std::vector<size_t>> shards = dist::partition_parameters(numels, world);
      std::vector<int> owners(parameters.size(), 0);
      std::vector<int64_t> bytes;
      for (int rank = 0; rank < world; ++rank) {
        std::vector<Tensor> shard;
        int64_t shard_elements = 0;
        for (size_t index : shards[static_cast<size_t>(rank)]) {
          ++owners[index];
          shard.push_back(parameters[index]);
          shard_elements += parameters[index].numel();
        }
        bytes.push_back(stepped_adam_bytes(shard));
        check(bytes.back() == 8 * shard_elements + 8 * static_cast<int64_t>(shard.size()),
              str("world ", world, ", rank ", rank, ": the local Adam holds its shard's moments and steps only"));
        // The greedy partition's bound: when the fullest rank got its last
        // parameter it had the fewest elements, at most elements / world.
        check(shard_elements * world <= elements + world * largest,
              str("world ", world, ", rank ", rank, ": within 1/world of the elements plus the largest parameter"));
      }
      int64_t sum = 0, most = 0, least = bytes[0];
      for (int64_t b : bytes) {
        sum += b;
        most = std::max(most, b);
        least = std::min(least, b);
      }
      check(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }),
            str("world ", world, ": every parameter in exactly one shard"));
      check(sum == unsharded, str("world ", world, ": the shards' bytes add up to the unsharded bytes"));
      const double ratio = static_cast<double>(most) / static_cast<double>(unsharded);
      ratios.emplace_back(world, ratio);
      std::string per_rank;
      for (size_t r = 0; r < bytes.size(); ++r) per_rank += str(r ? "," : "", bytes[r]);
      std::printf("{\"arch\":\"%s\",\"optimizer\":\"adam\",\"world\":%d,\"parameters\":%zu,\"elements\":%lld,"
                  "\"unsharded_bytes\":%lld,\"per_rank_bytes\":[%s],\"max_rank_bytes\":%lld,\"min_rank_bytes\":%lld,"
                  "\"max_to_unsharded\":%.6f,\"ideal\":%.6f}\n",
                  arch.c_str(), world, parameters.size(), static_cast<long long>(elements),
                  static_cast<long long>(unsharded), per_rank.c_str(), static_cast<long long>(most),
                  static_cast<long long>(least), ratio, 1.0 / world);
    }
    std::printf("%s, Adam: %.1f MB of state per rank unsharded;", arch.c_str(), unsharded / 1e6);
    for (auto [world, ratio] : ratios)
      std::printf(" world %d: %.1f MB on the fullest rank (%.3f of unsharded, 1/world = %.3f)%s", world,
                  ratio * unsharded / 1e6, ratio, 1.0 / world, world == ratios.back().first ? "\n" : ";");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_optimizer_state: %s\n", e.what());
    return 1;
  }
  return 0;
}
