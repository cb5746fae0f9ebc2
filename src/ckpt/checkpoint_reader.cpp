#include "ckpt/checkpoint_reader.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/tensor_file.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/path_safety.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One slice of the manifest's tensor table: [first, count, model, exp_avg, exp_avg_sq], `count`
// elements from `first`; or a block, [first, count, model, exp_avg, exp_avg_sq, rows, stride]:
// `rows` runs of `count` elements, the r-th from first + r * stride, hashed one after another.
struct SliceEntry {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t rows = 1;
  std::int64_t stride = 0;
  std::array<std::string, 3> hashes;  // model, exp_avg, exp_avg_sq

  [[nodiscard]] std::int64_t run_first(std::int64_t r) const noexcept { return first + r * stride; }
};

// A slice of `info`, its bounds checked (bad input naming the file and the tensor).
SliceEntry slice_entry(const json& s, const model::TensorInfo& info, const std::string& file) {
  const auto bad = [&] {
    return core::bad_input("a slice in the manifest lies outside the tensor or is malformed",
                           {.file = file, .tensor = info.name});
  };
  if (!s.is_array() || (s.size() != 5 && s.size() != 7)) throw bad();
  SliceEntry e;
  try {
    e.first = s.at(0).get<std::int64_t>();
    e.count = s.at(1).get<std::int64_t>();
    for (std::size_t c = 0; c < 3; ++c) e.hashes[c] = s.at(2 + c).get<std::string>();
    e.stride = e.count;
    if (s.size() == 7) {
      e.rows = s.at(5).get<std::int64_t>();
      e.stride = s.at(6).get<std::int64_t>();
    }
  } catch (const json::exception&) {
    throw bad();
  }
  // Runs that do not overlap (stride >= count), all inside the tensor.
  if (e.first < 0 || e.count <= 0 || e.rows < 1 || e.stride < e.count ||
      e.rows - 1 > (info.numel - e.first - e.count) / e.stride || e.first + e.count > info.numel) {
    throw bad();
  }
  return e;
}

std::string describe(const SliceEntry& e) {
  if (e.rows == 1) return fmt::format("elements [{}, {})", e.first, e.first + e.count);
  return fmt::format("the {} runs of {} elements every {} from element {}", e.rows, e.count,
                     e.stride, e.first);
}

// Every slice's runs, by their first element.
struct SliceRunRef {
  std::int64_t first = 0;
  std::size_t slice = 0;
};
std::vector<SliceRunRef> runs_in_order(const std::vector<SliceEntry>& slices) {
  std::vector<SliceRunRef> runs;
  for (std::size_t i = 0; i < slices.size(); ++i)
    for (std::int64_t r = 0; r < slices[i].rows; ++r) runs.push_back({slices[i].run_first(r), i});
  std::stable_sort(runs.begin(), runs.end(),
                   [](const SliceRunRef& a, const SliceRunRef& b) { return a.first < b.first; });
  return runs;
}

