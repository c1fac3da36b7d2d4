// Distributed debugging: LOOM_LOG_LEVEL (parsing, rank prefixes, whole lines
// from many threads, the rendezvous steps at debug), LOOM_DISTRIBUTED_DEBUG
// (parsing; at DETAIL ranks that call different collectives fail at once,
// naming both calls; DDP trains unchanged), and the desync report that names
// the rank that is behind when a collective times out.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include <loom/core/log.h>
#include <loom/dist/debug_process_group.h>
#include <loom/dist/process_group_gloo.h>
#include <loom/dist/store.h>
#include "tests/dist/multiprocess.h"
#include "tests/support/finished_group.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::testing;
using namespace std::chrono_literals;

namespace {

// A client of the job's rendezvous store (rank 0 hosts it), for the
// scenarios' own handshakes.
TCPStore job_store() {
  return TCPStore(env_string("MASTER_ADDR"), env_int("MASTER_PORT"), TCPStoreOptions().timeout(60s));
}

int64_t steady_nanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The value after "name=" in `text` (a scenario's output line).
int64_t reported(const std::string& text, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(text, match, std::regex(name + "=(-?[0-9]+)"))) return -1;
  return std::stoll(match[1]);
}

}  // namespace

TEST_SUITE("debug") {
  TEST_CASE("LOOM_LOG_LEVEL values") {
    CHECK(parse_log_level("error") == LogLevel::error);
    CHECK(parse_log_level("WARN") == LogLevel::warn);
    CHECK(parse_log_level("warning") == LogLevel::warn);
    CHECK(parse_log_level("Info") == LogLevel::info);
    CHECK(parse_log_level("debug") == LogLevel::debug);
    std::string message = error_of([] { parse_log_level("verbose"); });
    CHECK_MESSAGE(contains(message, "LOOM_LOG_LEVEL='verbose' is not a log level; expected error, warn, info or debug"),
                  message);
    CHECK(contains(error_of([] { parse_log_level("", "--log-level"); }), "--log-level=''"));
  }

  TEST_CASE("LOOM_DISTRIBUTED_DEBUG values") {
    CHECK(distributed_debug_level_from_environment(environment_from({})) == DistributedDebugLevel::off);
    CHECK(distributed_debug_level_from_environment(environment_from({{"LOOM_DISTRIBUTED_DEBUG", "OFF"}})) ==
          DistributedDebugLevel::off);
    CHECK(distributed_debug_level_from_environment(environment_from({{"LOOM_DISTRIBUTED_DEBUG", "info"}})) ==
          DistributedDebugLevel::info);
    CHECK(distributed_debug_level_from_environment(environment_from({{"LOOM_DISTRIBUTED_DEBUG", "Detail"}})) ==
          DistributedDebugLevel::detail);
    std::string message =
        error_of([] { distributed_debug_level_from_environment(environment_from({{"LOOM_DISTRIBUTED_DEBUG", "FULL"}})); });
    CHECK_MESSAGE(contains(message, "LOOM_DISTRIBUTED_DEBUG='FULL' is not a debug level; expected OFF"), message);
    CHECK(contains(message, "INFO"));
    CHECK(contains(message, "DETAIL"));
  }

  TEST_CASE("collective fingerprints: description and encoding") {
    Tensor a = Tensor::zeros({10, 100});
    Tensor b = Tensor::zeros({1000});
    Tensor c = Tensor::zeros({10}, DType::i64);
    auto reduce = CollectiveFingerprint::of_all_reduce({b}, ReduceOp::sum);
    reduce.sequence = 7;
    CHECK(reduce.describe() == "all_reduce(f32, 1000 elems, sum) #7");
    auto shaped = CollectiveFingerprint::of_all_reduce({a}, ReduceOp::sum);
    shaped.sequence = 7;
    CHECK(shaped.describe() == "all_reduce(f32, 1000 elems [10, 100], sum) #7");
    CHECK_FALSE(shaped == reduce);  // same count, different shapes
    auto several = CollectiveFingerprint::of_all_reduce({b, c}, ReduceOp::max);
    CHECK(several.describe() == "all_reduce(f32, 1010 elems in 2 tensors, max) #0");
    auto cast = CollectiveFingerprint::of_broadcast(c, 1);
    CHECK(cast.describe() == "broadcast(i64, 10 elems, root 1) #0");
    CHECK(CollectiveFingerprint::of_barrier().describe() == "barrier() #0");
    CHECK(CollectiveFingerprint::of_all_gather(b).describe() == "all_gather(f32, 1000 elems) #0");
    CHECK(CollectiveFingerprint::of_reduce_scatter(c, ReduceOp::avg).describe() ==
          "reduce_scatter(i64, 10 elems, avg) #0");
    for (const auto& fingerprint : {reduce, shaped, several, cast}) {
      auto words = fingerprint.encode();
      CHECK(CollectiveFingerprint::decode(words.data()) == fingerprint);
    }
  }

  TEST_CASE("a wrapped group numbers the collectives and forwards them") {
    auto store = local_store();
    auto inner = std::make_shared<ProcessGroupGloo>(store, 0, 1, GlooOptions().timeout(5s));
    DebugProcessGroup group(inner, store);
    CHECK(std::string(group.backend_name()) == "gloo");
    // CUDA graphs: inner's answer (gloo cannot be captured; a group that can, can through the wrapper).
    CHECK(contains(group.capture_refusal().value_or(""), "the gloo process group runs its collectives on the host"));
    CHECK(group.watch_replay("step 1") == nullptr);
    auto capturable = std::make_shared<loom::testing::FinishedGroup>();
    capturable->allow_capture();
    CHECK(DebugProcessGroup(capturable, local_store()).capture_refusal() == std::nullopt);
    Tensor x = Tensor::full({4}, 3.0);
    WorkHandle work = group.all_reduce(x);
    work->wait();
    CHECK(work->succeeded());
    CHECK(work->completed());
    CHECK(work->error() == nullptr);
    CHECK(work->enqueue_time() <= work->start_time());
    CHECK(work->start_time() <= work->end_time());
    CHECK(work->start_time() != Work::Clock::time_point{});
    group.barrier()->wait();
    CHECK(x.data<float>()[0] == 3.0f);
    CHECK(group.collectives_called() == 2);
    // This rank's progress reaches the store within the publish interval.
    std::string published;
    for (int i = 0; i < 200 && !contains(published, "barrier() #1"); ++i) {
      std::this_thread::sleep_for(25ms);
      published = store->check({"debug/progress/0"}) ? store->get_string("debug/progress/0") : "";
    }
    CHECK_MESSAGE(published == "2\nbarrier() #1", published);
  }

  TEST_CASE("a failed collective's error carries the desync report") {
    auto store = local_store();
    DebugProcessGroup group(std::make_shared<loom::testing::FinishedGroup>("the backend gave up"), store);
    WorkHandle work = group.all_reduce(Tensor::zeros({4}));
    CHECK(work->completed());
    CHECK_FALSE(work->succeeded());
    std::string message = error_of([&] { work->wait(); });
    CHECK_MESSAGE(contains(message, "the backend gave up\nDesync report for #0"), message);
    CHECK_MESSAGE(contains(message, "rank 0 (this rank): all_reduce(f32, 4 elems, sum) #0"), message);
    CHECK_MESSAGE(contains(message, "No rank is behind"), message);
    CHECK(work->error_message() == message);
  }
}

