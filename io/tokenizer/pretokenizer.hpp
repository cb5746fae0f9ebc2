// Llama 3's pre-tokenizer: Meta's guard against pathological inputs, then the split regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// on PCRE2 (UTF + Unicode properties, JIT-compiled). The guard, as in Meta's tokenizer.py:
// the text is cut into chunks of 400,000 characters, each chunk where a run of whitespace or of
// non-whitespace would exceed 25,000 characters, and the regex runs on each piece separately.
#pragma once

#include <functional>
#include <string_view>

struct pcre2_real_code_8;

namespace l3::tokenizer {

inline constexpr std::size_t kMaxEncodeChars = 400'000;
inline constexpr std::size_t kMaxSameClassRun = 25'000;

class Pretokenizer {
 public:
  Pretokenizer();
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;
  Pretokenizer(Pretokenizer&&) = delete;
  Pretokenizer& operator=(Pretokenizer&&) = delete;

  // Calls `piece` with each pre-token of `text` (valid UTF-8) in order; the pieces tile the text.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

 private:
  void split_regex(std::string_view text, const std::function<void(std::string_view)>& piece) const;

  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace l3::tokenizer
