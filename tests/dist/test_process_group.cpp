// ProcessGroupGloo and ProcessGroupShm collectives across 1 to 4 real
// processes on loopback, checked against hand-computed values; init methods;
// and failures: a dead or stalled peer must produce an error within the
// timeout, never a hang.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <thread>

#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>
#include <loom/dist/process_group.h>
#include <loom/dist/process_group_gloo.h>
#include <loom/dist/process_group_nccl.h>
#include <loom/dist/process_group_shm.h>
#include "tests/dist/multiprocess.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

// Rank r's value at element i: (r + 1) * (i % 7 + 1). Small integers, exact in every dtype.
double input_value(int rank, int64_t i) { return static_cast<double>((rank + 1) * (i % 7 + 1)); }

Tensor rank_tensor(int rank, int64_t numel, DType dtype) {
  std::vector<double> values(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) values[static_cast<size_t>(i)] = input_value(rank, i);
  return Tensor::from_vector_as(values, {numel}, dtype);
}

// Hand-computed result of reducing input_value over `world` ranks.
double expected_reduction(ReduceOp op, int world, int64_t i) {
  double base = static_cast<double>(i % 7 + 1);
  switch (op) {
    case ReduceOp::sum: return base * world * (world + 1) / 2;
    case ReduceOp::avg: return base * (world + 1) / 2.0;
    case ReduceOp::max: return base * world;
    case ReduceOp::min: return base;
  }
  return 0;
}

void expect_values(const Tensor& tensor, const std::function<double(int64_t)>& expected, const std::string& what) {
  std::vector<double> values = tensor.to_vector<double>();
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    double want = expected(i);
    double tolerance = tensor.dtype() == DType::bf16 ? 0.02 * std::abs(want) : 1e-6 * std::abs(want);
    expect(std::abs(values[static_cast<size_t>(i)] - want) <= tolerance, what, ": element ", i, " is ",
           values[static_cast<size_t>(i)], ", expected ", want);
  }
}

// The group a scenario runs on: LOOM_TEST_BACKEND's (gloo when unset). With
// LOOM_TEST_SHM_CHUNK the shm group is built directly with rounds of that many
// bytes, so every collective takes several rounds.
std::shared_ptr<ProcessGroup> init_from_environment(Milliseconds timeout = 20s) {
  if (const char* chunk = std::getenv("LOOM_TEST_SHM_CHUNK")) {
    int rank = env_int("RANK");
    auto store = std::make_shared<TCPStore>("127.0.0.1", env_int("MASTER_PORT"),
                                            TCPStoreOptions().is_server(rank == 0).timeout(timeout));
    return std::make_shared<ProcessGroupShm>(store, rank, env_int("WORLD_SIZE"),
                                             ShmOptions().timeout(timeout).chunk_bytes(std::stoul(chunk)));
  }
  return group_from_environment(timeout);
}

// In a group of one rank the collectives are copies; misuse is reported when
// the collective is called.
void check_world_of_one(ProcessGroup& group) {
  Tensor tensor = Tensor::full({4}, 3.0, DType::f32);
  group.all_reduce(tensor, ReduceOp::avg)->wait();
  CHECK(tensor.to_vector<float>() == std::vector<float>{3, 3, 3, 3});
  Tensor gathered = Tensor::zeros({4}, DType::f32);
  group.all_gather_into(gathered, tensor)->wait();
  CHECK(gathered.to_vector<float>() == std::vector<float>{3, 3, 3, 3});
  group.barrier()->wait();
  Tensor ints = Tensor::zeros({4}, DType::i64);
  CHECK(contains(error_of([&] { group.all_reduce(ints, ReduceOp::avg); }), "avg needs floating-point tensors"));
  CHECK(contains(error_of([&] { group.broadcast(ints, 3); }), "broadcast: root 3 is not a rank"));
  Tensor small = Tensor::zeros({3}, DType::i64);
  CHECK(contains(error_of([&] { group.all_gather_into(small, ints); }), "must hold 1 x 4 = 4 elements"));
  CHECK(contains(error_of([&] { group.all_reduce(Tensor()); }), "undefined tensor"));
}

}  // namespace

