# Finds cuDNN (8 or 9) and defines the imported target CUDNN::cudnn.
#
# Looks under CUDNN_ROOT (CMake or environment variable) first, then the CUDA
# toolkit and the system. Works with the layout of the nvidia-cudnn Python
# wheels (site-packages/nvidia/cudnn/{include,lib}), whose lib directory holds
# libcudnn.so.9 but no unversioned libcudnn.so (see LoomFindCudaLibrary.cmake).
#
# Sets CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION.
include(${CMAKE_CURRENT_LIST_DIR}/LoomFindCudaLibrary.cmake)
# cuDNN 9 keeps its version in cudnn_version.h, cuDNN 8 in cudnn.h.
loom_find_cuda_library(CUDNN
  HEADER cudnn.h
  LIBRARY_NAMES cudnn libcudnn.so.9 libcudnn.so.8
  VERSION_HEADERS cudnn_version.h cudnn.h
  VERSION_MACROS CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL
  TARGET CUDNN::cudnn)
