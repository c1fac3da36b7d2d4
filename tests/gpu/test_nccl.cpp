// ProcessGroupNCCL on real GPUs, in real processes started like torchrun
// starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): every
// collective in every dtype against hand-computed values, ordering with the
// caller's compute stream (the NCCL stream waits for it; Work::wait() makes it
// wait without blocking the host), errors, DDP with CUDA parameters
// against the bare model, and DDP's all-reduces captured in a CUDA graph
// against eager DDP steps, also through the Trainer. World 1 always (NCCL refuses two ranks on one GPU),
// world 2 (and one rank per GPU) when there are that many GPUs, plus a stalled
// peer that must produce a timeout error naming the collective and the rank,
// and (at world 1) a peer that never joins the initialisation.
//
// Without a GPU or without NCCL in the build, the binary says why and exits
// 77 (skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include <loom/core/autograd.h>
#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/graph.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/error.h>
#include <loom/core/generator.h>
#include <loom/dist/ddp.h>
#include <loom/dist/process_group.h>
#include <loom/dist/process_group_nccl.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/dist/store.h>
#include <loom/nn/layers.h>
#include <loom/ops/elementwise.h>
#include <loom/train/stop.h>
#include <loom/train/trainer.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"
#include "tests/gpu/convnet_o2.h"
#include "tests/gpu/no_gpu.h"
#include "tests/support/generated_dataset.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<ProcessGroup> nccl_group() {
  auto group = init_process_group(InitOptions().backend(Backend::nccl).init_method("env://").timeout(60s));
  expect(std::string(group->backend_name()) == "nccl", "backend is ", group->backend_name());
  expect(group->device() == Device::cuda(cuda::local_rank_device()), "the group drives ", group->device().str(),
         "; expected the local rank's device");
  // The scenario's handle owns the group: it is destroyed when the scenario
  // returns, not by a static destructor while the CUDA runtime shuts down.
  destroy_process_group();
  return group;
}

// The host's copy of `t` in f64.
std::vector<double> host(const Tensor& t) { return t.to(Device::cpu()).to(DType::f64).to_vector<double>(); }

// Rank r's input: (r + 1) * (i % 7 + 1), exact in every dtype.
double base(int64_t i) { return static_cast<double>(i % 7 + 1); }
Tensor ranked(DType dtype, int64_t n, int rank, Device device, double scale = 1.0) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = scale * (rank + 1) * base(i);
  return Tensor::from_vector_as(values, {n}, DType::f64).to(dtype).to(device);
}

// One bucket for each of tiny_model's four parameters.
DistributedDataParallelOptions four_buckets() {
  return DistributedDataParallelOptions().first_bucket_bytes_cap(64).bucket_bytes_cap(128);
}
// A communication hook that all-reduces every bucket, also at world 1 (where
// the default hook launches nothing), so that the NCCL path runs there too.
BucketReduction all_reduce_every_bucket(ProcessGroup& group, const Tensor& bucket) {
  return {group.all_reduce(bucket, ReduceOp::avg), nullptr, bucket.nbytes()};
}

// Exact unless `tolerance` (relative) is given: the values are small integers
// and halves, exact in every dtype.
void expect_values(const Tensor& t, const std::function<double(int64_t)>& expected, const std::string& what,
                   double tolerance = 0) {
  std::vector<double> actual = host(t);
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = expected(static_cast<int64_t>(i));
    expect(std::abs(actual[i] - e) <= tolerance * std::abs(e), what, ": element ", i, " is ", actual[i], ", expected ",
           e);
  }
}

void run_ranks(const std::string& scenario, int world, std::chrono::milliseconds deadline = 120s) {
  INFO(scenario, " at world ", world);
  auto results = spawn_ranks(scenario, world, {.deadline = deadline});
  for (const auto& result : results) {
    CHECK_MESSAGE(result.ok(), result.describe());
    if (!result.output.empty()) MESSAGE("rank ", result.rank, ": ", result.output);
  }
}

}  // namespace

