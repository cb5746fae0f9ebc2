// What Hugging Face's byte-level BPE files (tokenizer.json) spell the Llama 3 tokenizer with:
// GPT-2's byte alphabet (every byte a printable character) and Llama 3's pre-tokenizer pattern.
// Read by Tokenizer::load, written by hugging_face_tokenizer_files.
#pragma once

#include <array>
#include <string_view>

namespace l3::tokenizer {

inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte b -> the character standing for it: printable bytes for themselves, the others for
// U+0100 onwards in byte order.
[[nodiscard]] constexpr std::array<char32_t, 256> bytes_to_unicode() noexcept {
  std::array<char32_t, 256> table{};
  char32_t extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table.at(static_cast<std::size_t>(b)) = printable ? static_cast<char32_t>(b) : extra++;
  }
  return table;
}

}  // namespace l3::tokenizer
