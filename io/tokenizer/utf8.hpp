// UTF-8 validation and decoding for the tokenizer (the pre-tokenizer's chunking counts code
// points like Python's str, and invalid input must be an error, not a crash).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace l3::tokenizer {

// Byte offset of the first invalid sequence (overlong, surrogate, > U+10FFFF, truncated), or
// nullopt when `text` is valid UTF-8.
[[nodiscard]] std::optional<std::size_t> first_invalid_utf8(std::string_view text) noexcept;

// Decodes the code point starting at text[pos] (valid UTF-8 assumed) and advances pos.
[[nodiscard]] char32_t next_code_point(std::string_view text, std::size_t& pos) noexcept;

// Appends code point `c` (at most U+10FFFF, not a surrogate) to `out` in UTF-8.
void append_utf8(std::string& out, char32_t c);

// Python's str.isspace(): the characters Meta's tokenizer treats as whitespace when it splits
// long runs (bidirectional class WS, B, S, or category Zs).
[[nodiscard]] bool python_isspace(char32_t c) noexcept;

}  // namespace l3::tokenizer