// Every collective, every dtype, against hand-computed values.
LOOM_DIST_SCENARIO("nccl_collectives") {
  auto group = nccl_group();
  const int rank = group->rank(), world = group->size();
  const Device device = group->device();
  const double triangle = world * (world + 1) / 2.0;  // sum of (r + 1) over ranks
  const int64_t n = 1000;

  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    const std::string name = dtype_name(dtype);
    Tensor sum = ranked(dtype, n, rank, device);
    group->all_reduce(sum, ReduceOp::sum)->wait();
    expect_values(sum, [&](int64_t i) { return triangle * base(i); }, "all_reduce sum " + name);
    Tensor largest = ranked(dtype, n, rank, device);
    group->all_reduce(largest, ReduceOp::max)->wait();
    expect_values(largest, [&](int64_t i) { return world * base(i); }, "all_reduce max " + name);
    Tensor smallest = ranked(dtype, n, rank, device);
    group->all_reduce(smallest, ReduceOp::min)->wait();
    expect_values(smallest, [&](int64_t i) { return base(i); }, "all_reduce min " + name);
    if (is_floating(dtype)) {
      Tensor average = ranked(dtype, n, rank, device);
      group->all_reduce(average, ReduceOp::avg)->wait();
      // ncclAvg multiplies by 1 / world, exact only for a power-of-two world.
      const bool exact = (world & (world - 1)) == 0;
      const double tolerance = exact ? 0.0 : element_size(dtype) == 2 ? 1e-2 : 1e-6;
      expect_values(average, [&](int64_t i) { return (world + 1) / 2.0 * base(i); }, "all_reduce avg " + name,
                    tolerance);
    }

    const int root = world - 1;
    Tensor broadcast = ranked(dtype, n, rank, device);
    group->broadcast(broadcast, root)->wait();
    expect_values(broadcast, [&](int64_t i) { return (root + 1) * base(i); }, "broadcast " + name);

    Tensor flat = Tensor::zeros({world * n}, dtype, device);
    group->all_gather_into(flat, ranked(dtype, n, rank, device))->wait();
    expect_values(flat, [&](int64_t i) { return (i / n + 1) * base(i % n); }, "all_gather_into " + name);
    std::vector<Tensor> gathered;
    for (int r = 0; r < world; ++r) gathered.push_back(Tensor::zeros({n}, dtype, device));
    group->all_gather(gathered, ranked(dtype, n, rank, device))->wait();
    for (int r = 0; r < world; ++r)
      expect_values(gathered[r], [&](int64_t i) { return (r + 1) * base(i); }, str("all_gather output ", r, " ", name));

    // Rank r contributes (r + 1) * (q % 2 + 1) * base to output q (partial
    // sums stay within bf16's 8 significant bits up to 8 ranks).
    auto scale = [](int q) { return static_cast<double>(q % 2 + 1); };
    std::vector<Tensor> pieces;
    for (int q = 0; q < world; ++q) pieces.push_back(ranked(dtype, n, rank, device, scale(q)));
    Tensor scattered = Tensor::zeros({n}, dtype, device);
    group->reduce_scatter(scattered, pieces, ReduceOp::sum)->wait();
    expect_values(scattered, [&](int64_t i) { return triangle * scale(rank) * base(i); }, "reduce_scatter " + name);
    Tensor joined = Tensor::zeros({world * n}, dtype, device);
    for (int q = 0; q < world; ++q) make_view(joined, {n}, {1}, q * n).copy_(pieces[q]);
    Tensor scattered_flat = Tensor::zeros({n}, dtype, device);
    group->reduce_scatter_from(scattered_flat, joined, ReduceOp::max)->wait();
    expect_values(scattered_flat, [&](int64_t i) { return world * scale(rank) * base(i); },
                  "reduce_scatter_from max " + name);
  }

  // Several tensors of different dtypes in one call, and a non-contiguous view.
  Tensor a = ranked(DType::f32, 10, rank, device), b = ranked(DType::i64, 3, rank, device),
         c = ranked(DType::f16, 5, rank, device);
  group->all_reduce({a, b, c}, ReduceOp::sum)->wait();
  for (const Tensor& t : {a, b, c}) expect_values(t, [&](int64_t i) { return triangle * base(i); }, "coalesced " + t.str());
  Tensor matrix = ranked(DType::f32, 24, rank, device);        // (4, 6) row-major
  Tensor transposed = make_view(matrix, {6, 4}, {1, 6}, 0);  // (6, 4), strides (1, 6)
  expect(!transposed.is_contiguous(), "the view should not be contiguous");
  group->all_reduce(transposed, ReduceOp::sum)->wait();
  expect_values(matrix, [&](int64_t i) { return triangle * base(i); }, "all_reduce of a transposed view");

  group->barrier()->wait();

  // Tensors NCCL cannot take: named, with what to do instead.
  std::string cpu = error_of([&] { group->all_reduce(Tensor::ones({4})); });
  expect(contains(cpu, "a CPU tensor") && contains(cpu, "nccl backend works on CUDA tensors"), "CPU tensor error: ", cpu);
  std::string bytes = error_of([&] { group->broadcast(Tensor::zeros({4}, DType::u8, device)); });
  expect(contains(bytes, "NCCL collectives take f32"), "u8 error: ", bytes);
  std::string average = error_of([&] { group->all_reduce(Tensor::ones({4}, DType::i64, device), ReduceOp::avg); });
  expect(contains(average, "avg needs floating-point tensors"), "integer avg error: ", average);
  std::printf("rank %d: collectives in 6 dtypes checked on %s\n", rank, device.str().c_str());
}