// The checks; throws a core::Error describing the first problem.
void check(const std::string& step_dir, bool checksums, Verification& v) {
  v.manifest = read_manifest(step_dir);
  const Manifest& m = v.manifest;
  if (!m.resumable()) {
    throw core::bad_input(
        "no optimizer state (model.h5 only): it can initialise a run with "
        "--init, not resume one",
        {.file = step_dir});
  }
  const model::ParameterLayout layout = m.layout();  // a LoRA run's: its adapters
  const auto& tensors = layout.tensors();
  if (m.tensors.size() != tensors.size()) {
    throw core::bad_input(fmt::format("the tensor table lists {} tensors, the model has {}",
                                      m.tensors.size(), tensors.size()),
                          {.file = step_dir});
  }
  for (const char* file : {"model.h5", "optim.h5"}) {
    const fs::path path = fs::path(step_dir) / file;
    if (!fs::is_regular_file(path)) throw core::bad_input("missing", {.file = path.string()});
    const auto expected = m.files.value(file, json::object()).value("bytes", std::int64_t{-1});
    const auto actual = static_cast<std::int64_t>(fs::file_size(path));
    if (expected != actual) {
      throw core::bad_input(fmt::format("{} bytes where the manifest says {}", actual, expected),
                            {.file = path.string()});
    }
  }
  TensorFileReader model_file((fs::path(step_dir) / kModelFile).string());
  TensorFileReader optim_file((fs::path(step_dir) / kOptimFile).string());
  if (model_file.text_attribute("format") != "llama3-hpc/model" ||
      optim_file.text_attribute("format") != "llama3-hpc/optimizer") {
    throw core::bad_input("model.h5 or optim.h5 has the wrong format attribute",
                          {.file = step_dir});
  }
  json digests = {{"model.h5", json::object()}, {"optim.h5", json::object()}};
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const model::TensorInfo& info = tensors[t];
    const json& entry = m.tensors[t];
    if (entry.value("name", "") != info.name ||
        entry.value("shape", std::vector<std::int64_t>{}) != info.shape) {
      throw core::bad_input(fmt::format("the tensor table's entry {} is not {} of shape {}", t,
                                        info.name, json(info.shape).dump()),
                            {.file = step_dir});
    }
    // The slices must tile the tensor exactly: their runs, in element order, from 0 to numel.
    std::vector<SliceEntry> slices;
    for (const json& s : entry.at("slices")) slices.push_back(slice_entry(s, info, step_dir));
    const std::vector<SliceRunRef> runs = runs_in_order(slices);
    std::int64_t next = 0;
    for (const SliceRunRef& r : runs) {
      if (r.first != next) {
        throw core::bad_input("its slices do not cover the tensor exactly",
                              {.file = step_dir, .tensor = info.name});
      }
      next += slices[r.slice].count;
    }
    if (next != info.numel) {
      throw core::bad_input("its slices do not cover the tensor exactly",
                            {.file = step_dir, .tensor = info.name});
    }
    // Opening the datasets checks their presence and shapes.
    std::vector<float> probe(0);
    model_file.read(info.name, info.shape, 0, probe);
    optim_file.read("exp_avg/" + info.name, info.shape, 0, probe);
    optim_file.read("exp_avg_sq/" + info.name, info.shape, 0, probe);
    if (!checksums) continue;

    // One pass over the tensor in element order: each run read once feeds the whole tensor's
    // digest and its slice's (a block's runs come in its row order, as its writer hashed them).
    Xxh64Stream whole_model;
    Xxh64Stream whole_m;
    Xxh64Stream whole_v;
    // The three datasets of the tensor, in the order of a slice's hashes (named once: a
    // tensor-parallel block has a run per row).
    struct Part {
      TensorFileReader& file;
      const char* file_name;
      std::string dataset;
      Xxh64Stream& whole;
    };
    const std::array<Part, 3> parts = {
        Part{model_file, "model.h5", info.name, whole_model},
        Part{optim_file, "optim.h5", "exp_avg/" + info.name, whole_m},
        Part{optim_file, "optim.h5", "exp_avg_sq/" + info.name, whole_v}};
    std::vector<std::array<Xxh64Stream, 3>> per_slice(slices.size());
    std::vector<float> buffer;
    for (const SliceRunRef& r : runs) {
      buffer.resize(static_cast<std::size_t>(slices[r.slice].count));
      for (std::size_t c = 0; c < parts.size(); ++c) {
        parts[c].file.read(parts[c].dataset, info.shape, r.first, buffer);
        const auto bytes = std::as_bytes(std::span<const float>(buffer));
        per_slice[r.slice][c].update(bytes);
        parts[c].whole.update(bytes);
        v.bytes += static_cast<std::int64_t>(bytes.size());
      }
    }
    for (std::size_t i = 0; i < slices.size(); ++i) {
      for (std::size_t c = 0; c < parts.size(); ++c) {
        if (to_hex(per_slice[i][c].digest()) != slices[i].hashes[c]) {
          throw core::bad_input(fmt::format("checksum mismatch in {}", describe(slices[i])),
                                {.file = (fs::path(step_dir) / parts[c].file_name).string(),
                                 .tensor = parts[c].dataset});
        }
      }
    }
    digests["model.h5"][info.name] = to_hex(whole_model.digest());
    digests["optim.h5"]["exp_avg/" + info.name] = to_hex(whole_m.digest());
    digests["optim.h5"]["exp_avg_sq/" + info.name] = to_hex(whole_v.digest());
  }
  if (checksums) v.digests = std::move(digests);
}

