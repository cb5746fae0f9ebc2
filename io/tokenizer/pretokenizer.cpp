#include "io/tokenizer/pretokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <array>
#include <memory>

#include "core/error.hpp"
#include "io/tokenizer/utf8.hpp"

namespace l3::tokenizer {

namespace {

constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const noexcept { pcre2_match_data_free(m); }
};

}  // namespace

Pretokenizer::Pretokenizer() {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UCP: \s, \d and \w follow Unicode properties, as the Rust regex crate tiktoken uses does.
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kLlama3Pattern.data()),  // NOLINT
                        kLlama3Pattern.size(), PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_ == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error, message.data(), message.size());
    throw core::internal_error(
        fmt::format("PCRE2 cannot compile the Llama 3 pattern at {}: {}", offset,
                    reinterpret_cast<const char*>(message.data())));  // NOLINT
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(code_); }

void Pretokenizer::split_regex(std::string_view text,
                               const std::function<void(std::string_view)>& piece) const {
  const std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());  // NOLINT
  std::size_t start = 0;
  while (start < text.size()) {
    const int rc =
        pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      piece(text.substr(start));  // never drop bytes, even ones no alternative claims
      return;
    }
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      throw core::internal_error(
          fmt::format("PCRE2 match failed: {}",
                      reinterpret_cast<const char*>(message.data())));  // NOLINT
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const std::size_t begin = ovector[0];
    std::size_t end = ovector[1];
    if (begin > start) piece(text.substr(start, begin - start));
    if (end == begin) {  // cannot happen with this pattern; never loop forever
      std::size_t next = begin;
      (void)next_code_point(text, next);
      end = next;
    }
    piece(text.substr(begin, end - begin));
    start = end;
  }
}

void Pretokenizer::split(std::string_view text,
                         const std::function<void(std::string_view)>& piece) const {
  // Walk the code points once, cutting where Meta's guard cuts: every kMaxEncodeChars
  // characters, and inside those chunks before a run of one class (whitespace or not) would
  // exceed kMaxSameClassRun characters.
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t chars = 0;
    std::size_t slice_start = pos;
    std::size_t run = 0;
    bool run_is_space = false;
    while (pos < text.size() && chars < kMaxEncodeChars) {
      const std::size_t here = pos;
      const bool is_space = python_isspace(next_code_point(text, pos));
      if (chars == 0) run_is_space = is_space;
      if (is_space != run_is_space) {
        run = 1;
        run_is_space = is_space;
      } else if (++run > kMaxSameClassRun) {
        split_regex(text.substr(slice_start, here - slice_start), piece);
        slice_start = here;
        run = 1;
      }
      ++chars;
    }
    split_regex(text.substr(slice_start, pos - slice_start), piece);
  }
}

}  // namespace l3::tokenizer