// Ordering with the caller's stream: the NCCL stream waits for the kernels
// queued before the collective, Work::wait() returns at once and orders the
// kernels queued after it, and synchronize() blocks until the end.
LOOM_DIST_SCENARIO("nccl_stream_order") {
  auto group = nccl_group();
  const int rank = group->rank(), world = group->size();
  const Device device = group->device();
  cuda::Stream compute(device.index);
  cuda::StreamGuard on_compute(compute);

  const int64_t n = int64_t{1} << 20;
  Tensor busy = Tensor::zeros({int64_t{1} << 26}, DType::f32, device);  // 256 MiB
  Tensor x = Tensor::zeros({n}, DType::f32, device);
  Tensor gathered = Tensor::zeros({world * n}, DType::f32, device);
  cuda::synchronize(device.index);

  for (int i = 0; i < 3000; ++i) busy.mul_(0.5);  // ~0.3 s of queued work on an H200
  x.fill_(rank + 1.0);                            // what the collective must see
  cuda::Event busy_done(device.index);
  busy_done.record(compute);
  WorkHandle work = group->all_gather_into(gathered, x);
  work->wait();
  const bool host_was_blocked = busy_done.query();
  gathered.mul_(2.0);  // must run after the gather wrote `gathered`
  expect(!host_was_blocked, "Work::wait() blocked the host until the queued compute work finished");
  std::vector<double> values = host(gathered);  // synchronizes the compute stream
  for (int64_t i = 0; i < world * n; i += 4099)
    expect(values[i] == 2.0 * (i / n + 1), "gathered[", i, "] is ", values[i], ", expected ", 2.0 * (i / n + 1),
           ": the collective or the kernel after it ran out of order");
  work->synchronize();
  expect(work->completed() && work->succeeded(), "the work is not complete after synchronize()");
  expect(work->end_time() >= work->start_time(), "end before start");

  // A temporary handed to a collective and dropped at once: the caching
  // allocator must not reuse its memory before the NCCL stream is done.
  for (int i = 0; i < 200; ++i) busy.mul_(0.5);
  {
    Tensor temporary = Tensor::full({n}, rank + 1.0, DType::f32, device);
    group->all_reduce(temporary, ReduceOp::sum);
  }
  Tensor reused = Tensor::full({n}, -7.0, DType::f32, device);  // may get the temporary's block, on the compute stream
  std::vector<double> after = host(reused);
  expect(after[0] == -7.0 && after[n - 1] == -7.0, "a tensor allocated after a dropped collective input reads ",
         after[0], " (its memory was reused while NCCL still wrote it)");
  group->barrier()->wait();
  std::printf("rank %d: stream ordering checked (wait() returned while the compute stream was busy)\n", rank);
}

