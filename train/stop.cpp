#include <loom/train/stop.h>

#include <signal.h>

#include <atomic>
#include <cctype>
#include <utility>

#include <loom/core/cuda/runtime.h>
#include <loom/core/cuda/stream.h>
#include <loom/core/error.h>
#include <loom/dist/launcher.h>

namespace loom::train {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

// Only records the signal: the training loop acts on it between steps.
void record_stop_signal(int signal) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal);
}

}  // namespace

int parse_signal_name(const std::string& name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper.starts_with("SIG")) upper = upper.substr(3);
  if (upper == "NONE") return 0;
  static const std::pair<const char*, int> kSignals[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},
                                                         {"INT", SIGINT},   {"HUP", SIGHUP},   {"QUIT", SIGQUIT},
                                                         {"ALRM", SIGALRM}, {"XCPU", SIGXCPU}};
  for (auto& [signal_name, number] : kSignals)
    if (upper == signal_name) return number;
  LOOM_FAIL("'", name, "' is not a signal loom stops on: use USR1, USR2, TERM, HUP, QUIT, ALRM, XCPU or none");
}

void StopSignals::install(int extra) {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, nullptr);
  if (extra != 0 && extra != SIGINT) ::sigaction(extra, &action, nullptr);
  // The second Ctrl-C finds the default action again and ends the process.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  ::sigaction(SIGINT, &action, nullptr);
  ::signal(SIGXFSZ, SIG_IGN);
}

void print_preempted(int rank, int signal, int64_t step, const std::optional<fs::path>& checkpoint) {
  if (rank != 0) {
    std::fprintf(stderr, "rank %d: stopped by %s after step %lld\n", rank, dist::signal_name(signal).c_str(),
                 static_cast<long long>(step));
    std::fflush(stderr);
    return;
  }
  const std::string saved = checkpoint ? str("checkpoint ", checkpoint->string(), " written; resume with --resume auto")
                                       : std::string("no checkpoint written");
  const std::string line = str("Preempted by ", dist::signal_name(signal), " after step ", step, ": ", saved,
                               " (exit code ", 128 + signal, ")");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

int StopSignals::received() { return g_stop_signal.load(); }

void StopSignals::reset() { g_stop_signal.store(0); }

// The agreed flag of a CUDA group on its way to the host: the copy is queued
// on a side stream after the all-reduce, and `copied` marks its end.
struct StopAgreement::HostCopy {
  explicit HostCopy(int device)
      : stream(cuda::pooled_stream(device)), copied(device), value(Tensor::empty_pinned({1}, DType::f32)) {}
  cuda::StreamView stream;
  cuda::Event copied;
  Tensor value;
};

StopAgreement::StopAgreement(std::shared_ptr<dist::ProcessGroup> group, int depth) : group_(std::move(group)) {
  LOOM_CHECK(depth >= 0, "StopAgreement: depth must be >= 0 (0: automatic), got ", depth);
  if (!group_) return;
  const Device device = group_->device();
  if (depth == 0) depth = device.is_cuda() ? 2 : 1;
  slots_.resize(static_cast<size_t>(depth));
  for (Slot& slot : slots_) {
    slot.flag = Tensor::zeros({1}, DType::f32, device);
    if (device.is_cuda()) slot.host_copy = std::make_unique<HostCopy>(device.index);
  }
}

StopAgreement::~StopAgreement() = default;

int StopAgreement::poll() {
  if (!group_) return StopSignals::received();
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (slot.pending) {
    int agreed = 0;
    if (slot.host_copy) {
      // The all-reduce of `depth` steps ago and its copy; no wait once done.
      if (!slot.host_copy->copied.query()) slot.host_copy->copied.synchronize();
      slot.pending->wait();  // raises its error, if it failed
      agreed = static_cast<int>(slot.host_copy->value.data<float>()[0]);
    } else {
      slot.pending->wait();
      agreed = static_cast<int>(slot.flag.item());
    }
    slot.pending.reset();
    if (agreed != 0) return agreed;
  }
  slot.flag.fill_(static_cast<double>(StopSignals::received()));
  slot.pending = group_->all_reduce({slot.flag}, dist::ReduceOp::max);
  if (slot.host_copy) {
    cuda::StreamGuard on_side_stream(slot.host_copy->stream);
    slot.pending->wait();  // the side stream, not the compute stream, waits for the all-reduce
    cuda::copy_bytes_async(slot.host_copy->value.raw_data(), false, slot.flag.raw_data(), true, sizeof(float),
                           slot.host_copy->stream);
    slot.host_copy->copied.record(slot.host_copy->stream);
  }
  return 0;
}

void StopAgreement::finish() {
  // In the order they were issued (a collective order every rank shares).
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& slot = slots_[(next_ + k) % slots_.size()];
    if (slot.pending) slot.pending->wait();
    slot.pending.reset();
  }
}

}  // namespace loom::train