// Every collective, every dtype, sizes 1 / odd / 1M, against hand-computed values.
LOOM_DIST_SCENARIO("collectives") {
  auto group = init_from_environment();
  int rank = group->rank(), world = group->size();
  expect(rank == env_int("RANK") && world == env_int("WORLD_SIZE"), "group has rank ", rank, " of ", world);

  // all_reduce: each op and dtype, sizes 1 and 1001 (odd, not a multiple of the world).
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;
      for (int64_t numel : {1, 1001}) {
        Tensor tensor = rank_tensor(rank, numel, dtype);
        group->all_reduce(tensor, op)->wait();
        expect_values(tensor, [&](int64_t i) { return expected_reduction(op, world, i); },
                      str("all_reduce ", reduce_op_name(op), " ", dtype_name(dtype), "[", numel, "]"));
      }
    }
  }

  // A large tensor (1M f32) and a 2-d one.
  {
    Tensor big = rank_tensor(rank, 1 << 20, DType::f32);
    auto work = group->all_reduce(big);
    work->wait();
    expect(work->completed() && work->succeeded() && !work->error(), "large all_reduce not marked succeeded");
    expect(work->enqueue_time() <= work->start_time() && work->start_time() <= work->end_time(),
           "work timestamps out of order");
    expect_values(big, [&](int64_t i) { return expected_reduction(ReduceOp::sum, world, i); }, "all_reduce f32[1M]");
    Tensor matrix = rank_tensor(rank, 12, DType::f64).view({3, 4});
    group->all_reduce(matrix, ReduceOp::max)->wait();
    expect_values(matrix.flatten(), [&](int64_t i) { return expected_reduction(ReduceOp::max, world, i); },
                  "all_reduce f64[3, 4]");
  }

  // Several tensors of mixed dtypes in one call, one of them non-contiguous.
  {
    Tensor a = rank_tensor(rank, 5, DType::f32);
    Tensor b = rank_tensor(rank, 3, DType::i64);
    Tensor c_base = rank_tensor(rank, 12, DType::f32).view({3, 4});
    Tensor c = c_base.transpose(0, 1);  // non-contiguous view
    group->all_reduce(std::vector<Tensor>{a, b, c}, ReduceOp::sum)->wait();
    expect_values(a, [&](int64_t i) { return expected_reduction(ReduceOp::sum, world, i); }, "coalesced a");
    expect_values(b, [&](int64_t i) { return expected_reduction(ReduceOp::sum, world, i); }, "coalesced b");
    expect_values(c_base.flatten(), [&](int64_t i) { return expected_reduction(ReduceOp::sum, world, i); },
                  "coalesced c (through its base)");
  }

  // Many collectives in flight at once complete in order.
  {
    std::vector<Tensor> tensors;
    std::vector<WorkHandle> works;
    for (int k = 0; k < 20; ++k) {
      tensors.push_back(Tensor::full({17}, rank + k, DType::f32));
      works.push_back(group->all_reduce(tensors.back()));
    }
    for (int k = 0; k < 20; ++k) {
      works[k]->wait();
      double want = world * (world - 1) / 2.0 + k * world;
      expect_values(tensors[k], [&](int64_t) { return want; }, str("in-flight all_reduce ", k));
    }
  }

  // broadcast from every root, including a non-contiguous tensor.
  for (int root = 0; root < world; ++root) {
    Tensor tensor = rank_tensor(rank, 1001, DType::f32);
    group->broadcast(tensor, root)->wait();
    expect_values(tensor, [&](int64_t i) { return input_value(root, i); }, str("broadcast root ", root));
    Tensor base = rank_tensor(rank, 6, DType::bf16).view({2, 3});
    Tensor strided = base.transpose(0, 1);
    group->broadcast(strided, root)->wait();
    expect_values(base.flatten(), [&](int64_t i) { return input_value(root, i); }, "broadcast non-contiguous");
  }

  // all_gather into a list and into a flat tensor.
  {
    Tensor input = rank_tensor(rank, 9, DType::f32);
    std::vector<Tensor> outputs;
    for (int r = 0; r < world; ++r) outputs.push_back(Tensor::zeros({9}, DType::f32));
    group->all_gather(outputs, input)->wait();
    for (int r = 0; r < world; ++r)
      expect_values(outputs[r], [&](int64_t i) { return input_value(r, i); }, str("all_gather output ", r));
    Tensor flat = Tensor::zeros({world * 9}, DType::i32);
    group->all_gather_into(flat, rank_tensor(rank, 9, DType::i32))->wait();
    expect_values(flat, [&](int64_t i) { return input_value(static_cast<int>(i / 9), i % 9); }, "all_gather flat");
  }

  // reduce_scatter: rank r gets the reduction of chunk r.
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    constexpr int64_t chunk = 5;
    Tensor input = rank_tensor(rank, chunk * world, DType::f64);
    Tensor output = Tensor::zeros({chunk}, DType::f64);
    group->reduce_scatter_from(output, input, op)->wait();
    expect_values(output, [&](int64_t i) { return expected_reduction(op, world, rank * chunk + i); },
                  str("reduce_scatter flat ", reduce_op_name(op)));
    std::vector<Tensor> inputs;
    for (int r = 0; r < world; ++r) inputs.push_back(Tensor::full({chunk}, (rank + 1) * (r + 1), DType::f32));
    Tensor out2 = Tensor::zeros({chunk}, DType::f32);
    group->reduce_scatter(out2, inputs, ReduceOp::sum)->wait();
    double want = (rank + 1) * world * (world + 1) / 2.0;
    expect_values(out2, [&](int64_t) { return want; }, "reduce_scatter list");
    expect_values(input, [&](int64_t i) { return input_value(rank, i); }, "reduce_scatter leaves its input alone");
  }

  // new_buffer memory (shm: mapped by every rank, reduced without copies): the
  // whole buffer, a view at the same place on every rank, several blocks.
  {
    const bool shared = std::string(group->backend_name()) == "shm" && world > 1;
    Tensor buffer = group->new_buffer(1001, DType::f32, Device::cpu());
    expect(buffer.numel() == 1001 && buffer.dtype() == DType::f32 && buffer.is_contiguous(), "new_buffer gave ",
           buffer.str());
    expect_values(buffer, [](int64_t) { return 0.0; }, "new_buffer starts zeroed");
    buffer.copy_(rank_tensor(rank, 1001, DType::f32));
    auto work = group->all_reduce(buffer, ReduceOp::avg);
    work->wait();
    expect(!shared || contains(work->description(), "in shared buffer"), "not reduced in place: ", work->description());
    expect_values(buffer, [&](int64_t i) { return expected_reduction(ReduceOp::avg, world, i); }, "new_buffer avg");
    Tensor middle = buffer.slice(0, 17, 317);
    middle.copy_(rank_tensor(rank, 300, DType::f32));
    group->all_reduce(middle, ReduceOp::max)->wait();
    expect_values(middle, [&](int64_t i) { return expected_reduction(ReduceOp::max, world, i); }, "new_buffer view");
    expect_values(buffer.slice(0, 0, 17), [&](int64_t i) { return expected_reduction(ReduceOp::avg, world, i); },
                  "new_buffer outside the view");
    Tensor big = group->new_buffer(1 << 20, DType::f64, Device::cpu());
    big.copy_(rank_tensor(rank, 1 << 20, DType::f64));
    group->all_reduce(big, ReduceOp::sum)->wait();
    expect_values(big, [&](int64_t i) { return expected_reduction(ReduceOp::sum, world, i); }, "new_buffer f64[1M]");
    buffer = Tensor();  // the first buffer goes; the second still works
    big.copy_(rank_tensor(rank, 1 << 20, DType::f64));
    group->all_reduce(big, ReduceOp::min)->wait();
    expect_values(big, [&](int64_t i) { return expected_reduction(ReduceOp::min, world, i); }, "after a buffer died");
  }

  // barrier: nobody passes before the last rank arrives. The first barrier
  // lines the ranks up, so that rank 0's own lateness (checking 1M values
  // above, slow under a sanitizer on a busy machine) does not eat the late
  // rank's 300 ms.
  {
    group->barrier()->wait();
    if (rank == world - 1) std::this_thread::sleep_for(300ms);
    auto before = std::chrono::steady_clock::now();
    group->barrier()->wait();
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
    if (rank == 0 && world > 1) expect(waited > 0.2, "rank 0 left the barrier after ", waited, " s, before the late rank");
  }
  group->barrier()->wait();
  destroy_process_group();
}

