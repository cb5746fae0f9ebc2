// Writing safetensors files from fp32 tensors (stored as BF16 or F32), single or sharded the
// Hugging Face way (model-00001-of-0000N.safetensors + model.safetensors.index.json). Every
// file is written under a temporary name, fsynced and renamed: an interrupted export never
// leaves a file that looks complete.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors/safetensors_header.hpp"

namespace l3::safetensors {

struct TensorToWrite {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> values;  // row-major, product(shape) elements
  // Instead of `values` (left empty): fills a buffer of product(shape) elements when the tensor
  // is written, so that a model is written holding one tensor at a time (streaming export).
  std::function<void(std::span<float>)> fill = nullptr;
};

// One file. `dtype`: BF16 (rounded to nearest even) or F32 (bit for bit); F16 is not written.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       SafetensorsDType dtype, const std::map<std::string, std::string>& metadata);

// The tensors, in order, into files of at most `shard_bytes` of data each (a tensor larger than
// that gets a file to itself): `model.safetensors` when one file is enough, else
// `model-0000i-of-0000N.safetensors` and `model.safetensors.index.json` (metadata.total_size,
// weight_map). Returns the file names written.
std::vector<std::string> write_safetensors_model(
    const std::string& directory, const std::vector<TensorToWrite>& tensors, SafetensorsDType dtype,
    std::uint64_t shard_bytes, const std::map<std::string, std::string>& metadata);

}  // namespace l3::safetensors
