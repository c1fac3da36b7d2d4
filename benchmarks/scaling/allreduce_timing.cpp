// All-reduce time against message size, for fitting the alpha-beta cost
// model (benchmarks/scaling/cost_model.py) to this machine's process group.
// Started once per rank like scaling_step; rank 0 prints one JSON line. Each
// size is checked (every element equals the sum over ranks) before it is timed.
//   loomrun --nproc_per_node=2 build/benchmarks/scaling/allreduce_timing --sizes 4096,1048576
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <loom/core/parallel.h>
#include <loom/dist/environment.h>
#include <loom/dist/process_group.h>
#include "benchmarks/scaling/rank_result.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

int run(const std::vector<int64_t>& sizes, int64_t iterations, int64_t warmup, const std::string& backend,
        const std::string& device_name, bool plain_buffers) {
  set_num_threads(1);
  const dist::LaunchEnvironment launch = dist::resolve_launch_environment();
  const Device device = device_name == "cuda" ? Device::cuda(launch.local_rank) : parse_device(device_name);
  auto group = dist::init_process_group(
      dist::InitOptions()
          .backend(dist::parse_backend(backend != "auto" ? backend : device.is_cuda() ? "nccl" : "auto"))
          .init_method("env://")
          .timeout(std::chrono::minutes(5)));
  const int world = group->size(), rank = group->rank();
  LOOM_CHECK(world > 1, "allreduce_timing: needs a world of at least 2 ranks (start it with a launcher)");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes : sizes) {
    const int64_t count = std::max<int64_t>(1, bytes / 4);
    // Check: every element becomes 1 + 2 + ... + world.
    // Buffers from the group, as DDP's buckets are (shm: reduced in place
    // between the ranks' memory), unless --plain-buffers.
    auto buffer_of = [&](double value) {
      if (plain_buffers) return Tensor::full({count}, value, DType::f32, device);
      return group->new_buffer(count, DType::f32, device).fill_(value);
    };
    Tensor check = buffer_of(rank + 1.0);
    group->all_reduce(check)->wait();
    const std::vector<float> values = check.to_vector<float>();
    const float expected = world * (world + 1) / 2.0f;
    for (int64_t i : {int64_t{0}, count / 2, count - 1}) {
      LOOM_CHECK(values[i] == expected, "allreduce_timing: element ", i, " of a ", bytes, "-byte all-reduce is ",
                 values[i], ", expected ", expected);
    }
    // Time back-to-back all-reduces with sum, as DDP issues them.
    Tensor buffer = buffer_of(1e-3);
    std::vector<double> ms;
    group->barrier()->wait();
    for (int64_t i = 0; i < warmup + iterations; ++i) {
      const Clock::time_point start = Clock::now();
      group->all_reduce(buffer, dist::ReduceOp::sum)->wait();
      if (device.is_cuda()) static_cast<void>(buffer.slice(0, 0, 1).to(Device::cpu()));
      if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    // The slowest rank's time per iteration is what the group runs at.
    Tensor times = Tensor::from_vector(ms, {static_cast<int64_t>(ms.size())});
    group->all_reduce(times, dist::ReduceOp::max)->wait();
    ms = times.to_vector<double>();
    std::sort(ms.begin(), ms.end());
    rows.push_back({{"bytes", count * 4},
                    {"median_ms", ms[ms.size() / 2]},
                    {"min_ms", ms.front()},
                    {"max_ms", ms.back()},
                    {"iterations", ms.size()}});
  }
  const nlohmann::json out = {{"program", "loom allreduce_timing"}, {"world", world},
                              {"backend", group->backend_name()}, {"device", device.str()},
                              {"buffers", plain_buffers ? "plain" : "group"}, {"sizes", rows}};
  benchmarks::write_result_and_finish(*group, out, "", "allreduce_timing");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom all-reduce time against message size (JSON)"};
  std::vector<int64_t> sizes{4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  int64_t iterations = 20, warmup = 3;
  std::string backend = "auto", device = "cpu";
  bool plain_buffers = false;
  app.add_option("--sizes", sizes, "message sizes in bytes (f32 elements)")->delimiter(',')->capture_default_str();
  app.add_option("--iterations", iterations, "timed all-reduces per size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed all-reduces per size")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--backend", backend, "gloo, shm, nccl or auto (nccl for CUDA; shm for CPU ranks on one host, else gloo)")->capture_default_str();
  app.add_option("--device", device, "cpu, cuda (the local rank's GPU) or cuda:N")->capture_default_str();
  app.add_flag("--plain-buffers", plain_buffers,
               "reduce ordinary tensors, not the group's new_buffer memory DDP's buckets use (shm: the copying path)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(sizes, iterations, warmup, backend, device, plain_buffers);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_timing: %s\n", e.what());
    return 1;
  }
}
