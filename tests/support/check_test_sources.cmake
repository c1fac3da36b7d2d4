# The test `test_sources_compiled`: fails when a C++ source file under tests/
# is compiled into no target (a test file someone added and never listed
# would otherwise never run). Run as
#   cmake -DROOT=<tests dir> -DCOMPILED=<file listing compiled sources> -DIGNORED=<dirs> -P this
# The tree is read when the test runs, so a file added since configuring counts.
cmake_policy(VERSION 3.25)
file(STRINGS "${COMPILED}" compiled)
file(GLOB_RECURSE sources RELATIVE "${ROOT}" "${ROOT}/*.cpp" "${ROOT}/*.cc" "${ROOT}/*.cu")
set(missing "")
foreach(source IN LISTS sources)
  set(ignored FALSE)
  foreach(dir IN LISTS IGNORED)
    if(source MATCHES "^${dir}(/|$)")
      set(ignored TRUE)
    endif()
  endforeach()
  if(NOT ignored AND NOT "${ROOT}/${source}" IN_LIST compiled)
    list(APPEND missing "tests/${source}")
  endif()
endforeach()
if(missing)
  list(JOIN missing "\n  " missing)
  message(FATAL_ERROR "compiled into no test binary (add each to a target in its directory's CMakeLists.txt):\n  ${missing}")
endif()
list(LENGTH sources count)
message(STATUS "all ${count} source files under tests/ are compiled into a target")
