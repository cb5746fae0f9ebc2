#include "mid_model_inputs.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/rng.hpp"
#include "io/data/shard_format.hpp"

namespace l3::bench {

model::ModelConfig mid_model() {
  model::ModelConfig c = model::preset("tiny");
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.n_layers = 8;
  c.n_heads = 16;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  return c;
}

void write_mid_model_inputs(const std::string& dir, std::int64_t tokens) {
  write_model_inputs(dir, mid_model(), tokens);
}

void write_model_inputs(const std::string& dir, const model::ModelConfig& model,
                        std::int64_t tokens, std::int64_t document_tokens) {
  using nlohmann::json;
  const std::int64_t vocab = model.vocab_size;
  std::filesystem::create_directories(dir + "/data");
  const core::CounterRng rng(5, core::RngPurpose::test);
  std::uint64_t draw = 0;
  data::Documents docs;
  while (docs.token_count() < tokens) {
    const auto length = static_cast<std::size_t>(
        document_tokens > 0 ? document_tokens : 128 + rng.below(draw++, 385));
    std::vector<std::int32_t> t(length);
    for (auto& x : t)
      x = static_cast<std::int32_t>(rng.below(draw++, static_cast<std::uint64_t>(vocab)));
    docs.add(t, std::vector<std::uint8_t>(length, 1));
  }
  data::write_sft_shard(dir + "/data/part-00000.h5", docs, {"llama3-hpc/sft", 1, "bench", vocab});
  std::ofstream(dir + "/data/index.json") << json{
      {"format", "llama3-hpc/sft"},
      {"version", 1},
      {"tokenizer", {{"sha256", "bench"}, {"vocab_size", vocab}}},
      {"shards",
       {{{"file", "part-00000.h5"},
         {"documents", docs.count()},
         {"tokens", docs.token_count()}}}}}.dump();
  std::ofstream(dir + "/config.json") << model.to_hf_json().dump(2);
}

}  // namespace l3::bench
