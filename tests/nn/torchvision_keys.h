// Checks a model's state_dict against torchvision's: the test files write out
// torchvision's keys and shapes, in order, as a TorchvisionKeys list.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include <loom/nn/module.h>

namespace loom::testing {

using TorchvisionKeys = std::vector<std::pair<std::string, Shape>>;

// Every key of model.state_dict(), in order, equals torchvision's, with its shape.
inline void check_torchvision_keys(const nn::Module& model, const TorchvisionKeys& expected) {
  const nn::NamedTensors state = model.state_dict();
  REQUIRE(state.size() == expected.size());
  for (size_t i = 0; i < state.size(); ++i) {
    INFO("key ", i, ": ", state[i].first);
    CHECK(state[i].first == expected[i].first);
    CHECK(state[i].second.sizes() == expected[i].second);
  }
}

}  // namespace loom::testing
