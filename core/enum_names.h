// The names of an enum's values in one table that serves both directions, so
// that printing a value and parsing a flag or variable cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace loom {

//   constexpr EnumNames<Stem, 2> kStemNames{{{Stem::imagenet, "imagenet"}, {Stem::cifar, "cifar"}}};
//   kStemNames.name(Stem::cifar) == "cifar"; kStemNames.parse("imagenet") == Stem::imagenet
template <class Enum, size_t N>
struct EnumNames {
  std::pair<Enum, const char*> entries[N];

  // `value`'s name, or `unknown` for a value the table does not hold.
  constexpr const char* name(Enum value, const char* unknown = "?") const {
    for (const auto& [entry, entry_name] : entries) {
      if (entry == value) return entry_name;
    }
    return unknown;
  }

  // The value named `text` (exactly), or nullopt.
  constexpr std::optional<Enum> parse(std::string_view text) const {
    for (const auto& [entry, entry_name] : entries) {
      if (text == entry_name) return entry;
    }
    return std::nullopt;
  }
};

}  // namespace loom