// The three init methods reach the same collectives.
LOOM_DIST_SCENARIO("init_methods") {
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  std::string method = env_string("LOOM_TEST_INIT_METHOD");
  std::shared_ptr<ProcessGroup> group;
  if (method == "tcp") {
    // Explicit rank / world size / address: the launcher variables are ignored.
    group = init_process_group(InitOptions()
                                   .init_method(str("tcp://127.0.0.1:", env_string("MASTER_PORT")))
                                   .world_size(world)
                                   .rank(rank)
                                   .timeout(20s));
  } else {
    group = init_process_group(InitOptions().init_method("file://" + env_string("LOOM_TEST_PATH")).timeout(20s));
  }
  expect(default_process_group() == group && is_initialized(), "init_process_group did not set the default group");
  Tensor tensor = Tensor::full({3}, rank + 1.0, DType::f32);
  group->all_reduce(tensor)->wait();
  expect_values(tensor, [&](int64_t) { return world * (world + 1) / 2.0; }, "all_reduce after " + method + " init");
  group->barrier()->wait();
  destroy_process_group();
  expect(!is_initialized(), "destroy_process_group left a default group");
}

// Rank 1 dies (SIGKILL) right before a collective; rank 0 must get an error naming it.
LOOM_DIST_SCENARIO("dead_peer") {
  auto group = init_from_environment(5s);
  group->barrier()->wait();
  if (group->rank() == 1) ::raise(SIGKILL);
  Tensor tensor = Tensor::ones({1000}, DType::f32);
  const auto [message, waited] = timed_error_of([&] { group->all_reduce(tensor)->wait(); });
  std::cout << "rank 0 error after " << waited << " s: " << message << "\n";
  expect(contains(message, "all_reduce #"), "error does not name the collective: ", message);
  expect(contains(message, "rank 0 of 2"), "error does not name this rank: ", message);
  expect(contains(message, "peer rank 1"), "error does not name the dead peer: ", message);
  expect(waited < 6.0, "the error took ", waited, " s");
  // Later collectives fail at once with the first error.
  std::string later = error_of([&] { group->barrier()->wait(); });
  expect(contains(later, "earlier collective failed"), "later collective: ", later);
}

