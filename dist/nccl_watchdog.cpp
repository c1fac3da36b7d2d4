// The NCCL group's watchdog (see nccl_watchdog.h): enqueue, completion,
// timeouts, the ranks that did not arrive, and the abort. No NCCL here.
#include <loom/dist/nccl_watchdog.h>

#include <algorithm>
#include <optional>
#include <vector>

#include <loom/core/error.h>
#include <loom/core/log.h>
#include <loom/core/profiler.h>

namespace loom::dist::nccl {

namespace {

double seconds(Milliseconds duration) { return static_cast<double>(duration.count()) / 1000.0; }

constexpr const char* kUnusable =
    ". A peer process may have died or stopped calling collectives (or called them in a different order); the "
    "NCCL communicator was aborted and this process group is unusable from now on";

}  // namespace

WatchedWork::WatchedWork(std::string name, uint64_t sequence, const std::string& details, Milliseconds timeout,
                         WaitMode mode)
    : Work(str(name, " #", sequence, " (", details, ")")),
      name_(std::move(name)),
      sequence_(sequence),
      deadline_(Clock::now() + timeout),
      timeout_(timeout),
      mode_(mode) {}

void WatchedWork::wait() {
  if (captured_ && hooks_.order_caller_after) {  // enqueued (run() returned it): the graph orders the rest
    hooks_.order_caller_after();
    return;
  }
  if (mode_ == WaitMode::host || completed() || !hooks_.order_caller_after) {
    Work::wait();  // blocks until the watchdog finished it; rethrows its error
    return;
  }
  hooks_.order_caller_after();
}

Watchdog::Watchdog(std::shared_ptr<Communicator> communicator, WatchdogOptions options)
    : communicator_(std::move(communicator)), options_(std::move(options)) {
  LOOM_CHECK(communicator_ != nullptr, options_.prefix(), "the communicator is null");
  LOOM_CHECK(options_.poll_interval().count() > 0 && options_.check_interval().count() > 0 &&
                 options_.progress_interval().count() > 0,
             options_.prefix(), "the watchdog's poll, check and progress intervals must be positive");
  // Joined: 0 collectives enqueued. Written here, before initialisation can
  // block, so that a peer's init timeout knows this rank arrived.
  publish_progress();
  thread_ = std::thread([this] { run_thread(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;  // the thread drains pending works (each until its deadline), then exits
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  communicator_->abort();  // frees this rank's resources; cannot block on a peer that is gone
}

std::string Watchdog::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

std::string Watchdog::progress_key(int rank) const { return str("nccl_progress/", rank); }

bool Watchdog::publish_progress() {
  if (!options_.store()) return false;
  try {
    options_.store()->set(progress_key(options_.rank()), std::to_string(enqueued_count_.load()));
    return true;
  } catch (const std::exception& error) {
    // The store's host process ended: the progress stays as last written.
    log_debug(options_.prefix(), "stopped recording this rank's progress in the store: ", error.what());
    return false;
  }
}

std::string Watchdog::missing_ranks(uint64_t sequence) const {
  if (!options_.store()) return "";
  std::vector<std::string> behind;
  std::string details;
  try {
    for (int r = 0; r < options_.size(); ++r) {
      std::optional<uint64_t> enqueued;
      if (r == options_.rank()) {
        enqueued = enqueued_count_.load();
      } else if (options_.store()->check({progress_key(r)})) {
        enqueued = std::stoull(options_.store()->get_string(progress_key(r), std::chrono::seconds(5)));
      }
      if (enqueued && *enqueued > sequence) continue;
      behind.push_back(std::to_string(r));
      if (!details.empty()) details += ", ";
      details += !enqueued              ? str("rank ", r, " never joined")
                 : *enqueued == 0       ? str("rank ", r, " enqueued none")
                                        : str("rank ", r, " last enqueued #", *enqueued - 1);
    }
  } catch (const std::exception& error) {
    return str("; which ranks did not reach it is unknown: the store could not be read (", error.what(), ")");
  }
  if (behind.empty())
    return "; every rank enqueued it (the hang is inside NCCL or on a device: a rank may be stuck in a kernel)";
  std::string list;
  for (const std::string& r : behind) list += (list.empty() ? "" : ", ") + r;
  return str("; ", behind.size() == 1 ? "the rank that did not reach it: " : "the ranks that did not reach it: ",
             list, " (", details, ", as recorded in the store at most ", seconds(options_.progress_interval()),
             " s ago)");
}

void Watchdog::wait_until_initialized(Milliseconds timeout) {
  const auto deadline = Work::Clock::now() + timeout;
  std::string reason;
  while (true) {
    const Communicator::State state = communicator_->state(reason);
    if (state == Communicator::State::ready) return;
    if (state == Communicator::State::failed) {
      fail(str(options_.prefix(), "initialising the NCCL communicator failed (every rank needs its own GPU; ",
               options_.size(), " ranks): ", reason));
      break;
    }
    if (Work::Clock::now() > deadline) {
      std::string missing;
      if (options_.store()) {
        try {
          for (int r = 0; r < options_.size(); ++r)
            if (!options_.store()->check({progress_key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        } catch (const std::exception& error) {
          missing = str("unknown (the store could not be read: ", error.what(), ")");
        }
      }
      fail(str(options_.prefix(), "the NCCL communicator was not initialised within the timeout of ",
               seconds(timeout), " s",
               missing.empty() ? std::string("; every rank joined through the store (NCCL itself did not connect)")
                               : str("; ranks that did not join: ", missing),
               ". Start every rank of the group with the same rendezvous; the communicator was aborted"));
      break;
    }
    std::this_thread::sleep_for(options_.poll_interval());
  }
  LOOM_FAIL(failure());
}

std::shared_ptr<WatchedWork> Watchdog::run(std::string name, const std::string& details, Milliseconds timeout,
                                           WatchedWork::WaitMode mode, const std::function<void()>& enqueue,
                                           const std::function<WatchedWork::DeviceHooks()>& enqueued,
                                           bool captured) {
  std::lock_guard enqueue_lock(enqueue_mutex_);
  std::shared_ptr<WatchedWork> work;
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty())
      LOOM_FAIL(options_.prefix(), name, " called on a process group that failed earlier: ", failure_);
    work = std::make_shared<WatchedWork>(std::move(name), enqueued_count_.load(), details, timeout, mode);
    work->captured_ = captured;
    pending_.push_back(work);  // from here on its deadline is watched, even while enqueue blocks
  }
  enqueued_count_.fetch_add(1);
  wake_.notify_all();
  // Fails the group with `error` unless the watchdog failed it first (a
  // timeout, an abort), then throws the work's error.
  auto fail_with = [&](const std::string& error) {
    fail(str(options_.prefix(), work->description(), " failed: ", error, kUnusable));
    work->Work::wait();  // whichever fail() came first finishes every pending work, with an error
    LOOM_FAIL(options_.prefix(), work->description(), " failed: ", error);
  };
  try {
    enqueue();
  } catch (const std::exception& error) {
    fail_with(error.what());
  }
  // A non-blocking communicator completes the group call asynchronously:
  // only then are the collective's kernels on the stream.
  std::string reason;
  while (true) {
    const Communicator::State state = communicator_->state(reason);
    if (state == Communicator::State::ready) break;
    if (state == Communicator::State::failed) fail_with(str("NCCL reported an asynchronous error: ", reason));
    if (work->wait_for(options_.poll_interval())) std::rethrow_exception(work->error());  // failed by the watchdog
  }
  WatchedWork::DeviceHooks hooks;
  try {
    hooks = enqueued();
  } catch (const std::exception& error) {
    fail_with(error.what());
  }
  {
    std::lock_guard lock(mutex_);
    work->hooks_ = std::move(hooks);
    work->enqueued_ = true;
  }
  return work;
}

std::string Watchdog::check_oldest(bool& finished_one) {
  finished_one = false;
  std::shared_ptr<WatchedWork> work;
  bool enqueued = false;
  {
    std::lock_guard lock(mutex_);
    if (pending_.empty() || !failure_.empty()) return "";
    work = pending_.front();
    enqueued = work->enqueued_;
  }
  if (!enqueued) {  // its enqueue call, or NCCL's completion of the group, has not returned yet
    if (WatchedWork::Clock::now() <= work->deadline()) return "";
    return str(options_.prefix(), work->description(), " was not enqueued within the timeout of ",
               seconds(work->timeout()), " s (the NCCL call did not return)", missing_ranks(work->sequence()),
               kUnusable);
  }
  // Only this thread touches an enqueued work's hooks and started_noted_.
  // A captured work's events are the graph's: it is done once enqueued.
  bool finished = work->captured_;
  try {
    if (!finished && !work->started_noted_ && work->hooks_.started && work->hooks_.started()) {
      work->started_noted_ = true;
      work->mark_started();
    }
    if (!finished) finished = work->hooks_.finished();
  } catch (const std::exception& error) {  // a CUDA error while querying its events
    return str(options_.prefix(), work->description(), " failed: ", error.what(), kUnusable);
  }
  if (finished) {
    {
      std::lock_guard lock(mutex_);
      if (pending_.empty() || pending_.front() != work) return "";  // failed meanwhile by an enqueuing thread
      pending_.pop_front();
    }
    work->finish();
    finished_one = true;
    return "";
  }
  if (WatchedWork::Clock::now() <= work->deadline()) return "";
  return str(options_.prefix(), work->description(), " did not finish within the timeout of ", seconds(work->timeout()),
             " s", missing_ranks(work->sequence()), kUnusable);
}

void Watchdog::fail(const std::string& message) {
  std::deque<std::shared_ptr<WatchedWork>> failed;
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = message;
    failed.swap(pending_);
  }
  wake_.notify_all();
  log_error(message);
  // No lock held: calls blocked in the communicator return. Before the works
  // fail, so that a caller who sees the error finds the communicator gone;
  // the works left pending_ above, so events the abort completes finish none.
  communicator_->abort();
  // The oldest carries the message; each later one names itself and the cause.
  for (size_t i = 0; i < failed.size(); ++i) {
    const std::string error =
        i == 0 && message.find(failed[i]->description()) != std::string::npos
            ? message
            : str(options_.prefix(), failed[i]->description(), " was aborted because: ", message);
    failed[i]->finish(std::make_exception_ptr(Error(error)));
  }
}

void Watchdog::run_thread() {
  profiler::set_thread_name("nccl watchdog");  // where collectives end in a trace
  try {
    communicator_->bind_watchdog_thread();
  } catch (const std::exception& error) {
    log_warn(options_.prefix(), "the watchdog thread could not select the device: ", error.what());
  }
  auto last_check = Work::Clock::now();
  Work::Clock::time_point last_publish{};  // long ago: the first move is written at once
  uint64_t published = 0;
  bool store_usable = options_.store() != nullptr;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      if (!failure_.empty() || (stopping_ && pending_.empty())) break;
      wake_.wait_for(lock, pending_.empty() ? options_.check_interval() : options_.poll_interval());
      if (!failure_.empty() || (stopping_ && pending_.empty())) break;
    }
    std::string failure;
    bool finished_one = true;
    while (failure.empty() && finished_one) failure = check_oldest(finished_one);  // oldest first
    const auto now = Work::Clock::now();
    if (failure.empty() && now - last_check >= options_.check_interval()) {
      last_check = now;
      std::string reason;
      if (communicator_->state(reason) == Communicator::State::failed) {
        std::string running;
        {
          std::lock_guard lock(mutex_);
          running = pending_.empty() ? std::string("no collective") : pending_.front()->description();
        }
        failure = str(options_.prefix(), "NCCL reported an asynchronous error while running ", running, ": ", reason,
                      kUnusable);
      }
    }
    const uint64_t enqueued = enqueued_count_.load();
    if (failure.empty() && store_usable && enqueued != published && now - last_publish >= options_.progress_interval()) {
      last_publish = now;
      store_usable = publish_progress();
      published = enqueued;
    }
    if (!failure.empty()) fail(failure);
  }
}

}  // namespace loom::dist::nccl
