// The NCCL group's watchdog (dist/nccl_watchdog.h) driven by a fake
// communicator, on the CPU: a collective that never returns from its enqueue
// call, one that never finishes on the device, a group call that stays in
// progress until the abort, a peer that never joins the initialisation, a
// timeout while another thread enqueues, and an asynchronous error. Ranks are
// Watchdogs in this process sharing a FileStore. Timeouts are 300 ms and
// nothing depends on a thread being scheduled within them: each expected
// failure is waited for without a deadline, and the progress every check
// relies on is written at 10 ms intervals, long before any timeout.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <loom/core/error.h>
#include <loom/dist/nccl_watchdog.h>
#include <loom/dist/store.h>
#include "tests/dist/multiprocess.h"

using namespace loom;
using namespace loom::dist;
using namespace loom::dist::nccl;
using loom::dist::testing::contains;
using loom::dist::testing::error_of;
using namespace std::chrono_literals;

namespace {

constexpr Milliseconds kShortTimeout = 300ms;
constexpr Milliseconds kLongTimeout = 60s;

// What a test controls of a communicator: its state, and whether it was
// aborted; enqueue calls may block until the abort, as an NCCL call on a dead
// peer does. The handle is the real one's AbortableHandle with the same
// calls (state() queries through it, abort() takes it, enqueues call through
// it), so a change to its locking that lets a blocked enqueue hold up the
// watchdog hangs these tests, as it would hang the NCCL group.
class FakeCommunicator final : public Communicator {
 public:
  explicit FakeCommunicator(State initial = State::ready) : comm_(std::make_shared<FakeComm>()) {
    comm_->state = initial;
    handle_.set(comm_.get());
  }

  State state(std::string& reason) override {
    return handle_.query([&](FakeComm* comm) {
      if (comm == nullptr) {
        reason = "communicator aborted";
        return State::failed;
      }
      std::lock_guard lock(comm->mutex);
      if (comm->state == State::failed) reason = "unhandled system error (a peer's connection was reset)";
      return comm->state;
    });
  }
  void abort() noexcept override {
    FakeComm* comm = handle_.take();
    if (comm == nullptr) return;
    {  // the fake ncclCommAbort: a call blocked in the communicator returns
      std::lock_guard lock(comm->mutex);
      comm->aborted = true;
    }
    comm->aborted_changed.notify_all();
  }

  void set_state(State state) {
    std::lock_guard lock(comm_->mutex);
    comm_->state = state;
  }
  bool aborted() {
    std::lock_guard lock(comm_->mutex);
    return comm_->aborted;
  }
  // An enqueue call that returns only when the communicator is aborted, then fails.
  void block_until_aborted() {
    handle_.call([](FakeComm* comm) {
      std::unique_lock lock(comm->mutex);
      comm->aborted_changed.wait(lock, [&] { return comm->aborted; });
      throw Error("ncclAllReduce: the communicator was aborted");
    });
  }

