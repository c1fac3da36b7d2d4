// The CUDA layer's counters (counters.h); plain C++, in every build.
#include <loom/core/cuda/counters.h>

#include <array>
#include <atomic>

namespace loom::cuda {
namespace {

// The fields of Counters, one atomic slot each, in this order.
constexpr std::array<int64_t Counters::*, 10> kFields{
    &Counters::kernel_launches,       &Counters::library_calls,      &Counters::device_copies,
    &Counters::stream_synchronizes,   &Counters::event_synchronizes, &Counters::device_synchronizes,
    &Counters::device_to_host_copies, &Counters::blocking_copies,    &Counters::graph_fallbacks,
    &Counters::graph_runs};
static_assert(sizeof(Counters) == kFields.size() * sizeof(int64_t), "a field of Counters is missing from kFields");
std::array<std::atomic<int64_t>, kFields.size()> g_counts{};
thread_local bool t_capturing = false;
thread_local CaptureSyncs t_capture_syncs;

void bump(int64_t Counters::*field) noexcept {
  for (size_t i = 0; i < kFields.size(); ++i) {
    if (kFields[i] == field) g_counts[i].fetch_add(1, std::memory_order_relaxed);
  }
}

template <class Combine>
Counters combine(const Counters& a, const Counters& b, Combine&& op) {
  Counters out;
  for (auto field : kFields) out.*field = op(a.*field, b.*field);
  return out;
}

}  // namespace

Counters Counters::operator-(const Counters& earlier) const {
  return combine(*this, earlier, [](int64_t x, int64_t y) { return x - y; });
}
Counters Counters::operator+(const Counters& other) const {
  return combine(*this, other, [](int64_t x, int64_t y) { return x + y; });
}

Counters counters() {
  Counters c;
  for (size_t i = 0; i < kFields.size(); ++i) c.*kFields[i] = g_counts[i].load(std::memory_order_relaxed);
  return c;
}

void reset_counters() {
  for (auto& count : g_counts) count.store(0, std::memory_order_relaxed);
}

const char* host_sync_name(HostSync kind) {
  switch (kind) {
    case HostSync::stream_synchronize: return "stream_synchronize";
    case HostSync::event_synchronize: return "event_synchronize";
    case HostSync::device_synchronize: return "device_synchronize";
    case HostSync::device_to_host_copy: return "device_to_host_copy";
    case HostSync::blocking_copy: return "blocking_copy";
  }
  return "host sync";
}

namespace detail {
void count_kernel_launch() noexcept { bump(&Counters::kernel_launches); }
void count_library_call() noexcept { bump(&Counters::library_calls); }
void count_device_copy() noexcept { bump(&Counters::device_copies); }
void count_host_sync(HostSync kind) noexcept {
  if (t_capturing && t_capture_syncs.count++ == 0) t_capture_syncs.first = kind;
  switch (kind) {
    case HostSync::stream_synchronize: bump(&Counters::stream_synchronizes); break;
    case HostSync::event_synchronize: bump(&Counters::event_synchronizes); break;
    case HostSync::device_synchronize: bump(&Counters::device_synchronizes); break;
    case HostSync::device_to_host_copy: bump(&Counters::device_to_host_copies); break;
    case HostSync::blocking_copy: bump(&Counters::blocking_copies); break;
  }
}
void count_graph_fallback() noexcept { bump(&Counters::graph_fallbacks); }
void count_graph_run() noexcept {
  bump(&Counters::graph_runs);
  bump(&Counters::library_calls);
}
CaptureSyncs set_capturing(bool capturing) noexcept {
  const CaptureSyncs seen = t_capture_syncs;
  t_capturing = capturing;
  t_capture_syncs = {};
  return seen;
}
}  // namespace detail

}  // namespace loom::cuda
