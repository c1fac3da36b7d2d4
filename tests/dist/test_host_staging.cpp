// make_host_staged_process_group (dist/host_staging.h) on the CPU: the staging code
// that carries CUDA tensors over gloo and shm, run with the CPU as the
// callers' device, so every copy is a plain host copy. Two real processes on
// loopback over gloo: every collective against hand-computed values, results
// landing in the caller's tensors at wait() (not before: they went through a
// host copy), strided tensors, and DDP over the staged group equal to one
// process on the combined batch.
#include <doctest/doctest.h>

#include <loom/dist/host_staging.h>
#include "tests/dist/multiprocess.h"
#include "tests/dist/tiny_mlp.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

// (r + 1) * (i + 1) for rank r, element i.
Tensor ranked(int64_t n, int rank, DType dtype = DType::f32) {
  std::vector<double> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(static_cast<double>((rank + 1) * (i + 1)));
  return Tensor::from_vector_as(values, {n}, DType::f64).to(dtype);
}

void expect_values(const Tensor& t, const std::function<double(int64_t)>& expected, const std::string& what) {
  std::vector<double> actual = t.contiguous().to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < actual.size(); ++i)
    expect(actual[i] == expected(static_cast<int64_t>(i)), what, ": element ", i, " is ", actual[i], ", expected ",
           expected(static_cast<int64_t>(i)));
}

}  // namespace

LOOM_DIST_SCENARIO("host_staging_collectives") {
  auto group = make_host_staged_process_group(group_from_environment(20s), Device::cpu());
  const int rank = group->rank(), world = group->size();
  const double triangle = world * (world + 1) / 2.0;  // sum of (r + 1) over ranks
  expect(group->device() == Device::cpu(), "device ", group->device().str());

  for (DType dtype : {DType::f32, DType::f64, DType::i64}) {
    Tensor sum = ranked(7, rank, dtype);
    WorkHandle work = group->all_reduce(sum);
    expect(work->wait_for(20s), "all_reduce did not finish");
    // Finished on the host copy; the caller's tensor changes only when the
    // result is copied back (wait_for copied it just now).
    expect_values(sum, [&](int64_t i) { return triangle * (i + 1); }, str("all_reduce ", dtype_name(dtype)));
  }
  Tensor pending = ranked(5, rank);
  WorkHandle work = group->all_reduce(pending);
  while (!work->completed()) std::this_thread::sleep_for(1ms);
  expect_values(pending, [&](int64_t i) { return (rank + 1.0) * (i + 1); }, "all_reduce before wait()");
  work->wait();
  expect_values(pending, [&](int64_t i) { return triangle * (i + 1); }, "all_reduce after wait()");

  // Several tensors at once, one of them a strided view.
  Tensor matrix = ranked(6, rank).reshape({2, 3});
  Tensor column_major = matrix.transpose(0, 1);
  Tensor flat = ranked(4, rank, DType::f64);
  group->all_reduce({column_major, flat}, ReduceOp::max)->wait();
  expect_values(matrix, [&](int64_t i) { return world * (i + 1.0); }, "all_reduce max through a transpose");
  expect_values(flat, [&](int64_t i) { return world * (i + 1.0); }, "all_reduce max, second tensor");

  Tensor broadcast = ranked(5, rank);
  group->broadcast(broadcast, world - 1)->wait();
  expect_values(broadcast, [&](int64_t i) { return world * (i + 1.0); }, "broadcast from the last rank");

  Tensor gathered = Tensor::zeros({3 * world});
  group->all_gather_into(gathered, ranked(3, rank))->wait();
  expect_values(gathered, [&](int64_t i) { return (i / 3 + 1.0) * (i % 3 + 1); }, "all_gather_into");
  std::vector<Tensor> outputs;
  for (int r = 0; r < world; ++r) outputs.push_back(Tensor::zeros({3}));
  group->all_gather(outputs, ranked(3, rank))->synchronize();
  for (int r = 0; r < world; ++r)
    expect_values(outputs[r], [&](int64_t i) { return (r + 1.0) * (i + 1); }, str("all_gather output ", r));

  Tensor scattered = Tensor::zeros({2});
  group->reduce_scatter_from(scattered, ranked(2 * world, rank))->wait();
  expect_values(scattered, [&](int64_t i) { return triangle * (2 * rank + i + 1); }, "reduce_scatter_from");
  std::vector<Tensor> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(ranked(2, rank) * static_cast<double>(r + 1));
  Tensor mine = Tensor::zeros({2});
  group->reduce_scatter(mine, inputs)->wait();
  expect_values(mine, [&](int64_t i) { return triangle * (rank + 1) * (i + 1); }, "reduce_scatter");

  expect(contains(error_of([&] { make_host_staged_process_group(nullptr, Device::cpu()); }), "the process group is null"),
         "a null group is refused");
  group->barrier()->wait();
}

// DDP over the staged group equals one process on the combined batch.
LOOM_DIST_SCENARIO("host_staging_ddp") {
  auto group = make_host_staged_process_group(group_from_environment(20s), Device::cpu());
  expect_ddp_steps_equal_one_process(group, Device::cpu());
  group->barrier()->wait();
}

TEST_SUITE("host_staging") {
  TEST_CASE("collectives through host copies, 2 ranks") {
    expect_all_ok(spawn_ranks("host_staging_collectives", 2, {.deadline = 40s}));
  }
  TEST_CASE("DDP through host copies equals one process on the combined batch, 2 ranks") {
    expect_all_ok(spawn_ranks("host_staging_ddp", 2, {.deadline = 40s}));
  }
}
