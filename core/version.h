// loom's version and what this build of it holds: what every app's --version
// prints, and what a program built against loom can report about it.
#pragma once

#include <string>

namespace loom {

// The version loom was built as, "0.6.0": semantic versioning, the number
// find_package(loom 0.6) checks.
const char* version();

// What this build holds, fixed when CMake configured it. Strings are empty
// where something is unknown or not built in.
struct BuildInfo {
  const char* version;     // "0.6.0"
  const char* git_commit;  // `git describe --always --dirty` of loom's checkout at configure time
  const char* build_type;  // CMAKE_BUILD_TYPE, e.g. "Release"
  bool shared_libraries;   // BUILD_SHARED_LIBS
  const char* compiler;    // "GNU 12.2.0"
  // CPU: the AVX2/FMA kernels are chosen at run time, Eigen is the fallback.
  bool native;  // compiled for the building machine's CPU (LOOM_NATIVE)
  const char* eigen_version;
  const char* openmp_version;
  // CUDA
  bool cuda;                       // the CUDA backend is compiled in
  const char* cuda_version;        // the toolkit's, "13.0.88"
  const char* cuda_architectures;  // CMAKE_CUDA_ARCHITECTURES, "80, 90"
  const char* cudnn_version;       // "9.13.0"
  const char* cudnn_frontend_version;  // "1.32.0" (fused cuDNN graphs built in), "" without
  bool nccl;                       // the nccl process group is compiled in
  const char* nccl_version;        // "2.28.3"
};
const BuildInfo& build_info();

// build_info() as a few lines of text, e.g.
//   loom 0.6.0 (git 635a0ba1c2d3), Release build, static libraries, GNU 12.2.0
//   CPU kernels: loom's AVX2/FMA GEMM and Winograd convolution (chosen at run time), Eigen 3.4.0, OpenMP 4.5
//   CUDA: not built in
//   distributed backends: gloo, shm
std::string build_summary();

}  // namespace loom
