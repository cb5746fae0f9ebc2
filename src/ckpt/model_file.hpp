// model.h5: the fp32 master weights as full logical tensors, one dataset per tensor under its
// Hugging Face name ("model.layers.0.self_attn.q_proj.weight", shape [out, in]), so that any
// world size, and any tool with h5py, can read it. Root attributes: format
// "llama3-hpc/model", version, head ("language_model" or "reward").
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/parameter_layout.hpp"

namespace l3::ckpt {

// Writes every tensor of `layout` from the flat host buffer (layout.total() values).
void write_model_file(const std::string& path, const model::ParameterLayout& layout,
                      std::span<const float> flat);

enum class ModelTensors {
  all,            // every tensor of the layout must be in the file
  backbone_only,  // the head (lm_head / score) is left as it is: a reward model from an SFT one
};

// Reads the tensors of `layout` from the file into `flat` (layout.total() values; padding and
// tensors not read are left untouched). bad_input Errors name the file and tensor.
void read_model_file(const std::string& path, const model::ParameterLayout& layout,
                     std::span<float> flat, ModelTensors which = ModelTensors::all);

class TensorFileReader;

// bad_input Error naming the file unless it has model.h5's format attribute and version.
void require_model_format(const TensorFileReader& file);

// The same for the layout positions `ranges` only (ascending, disjoint) into `values` (their
// sizes back to back): a rank reads its share of the weights, not the file. Positions not read
// (padding, a skipped head) are left untouched.
void read_model_ranges(const std::string& path, const model::ParameterLayout& layout,
                       const std::vector<model::FlatRange>& ranges, std::span<float> values,
                       ModelTensors which = ModelTensors::all);

}  // namespace l3::ckpt
