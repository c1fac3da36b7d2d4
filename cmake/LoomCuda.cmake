# Decides whether the CUDA backend is built (LOOM_CUDA = AUTO | ON | OFF) and
# sets LOOM_HAVE_CUDA. Default architectures: 80 and 90 (A100, H100/H200);
# -DCMAKE_CUDA_ARCHITECTURES=... or the environment variable CUDAARCHS chooses others.
#
# The backend needs nvcc, cuBLAS and cuDNN; NCCL is optional (LOOM_HAVE_NCCL,
# target NCCL::nccl, for the NCCL process group). Libraries outside the CUDA
# toolkit (e.g. the nvidia-* Python wheels that PyTorch installs) are found
# through the hints CUDNN_ROOT, CUBLAS_ROOT and NCCL_ROOT (CMake or
# environment variables), each a directory holding include/ and lib/.
# The result is the interface target loom::cuda_libraries.
#
# cudnn-frontend (optional, header-only: NVIDIA's C++ API over cuDNN's graph
# API, for the fused convolution graphs of ops/cuda/conv2d_graph.cpp): the
# directory holding cudnn_frontend.h, CUDNN_FRONTEND_INCLUDE_DIR (cache or
# environment variable), else .deps/cudnn-frontend/include where
# scripts/fetch-cudnn-frontend.sh puts it. Found with the CUDA backend on, it
# sets LOOM_HAVE_CUDNN_FRONTEND and LOOM_CUDNN_FRONTEND_VERSION; the headers
# stay private to that one source file (ops/CMakeLists.txt).
set(LOOM_HAVE_CUDA OFF)
set(LOOM_HAVE_NCCL OFF)
if(NOT LOOM_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  # nvcc: CMAKE_CUDA_COMPILER, /usr/local/cuda/bin, CUDACXX or PATH
  # (check_language), else the newest /usr/local/cuda-*/bin.
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    file(GLOB _loom_versioned_nvcc /usr/local/cuda-*/bin/nvcc)
    list(SORT _loom_versioned_nvcc COMPARE NATURAL ORDER DESCENDING)
    if(_loom_versioned_nvcc)
      list(GET _loom_versioned_nvcc 0 _loom_nvcc)
      set(CMAKE_CUDA_COMPILER ${_loom_nvcc} CACHE FILEPATH "CUDA compiler" FORCE)
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    # CMake's own CUDAARCHS environment variable, when set, chooses instead.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      set(CMAKE_CUDA_ARCHITECTURES 80 90 CACHE STRING "CUDA architectures to build for")
    endif()
    # One CUDA runtime for loom, cuBLAS and cuDNN: the shared one.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag; the .cu files include loom
    # headers, which are C++20.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)

    # cuBLAS: the toolkit's, else one under CUBLAS_ROOT.
    set(_loom_cublas_target "")
    if(TARGET CUDA::cublas)
      set(_loom_cublas_target CUDA::cublas)
    else()
      set(_loom_cublas_hints ${CUBLAS_ROOT} $ENV{CUBLAS_ROOT})
      find_path(LOOM_CUBLAS_INCLUDE_DIR cublas_v2.h HINTS ${_loom_cublas_hints} PATH_SUFFIXES include)
      # NAMES_PER_DIR: the library from the first hint that has one, beside its header.
      find_library(LOOM_CUBLAS_LIBRARY NAMES cublas libcublas.so.13 libcublas.so.12 NAMES_PER_DIR
                   HINTS ${_loom_cublas_hints} PATH_SUFFIXES lib64 lib)
      find_library(LOOM_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12 NAMES_PER_DIR
                   HINTS ${_loom_cublas_hints} PATH_SUFFIXES lib64 lib)
      if(LOOM_CUBLAS_INCLUDE_DIR AND LOOM_CUBLAS_LIBRARY AND LOOM_CUBLASLT_LIBRARY)
        add_library(loom_cublas INTERFACE)
        target_include_directories(loom_cublas INTERFACE ${LOOM_CUBLAS_INCLUDE_DIR})
        target_link_libraries(loom_cublas INTERFACE ${LOOM_CUBLAS_LIBRARY} ${LOOM_CUBLASLT_LIBRARY})
        set(_loom_cublas_target loom_cublas)
      endif()
    endif()
    find_package(CUDNN)
    find_package(NCCL)

    if(_loom_cublas_target AND CUDNN_FOUND)
      set(LOOM_HAVE_CUDA ON)
      add_library(loom_cuda_libraries INTERFACE)
      target_link_libraries(loom_cuda_libraries INTERFACE CUDA::cudart ${_loom_cublas_target} CUDNN::cudnn)
      add_library(loom::cuda_libraries ALIAS loom_cuda_libraries)
      set(LOOM_HAVE_NCCL ${NCCL_FOUND})
    else()
      set(_loom_missing "")
      if(NOT _loom_cublas_target)
        string(APPEND _loom_missing " cuBLAS (set CUBLAS_ROOT)")
      endif()
      if(NOT CUDNN_FOUND)
        string(APPEND _loom_missing " cuDNN (set CUDNN_ROOT)")
      endif()
      if(LOOM_CUDA STREQUAL "ON")
        message(FATAL_ERROR "LOOM_CUDA=ON but the CUDA backend needs:${_loom_missing}")
      endif()
      message(WARNING "loom: nvcc found, but the CUDA backend is not built: missing${_loom_missing}")
    endif()
  elseif(LOOM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOOM_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA toolkit or set CMAKE_CUDA_COMPILER")
  endif()
endif()

set(LOOM_HAVE_CUDNN_FRONTEND OFF)
set(LOOM_CUDNN_FRONTEND_VERSION "")
if(LOOM_HAVE_CUDA)
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS $ENV{CUDNN_FRONTEND_INCLUDE_DIR} ${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include
            DOC "directory holding cudnn_frontend.h (optional; scripts/fetch-cudnn-frontend.sh fetches it)")
  set(_loom_cfe_version_header ${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h)
  if(CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS ${_loom_cfe_version_header})
    foreach(_part MAJOR MINOR PATCH)
      file(STRINGS ${_loom_cfe_version_header} _line REGEX "^#define CUDNN_FRONTEND_${_part}_VERSION [0-9]+")
      string(REGEX REPLACE ".* ([0-9]+).*" "\\1" _loom_cfe_${_part} "${_line}")
    endforeach()
    set(_loom_cfe_version ${_loom_cfe_MAJOR}.${_loom_cfe_MINOR}.${_loom_cfe_PATCH})
    # The graph API (cudnn_frontend::graph) as loom uses it came with 1.0;
    # 1.32's headers also call NVRTC (for engines of their own), so the
    # library links the toolkit's.
    if(NOT TARGET CUDA::nvrtc)
      message(WARNING "loom: cudnn-frontend in ${CUDNN_FRONTEND_INCLUDE_DIR} needs NVRTC, which this CUDA toolkit lacks; building without it")
    elseif(_loom_cfe_version VERSION_GREATER_EQUAL 1.0)
      set(LOOM_HAVE_CUDNN_FRONTEND ON)
      set(LOOM_CUDNN_FRONTEND_VERSION ${_loom_cfe_version})
    else()
      message(WARNING "loom: cudnn-frontend ${_loom_cfe_version} in ${CUDNN_FRONTEND_INCLUDE_DIR} predates its graph API (1.0); building without it")
    endif()
  endif()
endif()
message(STATUS "loom: CUDA backend ${LOOM_HAVE_CUDA} (LOOM_CUDA=${LOOM_CUDA}), NCCL ${LOOM_HAVE_NCCL}")
if(LOOM_HAVE_CUDNN_FRONTEND)
  message(STATUS "loom: cudnn-frontend ${LOOM_CUDNN_FRONTEND_VERSION} (${CUDNN_FRONTEND_INCLUDE_DIR}): fused cuDNN graphs built in")
elseif(LOOM_HAVE_CUDA)
  message(STATUS "loom: no cudnn-frontend (scripts/fetch-cudnn-frontend.sh or -DCUDNN_FRONTEND_INCLUDE_DIR=...): unfused convolutions only")
endif()