 private:
  // What the handle points to (the real one: NCCL's ncclComm).
  struct FakeComm {
    std::mutex mutex;
    std::condition_variable aborted_changed;
    State state = State::ready;
    bool aborted = false;
  };
  std::shared_ptr<FakeComm> comm_;  // outlives every call through the handle
  AbortableHandle<FakeComm> handle_;
};

std::shared_ptr<Store> fresh_store() {
  static std::atomic<int> counter{0};
  const auto path = std::filesystem::temp_directory_path() /
                    ("loom_nccl_watchdog_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove(path);
  return std::make_shared<FileStore>(path.string(), 10s);
}

WatchdogOptions options_for(int rank, int size, const std::shared_ptr<Store>& store) {
  return WatchdogOptions()
      .rank(rank)
      .size(size)
      .prefix("ProcessGroupNCCL rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ")
      .store(store)
      .check_interval(10ms)
      .progress_interval(10ms);
}

// Ranks 0 and 1 of a group of 2, each with its own fake communicator.
struct TwoRanks {
  std::shared_ptr<Store> store = fresh_store();
  std::shared_ptr<FakeCommunicator> fake0 = std::make_shared<FakeCommunicator>();
  std::shared_ptr<FakeCommunicator> fake1 = std::make_shared<FakeCommunicator>();
  Watchdog rank0{fake0, options_for(0, 2, store)};
  Watchdog rank1{fake1, options_for(1, 2, store)};
};

// Device hooks of a collective the device finishes at once, or never.
WatchedWork::DeviceHooks finished_hooks() { return {nullptr, [] { return true; }, nullptr}; }
WatchedWork::DeviceHooks never_finished_hooks() { return {nullptr, [] { return false; }, nullptr}; }

std::shared_ptr<WatchedWork> run_collective(Watchdog& watchdog, const char* name, Milliseconds timeout,
                                            std::function<void()> enqueue,
                                            std::function<WatchedWork::DeviceHooks()> hooks) {
  return watchdog.run(name, "f32[4], sum", timeout, WatchedWork::WaitMode::stream, enqueue, hooks);
}

// Waits until rank `rank` has recorded at least `count` enqueued collectives
// (its watchdog writes them every check interval).
void wait_for_progress(Store& store, int rank, uint64_t count) {
  const std::string key = "nccl_progress/" + std::to_string(rank);
  while (!store.check({key}) || std::stoull(store.get_string(key)) < count) std::this_thread::sleep_for(5ms);
}

}  // namespace

TEST_SUITE("nccl_watchdog") {
  TEST_CASE("a collective the device never finishes times out, naming it, its number and the rank behind") {
    TwoRanks ranks;
    auto& [store, fake0, fake1, rank0, rank1] = ranks;

    // #0 finishes on both ranks; wait() orders the caller's stream without blocking.
    std::atomic<int> ordered{0};
    std::atomic<bool> device_done{false};
    auto first = run_collective(rank0, "all_reduce", kLongTimeout, [] {}, [&] {
      return WatchedWork::DeviceHooks{nullptr, [&] { return device_done.load(); }, [&] { ++ordered; }};
    });
    first->wait();
    CHECK(ordered == 1);
    device_done = true;
    first->synchronize();
    run_collective(rank1, "all_reduce", kLongTimeout, [] {}, finished_hooks)->synchronize();
    wait_for_progress(*store, 1, 1);

    // #1 on rank 0 only: rank 1 never arrives. #2 queues behind it.
    auto stuck = run_collective(rank0, "all_reduce", kShortTimeout, [] {}, never_finished_hooks);
    auto behind = run_collective(rank0, "broadcast", kLongTimeout, [] {}, finished_hooks);
    const std::string error = error_of([&] { stuck->synchronize(); });
    CHECK(contains(error, "ProcessGroupNCCL rank 0 of 2: all_reduce #1 (f32[4], sum) did not finish within the "
                          "timeout of 0.3 s; the rank that did not reach it: 1 (rank 1 last enqueued #0"));
    CHECK(contains(error, "the NCCL communicator was aborted"));
    const std::string behind_error = error_of([&] { behind->synchronize(); });
    CHECK(contains(behind_error, "broadcast #2 (f32[4], sum) was aborted because: "));
    CHECK(contains(behind_error, "all_reduce #1"));
    CHECK(fake0->aborted());
    CHECK_FALSE(fake1->aborted());
    CHECK(contains(error_of([&] { run_collective(rank0, "barrier", kLongTimeout, [] {}, finished_hooks); }),
                   "barrier called on a process group that failed earlier: "));
    CHECK(first->succeeded());
  }

  TEST_CASE("a captured collective is done once enqueued, its events never queried; a stuck replay fails the group") {
    TwoRanks ranks;
    auto& [store, fake0, fake1, rank0, rank1] = ranks;
    // #0: an eager collective queued before the capture, finished on the device later.
    std::atomic<bool> eager_done{false};
    auto eager = run_collective(rank0, "all_reduce", kLongTimeout, [] {}, [&] {
      return WatchedWork::DeviceHooks{nullptr, [&] { return eager_done.load(); }, nullptr};
    });
    // #1, captured into a CUDA graph: its events are the graph's nodes.
    std::atomic<int> queries{0}, joins{0};
    auto captured = rank0.run("all_reduce", "f16[8], avg", kShortTimeout, WatchedWork::WaitMode::stream, [] {}, [&] {
      return WatchedWork::DeviceHooks{[&] { return ++queries, false; }, [&] { return ++queries, false; },
                                      [&] { ++joins; }};
    }, /*captured=*/true);
    CHECK(captured->captured());
    CHECK_FALSE(eager->captured());
    captured->wait();  // the capture's join, at once: not behind the eager collective
    CHECK(joins == 1);
    std::this_thread::sleep_for(2 * kShortTimeout);  // past its deadline, still behind #0: no timeout
    CHECK(rank0.failure().empty());
    eager_done = true;
    CHECK(captured->wait_for(kLongTimeout));  // done after the collective before it, never by its events
    CHECK(captured->succeeded());
    CHECK(queries == 0);
    // ProcessGroupNCCL::watch_replay: no communicator call, the replay's end
    // on the device watched; a replay that never ends (a captured collective
    // a peer never reached) fails the group and aborts the communicator.
    auto replay = run_collective(rank0, "graph replay", kShortTimeout, [] {}, never_finished_hooks);
    CHECK(contains(error_of([&] { replay->synchronize(); }),
                   "graph replay #2 (f32[4], sum) did not finish within the timeout of 0.3 s"));
    CHECK(fake0->aborted());
    CHECK(contains(error_of([&] {
                     rank0.run("all_reduce", "f16[8], avg", kLongTimeout, WatchedWork::WaitMode::stream, [] {},
                               finished_hooks, /*captured=*/true);
                   }),
                   "all_reduce called on a process group that failed earlier"));
  }

  TEST_CASE("a collective whose enqueue call never returns is timed out and the call ends with the abort") {
    TwoRanks ranks;
    auto& [store, fake, fake1, rank0, rank1] = ranks;
    const auto start = Work::Clock::now();
    const std::string error = error_of([&] {
      run_collective(rank0, "all_reduce", kShortTimeout, [&] { fake->block_until_aborted(); }, finished_hooks);
    });
    CHECK(Work::Clock::now() - start >= kShortTimeout);
    CHECK(contains(error, "all_reduce #0 (f32[4], sum) was not enqueued within the timeout of 0.3 s (the NCCL call "
                          "did not return); the rank that did not reach it: 1 (rank 1 enqueued none"));
    CHECK(fake->aborted());
    CHECK(contains(rank0.failure(), "all_reduce #0"));
  }

  TEST_CASE("an abort during a group call: the group stays in progress until the watchdog aborts it") {
    auto store = fresh_store();
    auto fake = std::make_shared<FakeCommunicator>();
    Watchdog rank0(fake, options_for(0, 1, store));
    // ncclGroupEnd returned ncclInProgress and the group never completes.
    const std::string error = error_of([&] {
      run_collective(rank0, "reduce_scatter", kShortTimeout, [&] { fake->set_state(Communicator::State::in_progress); },
                     finished_hooks);
    });
    CHECK(contains(error, "reduce_scatter #0 (f32[4], sum) was not enqueued within the timeout of 0.3 s"));
    CHECK(contains(error, "every rank enqueued it"));  // world 1: no one else to wait for
    CHECK(fake->aborted());
  }

  TEST_CASE("a peer that never joins the initialisation is named, and the communicator aborted") {
    auto store = fresh_store();
    auto fake = std::make_shared<FakeCommunicator>(Communicator::State::in_progress);
    Watchdog rank0(fake, options_for(0, 3, store));
    Watchdog rank2(std::make_shared<FakeCommunicator>(Communicator::State::in_progress), options_for(2, 3, store));
    const std::string error = error_of([&] { rank0.wait_until_initialized(kShortTimeout); });
    CHECK(contains(error, "ProcessGroupNCCL rank 0 of 3: the NCCL communicator was not initialised within the "
                          "timeout of 0.3 s; ranks that did not join: 1."));
    CHECK(fake->aborted());

    auto failing = std::make_shared<FakeCommunicator>(Communicator::State::failed);
    Watchdog lone(failing, options_for(0, 1, fresh_store()));
    CHECK(contains(error_of([&] { lone.wait_until_initialized(kLongTimeout); }),
                   "initialising the NCCL communicator failed (every rank needs its own GPU; 1 ranks): unhandled "
                   "system error"));
    CHECK(failing->aborted());

    auto ready = std::make_shared<FakeCommunicator>();
    Watchdog fine(ready, options_for(0, 1, fresh_store()));
    fine.wait_until_initialized(kShortTimeout);
    CHECK_FALSE(ready->aborted());
  }

  TEST_CASE("a timeout while another thread enqueues fails that thread's collectives too, without a hang") {
    TwoRanks ranks;
    auto& [store, fake, fake1, rank0, rank1] = ranks;
    auto stuck = run_collective(rank0, "all_reduce", kShortTimeout, [] {}, never_finished_hooks);
    std::string other_error;
    int enqueued_by_other = 0;
    std::thread other([&] {
      // Each of these finishes on the device at once but completes only after the stuck one (in order).
      while (true) {
        std::shared_ptr<WatchedWork> work;
        other_error = error_of([&] { work = run_collective(rank0, "broadcast", kLongTimeout, [] {}, finished_hooks); });
        if (!work) break;
        ++enqueued_by_other;
        std::this_thread::sleep_for(1ms);
      }
    });
    const std::string error = error_of([&] { stuck->synchronize(); });
    other.join();
    CHECK(contains(error, "all_reduce #0 (f32[4], sum) did not finish within the timeout of 0.3 s; the rank that "
                          "did not reach it: 1 (rank 1 enqueued none"));
    CHECK(enqueued_by_other > 0);
    // Refused at the start, or failed while its enqueue waited on the aborted communicator.
    CHECK((contains(other_error, "broadcast called on a process group that failed earlier: ") ||
           contains(other_error, " was aborted because: ")));
    CHECK(contains(other_error, "all_reduce #0"));
    CHECK(fake->aborted());
  }

  TEST_CASE("an asynchronous NCCL error fails the pending collective and aborts") {
    auto fake = std::make_shared<FakeCommunicator>();
    Watchdog rank0(fake, options_for(0, 2, fresh_store()));
    auto work = run_collective(rank0, "all_gather", kLongTimeout, [] {}, never_finished_hooks);
    fake->set_state(Communicator::State::failed);
    const std::string error = error_of([&] { work->synchronize(); });
    CHECK(contains(error, "NCCL reported an asynchronous error while running all_gather #0 (f32[4], sum): unhandled "
                          "system error"));
    CHECK(fake->aborted());
  }

  TEST_CASE("progress is written to the store at most once per progress interval") {
    auto store = fresh_store();
    Watchdog rank0(std::make_shared<FakeCommunicator>(), options_for(0, 1, store).progress_interval(60s));
    run_collective(rank0, "all_reduce", kLongTimeout, [] {}, finished_hooks)->synchronize();
    wait_for_progress(*store, 0, 1);  // the first move at once
    for (int i = 0; i < 3; ++i) run_collective(rank0, "all_reduce", kLongTimeout, [] {}, finished_hooks)->synchronize();
    std::this_thread::sleep_for(200ms);  // 20 check intervals
    CHECK(store->get_string("nccl_progress/0") == "1");
    CHECK(rank0.collectives_enqueued() == 4);
  }

  TEST_CASE("destroying the watchdog lets finished collectives complete and aborts the communicator") {
    auto fake = std::make_shared<FakeCommunicator>();
    std::shared_ptr<WatchedWork> work;
    {
      Watchdog rank0(fake, options_for(0, 1, nullptr));
      work = run_collective(rank0, "all_reduce", kLongTimeout, [] {}, finished_hooks);
    }
    CHECK(work->succeeded());
    CHECK(fake->aborted());
  }
}
