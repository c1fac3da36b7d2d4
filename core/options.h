// One options style for the whole API, as PyTorch's C++ frontend writes its
// options (TORCH_ARG): each field is one line that declares a chainable
// setter, a getter and the private field with its default, under the doc
// line that says what it is:
//   class SGDOptions {
//    public:
//     explicit SGDOptions(double lr) : lr_(lr) {}
//     // Learning rate.
//     LOOM_OPTION(double, lr);
//     // Momentum factor (default 0: plain SGD).
//     LOOM_OPTION(double, momentum) = 0;
//   };
//   SGDOptions(0.1).momentum(0.9).lr()  // 0.1
// The macro leaves the class in its private section: setters of another
// shape (two values, a scalar for a pair) come before the LOOM_OPTION lines
// or after a new `public:`. A type with a comma needs an alias.
#pragma once

#include <utility>

#define LOOM_OPTION(T, name)                                  \
 public:                                                      \
  auto name(T value)->decltype(*this) {                       \
    this->name##_ = std::move(value);                         \
    return *this;                                             \
  }                                                           \
  const T& name() const noexcept { return this->name##_; }    \
                                                              \
 private:                                                     \
  T name##_
