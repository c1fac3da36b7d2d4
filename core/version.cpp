#include <loom/core/version.h>

#include "loom_build_info.h"

namespace loom {

const char* version() { return LOOM_BUILD_VERSION; }

const BuildInfo& build_info() {
  static const BuildInfo info{
      .version = LOOM_BUILD_VERSION,
      .git_commit = LOOM_BUILD_GIT_COMMIT,
      .build_type = LOOM_BUILD_TYPE,
      .shared_libraries = LOOM_BUILD_SHARED != 0,
      .compiler = LOOM_BUILD_COMPILER,
      .native = LOOM_BUILD_NATIVE != 0,
      .eigen_version = LOOM_BUILD_EIGEN_VERSION,
      .openmp_version = LOOM_BUILD_OPENMP_VERSION,
      .cuda = LOOM_BUILD_CUDA != 0,
      .cuda_version = LOOM_BUILD_CUDA_VERSION,
      .cuda_architectures = LOOM_BUILD_CUDA_ARCHITECTURES,
      .cudnn_version = LOOM_BUILD_CUDNN_VERSION,
      .cudnn_frontend_version = LOOM_BUILD_CUDNN_FRONTEND_VERSION,
      .nccl = LOOM_BUILD_NCCL != 0,
      .nccl_version = LOOM_BUILD_NCCL_VERSION,
  };
  return info;
}

namespace {
// " 1.2.3", or "" for an unknown version.
std::string with_version(const char* version) { return *version ? std::string(" ") + version : std::string(); }
}  // namespace

std::string build_summary() {
  const BuildInfo& info = build_info();
  std::string text = std::string("loom ") + info.version;
  if (*info.git_commit) text += std::string(" (git ") + info.git_commit + ")";
  text += std::string(", ") + (*info.build_type ? info.build_type : "default") + " build, " +
          (info.shared_libraries ? "shared" : "static") + " libraries, " + info.compiler + "\n";
  text += "CPU kernels: loom's AVX2/FMA GEMM and Winograd convolution (chosen at run time), Eigen" +
          with_version(info.eigen_version) + ", OpenMP" + with_version(info.openmp_version) +
          (info.native ? ", compiled for the building machine's CPU (LOOM_NATIVE)" : ", code for any x86-64") + "\n";
  if (info.cuda) {
    text += std::string("CUDA") + with_version(info.cuda_version) + " for architectures " + info.cuda_architectures +
            ", cuBLAS, cuDNN" + with_version(info.cudnn_version) + ", " +
            (*info.cudnn_frontend_version ? std::string("cudnn-frontend ") + info.cudnn_frontend_version
                                          : std::string("no cudnn-frontend")) +
            ", " +
            (info.nccl ? "NCCL" + with_version(info.nccl_version) : std::string("no NCCL")) + "\n";
  } else {
    text += "CUDA: not built in\n";
  }
  text += std::string("distributed backends: gloo, shm") + (info.nccl ? ", nccl" : "") + "\n";
  return text;
}

}  // namespace loom
