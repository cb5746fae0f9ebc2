// Hugging Face's tokenizer files for a tokenizer of ours, for `export`: what AutoTokenizer,
// vLLM and transformers.js load next to the weights when the data was prepared with Meta's
// tokenizer.model (or the built-in bytes tokenizer), which Hugging Face's libraries do not read.
//
//   tokenizer.json           the byte-level BPE: the vocabulary in GPT-2's byte alphabet, the
//                            merges derived from the ranks as transformers' TikTokenConverter
//                            does (every split of a token into two tokens, ordered by the token's
//                            rank, then the parts'), Llama 3's pre-tokenizer pattern, the 256
//                            special tokens, BOS added by the post-processor, ignore_merges (a
//                            word in the vocabulary is one token, as in tiktoken)
//   tokenizer_config.json    the special tokens, BOS and EOS, and the chat template prep uses
//   special_tokens_map.json  BOS and EOS
//
// Encoding with them gives the ids ours gives (tests/data: Meta's reference ids through
// @huggingface/tokenizers), and the chat template rendered and encoded gives prep's ids.
#pragma once

#include <cstdint>
#include <string>

#include "io/tokenizer/tokenizer.hpp"

namespace l3::tokenizer {

// Llama 3 Instruct's chat template, which prep's chat format is (io/prep/record_format.hpp):
// <|begin_of_text|> then each message as <|start_header_id|>ROLE<|end_header_id|>\n\n, its
// content stripped, <|eot_id|>; with add_generation_prompt the assistant's header after.
inline constexpr std::string_view kLlama3ChatTemplate =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string special_tokens_map_json;
};

// `model_max_length`: the model's positions (tokenizer_config.json's model_max_length).
[[nodiscard]] HfTokenizerFiles hugging_face_tokenizer_files(const Tokenizer& tokenizer,
                                                            std::int64_t model_max_length);

}  // namespace l3::tokenizer
