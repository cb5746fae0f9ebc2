// Loading and exporting models larger than one rank: for parameter sharding (--shard-parameters)
// each rank reads only its pieces of a Hugging Face model or a checkpoint, so its peak resident
// memory (getrusage) grows by its share of the model plus at most one tensor and a fixed margin,
// not by the model, and the values are those of the file; `export` holds one tensor at a time.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "catch.hpp"
#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/hf_export.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/model_file.hpp"
#include "ckpt/rank_state.hpp"
#include "core/error.hpp"
#include "dist/world.hpp"
#include "io/safetensors/float_formats.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "model/model_config.hpp"
#include "model/parameter_init.hpp"
#include "model/parameter_layout.hpp"
#include "parallel/shard_plan.hpp"
#include "shared_directory.hpp"
#include "train/model_source.hpp"

namespace fs = std::filesystem;

namespace {

// The value of element j of every tensor in the file (before bf16 rounding).
float pattern(std::int64_t j) { return static_cast<float>((j * 7919) % 2003 - 1001) / 1024.0F; }

std::int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
}

// Resets the peak to the current resident set (Linux >= 4.0): the peak measured next is the
// load's, not the process's history (the writer of the file, MPI's start).
// Tensors large enough that a model's memory stands out from the process's: vocabulary 4096,
// hidden 1024 (the embedding and lm_head 4M values each), 14.7M parameters per block.
l3::model::ModelConfig wide_model(int layers) {
  l3::model::ModelConfig config = l3::model::preset("tiny");
  config.vocab_size = 4096;
  config.hidden_size = 1024;
  config.intermediate_size = 4096;
  config.n_layers = layers;
  config.n_heads = 16;
  config.n_kv_heads = 4;
  config.head_dim = 64;
  return config;
}

// Adds 1 to the first of `values` in `path` (model.h5), found through the HDF5 file's contiguous
// data by its first `bytes` bytes, which are unique here. False where they are not found.
bool damage_value(const std::string& path, const float* values, std::size_t bytes) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  const std::string contents((std::istreambuf_iterator<char>(file)), {});
  const std::string needle(reinterpret_cast<const char*>(values), bytes);  // NOLINT
  const std::size_t found = contents.find(needle);
  if (found == std::string::npos) return false;
  file.seekp(static_cast<std::streamoff>(found));
  const float changed = values[0] + 1.0F;
  file.write(reinterpret_cast<const char*>(&changed), sizeof(changed));  // NOLINT
  return static_cast<bool>(file);
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace

TEST_CASE("a sharded load from safetensors holds this rank's share and one tensor at most",
          "[train][zero][memory]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = l3::test::shared_directory(world, "train", "sharded-load");
  // 95M parameters: 380 MB in fp32, 190 MB of bf16 in the file; the largest tensor 4M values.
  const l3::model::ModelConfig config = wide_model(6);
  const l3::model::ParameterLayout layout(config, l3::model::HeadKind::language_model);
  std::int64_t largest = 0;
  for (const l3::model::TensorInfo& t : layout.tensors()) largest = std::max(largest, t.numel);
  if (world.is_root()) {
    // Every tensor's values are the same prefix of one buffer: the writer holds one tensor's
    // worth of values, not the model's.
    std::vector<float> values(static_cast<std::size_t>(largest));
    for (std::int64_t j = 0; j < largest; ++j) values[static_cast<std::size_t>(j)] = pattern(j);
    std::vector<l3::safetensors::TensorToWrite> tensors;
    for (const l3::model::TensorInfo& t : layout.tensors()) {
      tensors.push_back({t.name, t.shape,
                         std::span<const float>(values).first(static_cast<std::size_t>(t.numel))});
    }
    (void)l3::safetensors::write_safetensors_model(
        dir, tensors, l3::safetensors::SafetensorsDType::bf16, std::uint64_t{64} << 20, {});
    std::ofstream(dir + "/config.json") << config.to_hf_json().dump(2);
  }
  world.barrier();
  const l3::train::ModelSource source = l3::train::resolve_model_source("", dir);
  REQUIRE(source.hf_dir == dir);
  const l3::parallel::ShardPlan plan({.total = layout.total(),
                                      .groups = layout.gradient_groups(),
                                      .ranks = world.size(),
                                      .bucket_elements = std::int64_t{1} << 20});
  const std::vector<l3::model::FlatRange> mine = plan.owned(world.rank());
  std::int64_t share = 0;
  for (const l3::model::FlatRange& r : mine) share += r.size();

  const bool reset = reset_peak_rss();
  if (!reset) {
    WARN(
        "/proc/self/clear_refs is not writable here: the peak resident memory cannot be reset, "
        "the memory bound is not checked");
  }
  const std::int64_t before = peak_rss_bytes();
  const std::vector<float> loaded =
      l3::train::initial_weights_of_ranges(world, layout, source, 3, mine);
  const std::int64_t grown = peak_rss_bytes() - before;
  const std::int64_t bound = 4 * share + 4 * largest + (std::int64_t{32} << 20);
  INFO(
      fmt::format("rank {} of {}: share {:.1f} MB, largest tensor {:.1f} MB, peak grew {:.1f} MB "
                  "(bound {:.1f} MB; the whole model is {:.1f} MB)",
                  world.rank(), world.size(), 4e-6 * static_cast<double>(share),
                  4e-6 * static_cast<double>(largest), 1e-6 * static_cast<double>(grown),
                  1e-6 * static_cast<double>(bound), 4e-6 * static_cast<double>(layout.total())));
  if (reset) CHECK(grown <= bound);
  if (world.size() >= 4) CHECK(bound < 4 * layout.total() / 2);  // the bound excludes the model

  // The values: the file's (the bf16-rounded pattern).
  REQUIRE(static_cast<std::int64_t>(loaded.size()) == share);
  std::int64_t base = 0;
  std::int64_t wrong = 0;
  for (const l3::model::FlatRange& r : mine) {
    for (const l3::model::TensorInfo& t : layout.tensors()) {
      const std::int64_t lo = std::max(r.begin, t.offset);
      const std::int64_t hi = std::min(r.end, t.offset + t.numel);
      for (std::int64_t at = lo; at < hi; ++at) {
        const float expected =
            l3::safetensors::bf16_to_float(l3::safetensors::float_to_bf16(pattern(at - t.offset)));
        if (loaded[static_cast<std::size_t>(base + at - r.begin)] != expected) ++wrong;
      }
    }
    base += r.size();
  }
  CHECK(wrong == 0);
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

// From a checkpoint: every rank reads its ranges of model.h5 by hyperslab, the same values the
// whole file holds, and the ranks check the slices' checksums between them: a damaged tensor
// stops every rank with an error naming the file and the tensor.
TEST_CASE("a sharded load from a checkpoint reads this rank's ranges and checks every slice once",
          "[train][zero]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = l3::test::shared_directory(world, "train", "sharded-ckpt");
  const l3::model::ModelConfig config = l3::model::preset("tiny");
  const l3::model::ParameterLayout layout(config, l3::model::HeadKind::language_model);
  // A checkpoint written by the ranks' ZeRO-1 pieces of one plan...
  const l3::parallel::ShardPlan written(
      {.total = layout.total(), .ranks = world.size(), .bucket_elements = 4096});
  l3::ckpt::RankState state;
  state.allocate(written.owned(world.rank()));
  l3::model::initialize_parameter_ranges(state.master, layout, 21, state.ranges);
  std::fill(state.exp_avg.begin(), state.exp_avg.end(), 0.0F);
  std::fill(state.exp_avg_sq.begin(), state.exp_avg_sq.end(), 0.0F);
  {
    l3::ckpt::CheckpointWriter writer(world, dir, {.keep_last = 2, .async = false});
    writer.write(layout,
                 l3::ckpt::describe_checkpoint({.step = 1,
                                                .phase = l3::Phase::sft,
                                                .head = l3::model::HeadKind::language_model,
                                                .model = config,
                                                .world_size = world.size()}),
                 std::move(state));
    REQUIRE(writer.wait());
  }
  const l3::train::ModelSource source = l3::train::resolve_model_source("", dir);
  REQUIRE(source.checkpoint);
  std::vector<float> whole(static_cast<std::size_t>(layout.total()), 0.0F);
  l3::ckpt::read_model_file(source.step_dir + "/" + std::string(l3::ckpt::kModelFile), layout,
                            whole);

  // ... read back through another plan (the groups of ZeRO-3, other bucket sizes).
  const l3::parallel::ShardPlan plan({.total = layout.total(),
                                      .groups = layout.gradient_groups(),
                                      .ranks = world.size(),
                                      .bucket_elements = 1000});
  const std::vector<l3::model::FlatRange> mine = plan.owned(world.rank());
  const std::vector<float> loaded =
      l3::train::initial_weights_of_ranges(world, layout, source, 99, mine);
  std::size_t at = 0;
  std::int64_t wrong = 0;
  for (const l3::model::FlatRange& r : mine) {
    for (std::int64_t i = r.begin; i < r.end; ++i, ++at)
      if (loaded[at] != whole[static_cast<std::size_t>(i)]) ++wrong;
  }
  CHECK(wrong == 0);

  // One value of the last block's down_proj changed in the file: whichever rank checks that
  // slice finds it, and every rank reports it.
  world.barrier();
  if (world.is_root()) {
    const std::string path = source.step_dir + "/" + std::string(l3::ckpt::kModelFile);
    const std::string name =
        fmt::format("model.layers.{}.mlp.down_proj.weight", config.n_layers - 1);
    const l3::model::TensorInfo& t = layout.find(name);
    REQUIRE(damage_value(path, whole.data() + t.offset, 64));
  }
  world.barrier();
  int named = 0;  // this rank found the damage and names it
  try {
    (void)l3::train::initial_weights_of_ranges(world, layout, source, 99, mine);
    FAIL("a damaged model.h5 was loaded");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::bad_input);
    CHECK_THAT(std::string(e.what()), Catch::Contains("model.h5") &&
                                          Catch::Contains("mlp.down_proj.weight") &&
                                          Catch::Contains("checksum mismatch"));
    named = 1;
  } catch (const l3::core::PeerFailure& e) {
    CHECK(e.exit_code() == 2);  // the others learn that a rank failed on bad input
  }
  int naming = 0;
  MPI_Allreduce(&named, &naming, 1, MPI_INT, MPI_SUM, world.comm());
  CHECK(naming == 1);  // the slice is checked once, by one rank
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

// Tensor parallelism holds a row-parallel weight as a few columns of every row: one run per row.
// The checkpoint writes each rank's runs of a tensor as one block slice ([first, count, hashes,
// rows, stride]), not one slice per row; verification, the whole-tensor digests and reads by
// other ranges take blocks as they take plain slices, and damage inside a block is named.
TEST_CASE("a tensor-parallel rank's columns of every row are one block slice in the manifest",
          "[train][ckpt]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const int ranks = world.size();
  const std::string dir = l3::test::shared_directory(world, "train", "block-slices");
  const l3::model::ModelConfig config = l3::model::preset("tiny");
  const l3::model::ParameterLayout layout(config, l3::model::HeadKind::language_model);
  const l3::model::TensorInfo& down = layout.find("model.layers.0.mlp.down_proj.weight");
  const std::int64_t rows = down.shape[0];
  const std::int64_t columns = down.shape[1];
  REQUIRE(columns % ranks == 0);
  const std::int64_t width = columns / ranks;
  // This rank: its columns of every row of down_proj; rank 0 also every other tensor whole.
  std::vector<l3::model::FlatRange> ranges;
  if (world.is_root() && down.offset > 0) ranges.push_back({0, down.offset});
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t begin = down.offset + r * columns + world.rank() * width;
    ranges.push_back({begin, begin + width});
  }
  if (world.is_root()) {
    const std::int64_t end = down.offset + down.numel;
    if (ranks == 1)
      ranges = {{0, layout.total()}};
    else if (end < layout.total())
      ranges.push_back({end, layout.total()});
  }
  std::vector<float> whole(static_cast<std::size_t>(layout.total()), 0.0F);
  l3::model::initialize_parameter_ranges(whole, layout, 5, {{0, layout.total()}});
  l3::ckpt::RankState state;
  state.allocate(ranges);
  std::size_t at = 0;
  for (const l3::model::FlatRange& r : state.ranges) {
    for (std::int64_t i = r.begin; i < r.end; ++i, ++at) {
      state.master[at] = whole[static_cast<std::size_t>(i)];
      state.exp_avg[at] = 0.5F * whole[static_cast<std::size_t>(i)];
      state.exp_avg_sq[at] = static_cast<float>(i % 97) / 97.0F;
    }
  }
  // The blocks: down_proj in one (rows runs of `width` every `columns`); the rest plain.
  const std::vector<l3::ckpt::TensorBlock> blocks = l3::ckpt::tensor_blocks(layout, state.ranges);
  const auto down_index = static_cast<std::size_t>(&down - layout.tensors().data());
  const auto mine = std::count_if(blocks.begin(), blocks.end(),
                                  [&](const auto& b) { return b.tensor == down_index; });
  CHECK(mine == 1);
  for (const l3::ckpt::TensorBlock& b : blocks) {
    if (b.tensor != down_index || ranks == 1) {
      CHECK(b.rows == 1);
    } else {
      CHECK((b.first == world.rank() * width && b.count == width && b.rows == rows &&
             b.stride == columns));
    }
  }
  {
    l3::ckpt::CheckpointWriter writer(world, dir, {.keep_last = 2, .async = false});
    writer.write(layout,
                 l3::ckpt::describe_checkpoint({.step = 1,
                                                .phase = l3::Phase::sft,
                                                .head = l3::model::HeadKind::language_model,
                                                .model = config,
                                                .world_size = ranks}),
                 std::move(state));
    REQUIRE(writer.wait());
  }
  const std::string step_dir = dir + "/step-00000001";
  const l3::ckpt::Verification v = l3::ckpt::verify_checkpoint(step_dir, true);
  REQUIRE(v.ok);
  const nlohmann::json* entry = nullptr;
  for (const nlohmann::json& t : v.manifest.tensors)
    if (t.at("name") == down.name) entry = &t;
  REQUIRE(entry != nullptr);
  const nlohmann::json& slices = entry->at("slices");
  CHECK(slices.size() == static_cast<std::size_t>(ranks));  // not ranks x rows
  if (ranks > 1) {
    CHECK(slices[0].size() == 7);
    CHECK(slices[0][5] == rows);
    CHECK(slices[0][6] == columns);
  }
  // The whole tensor's digest, whatever the slicing: the xxHash64 of its values in order.
  const std::span<const float> down_values(whole.data() + down.offset,
                                           static_cast<std::size_t>(down.numel));
  CHECK(v.digests["model.h5"][down.name] ==
        l3::ckpt::to_hex(l3::ckpt::xxh64(std::as_bytes(down_values))));
  // Read back through other ranges (a 1-rank run's, and plan pieces): the written values.
  const l3::parallel::ShardPlan plan(
      {.total = layout.total(), .ranks = ranks, .bucket_elements = 1000});
  const l3::ckpt::RankState back =
      l3::ckpt::read_rank_state(step_dir, layout, plan.owned(world.rank()));
  at = 0;
  std::int64_t wrong = 0;
  for (const l3::model::FlatRange& r : back.ranges) {
    for (std::int64_t i = r.begin; i < r.end; ++i, ++at) {
      if (back.master[at] != whole[static_cast<std::size_t>(i)] ||
          back.exp_avg[at] != 0.5F * whole[static_cast<std::size_t>(i)])
        ++wrong;
    }
  }
  CHECK(wrong == 0);

  // One value of the last rank's block (row 3) changed in model.h5: verification names the
  // tensor and the block.
  world.barrier();
  if (world.is_root()) {
    const std::string path = step_dir + "/" + std::string(l3::ckpt::kModelFile);
    REQUIRE(damage_value(path, whole.data() + down.offset + 3 * columns + (ranks - 1) * width, 32));
    const l3::ckpt::Verification damaged = l3::ckpt::verify_checkpoint(step_dir, true);
    CHECK_FALSE(damaged.ok);
    CHECK_THAT(damaged.problem,
               Catch::Contains("model.h5") && Catch::Contains(down.name) &&
                   Catch::Contains(ranks > 1 ? fmt::format("the {} runs of {} elements every {}",
                                                           rows, width, columns)
                                             : std::string("checksum mismatch in elements")));
  }
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}