// ---- LOOM_LOG_LEVEL in real processes ----

// Rendezvous at LOOM_LOG_LEVEL=debug, then one info line of the scenario's own.
LOOM_DIST_SCENARIO("log_rendezvous") {
  auto group = group_from_environment(20s);
  group->barrier()->wait();
  log_info("scenario line from rank ", group->rank());
  log_debug("scenario debug line");
  destroy_process_group();
}

// Eight threads writing lines at once: every line arrives whole.
LOOM_DIST_SCENARIO("log_threads") {
  set_log_rank(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t] {
      for (int line = 0; line < 200; ++line)
        log_warn("thread ", t, " line ", line, " ", std::string(100, static_cast<char>('a' + t)), " end");
    });
  }
  for (auto& thread : threads) thread.join();
}

LOOM_DIST_SCENARIO("bad_debug_variables") {
  std::string message = error_of([] { group_from_environment(5s); });
  std::cout << "error: " << message << std::endl;
}

TEST_SUITE("debug") {
  TEST_CASE("LOOM_LOG_LEVEL=debug prints the rendezvous steps, rank-prefixed") {
    auto results = spawn_ranks("log_rendezvous", 2, {.environment = {{"LOOM_LOG_LEVEL", "debug"}}});
    expect_all_ok(results);
    const std::string& zero = results[0].output;
    const std::string& one = results[1].output;
    CAPTURE(zero);
    CAPTURE(one);
    for (const char* line :
         {"[rank 0] debug: rendezvous: launcher torchrun-style (RANK / WORLD_SIZE) detected: RANK / WORLD_SIZE are set",
          "[rank 0] debug: rendezvous: rank 0 hosts the TCPStore on port ",
          "[rank 0] debug: rendezvous: backend gloo, as asked; connecting the mesh of 2 ranks",
          "[rank 0] debug: process group 'default': backend gloo, rank 0 of 2, collective timeout 20 s, "
          "LOOM_DISTRIBUTED_DEBUG=OFF",
          "[rank 0] scenario line from rank 0", "[rank 0] debug: scenario debug line"})
      CHECK_MESSAGE(contains(zero, line), line);
    // The server side: who connected, and which rank each process claimed.
    CHECK(std::regex_search(zero, std::regex(R"(\[rank 0\] debug: TCPStore server on port \d+: a client connected )"
                                             R"(from 127\.0\.0\.1:\d+)")));
    CHECK(std::regex_search(zero, std::regex(R"(TCPStore server on port \d+: rank 1 joined \(host .*, pid \d+\))")));
    CHECK(contains(one, "[rank 1] debug: rendezvous: connecting to rank 0's TCPStore at 127.0.0.1:"));
    CHECK(contains(one, "[rank 1] debug: rendezvous: claimed rank 1 of 2 as host "));
    CHECK(contains(one, "[rank 1] debug: process group 'default': backend gloo, rank 1 of 2"));
    CHECK(contains(one, "[rank 1] scenario line from rank 1"));
  }

  TEST_CASE("the default level shows info lines but no debug lines; warn hides info") {
    auto results = spawn_ranks("log_rendezvous", 2);
    expect_all_ok(results);
    for (const auto& result : results) {
      CAPTURE(result.output);
      CHECK(contains(result.output, str("[rank ", result.rank, "] scenario line from rank ", result.rank)));
      CHECK_FALSE(contains(result.output, "debug:"));
    }
    results = spawn_ranks("log_rendezvous", 2, {.environment = {{"LOOM_LOG_LEVEL", "warn"}}});
    expect_all_ok(results);
    for (const auto& result : results) CHECK_MESSAGE(!contains(result.output, "scenario line"), result.output);
  }

  TEST_CASE("log lines from many threads arrive whole") {
    auto results = spawn_ranks("log_threads", 1);
    expect_all_ok(results);
    std::istringstream lines(results[0].output);
    std::regex whole(R"(\[rank 3\] warning: thread ([0-7]) line \d+ ([a-h])\2{99} end)");
    int count = 0;
    for (std::string line; std::getline(lines, line);) {
      std::smatch match;
      CHECK_MESSAGE(std::regex_match(line, match, whole), line);
      if (!match.empty()) CHECK(match[2].str()[0] == static_cast<char>('a' + std::stoi(match[1])));
      ++count;
    }
    CHECK(count == 8 * 200);
  }

  TEST_CASE("bad LOOM_LOG_LEVEL / LOOM_DISTRIBUTED_DEBUG values fail init_process_group, naming the variable") {
    auto results = spawn_ranks("bad_debug_variables", 1, {.environment = {{"LOOM_LOG_LEVEL", "loud"}}});
    expect_all_ok(results);
    CHECK_MESSAGE(contains(results[0].output, "error: LOOM_LOG_LEVEL='loud' is not a log level; expected error, warn, "
                                              "info or debug"),
                  results[0].output);
    results = spawn_ranks("bad_debug_variables", 1, {.environment = {{"LOOM_DISTRIBUTED_DEBUG", "yes"}}});
    expect_all_ok(results);
    CHECK_MESSAGE(contains(results[0].output, "error: LOOM_DISTRIBUTED_DEBUG='yes' is not a debug level"),
                  results[0].output);
  }
}

