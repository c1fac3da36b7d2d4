// Backend settings (runtime.h); plain C++, in every build.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include <loom/core/cuda/runtime.h>

namespace loom::cuda {
namespace {
std::atomic<bool> g_allow_tf32{false};
ConvAlgorithmSearch search_from_environment() {
  const char* value = std::getenv("LOOM_CUDNN_SEARCH");
  return value != nullptr && std::strcmp(value, "heuristic") == 0 ? ConvAlgorithmSearch::heuristic
                                                                   : ConvAlgorithmSearch::benchmark;
}
std::atomic<ConvAlgorithmSearch> g_conv_search{search_from_environment()};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }
void set_conv_algorithm_search(ConvAlgorithmSearch search) { g_conv_search = search; }
ConvAlgorithmSearch conv_algorithm_search() { return g_conv_search; }

}  // namespace loom::cuda