// A block's rows are evenly spaced runs of one tensor, back to back in the state: a run that
// breaks the spacing, changes length or crosses into another tensor starts a new block.
TEST_CASE("tensor_blocks merges evenly spaced runs of one tensor only", "[ckpt]") {
  const l3::model::ModelConfig config = l3::model::preset("tiny");
  const l3::model::ParameterLayout layout(config, l3::model::HeadKind::language_model);
  const l3::model::TensorInfo& t = layout.find("model.layers.0.self_attn.o_proj.weight");
  const std::int64_t o = t.offset;
  const std::int64_t row = t.shape[1];
  const l3::model::TensorInfo& next = *(&t + 1);  // after its alignment padding, if any
  // a partial row, three runs of 4 a row apart, one two rows on, one of 3, then a run that
  // spans into the next tensor
  const std::vector<l3::model::FlatRange> ranges = {{o + 1, o + 4},
                                                    {o + row, o + row + 4},
                                                    {o + 2 * row, o + 2 * row + 4},
                                                    {o + 3 * row, o + 3 * row + 4},
                                                    {o + 5 * row, o + 5 * row + 4},
                                                    {o + 6 * row, o + 6 * row + 3},
                                                    {o + t.numel - 2, next.offset + 2}};
  const std::vector<l3::ckpt::TensorBlock> b = l3::ckpt::tensor_blocks(layout, ranges);
  REQUIRE(b.size() == 6);
  CHECK((b[0].first == 1 && b[0].count == 3 && b[0].rows == 1 && b[0].position == 0));
  CHECK((b[1].first == row && b[1].count == 4 && b[1].rows == 3 && b[1].stride == row &&
         b[1].position == 3));
  CHECK((b[2].first == 5 * row && b[2].count == 4 && b[2].rows == 1 && b[2].position == 15));
  CHECK((b[3].first == 6 * row && b[3].count == 3 && b[3].rows == 1));
  CHECK((b[4].first == t.numel - 2 && b[4].count == 2));
  CHECK((b[5].tensor == b[4].tensor + 1 && b[5].first == 0 && b[5].count == 2));
}