// DDP with CUDA parameters: gradients when backward() returns equal the bare
// model's on the whole batch, with the default hook and with a hook that
// all-reduces every bucket even at world 1 (so the NCCL path runs there
// too), launched from the gradient hooks while backward goes on.
LOOM_DIST_SCENARIO("nccl_ddp") {
  auto group = nccl_group();
  const int rank = group->rank(), world = group->size();
  const Device device = group->device();
  const int64_t share = kSamples / world;

  auto reference = tiny_model(100, device);
  mse(reference->forward(inputs(0, kSamples, device)), targets(0, kSamples, device)).backward();

  for (bool every_bucket : {false, true}) {
    const std::string hook = every_bucket ? "all-reduce-avg hook" : "default hook";
    auto model = tiny_model(100 + rank, device);  // rank 0's parameters reach every rank through DDP
    DistributedDataParallel ddp(model, group, four_buckets());
    expect(ddp.bucket_parameter_names().size() == 4, "expected 4 buckets");
    if (every_bucket) ddp.register_comm_hook(all_reduce_every_bucket);
    Tensor loss = mse(ddp.forward(inputs(rank * share, share, device)), targets(rank * share, share, device));
    loss.backward();
    expect_close(model->named_parameters(), reference->named_parameters(), str(hook, ": gradients, rank ", rank), true);
    if (every_bucket || world > 1) {
      IterationTiming timing = ddp.last_iteration_timing();
      expect(timing.buckets.size() == 4, "bucket timings");
      expect(timing.buckets[0].launched < timing.backward_end, hook,
             ": the first bucket's all-reduce was not launched before backward ended");
      // Once the device is done, every bucket's collective reports when it ran.
      cuda::synchronize(device.index);
      for (const BucketTiming& bucket : ddp.bucket_timings()) {
        expect(bucket.done != std::chrono::steady_clock::time_point{}, hook, ": bucket ", bucket.bucket, " has no done time");
        expect(bucket.launched <= bucket.started && bucket.started <= bucket.done, hook, ": bucket ", bucket.bucket,
               " timestamps out of order");
      }
    }

    // Three more steps: four SGD steps in all equal the bare model's four on the whole batch.
    for (int step = 0; step < 3; ++step) {
      sgd_step(*model, 0.1);
      mse(ddp.forward(inputs(rank * share, share, device)), targets(rank * share, share, device)).backward();
    }
    sgd_step(*model, 0.1);
    auto replay = tiny_model(100, device);
    for (int step = 0; step < 4; ++step) {
      mse(replay->forward(inputs(0, kSamples, device)), targets(0, kSamples, device)).backward();
      sgd_step(*replay, 0.1);
    }
    expect_close(model->named_parameters(), replay->named_parameters(), str(hook, ": parameters after 4 steps, rank ", rank),
                 false);
  }

  // CPU parameters on an nccl group: named.
  if (world > 1) {
    auto cpu_model = tiny_model(5, Device::cpu());
    std::string message = error_of([&] { DistributedDataParallel wrong(cpu_model, group); });
    expect(contains(message, "nccl process group of this rank works on cuda:"), "DDP with CPU parameters: ", message);
  }
  group->barrier()->wait();
  std::printf("rank %d: DDP on %s equals the bare model\n", rank, device.str().c_str());
}

