// The 256 special tokens of Llama 3.1 (ids 128000-128255 in Meta's tokenizer; right after the
// 256 byte tokens in the built-in `bytes` tokenizer). Text that looks like one of them is
// encoded as plain text: control tokens come only from the chat template, never from data.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace l3::tokenizer {

inline constexpr int kSpecialTokenCount = 256;

// Offsets within the special-token block.
enum class Special : std::int32_t {
  begin_of_text = 0,
  end_of_text = 1,
  finetune_right_pad = 4,
  start_header = 6,
  end_header = 7,
  end_of_message = 8,
  end_of_turn = 9,
  python_tag = 10,
};

// "<|begin_of_text|>", ..., "<|reserved_special_token_247|>" (Llama 3.1's names).
[[nodiscard]] std::string special_token_name(int offset);

}  // namespace l3::tokenizer
