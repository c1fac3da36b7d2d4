// The waiting, timeout and abort logic of the NCCL process group, apart from
// the NCCL calls: a Communicator interface (process_group_nccl.cpp wraps a
// non-blocking ncclComm_t; CPU tests use a fake one) and the Watchdog that
// runs collectives on it, times them out and aborts it.
//
// Lock discipline (the hang of pytorch#46874 cannot happen): the watchdog's
// state mutex is never held across a call into the communicator that can
// block, the mutex that serialises enqueuing threads is never taken by the
// watchdog thread or by abort(), and the communicator's handle is guarded by
// a mutex held only to read or take it (AbortableHandle), never across a
// call, so state() and abort() never wait behind a blocked enqueue. A collective stuck in its enqueue call,
// in NCCL's asynchronous group completion or on the device is always timed
// out: every waiting collective fails with an error naming itself, its
// sequence number and the ranks that did not reach the one that timed out
// (each rank records in the store how many collectives it enqueued, as
// PyTorch's desync debug does), and the communicator is aborted.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <loom/core/error.h>
#include <loom/core/options.h>
#include <loom/dist/process_group.h>
#include <loom/dist/store.h>

namespace loom::dist::nccl {

// What the watchdog needs of a communicator (the real one: a non-blocking
// ncclComm_t, ncclCommInitRankConfig with blocking = 0).
class Communicator {
 public:
  enum class State { ready, in_progress, failed };
  Communicator() = default;
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // ncclCommGetAsyncError: ready, still initialising or completing an
  // enqueued group (in_progress), or failed (then `reason` says why). Never
  // blocks; callable from any thread.
  virtual State state(std::string& reason) = 0;
  // ncclCommAbort: ends every call in flight on the communicator (on any
  // thread; they return) and its kernels, and frees it. Idempotent, callable
  // from any thread, never throws.
  virtual void abort() noexcept = 0;
  // Called first on the watchdog's thread (the real one makes the rank's
  // device current there, so that event queries do not create a context on
  // GPU 0).
  virtual void bind_watchdog_thread() {}
};

// The handle of a communicator shared by enqueuing threads and the watchdog,
// with PyTorch's NCCLComm locking: the mutex is held only to read, query or
// take the handle, never across a call into it that can block, so abort()
// (from the watchdog) and state() never wait behind a blocked enqueue. NCCL
// allows ncclCommAbort while another thread's call on the same communicator
// blocks: that call returns. `T` is what the handle points to (ncclComm for
// ncclComm_t; the CPU tests use a fake).
template <typename T>
class AbortableHandle {
 public:
  // Once initialised (null: not yet, or aborted).
  void set(T* handle) {
    std::lock_guard lock(mutex_);
    handle_ = handle;
  }
  // Runs `calls(handle)` without the mutex; throws loom::Error once aborted.
  template <typename Calls>
  void call(Calls&& calls) {
    T* handle = nullptr;
    {
      std::lock_guard lock(mutex_);
      handle = handle_;
    }
    LOOM_CHECK(handle != nullptr, "the NCCL communicator was aborted");
    calls(handle);
  }
  // Runs `query(handle)` (null once aborted) under the mutex, so that abort
  // cannot free the handle meanwhile; `query` must never block.
  template <typename Query>
  auto query(Query&& query) {
    std::lock_guard lock(mutex_);
    return query(handle_);
  }
  // The handle for its abort, which the caller makes without the mutex; null
  // for every later caller.
  T* take() {
    std::lock_guard lock(mutex_);
    return std::exchange(handle_, nullptr);
  }

 private:
  std::mutex mutex_;  // held only for the few instructions above
  T* handle_ = nullptr;
};

class WatchdogOptions {
  // This rank and the group's size.
  LOOM_OPTION(int, rank) = 0;
  LOOM_OPTION(int, size) = 1;
  // Starts every error: "ProcessGroupNCCL rank 0 of 2 (cuda:0): ".
  LOOM_OPTION(std::string, prefix);
  // Where each rank records how many collectives it enqueued (null: errors
  // cannot name the ranks that did not arrive).
  LOOM_OPTION(std::shared_ptr<Store>, store);
  // How often the watchdog looks at the oldest pending collective.
  LOOM_OPTION(Milliseconds, poll_interval) = Milliseconds(1);
  // How often it asks the communicator for an asynchronous error.
  LOOM_OPTION(Milliseconds, check_interval) = Milliseconds(100);
  // How often at most it writes this rank's progress to the store, when it
  // moved (one store write per interval, off the enqueuing thread; the first
  // move at once). A timeout names the ranks behind from these records, so
  // the interval must be well below the collectives' timeout:
  // ProcessGroupNCCL takes max(1 s, timeout / 10).
  LOOM_OPTION(Milliseconds, progress_interval) = Milliseconds(1000);
};

// One collective run by a Watchdog.
class WatchedWork final : public Work {
 public:
  // Host-blocking works (barrier) wait on the host in wait(), as a barrier must.
  enum class WaitMode { stream, host };
  // What the backend gives once the collective is enqueued on the device.
  struct DeviceHooks {
    std::function<bool()> started;             // the device began it (null: never noted)
    std::function<bool()> finished;            // the device finished it; never blocks
    std::function<void()> order_caller_after;  // stream wait(): the caller's stream waits for it (null: blocks)
  };