// Rank 1 dies while a child it forked keeps its sockets open, so rank 0 sees
// no closed connection and its collective times out: the error must still
// name rank 1, found by its ended process.
LOOM_DIST_SCENARIO("dead_peer_sockets_held") {
  auto group = init_from_environment(20s);
  group->barrier()->wait();
  if (group->rank() == 1) {
    if (::fork() == 0) {  // holds the inherited sockets open after rank 1 is gone
      ::sleep(4);
      ::_exit(0);
    }
    ::raise(SIGKILL);
  }
  group->set_timeout(1500ms);
  Tensor tensor = Tensor::ones({10}, DType::f32);
  std::string message = error_of([&] { group->all_reduce(tensor)->wait(); });
  std::cout << "rank 0 error: " << message << "\n";
  expect(contains(message, "timeout 1.5 s"), "error does not give the timeout: ", message);
  expect(contains(message, "peer rank 1 (pid "), "error does not name the dead peer: ", message);
}

// Rank 0 is killed (SIGKILL: no destructor runs) while it waits for rank 1
// to map its new segment; nothing named loom-<rank 0's pid>-* may stay in
// /dev/shm. Rank 1 does the killing and the looking.
LOOM_DIST_SCENARIO("shm_killed_while_waiting") {
  const int rank = env_int("RANK");
  auto store = std::make_shared<TCPStore>("127.0.0.1", env_int("MASTER_PORT"),
                                          TCPStoreOptions().is_server(rank == 0).timeout(20s));
  if (rank == 0) {
    store->set("test/pid", std::to_string(::getpid()));
    ProcessGroupShm group(store, 0, 2, ShmOptions().timeout(20s));  // rank 1 never joins: killed in here
    throw Error("rank 0 was not killed while it waited");
  }
  const int pid = std::stoi(store->get_string("test/pid", 20s));
  store->wait({"shm/segment"}, 20s);  // rank 0 has created its segment and waits for rank 1
  const std::string prefix = str("loom-", pid, "-");
  auto left = [&] {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) names.push_back(entry.path().string());
    return names;
  };
  // The name may exist for the moment between creating and unlinking, never while rank 0 waits.
  ::kill(pid, SIGKILL);
  std::this_thread::sleep_for(200ms);
  const std::vector<std::string> names = left();
  for (const auto& name : names) std::filesystem::remove(name);  // leave the machine clean either way
  expect(names.empty(), "rank 0, killed while it waited, left ", names.size(), " segment(s) in /dev/shm, e.g. ",
         names.empty() ? "" : names[0]);
}

