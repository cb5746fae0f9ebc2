// The Llama 3 tokenizer: byte-level BPE exactly as Meta's tiktoken tokenizer, loaded from
// Meta's `tokenizer.model` or a Hugging Face `tokenizer.json`, plus the built-in `bytes`
// tokenizer (256 byte tokens and the same 256 special tokens right after them; vocabulary 512)
// for demos and tests without Meta's file.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/special_tokens.hpp"

namespace l3::tokenizer {

class BytePairEncoder;
class Pretokenizer;

class Tokenizer {
 public:
  // "bytes", a tokenizer.model, a tokenizer.json, or a directory holding one of them
  // (tokenizer.json, else original/tokenizer.model, else tokenizer.model). Bad files are
  // bad_input Errors naming the file and line.
  static Tokenizer load(const std::string& spec);
  static Tokenizer bytes();

  ~Tokenizer();
  Tokenizer(Tokenizer&& other) noexcept;
  Tokenizer& operator=(Tokenizer&& other) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Plain text (valid UTF-8, else a bad_input Error) -> ids. Text that spells a special token
  // is encoded as ordinary text. No BOS/EOS: add them with special().
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const;
  // ids -> the exact bytes they stand for (special tokens as their names). The result is not
  // always valid UTF-8 (an id sequence may cut a character); ids outside the vocabulary are an
  // Error.
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const;

  [[nodiscard]] std::int32_t special(Special token) const noexcept {
    return first_special_ + static_cast<std::int32_t>(token);
  }
  [[nodiscard]] std::int32_t first_special() const noexcept { return first_special_; }
  [[nodiscard]] std::int64_t vocab_size() const noexcept {
    return first_special_ + kSpecialTokenCount;
  }
  // "bytes", or the path it was loaded from.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  // sha256 (hex) of the file it was loaded from; of the text "llama3-hpc:bytes-tokenizer:v1"
  // for the built-in one. Shards record it so that training can check it.
  [[nodiscard]] const std::string& sha256() const noexcept { return sha256_; }

 private:
  Tokenizer();

  std::string name_;
  std::string sha256_;
  std::int32_t first_special_ = 0;
  std::vector<std::string> id_bytes_;     // id -> bytes, specials included (their names)
  std::unique_ptr<BytePairEncoder> bpe_;  // null for the bytes tokenizer
  std::unique_ptr<Pretokenizer> pretokenizer_;
};

// sha256 of a file (hex), as `sha256sum` prints it.
[[nodiscard]] std::string sha256_file(const std::string& path);
[[nodiscard]] std::string sha256_text(std::string_view text);

}  // namespace l3::tokenizer