// DDP's bucket all-reduces captured in a CUDA graph (what the Trainer's
// --cuda-graph does with DDP over nccl): one eager step, then the step
// captured with a hook that all-reduces every bucket even at world 1, and
// replayed 4 times, each replay one launch from the host and watched under
// the group's timeout (watch_replay). The parameters equal 5 eager DDP steps'.
// Then the same through the Trainer's --cuda-graph.
LOOM_DIST_SCENARIO("nccl_ddp_captured") {
  auto group = nccl_group();
  const int rank = group->rank(), world = group->size();
  const Device device = group->device();
  const int64_t share = kSamples / world;
  expect(!group->capture_refusal(), "the nccl group refuses capture: ", group->capture_refusal().value_or(""));
  const auto train = [&](bool graphed) {
    auto model = tiny_model(100 + rank, device);
    DistributedDataParallel ddp(model, group, four_buckets());
    ddp.register_comm_hook(all_reduce_every_bucket);
    const Tensor x = inputs(rank * share, share, device), y = targets(rank * share, share, device);
    const auto step = [&] {
      mse(ddp.forward(x), y).backward();
      sgd_step(*model, 0.1);
    };
    step();  // eager: the first step of a captured run is
    if (!graphed) {
      for (int i = 0; i < 4; ++i) step();
      return model;
    }
    cuda::Graph graph(device.index);
    graph.capture(step);
    for (int i = 0; i < 4; ++i) {
      const cuda::Counters before = cuda::counters();
      graph.replay();
      const int64_t launches = (cuda::counters() - before).launches();
      expect(launches == 1, "replay ", i, " made ", launches, " launches from the host");
      WorkHandle watched = group->watch_replay(str("replay ", i));
      expect(watched != nullptr, "watch_replay gave no work on an nccl group");
      watched->synchronize();  // done when the replay is
      expect(watched->succeeded(), "the watched replay ", i, " failed");
    }
    return model;
  };
  auto eager_model = train(false);
  auto graphed_model = train(true);
  expect_close(graphed_model->named_parameters(), eager_model->named_parameters(),
               str("captured DDP steps vs eager ones, rank ", rank, " of ", world), false);

  // The Trainer's --cuda-graph with DDP over nccl: the ConvNet (batch norms:
  // their buffers are broadcast in each forward) at O2 on 150 generated
  // samples, batch 16 per rank, 2 epochs. The run with the graph ends where
  // the eager run ends, bit for bit at world 1 and 2 (a sum of two is exact
  // in any order), and launches far less from the host.
  auto dataset = std::make_shared<loom::testing::GeneratedDataset>(
      "generated", 150, data::SampleShape{1, 28, 28}, [](int64_t index, float* pixels) -> int64_t {
        for (int64_t k = 0; k < 28 * 28; ++k) pixels[k] = static_cast<float>(std::sin(0.013 * k + 0.7 * index));
        return index % 10;
      });
  const auto run = [&](bool graphed, int64_t& launches) {
    const gpu_testing::ConvNetO2 convnet(device);
    const auto& [model, optimizer] = convnet;
    data::DataLoader loader(dataset, data::DataLoaderOptions().batch_size(16).seed(4).dtype(DType::f16).device(device),
                            std::make_shared<data::DistributedSampler>(150, world, rank, /*shuffle=*/true, 4));
    train::TrainerOptions options = train::TrainerOptions().epochs(2).cuda_graph(graphed).process_group(group);
    train::Trainer trainer(model, optimizer, options.log_interval(1000));
    const cuda::Counters before = cuda::counters();
    trainer.fit(loader, nullptr);
    launches = (cuda::counters() - before).launches();
    return convnet.state();
  };
  int64_t eager_launches = 0, graph_launches = 0;
  const auto eager = run(false, eager_launches);
  const auto graphed = run(true, graph_launches);
  expect(graph_launches * 2 < eager_launches, "rank ", rank, ": ", graph_launches, " launches with the graph, ",
         eager_launches, " without");
  expect(graphed.size() == eager.size(), "state sizes differ");
  for (size_t i = 0; i < eager.size(); ++i) {
    for (size_t k = 0; k < eager[i].size(); ++k) {
      const double tolerance = world <= 2 ? 0 : 1e-3 * std::max(1.0, std::abs(eager[i][k]));
      expect(std::abs(graphed[i][k] - eager[i][k]) <= tolerance, "rank ", rank, ": state entry ", i, " element ", k,
             " is ", graphed[i][k], " with the graph, ", eager[i][k], " eagerly");
    }
  }
  group->barrier()->wait();
  std::printf("rank %d: captured DDP steps equal eager ones, also the Trainer's (%lld vs %lld launches)\n", rank,
              static_cast<long long>(graph_launches), static_cast<long long>(eager_launches));
}