// Rank 1 stays alive but skips the collective; rank 0 must time out, not hang.
LOOM_DIST_SCENARIO("stalled_peer") {
  auto group = init_from_environment(20s);
  group->barrier()->wait();
  if (group->rank() == 1) {
    std::this_thread::sleep_for(4s);  // rank 0 gives up long before
    return;
  }
  group->set_timeout(1500ms);
  Tensor tensor = Tensor::ones({10}, DType::f32);
  const auto [message, waited] = timed_error_of([&] { group->all_reduce(tensor)->wait(); });
  std::cout << "rank 0 error after " << waited << " s: " << message << "\n";
  expect(contains(message, "all_reduce #"), "error does not name the collective: ", message);
  expect(contains(message, "timeout 1.5 s"), "error does not give the timeout: ", message);
  expect(waited >= 1.4 && waited < 4.0, "the error took ", waited, " s");
}

// backend "auto" picks shm for ranks on one host; ranks that call different
// collectives both get an error naming the two calls instead of exchanging
// garbage.
LOOM_DIST_SCENARIO("shm_auto_and_mismatch") {
  auto group = init_process_group(InitOptions().backend(Backend::automatic).init_method("env://").timeout(20s));
  expect(std::string(group->backend_name()) == "shm", "backend auto picked ", group->backend_name());
  Tensor tensor = Tensor::full({3}, group->rank() + 1.0, DType::f32);
  group->all_reduce(tensor)->wait();
  expect_values(tensor, [&](int64_t) { return 3.0; }, "all_reduce on the auto backend");
  std::string message = error_of([&] {
    if (group->rank() == 0) {
      group->all_reduce(Tensor::zeros({10}, DType::f32))->wait();
    } else {
      group->broadcast(Tensor::zeros({4}, DType::f64), 1)->wait();
    }
  });
  std::cout << "rank " << group->rank() << ": " << message << "\n";
  expect(contains(message, "the ranks called different collectives"), "mismatch not reported: ", message);
  expect(contains(message, group->rank() == 0 ? "this rank called all_reduce #1 of 40 bytes of f32, rank 1 called "
                                                "broadcast #1 of 32 bytes of f64"
                                              : "this rank called broadcast #1 of 32 bytes of f64, rank 0 called "
                                                "all_reduce #1 of 40 bytes of f32"),
         "mismatch message does not name both calls: ", message);
  destroy_process_group();
}

