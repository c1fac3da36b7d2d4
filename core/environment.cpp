#include <loom/core/environment.h>

#include <cstdlib>
#include <string>

#include <loom/core/error.h>

namespace loom {

size_t choose_from(const char* name, const char* text, std::initializer_list<EnvironmentChoice> choices) {
  const std::string_view value = text == nullptr ? "" : text;
  if (value.empty()) return 0;
  size_t index = 0;
  for (const EnvironmentChoice& choice : choices) {
    if (choice.value == value) return index;
    ++index;
  }
  std::string expected;
  index = 0;
  for (const EnvironmentChoice& choice : choices) {
    if (index > 0) expected += index + 1 == choices.size() ? " or " : ", ";
    expected += std::string(choice.value) + " (" + std::string(choice.meaning) + ")";
    ++index;
  }
  LOOM_FAIL(name, " must be ", expected, ", not '", std::string(value), "'");
}

size_t environment_choice(const char* name, std::initializer_list<EnvironmentChoice> choices) {
  return choose_from(name, std::getenv(name), choices);
}

}  // namespace loom
