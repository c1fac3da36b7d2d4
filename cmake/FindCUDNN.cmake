# Finds cuDNN (8 or 9) and defines the imported target CUDNN::cudnn.
#
# Looks under CUDNN_ROOT (CMake or environment variable) first, then the CUDA
# toolkit and the system. Works with the layout of the nvidia-cudnn Python
# wheels (site-packages/nvidia/cudnn/{include,lib}), whose lib directory holds
# libcudnn.so.9 but no unversioned libcudnn.so.
#
# Sets CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION.
set(_loom_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_loom_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
# NAMES_PER_DIR: every name in one directory before the next directory, so
# the library comes from the first hint that has one (beside its header),
# not from wherever the first name happens to exist.
find_library(CUDNN_LIBRARY
  NAMES cudnn libcudnn.so.9 libcudnn.so.8 NAMES_PER_DIR
  HINTS ${_loom_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib lib/x64)

set(CUDNN_VERSION "")
if(CUDNN_INCLUDE_DIR)
  foreach(_loom_header cudnn_version.h cudnn.h)
    if(EXISTS "${CUDNN_INCLUDE_DIR}/${_loom_header}" AND NOT CUDNN_VERSION)
      file(STRINGS "${CUDNN_INCLUDE_DIR}/${_loom_header}" _loom_lines REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
      foreach(_loom_part MAJOR MINOR PATCHLEVEL)
        string(REGEX MATCH "CUDNN_${_loom_part} +([0-9]+)" _loom_match "${_loom_lines}")
        set(_loom_${_loom_part} "${CMAKE_MATCH_1}")
      endforeach()
      if(_loom_MAJOR)
        set(CUDNN_VERSION "${_loom_MAJOR}.${_loom_MINOR}.${_loom_PATCHLEVEL}")
      endif()
    endif()
  endforeach()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