// Views of new_buffer memory at different places on different ranks are
// different collectives: both ranks are told.
LOOM_DIST_SCENARIO("shm_buffer_mismatch") {
  auto group = init_from_environment();
  Tensor buffer = group->new_buffer(8, DType::f32, Device::cpu());
  const int64_t start = group->rank() == 0 ? 0 : 4;
  std::string message = error_of([&] { group->all_reduce(buffer.slice(0, start, start + 4))->wait(); });
  std::cout << "rank " << group->rank() << ": " << message << "\n";
  expect(contains(message, group->rank() == 0 ? "this rank called all_reduce #1 of 16 bytes of f32 in shared buffer 0 "
                                                "at byte 0, rank 1 called all_reduce #1 of 16 bytes of f32 in shared "
                                                "buffer 0 at byte 16"
                                              : "this rank called all_reduce #1 of 16 bytes of f32 in shared buffer 0 "
                                                "at byte 16, rank 0 called"),
         "mismatch not reported: ", message);
}

TEST_SUITE("process_group") {
  TEST_CASE("collectives, 2 ranks") { expect_all_ok(spawn_ranks("collectives", 2, {.deadline = 40s})); }
  TEST_CASE("collectives, 4 ranks") { expect_all_ok(spawn_ranks("collectives", 4, {.deadline = 40s})); }

  TEST_CASE("shm: collectives, 2 ranks") { expect_all_ok(spawn_ranks("collectives", 2, on_shm(40s))); }
  TEST_CASE("shm: collectives, 4 ranks") { expect_all_ok(spawn_ranks("collectives", 4, on_shm(40s))); }
  TEST_CASE("shm: collectives, 3 ranks in rounds of 4 KiB") {
    expect_all_ok(spawn_ranks("collectives", 3, on_shm(60s, {{"LOOM_TEST_SHM_CHUNK", "4096"}})));
  }
  TEST_CASE("shm: auto picks it on one host; different collectives on different ranks are an error") {
    expect_all_ok(spawn_ranks("shm_auto_and_mismatch", 2, {.deadline = 20s}));
  }

  TEST_CASE("shm: views of shared buffers at different places are an error") {
    expect_all_ok(spawn_ranks("shm_buffer_mismatch", 2, on_shm(20s)));
  }

  TEST_CASE("shm: a world of one, in process") {
    auto store = local_store();
    ProcessGroupShm group(store, 0, 1, ShmOptions().timeout(5s));
    CHECK(group.chunk_bytes() == (size_t{1} << 20));
    CHECK(contains(group.capture_refusal().value_or(""), "the shm process group runs its collectives on the host, "
                                                         "which a CUDA graph cannot capture"));
    check_world_of_one(group);
    CHECK(contains(error_of([&] { ProcessGroupShm(store, 0, 1, ShmOptions().timeout(5s).chunk_bytes(100)); }),
                   "chunk_bytes 100 must be a multiple of 64"));
  }

  TEST_CASE("shm: a rank that cannot map rank 0's segment makes every rank give up, naming it") {
    // Rank 1 of 2, in process: rank 0 "published" a segment this process cannot open.
    auto store = local_store();
    // (token, name, creator's pid and descriptor: one this process does not have open)
    store->set("shm/segment", str("7 /loom-test-absent-", ::getpid(), " ", ::getpid(), " 999"));
    store->set("shm/status/0", "ok");
    std::string why;
    CHECK(ProcessGroupShm::try_create(store, 1, 2, ShmOptions().timeout(5s), &why) == nullptr);
    CHECK(contains(why, "not every rank can map one shared-memory segment; rank 1: cannot open rank 0's segment"));
    CHECK(contains(why, "another host or in another IPC namespace"));
    std::string thrown = error_of([&] { ProcessGroupShm(store, 1, 2, ShmOptions().timeout(5s)); });
    CHECK(contains(thrown, "Use the gloo backend for ranks on several hosts"));
    // And a rank that can map it gives up too when another rank reports it cannot.
    auto store2 = local_store();
    store2->set("shm/status/1", "cannot open it");
    CHECK(ProcessGroupShm::try_create(store2, 0, 2, ShmOptions().timeout(5s), &why) == nullptr);
    CHECK(contains(why, "rank 1: cannot open it"));
  }

  TEST_CASE("init_method tcp:// and file://") {
    expect_all_ok(spawn_ranks("init_methods", 2, {.deadline = 20s, .environment = {{"LOOM_TEST_INIT_METHOD", "tcp"}}}));
    std::string path = (std::filesystem::temp_directory_path() / ("loom_init_" + std::to_string(::getpid()))).string();
    expect_all_ok(spawn_ranks(
        "init_methods", 3,
        {.deadline = 20s, .environment = {{"LOOM_TEST_INIT_METHOD", "file"}, {"LOOM_TEST_PATH", path}}}));
    std::filesystem::remove(path);
  }

  TEST_CASE("a world of one, in process; misuse is reported when the collective is called") {
    auto store = local_store();
    ProcessGroupGloo group(store, 0, 1, GlooOptions().timeout(5s));
    check_world_of_one(group);
    CHECK(contains(group.capture_refusal().value_or(""), "the gloo process group runs its collectives on the host"));
    CHECK(group.watch_replay("step 1") == nullptr);
  }

  TEST_CASE("init_process_group: nccl, unknown backends and init methods") {
    // Where nccl cannot work, it says why before any rendezvous.
    if (!cuda::built_with_cuda()) {
      std::string nccl = error_of([] { init_process_group(InitOptions().backend(Backend::nccl)); });
      CHECK(contains(nccl, "loom was built without CUDA"));
      CHECK(contains(nccl, "NCCL backend needs the CUDA backend"));
      CHECK(contains(nccl, "use backend \"gloo\""));
    } else if (!nccl_available()) {
      std::string nccl = error_of([] { init_process_group(InitOptions().backend(Backend::nccl)); });
      CHECK(contains(nccl, "built with CUDA but without NCCL"));
      CHECK(contains(nccl, "NCCL_ROOT"));
    } else if (cuda::device_count() == 0) {
      std::string nccl = error_of([] { init_process_group(InitOptions().backend(Backend::nccl)); });
      CHECK(contains(nccl, "needs a CUDA device, but no CUDA device is visible"));
      CHECK(contains(error_of([] { make_process_group_nccl(nullptr, 0, 1, {}); }), "no CUDA device is visible"));
    }
    const std::string mpi = error_of([] { parse_backend("mpi"); });
    CHECK(contains(mpi, "unknown backend 'mpi'"));
    for (const char* name : {"\"auto\"", "\"gloo\"", "\"shm\"", "\"nccl\""}) CHECK(contains(mpi, name));
    CHECK(contains(error_of([] { parse_backend("Gloo"); }), "unknown backend 'Gloo'"));
    CHECK(contains(error_of([] { init_process_group(InitOptions().init_method("redis://x").world_size(1).rank(0)); }),
                   "init_method 'redis://x' is not one of"));
    CHECK(contains(
        error_of([] { init_process_group(InitOptions().init_method("tcp://nohost").world_size(1).rank(0)); }),
        "is not tcp://HOST:PORT"));
    CHECK(contains(error_of([] { default_process_group(); }), "call loom::dist::init_process_group() first"));
  }

  TEST_CASE("backend names and InitOptions") {
    CHECK(parse_backend("auto") == Backend::automatic);
    CHECK(parse_backend("gloo") == Backend::gloo);
    CHECK(parse_backend("shm") == Backend::shm);
    CHECK(parse_backend("nccl") == Backend::nccl);
    for (Backend backend : {Backend::automatic, Backend::gloo, Backend::shm, Backend::nccl}) {
      CHECK(parse_backend(backend_name(backend)) == backend);
    }
    // The defaults the aggregate had: gloo over env://, rank and world size from the launcher, PyTorch's 30 minutes.
    const InitOptions defaults;
    CHECK(defaults.backend() == Backend::gloo);
    CHECK(defaults.init_method() == "env://");
    CHECK(defaults.world_size() == -1);
    CHECK(defaults.rank() == -1);
    CHECK(defaults.timeout() == std::chrono::minutes(30));
    CHECK(defaults.store() == nullptr);
    CHECK(defaults.group_name() == "default");
    CHECK(defaults.device_index() == -1);
    auto store = local_store();
    const InitOptions set = InitOptions()
                                .backend(Backend::shm)
                                .init_method("file:///x")
                                .world_size(4)
                                .rank(3)
                                .timeout(7s)
                                .store(store)
                                .group_name("g")
                                .device_index(2);
    CHECK(set.backend() == Backend::shm);
    CHECK(set.init_method() == "file:///x");
    CHECK(set.world_size() == 4);
    CHECK(set.rank() == 3);
    CHECK(set.timeout() == 7s);
    CHECK(set.store() == store);
    CHECK(set.group_name() == "g");
    CHECK(set.device_index() == 2);
  }

  TEST_CASE("nccl: the dtypes it takes and the errors for tensors it cannot take") {
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32}) {
      CHECK_MESSAGE(nccl_supports(dtype), dtype_name(dtype));
    }
    CHECK_FALSE(nccl_supports(DType::u8));
    // CPU tensors handed to the nccl backend: named, with what to do instead.
    std::string cpu = error_of([] { check_nccl_tensor("all_reduce", Tensor::zeros({4}), "tensor 0", 0); });
    CHECK(contains(cpu, "all_reduce: tensor 0 is f32[4] cpu, a CPU tensor"));
    CHECK(contains(cpu, "the nccl backend works on CUDA tensors of this rank's device cuda:0"));
    CHECK(contains(cpu, "gloo backend for CPU tensors"));
    CHECK(contains(error_of([] { check_nccl_tensor("broadcast", Tensor(), "the tensor", 0); }),
                   "broadcast: the tensor is an undefined tensor"));
    if (cuda::device_count() > 0) {
      std::string bytes = error_of([] {
        check_nccl_tensor("all_gather", Tensor::zeros({2}, DType::u8, Device::cuda(0)), "the input", 0);
      });
      CHECK(contains(bytes, "NCCL collectives take f32, f64, f16, bf16, i64 or i32 tensors"));
      CHECK(contains(error_of([] { check_nccl_tensor("all_gather", Tensor::zeros({2}, DType::f32, Device::cuda(0)),
                                                     "the input", 1); }),
                     "this rank's NCCL communicator drives cuda:1"));
    }
  }
}

