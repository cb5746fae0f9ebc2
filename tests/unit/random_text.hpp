// Random Unicode text for round-trip tests: ASCII, Latin, CJK, Hangul, emoji, whitespace of
// every kind (including the ones Python's isspace() knows), digits and punctuation.
#pragma once

#include <string>

#include "numeric_support.hpp"

namespace l3::test {

inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6U));
    out += static_cast<char>(0x80 | (c & 0x3FU));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12U));
    out += static_cast<char>(0x80 | ((c >> 6U) & 0x3FU));
    out += static_cast<char>(0x80 | (c & 0x3FU));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18U));
    out += static_cast<char>(0x80 | ((c >> 12U) & 0x3FU));
    out += static_cast<char>(0x80 | ((c >> 6U) & 0x3FU));
    out += static_cast<char>(0x80 | (c & 0x3FU));
  }
}

inline std::string random_unicode(Random& rnd, int characters) {
  static constexpr char32_t kRanges[][2] = {
      {0x20, 0x7E},     {0x20, 0x7E},     {0x20, 0x7E},       {0x09, 0x0D},     {0xA0, 0x17F},
      {0x4E00, 0x4FFF}, {0xAC00, 0xAD00}, {0x1F300, 0x1F64F}, {0x2000, 0x200B}, {0x0660, 0x0669},
      {0x3000, 0x3000}, {0x85, 0x85},     {0x0400, 0x04FF}};
  std::string out;
  for (int i = 0; i < characters; ++i) {
    const auto& r =
        kRanges[static_cast<std::size_t>(rnd.uniform01() * (sizeof(kRanges) / sizeof(kRanges[0])))];
    const auto span = static_cast<double>(r[1] - r[0] + 1);
    append_utf8(out, r[0] + static_cast<char32_t>(rnd.uniform01() * span));
  }
  return out;
}

}  // namespace l3::test
