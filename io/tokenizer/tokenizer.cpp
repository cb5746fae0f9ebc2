#include "io/tokenizer/tokenizer.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "io/tokenizer/bpe.hpp"
#include "io/tokenizer/byte_level.hpp"
#include "io/tokenizer/pretokenizer.hpp"
#include "io/tokenizer/utf8.hpp"

namespace l3::tokenizer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kBytesIdentity = "llama3-hpc:bytes-tokenizer:v1";

std::string hex(const unsigned char* data, unsigned int size) {
  std::string out;
  out.reserve(static_cast<std::size_t>(size) * 2U);
  for (unsigned int i = 0; i < size; ++i) out += fmt::format("{:02x}", data[i]);  // NOLINT
  return out;
}

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
      throw core::internal_error("OpenSSL: cannot start a SHA-256");
    }
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&&) = delete;
  Sha256& operator=(Sha256&&) = delete;
  void update(const void* data, std::size_t size) { EVP_DigestUpdate(ctx_, data, size); }
  std::string finish() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_, digest.data(), &size);
    return hex(digest.data(), size);
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string read_file(const std::string& path) {
  std::string text = core::read_text_file(path, "a tokenizer file");
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw core::bad_input("empty: not a tokenizer file", {.file = path});
  return text;
}

// Standard base64 (with padding) -> bytes; nullopt-like empty+false on malformed input.
bool base64_decode(std::string_view in, std::string& out) {
  if (in.empty() || in.size() % 4 != 0) return false;
  std::string buffer(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(buffer.data()),    // NOLINT
                                reinterpret_cast<const unsigned char*>(in.data()),  // NOLINT
                                static_cast<int>(in.size()));
  if (n < 0) return false;
  auto size = static_cast<std::size_t>(n);
  if (in.back() == '=') --size;
  if (in.size() >= 2 && in[in.size() - 2] == '=') --size;
  buffer.resize(size);
  out = std::move(buffer);
  return true;
}

}  // namespace

std::string sha256_file(const std::string& path) {
  core::require_regular_file(path, "a file to hash");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::bad_input("cannot read file to hash", {.file = path});
  Sha256 sha;
  std::array<char, 1 << 16> buffer{};
  while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
    sha.update(buffer.data(), static_cast<std::size_t>(in.gcount()));
  }
  return sha.finish();
}

std::string sha256_text(std::string_view text) {
  Sha256 sha;
  sha.update(text.data(), text.size());
  return sha.finish();
}

Tokenizer::Tokenizer() : pretokenizer_(std::make_unique<Pretokenizer>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.name_ = "bytes";
  t.sha256_ = sha256_text(kBytesIdentity);
  t.first_special_ = 256;
  for (int b = 0; b < 256; ++b) t.id_bytes_.emplace_back(1, static_cast<char>(b));
  for (int s = 0; s < kSpecialTokenCount; ++s) t.id_bytes_.push_back(special_token_name(s));
  return t;
}

