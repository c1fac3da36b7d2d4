// What the always-on desync bookkeeping of DebugProcessGroup costs per
// collective: the same calls on a do-nothing process group of one rank, bare
// and wrapped (numbering, fingerprint, progress for the publisher thread, the
// forwarding Work). Prints one JSON line; the difference is the overhead.
//   build/benchmarks/dist/debug_overhead --calls 1000000
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <loom/core/error.h>
#include <loom/dist/debug_process_group.h>
#include <loom/dist/store.h>
#include "tests/support/finished_group.h"

using namespace loom;
using namespace loom::dist;
using Clock = std::chrono::steady_clock;

namespace {

// Nanoseconds per all_reduce(tensor) + wait(), the best of `rounds` runs.
double time_calls(ProcessGroup& group, const Tensor& tensor, int64_t calls, int rounds) {
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < calls; ++i) group.all_reduce(tensor)->wait();
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - start).count() / calls);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Per-collective cost of DebugProcessGroup's desync bookkeeping"};
  int64_t calls = 1000000;
  int rounds = 5;
  app.add_option("--calls", calls, "collectives per timed run")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "timed runs; the best is reported")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    auto inner = std::make_shared<loom::testing::FinishedGroup>();
    auto store = std::make_shared<TCPStore>("127.0.0.1", 0, TCPStoreOptions().is_server(true));
    DebugProcessGroup wrapped(inner, store);
    const Tensor tensor = Tensor::zeros({1000});
    // Check: the wrapper forwards and counts every call, and the result is a finished Work.
    WorkHandle work = wrapped.all_reduce(tensor);
    LOOM_CHECK(work->succeeded() && wrapped.collectives_called() == 1, "debug_overhead: the wrapper did not forward");
    const double bare = time_calls(*inner, tensor, calls, rounds);
    const double debug = time_calls(wrapped, tensor, calls, rounds);
    LOOM_CHECK(wrapped.collectives_called() == 1 + static_cast<uint64_t>(calls) * rounds,
               "debug_overhead: the wrapper counted ", wrapped.collectives_called(), " collectives");
    std::printf("{\"calls\": %lld, \"bare_ns_per_call\": %.1f, \"wrapped_ns_per_call\": %.1f, "
                "\"overhead_ns_per_call\": %.1f}\n",
                static_cast<long long>(calls), bare, debug, debug - bare);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "debug_overhead: %s\n", error.what());
    return 1;
  }
  return 0;
}