// step-N.damaged, or step-N.damaged-2, ... when that exists already (a link included).
fs::path damaged_name(const fs::path& dir) {
  fs::path target = dir.string() + std::string(kDamagedSuffix);
  for (int i = 2; core::entry_exists(target); ++i)
    target = fmt::format("{}{}-{}", dir.string(), kDamagedSuffix, i);
  return target;
}

// The reason a directory was set aside, in a file created in it (never through a link: a step
// directory that is a link is renamed, and nothing written into what it points to).
void record_why_damaged(const fs::path& aside, const std::string& problem) {
  if (!core::is_real_directory(aside)) return;
  try {
    const int fd = core::create_exclusive((aside / "why-damaged.txt").string());
    const std::string text = problem + "\n";
    const ssize_t n = ::write(fd, text.data(), text.size());
    ::close(fd);
    (void)n;                      // the reason is a courtesy: the rename is what counts
  } catch (const core::Error&) {  // e.g. one from an earlier fallback is there already
  }
}

}  // namespace

Verification verify_checkpoint(const std::string& step_dir, bool checksums) {
  Verification v;
  try {
    check(step_dir, checksums, v);
    v.ok = true;
  } catch (...) {
    v.problem = core::summarize(std::current_exception()).text;
  }
  return v;
}

ResumePick pick_resume_checkpoint(const std::string& root, bool checksums) {
  ResumePick pick;
  for (const std::string& name : step_directories(root)) {
    const fs::path dir = fs::path(root) / name;
    // A run resumes only from step directories it wrote: a link under a step's name is not one.
    Verification v;
    if (core::is_real_directory(dir)) {
      v = verify_checkpoint(dir.string(), checksums);
    } else {
      v.problem = "a symbolic link, not a step directory llama3-hpc wrote";
    }
    if (v.ok) {
      pick.step_dir = dir.string();
      break;
    }
    pick.rejected.push_back(fmt::format("{}: {}", name, v.problem));
    const fs::path aside = damaged_name(dir);
    core::rename_path(dir.string(), aside.string());  // a link is renamed itself
    record_why_damaged(aside, v.problem);
  }
  // `latest` names the pick (it may have named a damaged, missing or partial directory).
  if (!pick.step_dir.empty()) {
    const std::string name = fs::path(pick.step_dir).filename().string();
    std::string latest;
    try {
      latest = read_latest(root);
    } catch (const core::Error&) {  // unreadable: replaced below
    }
    if (latest != name)
      core::write_file_atomically((fs::path(root) / kLatestFile).string(), name + "\n");
  }
  return pick;
}

namespace {

// The manifest's slices of one tensor against its values (the whole tensor).
void check_tensor_slices(const json& entry, const std::string& file,
                         const model::TensorInfo& tensor, std::span<const float> values) {
  for (const json& s : entry.at("slices")) {
    const SliceEntry e = slice_entry(s, tensor, file);
    Xxh64Stream hash;
    for (std::int64_t r = 0; r < e.rows; ++r) {
      hash.update(std::as_bytes(values.subspan(static_cast<std::size_t>(e.run_first(r)),
                                               static_cast<std::size_t>(e.count))));
    }
    if (to_hex(hash.digest()) != e.hashes[0]) {
      throw core::bad_input(
          fmt::format("checksum mismatch in {}: the file is damaged", describe(e)),
          {.file = file, .tensor = tensor.name});
    }
  }
}

}  // namespace

