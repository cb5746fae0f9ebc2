#include "ckpt/model_file.hpp"

#include <fmt/format.h>

#include "ckpt/manifest.hpp"
#include "ckpt/rank_state.hpp"
#include "ckpt/tensor_file.hpp"
#include "core/error.hpp"
#include "io/h5/h5.hpp"

namespace l3::ckpt {

namespace {

constexpr std::string_view kModelFormat = "llama3-hpc/model";
constexpr std::int64_t kModelVersion = 1;

bool is_head(const model::ParameterLayout& layout, const model::TensorInfo& t) {
  return (layout.head() == model::HeadKind::reward && t.offset == layout.score()) ||
         (layout.head() == model::HeadKind::language_model &&
          !layout.config().tie_word_embeddings && t.offset == layout.lm_head());
}

}  // namespace

void write_model_file(const std::string& path, const model::ParameterLayout& layout,
                      std::span<const float> flat) {
  if (static_cast<std::int64_t>(flat.size()) != layout.total()) {
    throw core::internal_error(
        fmt::format("{} values for a layout of {}", flat.size(), layout.total()), {.file = path});
  }
  const h5::Handle file = h5::create_file(path);
  for (const model::TensorInfo& t : layout.tensors()) {
    h5::write_tensor(
        file, t.name,
        flat.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel)),
        t.shape, path);
  }
  h5::write_attribute(file, "format", std::string(kModelFormat), path);
  h5::write_attribute(file, "version", kModelVersion, path);
  h5::write_attribute(file, "head", std::string(head_name(layout.head())), path);
  h5::flush_file(file, path);
}

void read_model_file(const std::string& path, const model::ParameterLayout& layout,
                     std::span<float> flat, ModelTensors which) {
  if (static_cast<std::int64_t>(flat.size()) != layout.total()) {
    throw core::internal_error(
        fmt::format("{} values for a layout of {}", flat.size(), layout.total()), {.file = path});
  }
  const h5::Handle file = h5::open_file_read(path);
  if (h5::read_string_attribute(file, "format", path) != kModelFormat) {
    throw core::bad_input(fmt::format("not a model file (format is not \"{}\")", kModelFormat),
                          {.file = path});
  }
  if (h5::read_int_attribute(file, "version", path) != kModelVersion) {
    throw core::bad_input("model file version is not supported", {.file = path});
  }
  for (const model::TensorInfo& t : layout.tensors()) {
    if (which == ModelTensors::backbone_only && is_head(layout, t)) continue;
    h5::read_tensor(
        file, t.name, t.shape,
        flat.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel)), path);
  }
}

void require_model_format(const TensorFileReader& file) {
  if (file.text_attribute("format") != kModelFormat) {
    throw core::bad_input(fmt::format("not a model file (format is not \"{}\")", kModelFormat),
                          {.file = file.path()});
  }
  if (file.integer_attribute("version") != kModelVersion) {
    throw core::bad_input("model file version is not supported", {.file = file.path()});
  }
}

void read_model_ranges(const std::string& path, const model::ParameterLayout& layout,
                       const std::vector<model::FlatRange>& ranges, std::span<float> values,
                       ModelTensors which) {
  std::int64_t total = 0;
  for (const model::FlatRange& r : ranges) total += r.size();
  if (static_cast<std::int64_t>(values.size()) != total) {
    throw core::internal_error(fmt::format("{} values for ranges of {}", values.size(), total),
                               {.file = path});
  }
  TensorFileReader file(path);
  require_model_format(file);
  for (const TensorSlice& s : tensor_slices(layout, ranges)) {
    const model::TensorInfo& t = layout.tensors()[s.tensor];
    if (which == ModelTensors::backbone_only && is_head(layout, t)) continue;
    file.read(
        t.name, t.shape, s.first,
        values.subspan(static_cast<std::size_t>(s.position), static_cast<std::size_t>(s.count)));
  }
}

}  // namespace l3::ckpt
