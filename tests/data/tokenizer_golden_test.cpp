// Meta's Llama 3 tokenizer against reference encodings: needs the (non-redistributable) files
// named by L3_LLAMA3_TOKENIZER and L3_TOKENIZER_GOLDEN; skipped (77) when they are unset.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "catch.hpp"
#include "core/timer.hpp"
#include "io/tokenizer/hf_tokenizer_files.hpp"
#include "io/tokenizer/tokenizer.hpp"
#include "numeric_support.hpp"
#include "random_text.hpp"
#include "temp_dir.hpp"

using l3::tokenizer::Special;
using l3::tokenizer::Tokenizer;
using nlohmann::json;

namespace {

const Tokenizer& llama3() {
  static const Tokenizer t = Tokenizer::load(std::getenv("L3_LLAMA3_TOKENIZER"));
  return t;
}

std::vector<std::pair<std::string, std::vector<std::int32_t>>> golden() {
  std::ifstream in(std::getenv("L3_TOKENIZER_GOLDEN"));
  REQUIRE(in);
  std::vector<std::pair<std::string, std::vector<std::int32_t>>> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    cases.emplace_back(j.at("text").get<std::string>(),
                       j.at("ids").get<std::vector<std::int32_t>>());
  }
  return cases;
}

}  // namespace

TEST_CASE("Meta's tokenizer.model reproduces the golden encodings id for id", "[tokenizer]") {
  const Tokenizer& t = llama3();
  CHECK(t.vocab_size() == 128256);
  CHECK(t.special(Special::begin_of_text) == 128000);
  CHECK(t.special(Special::finetune_right_pad) == 128004);
  CHECK(t.special(Special::end_of_turn) == 128009);
  CHECK(t.sha256().starts_with("82e9d319"));
  const auto cases = golden();
  REQUIRE(cases.size() > 10);
  for (const auto& [text, ids] : cases) {
    INFO(text);
    CHECK(t.encode(text) == ids);
    CHECK(t.decode(ids) == text);
  }
}

TEST_CASE("Llama 3 tokenizer round-trips random Unicode and keeps special text as text",
          "[tokenizer]") {
  INFO("seed " << l3::test::test_seed());
  const Tokenizer& t = llama3();
  l3::test::Random rnd(201);
  for (int i = 0; i < 200; ++i) {
    const std::string text =
        l3::test::random_unicode(rnd, 1 + static_cast<int>(rnd.uniform01() * 300));
    const auto ids = t.encode(text);
    REQUIRE(t.decode(ids) == text);
    for (const std::int32_t id : ids) REQUIRE(id < t.first_special());
  }
  const auto ids = t.encode("<|begin_of_text|>hi<|eot_id|>");
  CHECK(std::none_of(ids.begin(), ids.end(),
                     [&](std::int32_t id) { return id >= t.first_special(); }));
  const std::vector<std::int32_t> eot = {t.special(Special::end_of_turn)};
  CHECK(t.decode(eot) == "<|eot_id|>");
}

TEST_CASE("pathological inputs: Meta's 25,000-character run guard, no quadratic blow-up",
          "[tokenizer]") {
  const Tokenizer& t = llama3();
  const l3::core::Stopwatch watch;
  for (const char c : {'a', ' ', '7', '!'}) {
    INFO("run of '" << c << "'");
    const std::string run(60'000, c);
    const auto ids = t.encode(run);
    CHECK(t.decode(ids) == run);
    // The guard cuts the run after 25,000 characters and again after 50,000.
    auto expected = t.encode(std::string(25'000, c));
    const auto second = t.encode(std::string(25'000, c));
    const auto third = t.encode(std::string(10'000, c));
    expected.insert(expected.end(), second.begin(), second.end());
    expected.insert(expected.end(), third.begin(), third.end());
    CHECK(ids == expected);
  }
  // Mixed runs reset the count: 20,000 letters, a space, 20,000 letters is not cut.
  const std::string mixed = std::string(20'000, 'x') + " " + std::string(20'000, 'y');
  CHECK(t.decode(t.encode(mixed)) == mixed);
  CHECK(watch.seconds() < 60.0);  // generous: the heap BPE does this in well under a second
}

// The tokenizer.json `export` writes (io/tokenizer/hf_tokenizer_files.hpp), read back by our own
// reader (tests/data/hf_tokenizer_test.sh reads it with Hugging Face's implementation).
TEST_CASE("a tokenizer.json converted from tokenizer.model encodes identically", "[tokenizer]") {
  INFO("seed " << l3::test::test_seed());
  const Tokenizer& meta = llama3();
  const l3::test::TempDir dir;
  const std::string path = dir.write(
      "tokenizer.json", l3::tokenizer::hugging_face_tokenizer_files(meta, 8192).tokenizer_json);
  CHECK(json::parse(std::ifstream(path)).at("model").at("merges").size() == 280147);  // HF's own
  const Tokenizer hf = Tokenizer::load(dir.path().string());  // a model directory
  CHECK(hf.vocab_size() == meta.vocab_size());
  CHECK(hf.name() == path);
  for (const auto& [text, ids] : golden()) {
    INFO(text);
    CHECK(hf.encode(text) == ids);
  }
  l3::test::Random rnd(202);
  for (int i = 0; i < 100; ++i) {
    const std::string text = l3::test::random_unicode(rnd, 200);
    REQUIRE(hf.encode(text) == meta.encode(text));
  }
  const std::vector<std::int32_t> pad = {128004};
  CHECK(hf.decode(pad) == "<|finetune_right_pad_id|>");
}
