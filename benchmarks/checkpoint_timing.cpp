// How long a training checkpoint takes to write and to load: ResNet-50 (10
// classes) with SGD momentum buffers, the checkpoint train_resnet50_cifar
// writes, saved with save_checkpoint (temporary file, CRC-32, fsync, rename,
// fsync of the directory) and read back with load_checkpoint (CRC-32
// checked). Checks that the loaded tensors equal the saved ones bit for bit,
// then prints the file size and the median seconds of --repeats writes and
// loads as one JSON line.
//   checkpoint_timing --dir /tmp --repeats 5
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include <loom/core/generator.h>
#include <loom/core/parallel.h>
#include <loom/nn/checkpoint.h>
#include <loom/nn/resnet.h>
#include <loom/ops/loss.h>
#include <loom/optim/optimizer.h>
#include "benchmarks/stats.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {
using bench::median;

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.sizes() == y.sizes() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom checkpoint write and load time (ResNet-50 with SGD momentum)"};
  std::string dir = ".";
  int repeats = 5;
  std::string arch = "resnet50";
  app.add_option("--dir", dir, "directory to write the checkpoint in (removed afterwards)")->capture_default_str();
  app.add_option("--repeats", repeats, "writes and loads timed; the median is reported")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--arch", arch, "resnet18 .. resnet152")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    manual_seed(0);
    auto model = nn::make_resnet(arch, nn::ResNetOptions().num_classes(10));
    optim::SGD sgd(model->parameters(), optim::SGDOptions(0.1).momentum(0.9).weight_decay(5e-4));
    // One step, so that the momentum buffers exist as in a real checkpoint.
    const Tensor images = Tensor::full({2, 3, 32, 32}, 0.5);
    const Tensor labels = Tensor::from_vector<int64_t>({1, 7}, {2});
    sgd.zero_grad();
    cross_entropy((*model)(images), labels).backward();
    sgd.step();

    nn::TrainingState state;
    state.epoch = 1;
    state.step = 1;
    state.optimizer = sgd.state();
    const nn::Checkpoint checkpoint{model->state_dict(), state};
    const std::filesystem::path path = std::filesystem::path(dir) / (arch + "_timing.checkpoint");
    std::vector<double> writes, loads;
    nn::Checkpoint loaded;
    for (int r = 0; r < repeats; ++r) {
      auto start = Clock::now();
      nn::save_checkpoint(path, checkpoint);
      writes.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      start = Clock::now();
      loaded = nn::load_checkpoint(path);
      loads.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const auto bytes = std::filesystem::file_size(path);
    std::filesystem::remove(path);
    // The result first: every tensor back bit for bit.
    bool ok = loaded.model.size() == checkpoint.model.size() && loaded.training &&
              loaded.training->optimizer.size() == state.optimizer.size();
    for (size_t i = 0; ok && i < loaded.model.size(); ++i)
      ok = loaded.model[i].first == checkpoint.model[i].first && same_bits(loaded.model[i].second, checkpoint.model[i].second);
    for (size_t i = 0; ok && i < state.optimizer.size(); ++i)
      ok = same_bits(loaded.training->optimizer[i].second, state.optimizer[i].second);
    if (!ok) {
      std::fprintf(stderr, "checkpoint_timing: the loaded checkpoint differs from the saved one\n");
      return 1;
    }
    std::printf("{\"model\": \"%s\", \"bytes\": %llu, \"repeats\": %d, \"write_s_median\": %.4f, \"write_s_min\": %.4f, "
                "\"load_s_median\": %.4f, \"load_s_min\": %.4f, \"dir\": \"%s\"}\n",
                arch.c_str(), static_cast<unsigned long long>(bytes), repeats, median(writes),
                *std::min_element(writes.begin(), writes.end()), median(loads),
                *std::min_element(loads.begin(), loads.end()), dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_timing: %s\n", e.what());
    return 1;
  }
}