// Rank 1 never joins the all-reduce: rank 0 gets an error naming it within
// the timeout instead of hanging.
LOOM_DIST_SCENARIO("nccl_timeout") {
  auto group = nccl_group();
  group->barrier()->wait();
  if (group->rank() != 0) {
    std::this_thread::sleep_for(20s);
    std::fflush(stdout);
    std::_Exit(0);  // without destroying the communicator the other rank aborted
  }
  group->set_timeout(5s);
  Tensor t = Tensor::ones({1024}, DType::f32, group->device());
  WorkHandle work = group->all_reduce(t);
  const auto start = std::chrono::steady_clock::now();
  std::string message = error_of([&] { work->synchronize(); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect(contains(message, "all_reduce #") && contains(message, "f32[1024]"), "the error names the collective: ", message);
  // Rank 1 entered the barrier (#0), not the all-reduce: the store says so.
  expect(contains(message, "the rank that did not reach it: 1 (rank 1 last enqueued #0"),
         "the error names the rank that did not arrive: ", message);
  expect(seconds < 15, "the timeout error came after ", seconds, " s");
  std::string later = error_of([&] { group->all_reduce(t); });
  expect(contains(later, "failed earlier"), "a later collective: ", later);
  std::printf("rank 0: timeout error after %.1f s: %s\n", seconds, message.c_str());
  std::fflush(stdout);
  std::_Exit(0);
}

// A peer that never joins: rank 0 of a world of 2 starts the communicator
// alone (no rank 1 process exists); the non-blocking initialisation gives up
// after the timeout and names rank 1 instead of hanging. One GPU suffices.
LOOM_DIST_SCENARIO("nccl_init_timeout") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("loom_nccl_init_timeout_" + std::to_string(::getpid()))).string();
  std::filesystem::remove(path);
  auto store = std::make_shared<FileStore>(path, 30s);
  const auto start = std::chrono::steady_clock::now();
  std::string message = error_of([&] { make_process_group_nccl(store, 0, 2, NcclOptions().timeout(3s)); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect(contains(message, "the NCCL communicator was not initialised within the timeout of 3 s; ranks that did "
                           "not join: 1"),
         "the error names the missing rank: ", message);
  expect(seconds < 20, "the init timeout error came after ", seconds, " s");
  std::printf("rank 0: init timeout error after %.1f s: %s\n", seconds, message.c_str());
  std::fflush(stdout);
  std::_Exit(0);  // the aborted communicator's threads may still be winding down
}

// The stop agreement on a CUDA group: depth 2, rank 0's signal stops every
// rank at the same poll, two polls after the one that issued it, and a poll
// whose copy is done (the host not ahead of the GPU) makes no host sync.
LOOM_DIST_SCENARIO("nccl_stop_agreement") {
  auto group = nccl_group();
  const int rank = group->rank();
  const Device device = group->device();
  train::StopSignals::install(SIGUSR1);
  train::StopAgreement agreement(group);
  expect(agreement.depth() == 2, "a CUDA group's depth is ", agreement.depth(), ", expected 2");
  const auto settled_poll = [&] {
    cuda::synchronize(device.index);  // every all-reduce and copy done
    const cuda::Counters before = cuda::counters();
    const int agreed = agreement.poll();
    const int64_t syncs = (cuda::counters() - before).host_syncs();
    expect(syncs == 0, "rank ", rank, ": a poll after the device finished made ", syncs, " host syncs");
    return agreed;
  };
  for (int i = 0; i < 3; ++i) expect(settled_poll() == 0, "rank ", rank, ": poll ", i, " stopped with no signal");
  if (rank == 0) ::raise(SIGUSR1);
  for (int i = 0; i < 2; ++i) expect(settled_poll() == 0, "rank ", rank, ": stopped ", i, " polls after the signal");
  expect(settled_poll() == SIGUSR1, "rank ", rank, ": did not stop two polls after rank 0's signal");
  agreement.finish();
  train::StopSignals::reset();
}

TEST_SUITE("nccl") {
  TEST_CASE("world 1: collectives, stream ordering, DDP, DDP captured in a CUDA graph") {
    run_ranks("nccl_collectives", 1);
    run_ranks("nccl_stream_order", 1);
    run_ranks("nccl_ddp", 1);
    run_ranks("nccl_ddp_captured", 1);
    run_ranks("nccl_stop_agreement", 1);
    run_ranks("nccl_init_timeout", 1, 60s);
  }

  TEST_CASE("one rank per GPU: collectives, stream ordering, DDP, a stalled peer") {
    const int gpus = cuda::device_count();
    if (gpus < 2) {
      MESSAGE("skipped: ", gpus, " GPU visible; NCCL needs one GPU per rank for world 2");
      return;
    }
    run_ranks("nccl_collectives", 2);
    run_ranks("nccl_stream_order", 2);
    run_ranks("nccl_ddp", 2);
    run_ranks("nccl_ddp_captured", 2);
    run_ranks("nccl_stop_agreement", 2);
    if (gpus > 2) {
      run_ranks("nccl_collectives", gpus);
      run_ranks("nccl_ddp", gpus);
    }
    run_ranks("nccl_timeout", 2, 90s);
  }
}

int main(int argc, char** argv) {
  int scenario_exit = run_scenario_if_requested(argc, argv);
  if (scenario_exit >= 0) return scenario_exit;
  if (gpu_testing::skip_without_gpu()) return 77;
  if (!nccl_available()) {
    std::printf("skipped: this build of loom has no NCCL (configure with NCCL_ROOT pointing at NCCL)\n");
    return 77;
  }
  std::printf("CUDA devices: %d (%s)\n", cuda::device_count(), cuda::device_name(0).c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
