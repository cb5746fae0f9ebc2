#include "io/tokenizer/hf_tokenizer_files.hpp"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "io/tokenizer/byte_level.hpp"
#include "io/tokenizer/utf8.hpp"

namespace l3::tokenizer {

namespace {

using nlohmann::json;

// GPT-2's byte alphabet, each character in UTF-8.
std::array<std::string, 256> byte_alphabet() {
  std::array<std::string, 256> alphabet;
  const std::array<char32_t, 256> table = bytes_to_unicode();
  for (std::size_t b = 0; b < 256; ++b) append_utf8(alphabet.at(b), table.at(b));
  return alphabet;
}

json special_token_entry(std::int32_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

std::string token_name(const Tokenizer& t, Special s) {
  const std::array<std::int32_t, 1> id{t.special(s)};
  return t.decode(id);
}

}  // namespace

HfTokenizerFiles hugging_face_tokenizer_files(const Tokenizer& t, std::int64_t model_max_length) {
  const std::array<std::string, 256> alphabet = byte_alphabet();
  const auto in_alphabet = [&](const std::string& bytes) {
    std::string s;
    for (const char c : bytes) s += alphabet.at(static_cast<unsigned char>(c));
    return s;
  };
  // The ordinary tokens' bytes and ranks (rank = id).
  std::vector<std::string> tokens;
  std::unordered_map<std::string, std::int32_t> rank_of;
  tokens.reserve(static_cast<std::size_t>(t.first_special()));
  for (std::int32_t id = 0; id < t.first_special(); ++id) {
    const std::array<std::int32_t, 1> one{id};
    tokens.push_back(t.decode(one));
    rank_of.emplace(tokens.back(), id);
  }
  json vocab = json::object();
  // (merged rank, left rank, right rank): the BPE merges, in priority order.
  std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t>> merges;
  for (std::int32_t id = 0; id < t.first_special(); ++id) {
    const std::string& token = tokens[static_cast<std::size_t>(id)];
    vocab[in_alphabet(token)] = id;
    for (std::size_t cut = 1; cut < token.size(); ++cut) {
      const auto left = rank_of.find(token.substr(0, cut));
      const auto right = rank_of.find(token.substr(cut));
      if (left != rank_of.end() && right != rank_of.end())
        merges.emplace_back(id, left->second, right->second);
    }
  }
  std::sort(merges.begin(), merges.end());
  json merge_list = json::array();
  for (const auto& [merged, left, right] : merges) {
    merge_list.push_back(in_alphabet(tokens[static_cast<std::size_t>(left)]) + " " +
                         in_alphabet(tokens[static_cast<std::size_t>(right)]));
  }

  json added = json::array();
  json added_decoder = json::object();
  for (int s = 0; s < kSpecialTokenCount; ++s) {
    const std::int32_t id = t.first_special() + s;
    const std::array<std::int32_t, 1> one{id};
    const std::string content = t.decode(one);
    added.push_back(special_token_entry(id, content));
    json decoder = special_token_entry(id, content);
    decoder.erase("id");
    added_decoder[std::to_string(id)] = decoder;
  }
  const std::string bos = token_name(t, Special::begin_of_text);
  const std::string eos = token_name(t, Special::end_of_turn);  // a chat model's end of answer
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}};
  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", std::string(kLlama3SplitPattern)}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       byte_level})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{bos, {{"id", bos}, {"ids", {t.special(Special::begin_of_text)}}, {"tokens", {bos}}}}}}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", merge_list}}}};
  const json config = {{"added_tokens_decoder", added_decoder},
                       {"bos_token", bos},
                       {"eos_token", eos},
                       {"chat_template", std::string(kLlama3ChatTemplate)},
                       {"clean_up_tokenization_spaces", true},
                       {"model_input_names", {"input_ids", "attention_mask"}},
                       {"model_max_length", model_max_length},
                       {"tokenizer_class", "PreTrainedTokenizerFast"}};
  const json special_map = {{"bos_token", bos}, {"eos_token", eos}};
  return {.tokenizer_json = tokenizer.dump(),
          .tokenizer_config_json = config.dump(2) + "\n",
          .special_tokens_map_json = special_map.dump(2) + "\n"};
}

}  // namespace l3::tokenizer
