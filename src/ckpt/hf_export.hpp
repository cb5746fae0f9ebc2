// A checkpoint as a Hugging Face model directory that transformers and vLLM load as they are:
// an SFT checkpoint as LlamaForCausalLM, a reward checkpoint as LlamaForSequenceClassification
// (score.weight [1, hidden], num_labels 1, pad_token_id the <|finetune_right_pad_id|> token).
// Written into DIR.partial and renamed to DIR when complete.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"

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
  // The Hugging Face tokenizer files: "copied from beside ...", "... written for ...", or ""
  // when there are none (the tokenizer the data was prepared with is unknown or gone).
  std::string tokenizer;
};

// The values of one tensor of the model being exported (t: a tensor of its layout; out: its
// numel values), called once per tensor, in the order the files are written.
using TensorFill = std::function<void(const model::TensorInfo& t, std::span<float> out)>;

// Rank-local. The checkpoint's weights are checked against its checksums before anything is
// written. usage Error when the output exists (without overwrite); bad_input Errors name the
// checkpoint file and tensor.
HfExportReport export_hugging_face(const std::string& checkpoint, const std::string& output,
                                   const HfExportOptions& options);

// The same for a model that is not a checkpoint's model.h5 as it stands (a LoRA checkpoint's
// base with its adapters folded in: train/lora_checkpoint_model.hpp): `manifest` describes it
// (model, head, step, tokenizer; a LoRA manifest is recorded in config.json as merged) and
// `fill` gives its tensors, one at a time.
HfExportReport export_hugging_face(const Manifest& manifest, const std::string& step_dir,
                                   const TensorFill& fill, const std::string& output,
                                   const HfExportOptions& options);

// "5GB", "500MB", "2GiB", "1000000": bytes. usage Error otherwise.
[[nodiscard]] std::uint64_t parse_byte_size(const std::string& text);

}  // namespace l3::ckpt
