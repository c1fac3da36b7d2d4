// LOOM_CUDA_BATCH_NORM, which chooses the CUDA batch-norm kernels
// (ops/batch_norm_cuda_kernels.h): parsed in host code, so checked here
// without a GPU; the kernels themselves are checked by gpu.backend_ops.
#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <loom/core/error.h>
#include <loom/ops/batch_norm_cuda_kernels.h>

using namespace loom;
using ops::CudaBatchNormKernels;

namespace {
// Sets LOOM_CUDA_BATCH_NORM (or unsets it) for its lifetime.
class ScopedVariable {
 public:
  explicit ScopedVariable(const char* value) {
    if (const char* old = std::getenv(kName)) saved_ = old;
    if (value == nullptr) {
      ::unsetenv(kName);
    } else {
      ::setenv(kName, value, 1);
    }
  }
  ~ScopedVariable() {
    if (saved_) {
      ::setenv(kName, saved_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  static constexpr const char* kName = "LOOM_CUDA_BATCH_NORM";
  std::optional<std::string> saved_;
};
}  // namespace

TEST_CASE("LOOM_CUDA_BATCH_NORM: unset, empty or v1 is v1, v2 is v2, anything else an error naming the values") {
  {
    const ScopedVariable unset(nullptr);
    CHECK(ops::cuda_batch_norm_kernels_from_environment() == CudaBatchNormKernels::v1);
  }
  for (const char* v1 : {"", "v1"}) {
    const ScopedVariable set(v1);
    CHECK(ops::cuda_batch_norm_kernels_from_environment() == CudaBatchNormKernels::v1);
  }
  {
    const ScopedVariable set("v2");
    CHECK(ops::cuda_batch_norm_kernels_from_environment() == CudaBatchNormKernels::v2);
  }
  for (const char* bad : {"V2", "2", "v3", " v2"}) {
    const ScopedVariable set(bad);
    std::string message;
    try {
      (void)ops::cuda_batch_norm_kernels_from_environment();
    } catch (const Error& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("LOOM_CUDA_BATCH_NORM must be v1") != std::string::npos);
    CHECK(message.find("or v2") != std::string::npos);
    CHECK(message.find(std::string("'") + bad + "'") != std::string::npos);
  }
}

TEST_CASE("ScopedCudaBatchNormKernels overrides the choice for its lifetime and nests") {
  const CudaBatchNormKernels before = ops::cuda_batch_norm_kernels();
  {
    const ops::ScopedCudaBatchNormKernels v2(CudaBatchNormKernels::v2);
    CHECK(ops::cuda_batch_norm_kernels() == CudaBatchNormKernels::v2);
    {
      const ops::ScopedCudaBatchNormKernels v1(CudaBatchNormKernels::v1);
      CHECK(ops::cuda_batch_norm_kernels() == CudaBatchNormKernels::v1);
    }
    CHECK(ops::cuda_batch_norm_kernels() == CudaBatchNormKernels::v2);
  }
  CHECK(ops::cuda_batch_norm_kernels() == before);
}
