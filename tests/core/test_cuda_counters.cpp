// core/cuda/counters: the CUDA layer's counts of launches, library calls,
// copies and host waits, as its call sites bump them (the bumps themselves
// are driven on a real device in tests/gpu/test_runtime.cpp).
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include <loom/core/cuda/counters.h>
#include <loom/core/cuda/runtime.h>
#include <loom/core/error.h>

using namespace loom;
namespace counting = loom::cuda::detail;
using cuda::HostSync;

TEST_CASE("reset_counters zeroes every counter and each call bumps its own") {
  counting::count_kernel_launch();
  counting::count_host_sync(HostSync::event_synchronize);
  cuda::reset_counters();
  CHECK(cuda::counters() == cuda::Counters{});

  counting::count_kernel_launch();
  counting::count_kernel_launch();
  counting::count_library_call();
  counting::count_device_copy();
  counting::count_host_sync(HostSync::stream_synchronize);
  counting::count_host_sync(HostSync::event_synchronize);
  counting::count_host_sync(HostSync::device_synchronize);
  counting::count_host_sync(HostSync::device_to_host_copy);
  counting::count_host_sync(HostSync::device_to_host_copy);
  counting::count_host_sync(HostSync::blocking_copy);
  counting::count_graph_fallback();
  counting::count_graph_run();
  const cuda::Counters c = cuda::counters();
  CHECK(c.kernel_launches == 2);
  CHECK(c.library_calls == 2);  // a graph run is a library call too
  CHECK(c.device_copies == 1);
  CHECK(c.stream_synchronizes == 1);
  CHECK(c.event_synchronizes == 1);
  CHECK(c.device_synchronizes == 1);
  CHECK(c.device_to_host_copies == 2);
  CHECK(c.blocking_copies == 1);
  CHECK(c.graph_fallbacks == 1);  // neither a launch nor a host wait
  CHECK(c.graph_runs == 1);
  CHECK(c.host_syncs() == 1 + 1 + 1 + 2 + 1);
  CHECK(c.launches() == 2 + 2 + 1);
  cuda::reset_counters();
  CHECK(cuda::counters().host_syncs() == 0);
  CHECK(cuda::counters().launches() == 0);
}

TEST_CASE("the difference of two readings is what happened between them; sums add field by field") {
  cuda::reset_counters();
  counting::count_kernel_launch();
  counting::count_host_sync(HostSync::stream_synchronize);
  const cuda::Counters before = cuda::counters();
  for (int i = 0; i < 5; ++i) counting::count_kernel_launch();
  counting::count_library_call();
  counting::count_host_sync(HostSync::device_to_host_copy);
  const cuda::Counters d = cuda::counters() - before;
  cuda::Counters expected;
  expected.kernel_launches = 5;
  expected.library_calls = 1;
  expected.device_to_host_copies = 1;
  CHECK(d == expected);
  CHECK(d.host_syncs() == 1);
  CHECK(d.launches() == 6);
  const cuda::Counters twice = d + d;
  CHECK(twice.kernel_launches == 10);
  CHECK(twice.library_calls == 2);
  CHECK(twice.device_to_host_copies == 2);
  CHECK(twice - d == d);
}

TEST_CASE("counts from many threads add up exactly") {
  cuda::reset_counters();
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kEach; ++i) {
        counting::count_kernel_launch();
        if (i % 4 == 0) counting::count_host_sync(HostSync::event_synchronize);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(cuda::counters().kernel_launches == int64_t{kThreads} * kEach);
  CHECK(cuda::counters().event_synchronizes == int64_t{kThreads} * kEach / 4);
}

TEST_CASE("without a device nothing is counted: the calls fail before they count") {
  if (cuda::device_count() > 0) return;  // on a GPU machine tests/gpu covers the real calls
  cuda::reset_counters();
  CHECK_THROWS_AS(cuda::synchronize(0), Error);
  CHECK_THROWS_AS(cuda::current_stream(0).synchronize(), Error);
  CHECK(cuda::counters() == cuda::Counters{});
}

TEST_CASE("a graph capture's mark collects the thread's host syncs, the first by kind") {
  using cuda::HostSync;
  CHECK(cuda::detail::set_capturing(true).count == 0);
  cuda::detail::count_kernel_launch();  // launches are what a capture holds: not collected
  cuda::detail::count_host_sync(HostSync::device_to_host_copy);
  cuda::detail::count_host_sync(HostSync::stream_synchronize);
  // Another thread's syncs are its own.
  std::thread([] { cuda::detail::count_host_sync(HostSync::event_synchronize); }).join();
  const cuda::CaptureSyncs seen = cuda::detail::set_capturing(false);
  CHECK(seen.count == 2);
  CHECK(seen.first == HostSync::device_to_host_copy);
  CHECK(std::string(cuda::host_sync_name(seen.first)) == "device_to_host_copy");
  // Without the mark nothing is collected.
  cuda::detail::count_host_sync(HostSync::blocking_copy);
  CHECK(cuda::detail::set_capturing(false).count == 0);
}