// ---- LOOM_DISTRIBUTED_DEBUG=DETAIL: mismatched collectives ----

// One matching all_reduce, then rank 0 all-reduces 1000 floats while rank 1
// broadcasts 10. With a collective timeout of a minute, only the fingerprint
// check can end the call quickly. Each rank prints when it entered the call
// and when it failed (steady clock: one clock for every process of the host).
LOOM_DIST_SCENARIO("mismatch") {
  auto group = group_from_environment(60s);
  const int rank = group->rank();
  group->all_reduce(Tensor::ones({4}))->wait();
  Tensor big = Tensor::ones({1000});
  Tensor small = Tensor::ones({10});
  const int64_t entered = steady_nanoseconds();
  std::string message = error_of([&] {
    if (rank == 0) {
      group->all_reduce(big)->wait();
    } else {
      group->broadcast(small, 0)->wait();
    }
  });
  const int64_t failed = steady_nanoseconds();
  std::cout << "entered_ns=" << entered << " failed_ns=" << failed << std::endl;
  expect(contains(message, "rank 0 called all_reduce(f32, 1000 elems, sum) #1 but rank 1 called broadcast(f32, 10 "
                           "elems, root 0) #1"),
         "rank ", rank, " got: ", message);
  // Nothing ran: the group goes on with matching calls.
  Tensor x = Tensor::ones({3});
  group->all_reduce(x)->wait();
  expect(x.data<float>()[0] == 2.0f, "the all_reduce after the mismatch gave ", x.data<float>()[0]);
  group->barrier()->wait();
}

