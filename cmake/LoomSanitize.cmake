# Sanitizer builds (CPU only): -DLOOM_SANITIZE=address,undefined or
# -DLOOM_SANITIZE=thread. Every target (libraries, apps, tests, benchmarks) is
# compiled and linked with the sanitizer, so the processes that multi-process
# tests start, being the same binaries, are checked too. scripts/sanitize.sh
# configures such a build and runs the suite; tests/CMakeLists.txt scales the
# tests' timeouts by LOOM_TEST_TIMEOUT_SCALE and sets the runtime options.
set(LOOM_SANITIZE "" CACHE STRING "Sanitizers for a CPU build: address,undefined or thread (empty: none)")
set(LOOM_TEST_TIMEOUT_SCALE "" CACHE STRING
    "Factor applied to every test's timeout (empty: 1, or 4 in a sanitized build, which runs 2-10x slower)")
set(loom_test_timeout_scale ${LOOM_TEST_TIMEOUT_SCALE})
if(NOT loom_test_timeout_scale)
  set(loom_test_timeout_scale 1)
  if(LOOM_SANITIZE)
    set(loom_test_timeout_scale 4)
  endif()
endif()

# The option that lowers a sanitized build's optimization (below); a directory
# removes it from its COMPILE_OPTIONS to keep the build type's.
set(LOOM_SANITIZED_CODE_O1 "$<$<COMPILE_LANGUAGE:C,CXX>:-O1>")
if(LOOM_SANITIZE)
  string(REPLACE "," ";" loom_sanitizers "${LOOM_SANITIZE}")
  foreach(s IN LISTS loom_sanitizers)
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "LOOM_SANITIZE=${LOOM_SANITIZE}: unknown sanitizer '${s}' "
                          "(use address,undefined or thread)")
    endif()
  endforeach()
  if("thread" IN_LIST loom_sanitizers AND "address" IN_LIST loom_sanitizers)
    message(FATAL_ERROR "LOOM_SANITIZE=${LOOM_SANITIZE}: thread and address cannot be combined")
  endif()
  if(LOOM_HAVE_CUDA)
    message(FATAL_ERROR "LOOM_SANITIZE is for CPU builds: configure with -DLOOM_CUDA=OFF")
  endif()
  # -fno-sanitize-recover: an undefined-behaviour report ends the process, so a
  # test cannot pass with one. Frame pointers and line tables (-g1, after the
  # build type's -g: the reports need file and line, not local variables; it
  # cuts the sanitized build's compile time by about a sixth) give readable
  # stacks.
  set(loom_sanitize_flags -fsanitize=${LOOM_SANITIZE} -fno-omit-frame-pointer -g1)
  if("undefined" IN_LIST loom_sanitizers)
    list(APPEND loom_sanitize_flags -fno-sanitize-recover=all)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${loom_sanitize_flags}>")
  add_link_options(-fsanitize=${LOOM_SANITIZE})
  # -O1 instead of the build type's -O2 (it comes after it): a sanitizer triples
  # GCC's compile time at -O2 and doubles it at -O1 (ops/cpu/conv2d.cpp 10.3 s
  # against 6.7 s, dist/ddp.cpp 10.8 against 6.9), and little of the suite's
  # run time is in this code. ops/ (the compute kernels, most of that time)
  # takes it out again; tests/ puts -O0 after it.
  if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo)$")
    add_compile_options("${LOOM_SANITIZED_CODE_O1}")
  endif()
  message(STATUS "loom: sanitizers ${LOOM_SANITIZE}; test timeouts x${loom_test_timeout_scale}")
endif()

# Fuzzing build (-DLOOM_FUZZ=ON, clang only): everything is compiled with
# libFuzzer's coverage instrumentation plus ASan and UBSan, and
# tests/fuzz/CMakeLists.txt adds the fuzzers fuzz_<harness>. scripts/fuzz.sh
# configures build-fuzz this way and runs them.
option(LOOM_FUZZ "Build the libFuzzer harnesses of tests/fuzz (requires clang)" OFF)
if(LOOM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "LOOM_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang")
  endif()
  if(LOOM_SANITIZE OR LOOM_HAVE_CUDA)
    message(FATAL_ERROR "LOOM_FUZZ=ON is a CPU build with its own sanitizers: leave LOOM_SANITIZE empty, LOOM_CUDA=OFF")
  endif()
  # -mavx2 -mfma: clang ignores '#pragma GCC target' (ops/cpu/winograd*.cpp's
  # AVX2 kernels would not compile), so the fuzzers are built for AVX2 machines.
  # -O1 and line tables only (not the build type's -O2 -g): the fuzz build
  # took about 265 s instead of 340 in CI's run on 2 cores.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=all;-fno-omit-frame-pointer;-O1;-gline-tables-only>")
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-mavx2;-mfma>")
  endif()
  add_link_options(-fsanitize=address,undefined)
endif()
