// DebugProcessGroup: collective numbering, progress published to the store by
// a background thread, the desync report on failures, and DETAIL's
// fingerprint exchange before each collective.
#include <loom/dist/debug_process_group.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include <loom/core/enum_names.h>
#include <loom/core/error.h>
#include <loom/core/log.h>

namespace loom::dist {

namespace {
constexpr EnumNames<DistributedDebugLevel, 3> kDebugLevelNames{{{DistributedDebugLevel::off, "OFF"},
                                                                {DistributedDebugLevel::info, "INFO"},
                                                                {DistributedDebugLevel::detail, "DETAIL"}}};
}  // namespace

const char* distributed_debug_level_name(DistributedDebugLevel level) {
  return kDebugLevelNames.name(level, "unknown");
}

DistributedDebugLevel distributed_debug_level_from_environment(const EnvironmentLookup& environment) {
  auto text = environment("LOOM_DISTRIBUTED_DEBUG");
  if (!text) return DistributedDebugLevel::off;
  std::string upper;
  for (unsigned char c : *text) upper += static_cast<char>(std::toupper(c));
  if (auto level = kDebugLevelNames.parse(upper)) return *level;
  LOOM_FAIL("LOOM_DISTRIBUTED_DEBUG='", *text,
            "' is not a debug level; expected OFF (the default: a desync report when a collective fails), INFO "
            "(and a line per process group) or DETAIL (and every collective checked across ranks before it runs)");
}

// ---- CollectiveFingerprint ----

namespace {

const char* op_name(CollectiveFingerprint::Op op) {
  switch (op) {
    case CollectiveFingerprint::Op::all_reduce: return "all_reduce";
    case CollectiveFingerprint::Op::broadcast: return "broadcast";
    case CollectiveFingerprint::Op::all_gather: return "all_gather";
    case CollectiveFingerprint::Op::reduce_scatter: return "reduce_scatter";
    case CollectiveFingerprint::Op::barrier: return "barrier";
  }
  return "unknown collective";
}

// FNV-1a over the dtypes and shapes of `tensors`.
uint64_t hash_shapes(const std::vector<Tensor>& tensors) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](int64_t value) {
    for (int byte = 0; byte < 8; ++byte) hash = (hash ^ ((static_cast<uint64_t>(value) >> (8 * byte)) & 0xff)) * 1099511628211ull;
  };
  for (const Tensor& t : tensors) {
    mix(static_cast<int64_t>(t.dtype()));
    mix(t.dim());
    for (int64_t size : t.sizes()) mix(size);
  }
  return hash;
}

CollectiveFingerprint of_tensors(CollectiveFingerprint::Op op, const std::vector<Tensor>& tensors) {
  CollectiveFingerprint fingerprint;
  fingerprint.op = op;
  fingerprint.tensors = static_cast<int64_t>(tensors.size());
  for (const Tensor& t : tensors) fingerprint.numel += t.numel();
  if (!tensors.empty()) {
    const Tensor& first = tensors.front();
    fingerprint.dtype = static_cast<int64_t>(first.dtype());
    fingerprint.dims = first.dim();
    for (int64_t d = 0; d < std::min<int64_t>(first.dim(), CollectiveFingerprint::kMaxDims); ++d)
      fingerprint.shape[static_cast<size_t>(d)] = first.size(d);
  }
  fingerprint.shapes_hash = hash_shapes(tensors);
  return fingerprint;
}

// Calls visit(field) for every field of `fingerprint` (const or not) in the
// order of the words exchanged: encode and decode share this one layout.
template <class Fingerprint, class Visit>
void for_each_word(Fingerprint& fingerprint, Visit&& visit) {
  visit(fingerprint.sequence);
  visit(fingerprint.op);
  visit(fingerprint.dtype);
  visit(fingerprint.numel);
  visit(fingerprint.tensors);
  visit(fingerprint.root);
  visit(fingerprint.reduce_op);
  visit(fingerprint.dims);
  visit(fingerprint.shapes_hash);
  for (auto& size : fingerprint.shape) visit(size);
}

}  // namespace

