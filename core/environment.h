// Settings chosen by an environment variable from a fixed list
// (LOOM_CUDA_BATCH_NORM=v2, LOOM_CUDNN_GRAPH=1, ...): the switches through
// which users and the device scripts compare a proven path with a new one.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace loom {

// One value a variable takes, and what it means (said in the error).
struct EnvironmentChoice {
  std::string_view value;
  std::string_view meaning;
};

// The index among `choices` of `text`, the value of variable `name` (null
// when unset); unset or empty is 0, the first choice, the default. Any
// other value is a loom::Error: "NAME must be V0 (M0) or V1 (M1), not 'x'".
size_t choose_from(const char* name, const char* text, std::initializer_list<EnvironmentChoice> choices);

// choose_from(name, getenv(name), choices): reads the environment on every call.
size_t environment_choice(const char* name, std::initializer_list<EnvironmentChoice> choices);

// A switch of two settings, `off` (the default) and `on`, read as
// environment_choice reads them: off_value or on_value.
template <class T>
T environment_switch(const char* name, EnvironmentChoice off, T off_value, EnvironmentChoice on, T on_value) {
  return environment_choice(name, {off, on}) == 1 ? on_value : off_value;
}

}  // namespace loom
