// Per-thread scratch buffers of the CPU kernels that keep their capacity
// between calls: column matrices and transformed tiles are megabytes, and a
// fresh allocation of that size is a fresh mmap and a page fault per 4 KiB on
// every call. A kernel file names its buffers with an enum class of slots
// (the enum is the owner: one file's buffers are never another's) ending in
// `count`, and says beside it which slots a pass holds at the same time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include <loom/core/parallel.h>

namespace loom::ops::cpu {

// A slot enum: enumerators 0 .. count - 1, one buffer each.
template <class Slot>
concept ScratchSlot = std::is_enum_v<Slot> && !std::is_convertible_v<Slot, int> && requires { Slot::count; };

// The calling thread's buffer `slot` of element type T, grown to at least
// `elements`. Its contents are whatever the thread left there last.
template <class T = float, ScratchSlot Slot>
T* thread_scratch(Slot slot, int64_t elements) {
  thread_local std::vector<T> buffers[static_cast<int>(Slot::count)];
  std::vector<T>& buffer = buffers[static_cast<int>(slot)];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

// Whether the slots a pass holds at the same time are distinct buffers
// (checked with static_assert beside each slot enum).
template <ScratchSlot Slot>
constexpr bool distinct_slots(std::initializer_list<Slot> live) {
  for (auto a = live.begin(); a != live.end(); ++a) {
    if (static_cast<int>(*a) < 0 || static_cast<int>(*a) >= static_cast<int>(Slot::count)) return false;
    for (auto b = a + 1; b != live.end(); ++b) {
      if (*a == *b) return false;
    }
  }
  return true;
}

// dst[i] += partials[t * size + i] for t = 0, 1, ... count - 1, in that
// order for every i (the same sum whatever the threads' timing), with the
// elements split over the thread team. Kernels that give each task its own
// partial result (weight gradients summed over the batch) end with this.
template <class T>
void add_partials(T* dst, const T* partials, int64_t count, int64_t size) {
  if (count <= 0) return;
  parallel_for(0, size, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
    for (int64_t t = 0; t < count; ++t) {
      const T* partial = partials + t * size;
      for (int64_t i = begin; i < end; ++i) dst[i] += partial[i];
    }
  });
}

// The per-task sums of a kernel whose tasks each accumulate their own
// (task 0's at `first`, task t's at rest + (t - 1) * size), added into
// `first` in task order. A task that never started (a batch with fewer
// images than tasks, or none) never wrote its sum, which counts as zeros.
template <class T>
void sum_task_partials(T* first, T* rest, const std::vector<char>& started, int64_t size) {
  const int64_t tasks = static_cast<int64_t>(started.size());
  for (int64_t task = 0; task < tasks; ++task) {
    if (!started[task]) std::fill_n(task == 0 ? first : rest + (task - 1) * size, size, T(0));
  }
  add_partials(first, rest, tasks - 1, size);
}

}  // namespace loom::ops::cpu