// ---- The desync report: rank 1 stops calling collectives ----

// Two collectives together, then rank 0 all-reduces with a 2 s timeout while
// rank 1 waits (on a store key) until rank 0 has checked its error.
LOOM_DIST_SCENARIO("behind") {
  auto group = group_from_environment(30s);
  const int rank = group->rank();
  group->all_reduce(Tensor::ones({4}))->wait();
  group->barrier()->wait();
  TCPStore store = job_store();
  if (rank == 0) {
    group->set_timeout(2s);
    std::string message = error_of([&] { group->all_reduce(Tensor::ones({8}))->wait(); });
    store.set("test/checked", "1");
    std::cout << "rank 0 error: " << message << std::endl;
    expect(contains(message, "Desync report for #2"), "no desync report: ", message);
    expect(contains(message, "rank 0 (this rank): all_reduce(f32, 8 elems, sum) #2"), "rank 0's entry: ", message);
    expect(contains(message, "rank 1: barrier() #1"), "rank 1's entry: ", message);
    expect(contains(message, "Behind: rank 1 has not reached #2"), "rank 1 not named as behind: ", message);
    store.get("test/released", 60s);  // rank 1 has read the key: the store may go
  } else {
    store.get("test/checked", 60s);
    store.set("test/released", "1");
  }
}

TEST_SUITE("debug") {
  TEST_CASE("DETAIL: ranks calling different collectives fail at once, naming both calls") {
    for (const char* backend : {"gloo", "shm"}) {
      CAPTURE(backend);
      auto results = spawn_ranks("mismatch", 2,
                                 {.deadline = 90s,
                                  .environment = {{"LOOM_DISTRIBUTED_DEBUG", "DETAIL"}, {"LOOM_TEST_BACKEND", backend}}});
      expect_all_ok(results);
      const int64_t both_entered = std::max(reported(results[0].output, "entered_ns"),
                                            reported(results[1].output, "entered_ns"));
      for (const auto& result : results) {
        const int64_t failed = reported(result.output, "failed_ns");
        REQUIRE_MESSAGE(failed > 0, result.output);
        const double seconds = static_cast<double>(failed - both_entered) / 1e9;
        // The fingerprint exchange takes milliseconds; 1 s leaves room for a
        // heavily loaded machine and is far below the 60 s collective timeout.
        CHECK_MESSAGE(seconds < 1.0, "rank ", result.rank, " failed ", seconds, " s after both ranks entered");
      }
    }
  }

  TEST_CASE("a timed-out collective names the rank that is behind") {
    for (const char* backend : {"gloo", "shm"}) {
      CAPTURE(backend);
      auto results =
          spawn_ranks("behind", 2, {.deadline = 90s, .environment = {{"LOOM_TEST_BACKEND", backend}}});
      expect_all_ok(results);
    }
  }

  TEST_CASE("DETAIL: DDP training with matching collectives passes unchanged") {
    std::map<std::string, std::string> detail = {{"LOOM_DISTRIBUTED_DEBUG", "DETAIL"}};
    auto results = spawn_ranks("ddp_equivalence", 2, {.deadline = 60s, .environment = detail});
    expect_all_ok(results);
    for (const auto& result : results) {
      CAPTURE(result.output);
      CHECK(contains(result.output, str("[rank ", result.rank, "] process group 'default': backend gloo, rank ",
                                        result.rank, " of 2, collective timeout 20 s, LOOM_DISTRIBUTED_DEBUG=DETAIL")));
      // INFO and above: a line when the group goes, with what it ran.
      CHECK(std::regex_search(result.output, std::regex(R"(process group 'default' \(gloo, rank \d of 2\) destroyed )"
                                                        R"(after \d+ collectives, the last barrier\(\) #\d+)")));
    }
    expect_all_ok(spawn_ranks("ddp_equivalence", 2, on_shm(60s, detail)));
    expect_all_ok(spawn_ranks("ddp_overlap", 2, {.deadline = 60s, .environment = detail}));
  }
}