// A function-try-block: a field of the wrong JSON type anywhere in tokenizer.json is reported
// with the file's name, not as the JSON library's bare message.
Tokenizer Tokenizer::load(const std::string& spec) try {
  if (spec == "bytes") return bytes();
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    for (const char* candidate :
         {"tokenizer.json", "original/tokenizer.model", "tokenizer.model"}) {
      const fs::path p = fs::path(spec) / candidate;
      if (fs::exists(p, ec)) return load(p.string());
    }
    throw core::bad_input("no tokenizer.json, original/tokenizer.model or tokenizer.model here",
                          {.file = spec});
  }
  if (!fs::exists(spec, ec)) {
    throw core::bad_input(
        "tokenizer not found (give \"bytes\", a tokenizer.model, a tokenizer.json "
        "or a model directory)",
        {.file = spec});
  }
  const std::string text = read_file(spec);
  Tokenizer t;
  t.name_ = spec;
  t.sha256_ = sha256_text(text);
  const bool is_json = !text.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos &&
                       text[text.find_first_not_of(" \t\r\n")] == '{';
  std::unordered_map<std::string, std::int32_t> ids;

  if (!is_json) {  // Meta's tiktoken format: "base64(bytes) rank" per line
    std::istringstream lines(text);
    std::string line;
    std::int64_t number = 0;
    while (std::getline(lines, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      const auto space = line.find(' ');
      std::string token;
      std::int64_t rank = -1;
      const bool ok =
          space != std::string::npos &&
          base64_decode(std::string_view(line).substr(0, space), token) &&
          std::from_chars(line.data() + space + 1, line.data() + line.size(), rank).ec ==
              std::errc{};
      if (!ok || rank < 0 || rank >= (1LL << 30)) {
        throw core::bad_input("expected 'base64(token) rank'",
                              {.file = spec, .record = fmt::format("line {}", number)});
      }
      if (!ids.try_emplace(token, static_cast<std::int32_t>(rank)).second) {
        throw core::bad_input("duplicate token",
                              {.file = spec, .record = fmt::format("line {}", number)});
      }
    }
    t.first_special_ = static_cast<std::int32_t>(ids.size());
    t.id_bytes_.assign(static_cast<std::size_t>(t.first_special_), {});
    for (const auto& [bytes, id] : ids) {
      if (id >= t.first_special_ || !t.id_bytes_[static_cast<std::size_t>(id)].empty()) {
        throw core::bad_input(
            fmt::format("ranks must be 0..{} without gaps (rank {})", ids.size() - 1, id),
            {.file = spec});
      }
      t.id_bytes_[static_cast<std::size_t>(id)] = bytes;
    }
    for (int s = 0; s < kSpecialTokenCount; ++s) t.id_bytes_.push_back(special_token_name(s));
    t.bpe_ = std::make_unique<BytePairEncoder>(BytePairEncoder::from_ranks(std::move(ids)));
    return t;
  }

  // Hugging Face tokenizer.json with a byte-level BPE model.
  const json doc = core::parse_json(text, "a tokenizer file", {.file = spec});
  const json& model = doc.value("model", json::object());
  if (model.value("type", "") != "BPE" || !model.contains("vocab") || !model.contains("merges")) {
    throw core::bad_input(
        "not a byte-level BPE tokenizer (model.type must be \"BPE\" with vocab and merges)",
        {.file = spec});
  }
  if (const std::string dump = doc.value("pre_tokenizer", json::object()).dump();
      dump.find("Split") != std::string::npos) {
    const std::string escaped = json(std::string(kLlama3SplitPattern)).dump();
    if (dump.find(escaped.substr(1, escaped.size() - 2)) == std::string::npos) {
      throw core::bad_input("the pre-tokenizer's split pattern is not Llama 3's", {.file = spec});
    }
  }
  const auto to_unicode = bytes_to_unicode();
  std::unordered_map<char32_t, unsigned char> to_byte;
  for (int b = 0; b < 256; ++b)
    to_byte[to_unicode[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);
  auto decode_token = [&](const std::string& s) {
    std::string out;
    for (std::size_t pos = 0; pos < s.size();) {
      const char32_t c = next_code_point(s, pos);
      const auto it = to_byte.find(c);
      if (it == to_byte.end())
        throw core::bad_input("vocabulary token outside the byte alphabet",
                              {.file = spec, .record = s});
      out += static_cast<char>(it->second);
    }
    return out;
  };
  std::int32_t max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    const auto value = id.get<std::int64_t>();
    if (value < 0 || value >= (1LL << 30)) {
      throw core::bad_input(fmt::format("token id {} is outside 0..2^30", value),
                            {.file = spec, .record = token});
    }
    ids.emplace(decode_token(token), static_cast<std::int32_t>(value));
    max_id = std::max(max_id, static_cast<std::int32_t>(value));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& m : model["merges"]) {
    std::string a;
    std::string b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos)
        throw core::bad_input("merge without a space: " + s, {.file = spec});
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw core::bad_input("malformed merge: " + m.dump(), {.file = spec});
    }
    merges.emplace_back(decode_token(a), decode_token(b));
  }
  t.first_special_ = max_id + 1;
  t.id_bytes_.assign(static_cast<std::size_t>(t.first_special_), {});
  for (const auto& [bytes, id] : ids) t.id_bytes_[static_cast<std::size_t>(id)] = bytes;
  for (int s = 0; s < kSpecialTokenCount; ++s) t.id_bytes_.push_back(special_token_name(s));
  for (const json& added : doc.value("added_tokens", json::array())) {  // the file's own names
    const auto id = added.value("id", -1);
    if (id >= t.first_special_ && id < t.first_special_ + kSpecialTokenCount) {
      t.id_bytes_[static_cast<std::size_t>(id)] =
          added.value("content", t.id_bytes_[static_cast<std::size_t>(id)]);
    }
  }
  t.bpe_ = std::make_unique<BytePairEncoder>(BytePairEncoder::from_merges(std::move(ids), merges));
  return t;
} catch (const json::exception& e) {
  throw core::bad_input(fmt::format("not a tokenizer this program reads: {}", e.what()),
                        {.file = spec});
}

void Tokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  if (const auto bad = first_invalid_utf8(text)) {
    throw core::bad_input(fmt::format("invalid UTF-8 at byte {}", *bad));
  }
  if (!bpe_) {  // bytes tokenizer
    for (const char c : text)
      out.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
    return;
  }
  pretokenizer_->split(text, [&](std::string_view piece) { bpe_->encode(piece, out); });
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_append(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= static_cast<std::int32_t>(id_bytes_.size())) {
      throw core::bad_input(
          fmt::format("token id {} is outside the vocabulary [0, {})", id, id_bytes_.size()));
    }
    out += id_bytes_[static_cast<std::size_t>(id)];
  }
  return out;
}

}  // namespace l3::tokenizer