void check_loaded_model(const Manifest& manifest, const std::string& step_dir,
                        const model::ParameterLayout& layout, std::span<const float> flat,
                        const std::function<bool(const std::string&)>& skip) {
  const std::string file = (fs::path(step_dir) / kModelFile).string();
  for (const json& entry : manifest.tensors) {
    const std::string name = entry.at("name").get<std::string>();
    const auto known = std::find_if(layout.tensors().begin(), layout.tensors().end(),
                                    [&](const model::TensorInfo& t) { return t.name == name; });
    if (known == layout.tensors().end() || (skip && skip(name))) continue;
    check_tensor_slices(entry, file, *known,
                        flat.subspan(static_cast<std::size_t>(known->offset),
                                     static_cast<std::size_t>(known->numel)));
  }
}

void check_loaded_tensor(const Manifest& manifest, const std::string& step_dir,
                         const model::TensorInfo& tensor, std::span<const float> values) {
  for (const json& entry : manifest.tensors) {
    if (entry.at("name").get<std::string>() == tensor.name) {
      check_tensor_slices(entry, (fs::path(step_dir) / kModelFile).string(), tensor, values);
      return;
    }
  }
}

RankState read_rank_state(const std::string& step_dir, const model::ParameterLayout& layout,
                          std::vector<model::FlatRange> ranges) {
  RankState state;
  state.allocate(std::move(ranges));
  TensorFileReader model_file((fs::path(step_dir) / kModelFile).string());
  TensorFileReader optim_file((fs::path(step_dir) / kOptimFile).string());
  for (const TensorSlice& s : tensor_slices(layout, state.ranges)) {
    const model::TensorInfo& info = layout.tensors()[s.tensor];
    const auto at = static_cast<std::size_t>(s.position);
    const auto n = static_cast<std::size_t>(s.count);
    model_file.read(info.name, info.shape, s.first, std::span(state.master).subspan(at, n));
    optim_file.read("exp_avg/" + info.name, info.shape, s.first,
                    std::span(state.exp_avg).subspan(at, n));
    optim_file.read("exp_avg_sq/" + info.name, info.shape, s.first,
                    std::span(state.exp_avg_sq).subspan(at, n));
  }
  return state;
}

void check_model_share(const Manifest& manifest, const std::string& step_dir,
                       const model::ParameterLayout& layout,
                       const std::function<bool(const std::string&)>& skip, int part, int parts) {
  const std::string file = (fs::path(step_dir) / kModelFile).string();
  TensorFileReader model_file(file);
  std::vector<float> buffer;
  std::int64_t index = 0;  // the slices of every tensor, numbered in the manifest's order
  for (const json& entry : manifest.tensors) {
    const std::string name = entry.at("name").get<std::string>();
    const auto known = std::find_if(layout.tensors().begin(), layout.tensors().end(),
                                    [&](const model::TensorInfo& t) { return t.name == name; });
    const bool checked = known != layout.tensors().end() && !(skip && skip(name));
    for (const json& s : entry.at("slices")) {
      if (index++ % parts != part || !checked) continue;
      const SliceEntry e = slice_entry(s, *known, file);
      Xxh64Stream hash;
      buffer.resize(static_cast<std::size_t>(e.count));
      for (std::int64_t r = 0; r < e.rows; ++r) {
        model_file.read(name, known->shape, e.run_first(r), buffer);
        hash.update(std::as_bytes(std::span<const float>(buffer)));
      }
      if (to_hex(hash.digest()) != e.hashes[0]) {
        throw core::bad_input(
            fmt::format("checksum mismatch in {}: the file is damaged", describe(e)),
            {.file = file, .tensor = name});
      }
    }
  }
}

}  // namespace l3::ckpt
