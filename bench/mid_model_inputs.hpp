// The benchmarks' mid-size CPU model (156M parameters: vocab 32000, hidden 1024, 8 layers,
// 16/4 heads, intermediate 2816) and a synthetic SFT dataset for it, written to a directory.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.hpp"

namespace l3::bench {

[[nodiscard]] model::ModelConfig mid_model();

// DIR/config.json (the mid model) and DIR/data/ (one shard of documents of 128..512 random
// token ids, all in the loss, `tokens` in all).
void write_mid_model_inputs(const std::string& dir, std::int64_t tokens);
// The same for any model: token ids below its vocabulary; document_tokens > 0: every document
// that long (one long sequence per row).
void write_model_inputs(const std::string& dir, const model::ModelConfig& model,
                        std::int64_t tokens, std::int64_t document_tokens = 0);

}  // namespace l3::bench
