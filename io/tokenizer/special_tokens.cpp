#include "io/tokenizer/special_tokens.hpp"

#include <fmt/format.h>

namespace l3::tokenizer {

std::string special_token_name(int offset) {
  static constexpr std::array<std::string_view, 11> kNamed = {"<|begin_of_text|>",
                                                              "<|end_of_text|>",
                                                              "<|reserved_special_token_0|>",
                                                              "<|reserved_special_token_1|>",
                                                              "<|finetune_right_pad_id|>",
                                                              "<|reserved_special_token_2|>",
                                                              "<|start_header_id|>",
                                                              "<|end_header_id|>",
                                                              "<|eom_id|>",
                                                              "<|eot_id|>",
                                                              "<|python_tag|>"};
  if (offset >= 0 && offset < static_cast<int>(kNamed.size())) {
    return std::string(kNamed[static_cast<std::size_t>(offset)]);
  }
  // Llama 3.1 numbers the rest from 3: offset 11 is <|reserved_special_token_3|>.
  return fmt::format("<|reserved_special_token_{}|>", offset - 8);
}

}  // namespace l3::tokenizer
