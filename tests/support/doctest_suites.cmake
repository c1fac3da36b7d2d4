# Evaluated by ctest (a TEST_INCLUDE_FILES script written by loom_suite_tests()
# in tests/CMakeLists.txt): asks a doctest binary for its test suites and adds
# one CTest test per suite, so that a new TEST_SUITE runs without anyone
# listing it. Inputs: LOOM_SUITES_BINARY, LOOM_SUITES_PREFIX,
# LOOM_SUITES_TIMEOUT, LOOM_SUITES_LABELS, LOOM_SUITES_ENVIRONMENT and
# LOOM_SUITES_ENVIRONMENT_MODIFICATION (the properties of every suite's test),
# LOOM_SUITES_LABELS_FOR_<suite> (labels replacing the default ones),
# LOOM_SUITES_CMAKE (cmake, for the test that reports a failed listing).
set(loom_listing_failed "")
if(NOT EXISTS "${LOOM_SUITES_BINARY}")
  set(loom_listing_failed "${LOOM_SUITES_BINARY} is not built")
else()
  execute_process(COMMAND "${LOOM_SUITES_BINARY}" --list-test-suites --no-colors
                  OUTPUT_VARIABLE loom_listing ERROR_VARIABLE loom_listing_err
                  RESULT_VARIABLE loom_listing_rc TIMEOUT 120)
  if(NOT loom_listing_rc EQUAL 0)
    set(loom_listing_failed "${LOOM_SUITES_BINARY} --list-test-suites exited with ${loom_listing_rc}: ${loom_listing_err}")
  endif()
endif()
if(loom_listing_failed)
  # A test that fails and says why, rather than silently running nothing.
  add_test("${LOOM_SUITES_PREFIX}suite_listing" "${LOOM_SUITES_CMAKE}" -E echo "${loom_listing_failed}")
  set_tests_properties("${LOOM_SUITES_PREFIX}suite_listing" PROPERTIES FAIL_REGULAR_EXPRESSION ".")
  message(WARNING "${loom_listing_failed}")
  return()
endif()

# The suites are the lines between the two "=====" separators.
string(REPLACE "\n" ";" loom_lines "${loom_listing}")
set(loom_in_list FALSE)
set(loom_suites "")
set(loom_unnamed FALSE)
foreach(line IN LISTS loom_lines)
  if(line MATCHES "^=+$")
    if(loom_in_list)
      break()
    endif()
    set(loom_in_list TRUE)
  elseif(loom_in_list)
    if(line STREQUAL "")
      set(loom_unnamed TRUE)
    else()
      list(APPEND loom_suites "${line}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES loom_suites)

macro(loom_suite_properties name labels)
  set_tests_properties("${name}" PROPERTIES TIMEOUT "${LOOM_SUITES_TIMEOUT}" SKIP_RETURN_CODE 77
                                            LABELS "${labels}")
  if(LOOM_SUITES_ENVIRONMENT)
    set_tests_properties("${name}" PROPERTIES ENVIRONMENT "${LOOM_SUITES_ENVIRONMENT}")
  endif()
  if(LOOM_SUITES_ENVIRONMENT_MODIFICATION)
    set_tests_properties("${name}" PROPERTIES ENVIRONMENT_MODIFICATION "${LOOM_SUITES_ENVIRONMENT_MODIFICATION}")
  endif()
endmacro()

foreach(suite IN LISTS loom_suites)
  set(name "${LOOM_SUITES_PREFIX}${suite}")
  add_test("${name}" "${LOOM_SUITES_BINARY}" "--test-suite=${suite}")
  if(DEFINED "LOOM_SUITES_LABELS_FOR_${suite}")
    loom_suite_properties("${name}" "${LOOM_SUITES_LABELS_FOR_${suite}}")
  else()
    loom_suite_properties("${name}" "${LOOM_SUITES_LABELS}")
  endif()
endforeach()
if(loom_unnamed)
  # Test cases outside any TEST_SUITE: everything the named suites leave.
  string(REPLACE ";" "," loom_excluded "${loom_suites}")
  set(name "${LOOM_SUITES_PREFIX}unnamed_suite")
  add_test("${name}" "${LOOM_SUITES_BINARY}" "--test-suite-exclude=${loom_excluded}")
  loom_suite_properties("${name}" "${LOOM_SUITES_LABELS}")
endif()
