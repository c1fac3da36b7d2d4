# The search that FindCUDNN.cmake and FindNCCL.cmake share (installed beside
# them): a CUDA library's header and shared library, its version from the
# header's #defines, and an imported target.
include_guard(GLOBAL)
include(FindPackageHandleStandardArgs)

# loom_find_cuda_library(PACKAGE HEADER h LIBRARY_NAMES n... VERSION_MACROS
#                        MAJOR MINOR PATCH [VERSION_HEADERS h...] TARGET t)
# Looks under PACKAGE_ROOT (CMake or environment variable) first, then the
# CUDA toolkit and the system. LIBRARY_NAMES are tried in every directory
# before the next (NAMES_PER_DIR), so the library comes from the first hint
# that has one, beside its header: an nvidia-* Python wheel's lib/ holds only
# a versioned name (libcudnn.so.9, libnccl.so.2), and an unversioned one of
# the same library in a directory searched later must not win. The version
# is read from the first of VERSION_HEADERS (default: HEADER) that defines
# the three VERSION_MACROS. Sets PACKAGE_FOUND, PACKAGE_INCLUDE_DIR,
# PACKAGE_LIBRARY and PACKAGE_VERSION, and defines TARGET when found.
function(loom_find_cuda_library package)
  cmake_parse_arguments(ARG "" "HEADER;TARGET" "LIBRARY_NAMES;VERSION_MACROS;VERSION_HEADERS" ${ARGN})
  if(NOT ARG_VERSION_HEADERS)
    set(ARG_VERSION_HEADERS ${ARG_HEADER})
  endif()
  set(hints ${${package}_ROOT} $ENV{${package}_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  find_path(${package}_INCLUDE_DIR ${ARG_HEADER}
    HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include)
  find_library(${package}_LIBRARY
    NAMES ${ARG_LIBRARY_NAMES} NAMES_PER_DIR
    HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib64 lib lib/x64)
  set(include_dir "${${package}_INCLUDE_DIR}")

  set(version "")
  list(JOIN ARG_VERSION_MACROS "|" macros)
  foreach(header IN LISTS ARG_VERSION_HEADERS)
    if(include_dir AND EXISTS "${include_dir}/${header}" AND NOT version)
      file(STRINGS "${include_dir}/${header}" lines REGEX "#define (${macros}) +[0-9]+")
      set(parts "")  # ".MAJOR.MINOR.PATCH", a part empty where its macro is missing
      foreach(macro IN LISTS ARG_VERSION_MACROS)
        string(REGEX MATCH "${macro} +([0-9]+)" match "${lines}")
        string(APPEND parts ".${CMAKE_MATCH_1}")
      endforeach()
      if(parts MATCHES "^\\.[0-9]")
        string(SUBSTRING "${parts}" 1 -1 version)
      endif()
    endif()
  endforeach()

  find_package_handle_standard_args(${package} REQUIRED_VARS ${package}_LIBRARY ${package}_INCLUDE_DIR
                                    VERSION_VAR version)
  if(${package}_FOUND AND NOT TARGET ${ARG_TARGET})
    add_library(${ARG_TARGET} UNKNOWN IMPORTED)
    set_target_properties(${ARG_TARGET} PROPERTIES
      IMPORTED_LOCATION "${${package}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${include_dir}")
  endif()
  mark_as_advanced(${package}_INCLUDE_DIR ${package}_LIBRARY)
  set(${package}_FOUND ${${package}_FOUND} PARENT_SCOPE)
  set(${package}_VERSION "${version}" PARENT_SCOPE)
endfunction()