  WatchedWork(std::string name, uint64_t sequence, const std::string& details, Milliseconds timeout, WaitMode mode);

  const std::string& name() const { return name_; }
  uint64_t sequence() const { return sequence_; }
  Clock::time_point deadline() const { return deadline_; }
  Milliseconds timeout() const { return timeout_; }

  // Stream mode: orders the caller's stream after the collective without
  // blocking the host (a failure found later is raised by the next
  // collective or synchronize()); host mode: blocks as synchronize(). A
  // captured work orders the capturing stream after it (the capture's join).
  void wait() override;
  // Recorded into a CUDA graph: it runs at the graph's replays, not now.
  bool captured() const { return captured_; }

 private:
  friend class Watchdog;
  std::string name_;
  uint64_t sequence_;
  Clock::time_point deadline_;
  Milliseconds timeout_;
  WaitMode mode_;
  DeviceHooks hooks_;          // set under the watchdog's mutex once enqueued
  bool enqueued_ = false;      // under the watchdog's mutex
  bool started_noted_ = false;  // the watchdog thread's
  bool captured_ = false;       // set before it is shared
};

// Runs collectives on a communicator and watches them: completes each when
// the device says so, fails every pending one and aborts the communicator
// on a timeout or an asynchronous error. Thread-safe.
class Watchdog {
 public:
  // Records this rank as joined in the store and starts the watchdog thread.
  Watchdog(std::shared_ptr<Communicator> communicator, WatchdogOptions options);
  // Lets pending collectives finish (each at most until its deadline, then
  // it fails), stops the thread and aborts the communicator. Never throws.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Waits until the communicator finished its non-blocking initialisation;
  // throws loom::Error, after aborting it, when it failed or `timeout`
  // passed first (naming the ranks that did not join).
  void wait_until_initialized(Milliseconds timeout);

  // Runs one collective, numbered in enqueue order: `enqueue` makes the
  // communicator calls (serialised with other threads' enqueues; it may
  // return while the communicator is still in_progress), then this waits for
  // the communicator to leave in_progress and calls `enqueued` for the
  // device hooks. Throws loom::Error when the group failed earlier, or when
  // this collective failed or timed out while being enqueued (the group is
  // then unusable). A `captured` collective (the caller's stream captures a
  // CUDA graph) is watched until it is enqueued, and then done: its events
  // belong to the graph and cannot be queried (ProcessGroup::watch_replay
  // watches the replays instead); its hooks only order the capture.
  std::shared_ptr<WatchedWork> run(std::string name, const std::string& details, Milliseconds timeout,
                                   WatchedWork::WaitMode mode, const std::function<void()>& enqueue,
                                   const std::function<WatchedWork::DeviceHooks()>& enqueued, bool captured = false);

  // The first failure ("" while the group is usable).
  std::string failure() const;
  // Collectives run so far (the next one's sequence number).
  uint64_t collectives_enqueued() const { return enqueued_count_.load(); }

 private:
  void run_thread();
  // Finishes the oldest pending work when the device finished it (then
  // sets `finished_one`); returns the failure message ("" for none) when it
  // timed out or its hooks threw.
  std::string check_oldest(bool& finished_one);
  // Records the failure, aborts the communicator, then fails every pending
  // work (the first with `message`, the others naming it as the cause). Only
  // the first call does anything.
  void fail(const std::string& message);
  // Writes this rank's progress to the store; false once the store failed.
  bool publish_progress();
  // "ranks that did not reach it: 1, 3 (...)" for collective `sequence`, read from the store.
  std::string missing_ranks(uint64_t sequence) const;
  std::string progress_key(int rank) const;

  std::shared_ptr<Communicator> communicator_;
  WatchdogOptions options_;

  std::mutex enqueue_mutex_;  // serialises run(); never taken by the watchdog thread or abort
  std::atomic<uint64_t> enqueued_count_{0};

  mutable std::mutex mutex_;  // the state below; never held across a communicator call that can block
  std::condition_variable wake_;
  std::deque<std::shared_ptr<WatchedWork>> pending_;  // enqueue order
  std::string failure_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom::dist::nccl