// export streams: the exporter holds one tensor at a time, not the model (rank 0 exports a
// checkpoint the ranks wrote; its peak resident memory grows by about the largest tensor).
TEST_CASE("export holds one tensor at a time, not the model", "[train][memory]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  const std::string dir = l3::test::shared_directory(world, "train", "export-memory");
  // 37M parameters: 148 MB in fp32; the largest tensor (embedding, lm_head) 4M values.
  const l3::model::ModelConfig config = wide_model(2);
  const l3::model::ParameterLayout layout(config, l3::model::HeadKind::language_model);
  const l3::parallel::ShardPlan plan(
      {.total = layout.total(), .ranks = world.size(), .bucket_elements = std::int64_t{1} << 20});
  l3::ckpt::RankState state;
  state.allocate(plan.owned(world.rank()));
  l3::model::initialize_parameter_ranges(state.master, layout, 5, state.ranges);
  std::fill(state.exp_avg.begin(), state.exp_avg.end(), 0.0F);
  std::fill(state.exp_avg_sq.begin(), state.exp_avg_sq.end(), 0.0F);
  {
    l3::ckpt::CheckpointWriter writer(world, dir + "/ckpt", {.keep_last = 2, .async = false});
    writer.write(layout,
                 l3::ckpt::describe_checkpoint({.step = 1,
                                                .phase = l3::Phase::sft,
                                                .head = l3::model::HeadKind::language_model,
                                                .model = config,
                                                .world_size = world.size()}),
                 std::move(state));
    REQUIRE(writer.wait());
  }
  if (world.is_root()) {
    std::int64_t largest = 0;
    for (const l3::model::TensorInfo& t : layout.tensors()) largest = std::max(largest, t.numel);
    const bool reset = reset_peak_rss();
    const std::int64_t before = peak_rss_bytes();
    const l3::ckpt::HfExportReport report =
        l3::ckpt::export_hugging_face(dir + "/ckpt", dir + "/hf", {.bf16 = true});
    const std::int64_t grown = peak_rss_bytes() - before;
    const std::int64_t bound = 4 * largest + (std::int64_t{32} << 20);
    INFO(fmt::format("export of {:.1f} MB of fp32 weights: peak grew {:.1f} MB (bound {:.1f} MB)",
                     4e-6 * static_cast<double>(layout.total()), 1e-6 * static_cast<double>(grown),
                     1e-6 * static_cast<double>(bound)));
    CHECK(report.tensor_bytes == 2 * static_cast<std::uint64_t>(layout.parameter_count()));
    if (reset) CHECK(grown <= bound);
    CHECK(bound < 4 * layout.total() / 2);  // the bound excludes the model
  }
  world.barrier();
  if (world.is_root()) fs::remove_all(dir);
}
