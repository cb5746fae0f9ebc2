// A checkpoint as a Hugging Face model directory that transformers and vLLM load as they are:
// an SFT checkpoint as LlamaForCausalLM, a reward checkpoint as LlamaForSequenceClassification
// (score.weight [1, hidden], num_labels 1, pad_token_id the <|finetune_right_pad_id|> token).
// Written into DIR.partial and renamed to DIR when complete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace l3::ckpt {

struct HfExportOptions {
  bool bf16 = true;                           // else fp32 (bit for bit)
  std::uint64_t shard_bytes = 5'000'000'000;  // per safetensors file
  bool overwrite = false;                     // replace an existing DIR
};

struct HfExportReport {
  std::string directory;
  std::string architecture;        // LlamaForCausalLM or LlamaForSequenceClassification
  std::vector<std::string> files;  // written, relative to the directory
  std::uint64_t tensor_bytes = 0;
  bool tokenizer_copied = false;
};

// Rank-local. The checkpoint's weights are checked against its checksums before anything is
// written. usage Error when the output exists (without overwrite); bad_input Errors name the
// checkpoint file and tensor.
HfExportReport export_hugging_face(const std::string& checkpoint, const std::string& output,
                                   const HfExportOptions& options);

// "5GB", "500MB", "2GiB", "1000000": bytes. usage Error otherwise.
[[nodiscard]] std::uint64_t parse_byte_size(const std::string& text);

}  // namespace l3::ckpt