std::array<int64_t, CollectiveFingerprint::kWords> CollectiveFingerprint::encode() const {
  std::array<int64_t, kWords> words{};
  size_t next = 0;
  for_each_word(*this, [&](const auto& field) { words[next++] = static_cast<int64_t>(field); });
  return words;
}

CollectiveFingerprint CollectiveFingerprint::decode(const int64_t* words) {
  CollectiveFingerprint fingerprint;
  size_t next = 0;
  for_each_word(fingerprint, [&](auto& field) {
    field = static_cast<std::remove_reference_t<decltype(field)>>(words[next++]);
  });
  return fingerprint;
}

std::string CollectiveFingerprint::describe() const {
  const bool known_op = op >= Op::all_reduce && op <= Op::barrier;
  std::string text = known_op ? op_name(op) : str("collective ", static_cast<int64_t>(op));
  if (op != Op::barrier) {
    const bool known_dtype = dtype >= 0 && dtype <= static_cast<int64_t>(DType::u8);
    text += str("(", known_dtype ? dtype_name(static_cast<DType>(dtype)) : "?", ", ", numel, " elems");
    if (tensors != 1) text += str(" in ", tensors, " tensors");
    if (tensors == 1 && dims > 1) {
      text += " [";
      for (int64_t d = 0; d < dims; ++d) {
        text += d ? ", " : "";
        text += d < kMaxDims ? std::to_string(shape[static_cast<size_t>(d)]) : "...";
        if (d >= kMaxDims) break;
      }
      text += "]";
    }
    if (root >= 0) text += str(", root ", root);
    if (reduce_op >= 0 && reduce_op <= static_cast<int64_t>(ReduceOp::min))
      text += str(", ", reduce_op_name(static_cast<ReduceOp>(reduce_op)));
    text += ")";
  } else {
    text += "()";
  }
  return text + str(" #", sequence);
}

CollectiveFingerprint CollectiveFingerprint::of_all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
  CollectiveFingerprint fingerprint = of_tensors(Op::all_reduce, tensors);
  fingerprint.reduce_op = static_cast<int64_t>(op);
  return fingerprint;
}

CollectiveFingerprint CollectiveFingerprint::of_broadcast(const Tensor& tensor, int root) {
  CollectiveFingerprint fingerprint = of_tensors(Op::broadcast, {tensor});
  fingerprint.root = root;
  return fingerprint;
}

CollectiveFingerprint CollectiveFingerprint::of_all_gather(const Tensor& input) {
  return of_tensors(Op::all_gather, {input});
}

CollectiveFingerprint CollectiveFingerprint::of_reduce_scatter(const Tensor& output, ReduceOp op) {
  CollectiveFingerprint fingerprint = of_tensors(Op::reduce_scatter, {output});
  fingerprint.reduce_op = static_cast<int64_t>(op);
  return fingerprint;
}

CollectiveFingerprint CollectiveFingerprint::of_barrier() { return of_tensors(Op::barrier, {}); }

// ---- State shared by the group and its Works ----

struct DebugProcessGroup::State {
  int rank;
  int size;
  std::string backend;
  std::shared_ptr<Store> store;
  DebugOptions options;
  std::shared_ptr<ProcessGroup> checker;  // DETAIL only

  // One collective enters at a time, so the numbers follow the order the
  // backend sees the calls in.
  std::mutex call_mutex;
  uint64_t next_sequence = 0;  // under call_mutex

  // What the publisher publishes: how many collectives were entered, and the
  // last one.
  std::atomic<uint64_t> entered{0};
  mutable std::mutex last_mutex;
  CollectiveFingerprint last;  // under last_mutex

  std::mutex publisher_mutex;
  std::condition_variable publisher_wake;
  bool stopping = false;  // under publisher_mutex
  std::thread publisher;

  std::mutex report_mutex;
  std::optional<std::string> report;  // the first failure's, under report_mutex
  std::atomic<bool> failed{false};

  static std::string progress_key(int r) { return str("debug/progress/", r); }

