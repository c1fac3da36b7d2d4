// loom::Error and the checking macros every layer uses to report failures.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

// The one exception type loom throws. The message is a sentence a user can act
// on; for library failures it also carries the call and file:line.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class First, class... Rest>
void append(std::ostringstream& out, const First& first, const Rest&... rest) {
  out << first;
  append(out, rest...);
}
}  // namespace detail

// Builds a message from any streamable pieces: str("expected ", n, " bytes").
template <class... Parts>
std::string str(const Parts&... parts) {
  std::ostringstream out;
  detail::append(out, parts...);
  return out.str();
}

[[noreturn]] inline void throw_error(const std::string& message) { throw Error(message); }

}  // namespace loom

// Throws loom::Error with the message when cond is false. Used for contract
// violations inside the library (bad shapes, wrong dtype); the message must say
// what was expected and what was found.
#define LOOM_CHECK(cond, ...)                                          \
  do {                                                                 \
    if (!(cond)) ::loom::throw_error(::loom::str(__VA_ARGS__)); \
  } while (0)

#define LOOM_FAIL(...) ::loom::throw_error(::loom::str(__VA_ARGS__))
