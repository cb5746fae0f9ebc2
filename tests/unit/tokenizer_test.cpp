// The built-in bytes tokenizer and the tokenizer machinery that needs no external data.
#include "io/tokenizer/tokenizer.hpp"

#include <random>

#include "catch.hpp"
#include "core/error.hpp"
#include "io/tokenizer/utf8.hpp"
#include "numeric_support.hpp"
#include "random_text.hpp"
#include "temp_dir.hpp"

using l3::tokenizer::Special;
using l3::tokenizer::Tokenizer;

TEST_CASE("bytes tokenizer: one id per byte, specials after them", "[tokenizer]") {
  const Tokenizer t = Tokenizer::load("bytes");
  CHECK(t.vocab_size() == 512);
  CHECK(t.special(Special::begin_of_text) == 256);
  CHECK(t.special(Special::finetune_right_pad) == 260);
  CHECK(t.special(Special::end_of_turn) == 265);
  CHECK(t.encode("Hi é") == std::vector<std::int32_t>{72, 105, 32, 0xC3, 0xA9});
  CHECK(t.decode(std::vector<std::int32_t>{256, 72, 265}) == "<|begin_of_text|>H<|eot_id|>");
  CHECK(t.decode(std::vector<std::int32_t>{256 + 255}) == "<|reserved_special_token_247|>");
  CHECK(t.decode(std::vector<std::int32_t>{256 + 11}) == "<|reserved_special_token_3|>");
  CHECK(t.sha256().size() == 64);
  CHECK(t.sha256() == Tokenizer::bytes().sha256());
  // special-token text is data, not control
  const auto ids = t.encode("<|eot_id|>");
  CHECK(ids.size() == 10);
  CHECK(std::find(ids.begin(), ids.end(), 265) == ids.end());
  CHECK_THROWS_AS(t.decode(std::vector<std::int32_t>{512}), l3::core::Error);
}

TEST_CASE("invalid UTF-8 is an error naming the byte, never a crash", "[tokenizer]") {
  const Tokenizer t = Tokenizer::bytes();
  for (const std::string& bad :
       {std::string("ok\xC3"), std::string("\xFF"), std::string("a\xED\xA0\x80"),
        std::string("\xC0\xAF"), std::string("\xF4\x90\x80\x80")}) {
    try {
      (void)t.encode(bad);
      FAIL("no error for invalid UTF-8");
    } catch (const l3::core::Error& e) {
      CHECK(e.kind() == l3::core::ErrorKind::bad_input);
      CHECK(std::string(e.what()).find("invalid UTF-8 at byte") != std::string::npos);
    }
  }
  CHECK_FALSE(l3::tokenizer::first_invalid_utf8("héllo 🦙 数据").has_value());
  CHECK(*l3::tokenizer::first_invalid_utf8("ab\x80") == 2);
}

TEST_CASE("bytes tokenizer round-trips random Unicode", "[tokenizer]") {
  INFO("seed " << l3::test::test_seed());
  const Tokenizer t = Tokenizer::bytes();
  l3::test::Random rnd(200);
  for (int i = 0; i < 50; ++i) {
    const std::string text = l3::test::random_unicode(rnd, 200);
    CHECK(t.decode(t.encode(text)) == text);
  }
}

TEST_CASE("tokenizer loading errors name the file and line", "[tokenizer]") {
  const l3::test::TempDir dir;
  auto message = [](const std::string& spec) -> std::string {
    try {
      (void)Tokenizer::load(spec);
    } catch (const l3::core::Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(message((dir.path() / "missing.model").string()).find("tokenizer not found") !=
        std::string::npos);
  const std::string bad = dir.write("tokenizer.model", "IQ== 0\nIg== 1\nnot base64 x\n");
  CHECK(message(bad).find("line 3") != std::string::npos);
  const std::string gap = dir.write("gap.model", "IQ== 0\nIg== 2\n");
  CHECK(message(gap).find("without gaps") != std::string::npos);
  const std::string json = dir.write("tokenizer.json", R"({"model": {"type": "Unigram"}})");
  CHECK(message(json).find("not a byte-level BPE") != std::string::npos);
  CHECK(message(dir.path().string()).find("not a byte-level BPE") !=
        std::string::npos);  // dir -> tokenizer.json
  const l3::test::TempDir empty;
  CHECK(message(empty.path().string()).find("no tokenizer.json") != std::string::npos);
}

TEST_CASE("a tiny tiktoken file: BPE merges by rank, leftmost first", "[tokenizer]") {
  const l3::test::TempDir dir;
  // bytes a b c (ranks 0-2 are 'a','b','c'; 'ab' rank 3, 'bc' rank 4, 'abc' rank 5), plus the
  // 253 other single bytes so that every byte has a token
  std::string file;
  auto b64 = [](std::string_view s) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    std::size_t i = 0;
    for (; i + 2 < s.size(); i += 3) {
      const unsigned v = (static_cast<unsigned char>(s[i]) << 16U) |
                         (static_cast<unsigned char>(s[i + 1]) << 8U) |
                         static_cast<unsigned char>(s[i + 2]);
      for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6U * static_cast<unsigned>(k))) & 63U];
    }
    const std::size_t rest = s.size() - i;
    if (rest > 0) {
      unsigned v = static_cast<unsigned char>(s[i]) << 16U;
      if (rest == 2) v |= static_cast<unsigned char>(s[i + 1]) << 8U;
      out += kAlphabet[(v >> 18U) & 63U];
      out += kAlphabet[(v >> 12U) & 63U];
      out += rest == 2 ? kAlphabet[(v >> 6U) & 63U] : '=';
      out += '=';
    }
    return out;
  };
  int rank = 0;
  for (const char* tok : {"a", "b", "c", "ab", "bc", "abc"})
    file += b64(tok) + " " + std::to_string(rank++) + "\n";
  for (int byte = 0; byte < 256; ++byte) {
    if (byte == 'a' || byte == 'b' || byte == 'c') continue;
    file += b64(std::string(1, static_cast<char>(byte))) + " " + std::to_string(rank++) + "\n";
  }
  const Tokenizer t = Tokenizer::load(dir.write("tiny.model", file));
  CHECK(t.vocab_size() == 256 + 3 + 256);
  CHECK(t.first_special() == 259);
  CHECK(t.encode("abc") == std::vector<std::int32_t>{5});      // whole piece is a token
  CHECK(t.encode("abcb") == std::vector<std::int32_t>{5, 1});  // ab (3) first, then abc (5)
  CHECK(t.encode("bca") == std::vector<std::int32_t>{4, 0});
  CHECK(t.encode("aab") == std::vector<std::int32_t>{0, 3});
  CHECK(t.decode(t.encode("abcab cab")) == "abcab cab");
}