TEST_SUITE("failures") {
  TEST_CASE("a dead peer fails the collective within the timeout") {
    auto results = spawn_ranks("dead_peer", 2, {.deadline = 20s});
    CHECK_MESSAGE(results[0].ok(), results[0].describe());
    CHECK_MESSAGE(results[1].signal == SIGKILL, results[1].describe());
    MESSAGE(results[0].output);
  }

  TEST_CASE("a dead peer whose sockets stay open fails the collective at the timeout, named") {
    auto results = spawn_ranks("dead_peer_sockets_held", 2, {.deadline = 20s});
    CHECK_MESSAGE(results[0].ok(), results[0].describe());
    CHECK_MESSAGE(results[1].signal == SIGKILL, results[1].describe());
    MESSAGE(results[0].output);
  }

  TEST_CASE("a stalled peer fails the collective at the timeout") {
    auto results = spawn_ranks("stalled_peer", 2, {.deadline = 20s});
    expect_all_ok(results);
    MESSAGE(results[0].output);
  }

  TEST_CASE("shm: a dead peer fails the collective within the timeout") {
    auto results = spawn_ranks("dead_peer", 2, on_shm(20s));
    CHECK_MESSAGE(results[0].ok(), results[0].describe());
    CHECK_MESSAGE(results[1].signal == SIGKILL, results[1].describe());
    MESSAGE(results[0].output);
  }

  TEST_CASE("shm: a rank killed while it waits leaves no segment in /dev/shm") {
    auto results = spawn_ranks("shm_killed_while_waiting", 2, {.deadline = 20s});
    CHECK_MESSAGE(results[0].signal == SIGKILL, results[0].describe());
    CHECK_MESSAGE(results[1].ok(), results[1].describe());
  }

  TEST_CASE("shm: a stalled peer fails the collective at the timeout") {
    auto results = spawn_ranks("stalled_peer", 2, on_shm(20s));
    expect_all_ok(results);
    MESSAGE(results[0].output);
  }
}
