# Generates ${LOOM_BUILD_INFO_DIR}/loom_build_info.h for core/version.cpp: the
# version (project(VERSION)), the git commit the sources were configured at,
# and what the build holds (CUDA, cuDNN, NCCL, CPU libraries). The commit is
# read when CMake configures: a build after new commits without a
# reconfigure reports the older one. Outside a git checkout of loom itself
# (a release tarball, loom vendored into another repository) it is empty.
set(LOOM_BUILD_INFO_DIR ${PROJECT_BINARY_DIR}/generated)

set(LOOM_GIT_COMMIT "")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --show-toplevel
                  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                  OUTPUT_VARIABLE _loom_git_top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE _loom_git_result)
  if(_loom_git_result EQUAL 0)
    file(REAL_PATH "${_loom_git_top}" _loom_git_top)
    file(REAL_PATH "${PROJECT_SOURCE_DIR}" _loom_source_dir)
    if(_loom_git_top STREQUAL _loom_source_dir)
      execute_process(COMMAND ${GIT_EXECUTABLE} describe --always --dirty --abbrev=12
                      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                      OUTPUT_VARIABLE LOOM_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
endif()

set(LOOM_BUILD_TYPE "${CMAKE_BUILD_TYPE}")
if(CMAKE_CONFIGURATION_TYPES)
  set(LOOM_BUILD_TYPE "multi-config")
endif()
set(LOOM_BUILD_SHARED 0)
if(BUILD_SHARED_LIBS)
  set(LOOM_BUILD_SHARED 1)
endif()
set(LOOM_BUILD_NATIVE 0)
if(LOOM_NATIVE)
  set(LOOM_BUILD_NATIVE 1)
endif()
set(LOOM_BUILD_CUDA 0)
set(LOOM_BUILD_NCCL 0)
set(LOOM_BUILD_CUDA_VERSION "")
set(LOOM_BUILD_CUDA_ARCHITECTURES "")
set(LOOM_BUILD_CUDNN_VERSION "")
set(LOOM_BUILD_NCCL_VERSION "")
set(LOOM_BUILD_CUDNN_FRONTEND_VERSION "")
if(LOOM_HAVE_CUDA)
  set(LOOM_BUILD_CUDA 1)
  set(LOOM_BUILD_CUDA_VERSION "${CUDAToolkit_VERSION}")
  list(JOIN CMAKE_CUDA_ARCHITECTURES ", " LOOM_BUILD_CUDA_ARCHITECTURES)
  set(LOOM_BUILD_CUDNN_VERSION "${CUDNN_VERSION}")
  set(LOOM_BUILD_CUDNN_FRONTEND_VERSION "${LOOM_CUDNN_FRONTEND_VERSION}")
  if(LOOM_HAVE_NCCL)
    set(LOOM_BUILD_NCCL 1)
    set(LOOM_BUILD_NCCL_VERSION "${NCCL_VERSION}")
  endif()
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/loom_build_info.h.in ${LOOM_BUILD_INFO_DIR}/loom_build_info.h @ONLY)