  void enter(const CollectiveFingerprint& fingerprint) {
    {
      std::lock_guard lock(last_mutex);
      last = fingerprint;
    }
    entered.store(fingerprint.sequence + 1, std::memory_order_release);
  }

  // Publishes "<entered>\n<last collective>" whenever it changed, every
  // publish_interval, until stopped; gives up quietly (a debug line) when the
  // store fails, which happens when the process hosting it has ended.
  void publish_loop() noexcept {
    uint64_t published = UINT64_MAX;
    std::unique_lock lock(publisher_mutex);
    while (!stopping) {
      const uint64_t now = entered.load(std::memory_order_acquire);
      if (now != published) {
        lock.unlock();
        std::string value;
        {
          std::lock_guard last_lock(last_mutex);
          value = str(now, "\n", now == 0 ? std::string("no collective yet") : last.describe());
        }
        try {
          store->set(progress_key(rank), value);
        } catch (const std::exception& error) {
          log_debug("process group '", options.group_name(), "': stopped publishing this rank's progress: ",
                    error.what());
          return;
        }
        published = now;
        lock.lock();
      }
      publisher_wake.wait_for(lock, options.publish_interval(), [&] { return stopping; });
    }
  }

  void stop_publishing() {
    {
      std::lock_guard lock(publisher_mutex);
      stopping = true;
    }
    publisher_wake.notify_all();
    if (publisher.joinable()) publisher.join();
  }

  ~State() { stop_publishing(); }

  std::string read_report(uint64_t sequence) {
    struct Progress {
      std::optional<uint64_t> entered;  // empty: nothing published
      std::string last;
    };
    std::vector<Progress> progress(static_cast<size_t>(size));
    try {
      for (int r = 0; r < size; ++r) {
        Progress& p = progress[static_cast<size_t>(r)];
        if (r == rank) {
          p.entered = entered.load(std::memory_order_acquire);
          std::lock_guard lock(last_mutex);
          p.last = *p.entered == 0 ? "no collective yet" : last.describe();
          continue;
        }
        if (!store->check({progress_key(r)})) continue;
        std::string value = store->get_string(progress_key(r), std::chrono::seconds(5));
        size_t newline = value.find('\n');
        p.entered = std::strtoull(value.substr(0, newline).c_str(), nullptr, 10);
        p.last = newline == std::string::npos ? "" : value.substr(newline + 1);
      }
    } catch (const std::exception& error) {
      return str("Desync report unavailable: the store could not be read (", error.what(), ")");
    }
    std::string text = str("Desync report for #", sequence, " (collectives counted from #0 in the order the program "
                           "called them; the one each rank entered last, at most ", options.publish_interval().count(),
                           " ms old):");
    std::vector<int> behind, unknown;
    for (int r = 0; r < size; ++r) {
      const Progress& p = progress[static_cast<size_t>(r)];
      text += str(r ? "; " : " ", "rank ", r, r == rank ? " (this rank)" : "", ": ");
      if (!p.entered) {
        text += "nothing published (not started, or ended early)";
        unknown.push_back(r);
        continue;
      }
      text += p.last;
      if (*p.entered <= sequence) behind.push_back(r);
    }
    auto list = [](const std::vector<int>& ranks) {
      std::string names = ranks.size() == 1 ? "rank " : "ranks ";
      for (size_t i = 0; i < ranks.size(); ++i) names += str(i ? ", " : "", ranks[i]);
      return names;
    };
    if (!behind.empty()) {
      text += str(". Behind: ", list(behind), " ", behind.size() == 1 ? "has" : "have", " not reached #", sequence,
                  " (stuck in other work, waiting for something else, or taking another code path).");
    } else if (unknown.empty()) {
      text += str(". No rank is behind: every rank entered #", sequence,
                  "; if they called different collectives, LOOM_DISTRIBUTED_DEBUG=DETAIL names them.");
    } else {
      text += str(". Unknown: ", list(unknown), ".");
    }
    return text;
  }

  std::string report_for(uint64_t sequence) {
    std::lock_guard lock(report_mutex);
    if (!report) report = read_report(sequence);
    failed.store(true);
    return *report;
  }

