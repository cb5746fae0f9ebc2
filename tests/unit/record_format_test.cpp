#include "io/prep/record_format.hpp"

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "core/error.hpp"

using l3::prep::Example;
using l3::prep::FormatOptions;
using l3::prep::RecordFormatter;
using l3::prep::Verdict;
using nlohmann::json;

namespace {
const l3::tokenizer::Tokenizer& bytes() {
  static const auto t = l3::tokenizer::Tokenizer::bytes();
  return t;
}
// The example as text, with the targets in [brackets].
std::string show(const Example& e) {
  std::string out;
  bool in_target = false;
  for (std::size_t i = 0; i < e.tokens.size(); ++i) {
    if ((e.mask[i] != 0) != in_target) {
      out += in_target ? "]" : "[";
      in_target = !in_target;
    }
    const std::vector<std::int32_t> one = {e.tokens[i]};
    out += bytes().decode(one);
  }
  if (in_target) out += "]";
  return out;
}
std::string failure(const RecordFormatter& f, const char* record, bool preference = false) {
  try {
    if (preference) {
      (void)f.preference(json::parse(record));
    } else {
      (void)f.sft(json::parse(record));
    }
  } catch (const l3::core::Error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("messages: the Llama 3 template, loss on assistant turns and their eot", "[prep]") {
  const RecordFormatter f(bytes(), {});
  const Example e = f.sft(json::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi \n"},
      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More?"},
      {"role": "assistant", "content": "\tNo.  "}]})"));
  CHECK(show(e) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n[Hello.<|eot_id|>]"
        "<|start_header_id|>user<|end_header_id|>\n\nMore?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n[No.<|eot_id|>]");
  CHECK(e.mask.front() == 0);  // BOS is never a target

  FormatOptions last;
  last.last_turn_only = true;
  const Example l = RecordFormatter(bytes(), last).sft(json::parse(R"({"messages": [
      {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})"));
  CHECK(show(l).find("\n\nb<|eot_id|>") != std::string::npos);
  CHECK(show(l).ends_with("\n\n[d<|eot_id|>]"));
}

TEST_CASE("prompt/completion (chat and raw) and text records", "[prep]") {
  const RecordFormatter chat(bytes(), {});
  CHECK(show(chat.sft(json::parse(R"({"prompt": "Q", "completion": "A"})"))) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n[A<|eot_id|>]");
  FormatOptions raw_options;
  raw_options.prompt_template = l3::prep::Template::raw;
  const RecordFormatter raw(bytes(), raw_options);
  CHECK(show(raw.sft(json::parse(R"({"prompt": "Q: ", "completion": "A"})"))) ==
        "<|begin_of_text|>Q: [A<|end_of_text|>]");
  CHECK(show(chat.sft(json::parse(R"({"text": "some text"})"))) ==
        "<|begin_of_text|>[some text<|end_of_text|>]");
  // special-token text in data stays text: no control token appears
  const Example injected = chat.sft(json::parse(R"({"text": "<|eot_id|>"})"));
  CHECK(std::count(injected.tokens.begin(), injected.tokens.end(),
                   bytes().special(l3::tokenizer::Special::end_of_turn)) == 0);
}

TEST_CASE("records that teach nothing are dropped with a reason", "[prep]") {
  const RecordFormatter f(bytes(), {});
  Example empty = f.sft(json::parse(R"({"text": ""})"));
  CHECK(f.fit(empty) == Verdict::empty);
  Example blank = f.sft(json::parse(R"({"prompt": "Q", "completion": "   "})"));
  CHECK(f.fit(blank) == Verdict::empty);
  Example no_assistant = f.sft(json::parse(R"({"messages": [{"role": "user", "content": "x"}]})"));
  CHECK(f.fit(no_assistant) == Verdict::all_masked);
}

TEST_CASE("max-len: drop, or cut the prompt from the left", "[prep]") {
  const char* record = R"({"prompt": "0123456789", "completion": "abc"})";
  FormatOptions raw;
  raw.prompt_template = l3::prep::Template::raw;
  raw.max_len = 10;  // BOS + 10 + 3 + EOT = 15 tokens
  Example dropped = RecordFormatter(bytes(), raw).sft(json::parse(record));
  CHECK(RecordFormatter(bytes(), raw).fit(dropped) == Verdict::too_long);
  raw.truncation = l3::prep::Truncation::left;
  const RecordFormatter left(bytes(), raw);
  Example cut = left.sft(json::parse(record));
  CHECK(left.fit(cut) == Verdict::keep);
  CHECK(show(cut) == "<|begin_of_text|>56789[abc<|end_of_text|>]");
  raw.max_len = 4;  // the completion alone does not fit: dropped, never cut
  const RecordFormatter tiny(bytes(), raw);
  Example too_long = tiny.sft(json::parse(record));
  CHECK(tiny.fit(too_long) == Verdict::too_long);
}

TEST_CASE("preference records: strings, message lists, margins", "[prep]") {
  const RecordFormatter f(bytes(), {});
  const auto p = f.preference(
      json::parse(R"({"prompt": "Q", "chosen": "good", "rejected": "bad", "margin": 1.5})"));
  CHECK(show(p.chosen) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n[good<|eot_id|>]");
  CHECK(show(p.rejected).ends_with("\n\n[bad<|eot_id|>]"));
  REQUIRE(p.margin.has_value());
  CHECK(*p.margin == 1.5F);
  const auto conv = f.preference(json::parse(R"({
      "chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "good"}],
      "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "bad"}]})"));
  CHECK(conv.chosen.tokens == p.chosen.tokens);
  CHECK_FALSE(conv.margin.has_value());
  CHECK(failure(f, R"({"chosen": "a", "rejected": "b"})", true).find("no \"prompt\"") !=
        std::string::npos);
  CHECK(failure(f, R"({"prompt": "Q", "chosen": "a"})", true) == R"(missing "rejected")");
  CHECK(failure(f, R"({"prompt": "Q", "chosen": "a", "rejected": "b", "margin": "x"})", true) ==
        R"("margin" must be a number)");
}

TEST_CASE("malformed SFT records say what is wrong", "[prep]") {
  const RecordFormatter f(bytes(), {});
  CHECK(failure(f, "[1, 2]") == "a record must be a JSON object");
  CHECK(failure(f, R"({"messages": []})").find("non-empty list") != std::string::npos);
  CHECK(failure(f, R"({"messages": [{"role": "user"}]})").find("messages[0]") != std::string::npos);
  CHECK(failure(f, R"({"prompt": "x"})") == R"(missing "completion")");
  CHECK(failure(f, R"({"text": 3})") == R"("text" must be a string)");
  CHECK(failure(f, R"({"other": 1})").find("expected") != std::string::npos);
  CHECK(l3::prep::strip("\u3000 a b\t\n") == "a b");
  // A model's completion need not be UTF-8: a code point cut short at either end stays.
  CHECK(l3::prep::strip("\xE2") == "\xE2");
  CHECK(l3::prep::strip(" \xE2\x80") == "\xE2\x80");
  CHECK(l3::prep::strip("a\xF0 ") == "a\xF0");
  CHECK(l3::prep::strip("\x80\x80 x") == "\x80\x80 x");
}
