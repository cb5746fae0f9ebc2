#include "io/tokenizer/utf8.hpp"

namespace l3::tokenizer {

std::optional<std::size_t> first_invalid_utf8(std::string_view text) noexcept {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());  // NOLINT: byte view
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    char32_t min = 0;
    char32_t cp = 0;
    if ((c & 0xE0U) == 0xC0U) {
      length = 2;
      min = 0x80;
      cp = c & 0x1FU;
    } else if ((c & 0xF0U) == 0xE0U) {
      length = 3;
      min = 0x800;
      cp = c & 0x0FU;
    } else if ((c & 0xF8U) == 0xF0U) {
      length = 4;
      min = 0x10000;
      cp = c & 0x07U;
    } else {
      return i;
    }
    if (i + length > n) return i;
    for (std::size_t k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0U) != 0x80U) return i;
      cp = (cp << 6U) | (s[i + k] & 0x3FU);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += length;
  }
  return std::nullopt;
}

char32_t next_code_point(std::string_view text, std::size_t& pos) noexcept {
  const auto c = static_cast<unsigned char>(text[pos]);
  std::size_t length = 1;
  char32_t cp = c;
  if (c >= 0xF0) {
    length = 4;
    cp = c & 0x07U;
  } else if (c >= 0xE0) {
    length = 3;
    cp = c & 0x0FU;
  } else if (c >= 0xC0) {
    length = 2;
    cp = c & 0x1FU;
  }
  for (std::size_t k = 1; k < length && pos + k < text.size(); ++k) {
    cp = (cp << 6U) | (static_cast<unsigned char>(text[pos + k]) & 0x3FU);
  }
  pos += length;
  return cp;
}

bool python_isspace(char32_t c) noexcept {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0U | (c >> 6U));
    out += static_cast<char>(0x80U | (c & 0x3FU));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0U | (c >> 12U));
    out += static_cast<char>(0x80U | ((c >> 6U) & 0x3FU));
    out += static_cast<char>(0x80U | (c & 0x3FU));
  } else {
    out += static_cast<char>(0xF0U | (c >> 18U));
    out += static_cast<char>(0x80U | ((c >> 12U) & 0x3FU));
    out += static_cast<char>(0x80U | ((c >> 6U) & 0x3FU));
    out += static_cast<char>(0x80U | (c & 0x3FU));
  }
}

}  // namespace l3::tokenizer
