# Finds NCCL 2 and defines the imported target NCCL::nccl.
#
# Looks under NCCL_ROOT (CMake or environment variable) first, then the CUDA
# toolkit and the system; works with the nvidia-nccl Python wheels
# (site-packages/nvidia/nccl/{include,lib}, libnccl.so.2 without libnccl.so;
# see LoomFindCudaLibrary.cmake).
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.
include(${CMAKE_CURRENT_LIST_DIR}/LoomFindCudaLibrary.cmake)
loom_find_cuda_library(NCCL
  HEADER nccl.h
  LIBRARY_NAMES nccl libnccl.so.2
  VERSION_MACROS NCCL_MAJOR NCCL_MINOR NCCL_PATCH
  TARGET NCCL::nccl)
