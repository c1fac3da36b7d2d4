// A string as a JSON string literal: the one escaper for loom's hand-written
// JSON (metrics files, Chrome traces, torchelastic error files).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace loom {

// Appends `text` to `out` quoted and escaped per RFC 8259: `"` and `\`,
// \n \r \t by name, other control characters as \u00XX; bytes >= 0x20
// (UTF-8 included) as they are.
inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

inline std::string json_string(std::string_view text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

}  // namespace loom