  std::exception_ptr annotate(const std::exception_ptr& error, uint64_t sequence) {
    std::string message = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    return std::make_exception_ptr(Error(message + "\n" + report_for(sequence)));
  }

  // DETAIL: every rank's fingerprint for this call, compared before it runs.
  void check_across_ranks(const CollectiveFingerprint& mine) {
    auto words = mine.encode();
    Tensor input = Tensor::from_vector(std::vector<int64_t>(words.begin(), words.end()),
                                       {CollectiveFingerprint::kWords});
    Tensor everyone = Tensor::zeros({size * CollectiveFingerprint::kWords}, DType::i64);
    try {
      checker->all_gather_into(everyone, input)->wait();
    } catch (...) {
      std::rethrow_exception(annotate(std::current_exception(), mine.sequence));
    }
    std::vector<CollectiveFingerprint> fingerprints;
    for (int r = 0; r < size; ++r)
      fingerprints.push_back(CollectiveFingerprint::decode(everyone.data<int64_t>() + r * CollectiveFingerprint::kWords));
    if (std::all_of(fingerprints.begin(), fingerprints.end(), [&](const auto& f) { return f == fingerprints[0]; }))
      return;
    // The ranks grouped by what they called, in rank order: the same sentence on every rank.
    std::vector<std::pair<CollectiveFingerprint, std::vector<int>>> calls;
    for (int r = 0; r < size; ++r) {
      auto same = std::find_if(calls.begin(), calls.end(), [&](const auto& c) { return c.first == fingerprints[r]; });
      if (same == calls.end()) {
        calls.push_back({fingerprints[r], {r}});
      } else {
        same->second.push_back(r);
      }
    }
    std::string text;
    for (size_t i = 0; i < calls.size(); ++i) {
      const auto& ranks = calls[i].second;
      text += i == 0 ? "" : (i + 1 == calls.size() ? " but " : ", ");
      text += ranks.size() == 1 ? "rank " : "ranks ";
      for (size_t k = 0; k < ranks.size(); ++k) text += str(k ? ", " : "", ranks[k]);
      text += str(" called ", calls[i].first.describe());
    }
    const bool same_text = calls[0].first.describe() == calls[1].first.describe();
    LOOM_FAIL("process group '", options.group_name(), "' (", backend,
              ", LOOM_DISTRIBUTED_DEBUG=DETAIL): the ranks called different collectives: ", text,
              same_text ? " (the same sizes in different shapes)" : "",
              ". Every rank must call the same collectives in the same order with the same dtypes, sizes and roots; "
              "nothing was run.");
  }
};

// ---- TracedWork ----

// The backend's Work, seen through the wrapper: every call goes to it, and
// its failure comes back with the desync report appended.
class DebugProcessGroup::TracedWork final : public Work {
 public:
  TracedWork(WorkHandle inner, std::shared_ptr<State> state, uint64_t sequence)
      : Work(inner->description()), inner_(std::move(inner)), state_(std::move(state)), sequence_(sequence) {}

  void wait() override {
    try {
      inner_->wait();
    } catch (...) {
      std::rethrow_exception(annotated(std::current_exception()));
    }
  }
  void synchronize() override {
    try {
      inner_->synchronize();
    } catch (...) {
      std::rethrow_exception(annotated(std::current_exception()));
    }
  }
  bool wait_for(Milliseconds timeout) override { return inner_->wait_for(timeout); }
  bool completed() const override { return inner_->completed(); }
  bool succeeded() const override { return inner_->succeeded(); }
  std::exception_ptr error() const override {
    std::exception_ptr error = inner_->error();
    return error ? annotated(error) : error;
  }
  Clock::time_point enqueue_time() const override { return inner_->enqueue_time(); }
  Clock::time_point start_time() const override { return inner_->start_time(); }
  Clock::time_point end_time() const override { return inner_->end_time(); }
  int thread_id() const override { return inner_->thread_id(); }

