// environment_choice / choose_from: the shared parser of the LOOM_* switches.
#include <doctest/doctest.h>

#include <string>

#include <loom/core/environment.h>
#include <loom/core/error.h>

using namespace loom;

TEST_CASE("choose_from: unset or empty is the first choice, a listed value its index, anything else an error") {
  const auto pick = [](const char* text) {
    return choose_from("LOOM_TEST_SWITCH", text, {{"a", "the default"}, {"b", "second"}, {"c", "third"}});
  };
  CHECK(pick(nullptr) == 0);
  CHECK(pick("") == 0);
  CHECK(pick("a") == 0);
  CHECK(pick("b") == 1);
  CHECK(pick("c") == 2);
  for (const char* bad : {"B", " b", "d", "b "}) {
    INFO(bad);
    const std::string expected =
        std::string("LOOM_TEST_SWITCH must be a (the default), b (second) or c (third), not '") + bad + "'";
    CHECK_THROWS_WITH_AS(pick(bad), doctest::Contains(expected.c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(choose_from("LOOM_TEST_SWITCH", "x", {{"0", "off"}, {"1", "on"}}),
                       doctest::Contains("LOOM_TEST_SWITCH must be 0 (off) or 1 (on), not 'x'"), Error);
}

TEST_CASE("environment_choice reads the variable on every call") {
  ::unsetenv("LOOM_TEST_SWITCH");
  CHECK(environment_choice("LOOM_TEST_SWITCH", {{"0", "off"}, {"1", "on"}}) == 0);
  ::setenv("LOOM_TEST_SWITCH", "1", 1);
  CHECK(environment_choice("LOOM_TEST_SWITCH", {{"0", "off"}, {"1", "on"}}) == 1);
  ::setenv("LOOM_TEST_SWITCH", "2", 1);
  CHECK_THROWS_WITH_AS(environment_choice("LOOM_TEST_SWITCH", {{"0", "off"}, {"1", "on"}}),
                       doctest::Contains("LOOM_TEST_SWITCH must be 0 (off) or 1 (on), not '2'"), Error);
  ::unsetenv("LOOM_TEST_SWITCH");
}
