# Finds NCCL 2 and defines the imported target NCCL::nccl.
#
# Looks under NCCL_ROOT (CMake or environment variable) first, then the CUDA
# toolkit and the system; works with the nvidia-nccl Python wheels
# (site-packages/nvidia/nccl/{include,lib}, libnccl.so.2 without libnccl.so).
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.
set(_loom_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_loom_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
# NAMES_PER_DIR: both names in one directory before the next (see FindCUDNN.cmake).
find_library(NCCL_LIBRARY
  NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${_loom_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib)

set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _loom_lines REGEX "#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_loom_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_loom_part} +([0-9]+)" _loom_match "${_loom_lines}")
    set(_loom_${_loom_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(_loom_MAJOR)
    set(NCCL_VERSION "${_loom_MAJOR}.${_loom_MINOR}.${_loom_PATCH}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