 private:
  std::exception_ptr annotated(const std::exception_ptr& error) const {
    std::lock_guard lock(mutex_);
    if (error != original_ || !annotated_) {
      original_ = error;
      annotated_ = state_->annotate(error, sequence_);
    }
    return annotated_;
  }

  WorkHandle inner_;
  std::shared_ptr<State> state_;
  uint64_t sequence_;
  mutable std::mutex mutex_;
  mutable std::exception_ptr original_, annotated_;
};

// ---- DebugProcessGroup ----

DebugProcessGroup::DebugProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store,
                                     DebugOptions options, std::shared_ptr<ProcessGroup> checker)
    : ProcessGroup(inner ? inner->rank() : 0, inner ? inner->size() : 1), inner_(std::move(inner)) {
  LOOM_CHECK(inner_ != nullptr, "DebugProcessGroup: the wrapped process group is null");
  LOOM_CHECK(store != nullptr, "DebugProcessGroup: the store is null");
  LOOM_CHECK(options.publish_interval().count() > 0, "DebugProcessGroup: publish_interval must be positive");
  if (options.level() == DistributedDebugLevel::detail) {
    LOOM_CHECK(checker != nullptr, "DebugProcessGroup: DETAIL needs a checker process group for the fingerprints");
    LOOM_CHECK(checker->size() == size() && checker->rank() == rank(), "DebugProcessGroup: the checker group is rank ",
               checker->rank(), " of ", checker->size(), "; expected rank ", rank(), " of ", size());
    LOOM_CHECK(checker->device().is_cpu(), "DebugProcessGroup: the checker group must work on CPU tensors (gloo)");
  }
  state_ = std::make_shared<State>();
  state_->rank = rank();
  state_->size = size();
  state_->backend = inner_->backend_name();
  state_->store = std::move(store);
  state_->options = std::move(options);
  state_->checker = std::move(checker);
  State* state = state_.get();
  state_->publisher = std::thread([state] { state->publish_loop(); });
}

DebugProcessGroup::~DebugProcessGroup() {
  state_->stop_publishing();
  if (state_->options.level() >= DistributedDebugLevel::info) {
    const uint64_t called = state_->entered.load();
    std::lock_guard lock(state_->last_mutex);
    log_info("process group '", state_->options.group_name(), "' (", state_->backend, ", rank ", rank(), " of ", size(),
             ") destroyed after ", called, " collective", called == 1 ? "" : "s",
             called ? str(", the last ", state_->last.describe()) : std::string());
  }
}

DistributedDebugLevel DebugProcessGroup::level() const { return state_->options.level(); }

uint64_t DebugProcessGroup::collectives_called() const { return state_->entered.load(std::memory_order_acquire); }

std::string DebugProcessGroup::desync_report(uint64_t sequence) const { return state_->read_report(sequence); }

DebugProcessGroup::Entered DebugProcessGroup::enter(const CollectiveFingerprint& call_fingerprint) {
  State& state = *state_;
  std::unique_lock lock(state.call_mutex);
  CollectiveFingerprint fingerprint = call_fingerprint;
  fingerprint.sequence = state.next_sequence++;
  state.enter(fingerprint);
  if (state.options.level() == DistributedDebugLevel::detail) state.check_across_ranks(fingerprint);
  return {std::move(lock), fingerprint.sequence};
}

std::exception_ptr DebugProcessGroup::reported_failure(uint64_t sequence) const {
  if (!state_->failed.load()) return nullptr;
  return state_->annotate(std::current_exception(), sequence);
}

WorkHandle DebugProcessGroup::traced(WorkHandle work, uint64_t sequence) const {
  return std::make_shared<TracedWork>(std::move(work), state_, sequence);
}

Tensor DebugProcessGroup::new_buffer(int64_t numel, DType dtype, Device device) {
  return inner_->new_buffer(numel, dtype, device);
}

void DebugProcessGroup::set_timeout(Milliseconds timeout) {
  inner_->set_timeout(timeout);
  if (state_->checker) state_->checker->set_timeout(timeout);
}

}  // namespace loom::dist
