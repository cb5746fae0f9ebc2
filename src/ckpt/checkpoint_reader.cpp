#include "ckpt/checkpoint_reader.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
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
    // The slices must tile the tensor exactly.
    std::int64_t next = 0;
    for (const json& s : entry.at("slices")) {
      if (s.at(0).get<std::int64_t>() != next || s.at(1).get<std::int64_t>() <= 0) {
        throw core::bad_input("its slices do not cover the tensor exactly",
                              {.file = step_dir, .tensor = info.name});
      }
      next += s.at(1).get<std::int64_t>();
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

    Xxh64Stream whole_model;
    Xxh64Stream whole_m;
    Xxh64Stream whole_v;
    std::vector<float> buffer;
    for (const json& s : entry.at("slices")) {
      const auto first = s.at(0).get<std::int64_t>();
      buffer.resize(static_cast<std::size_t>(s.at(1).get<std::int64_t>()));
      struct Part {
        TensorFileReader& file;
        std::string dataset;
        int column;
        Xxh64Stream& whole;
        const char* what;
      };
      for (const Part& p : {Part{model_file, info.name, 2, whole_model, "model.h5"},
                            Part{optim_file, "exp_avg/" + info.name, 3, whole_m, "optim.h5"},
                            Part{optim_file, "exp_avg_sq/" + info.name, 4, whole_v, "optim.h5"}}) {
        p.file.read(p.dataset, info.shape, first, buffer);
        const std::string hash = to_hex(xxh64(std::as_bytes(std::span<const float>(buffer))));
        if (hash != s.at(p.column).get<std::string>()) {
          throw core::bad_input(
              fmt::format("checksum mismatch in elements {}..{}", first,
                          first + static_cast<std::int64_t>(buffer.size())),
              {.file = (fs::path(step_dir) / p.what).string(), .tensor = p.dataset});
        }
        p.whole.update(std::as_bytes(std::span<const float>(buffer)));
        v.bytes += static_cast<std::int64_t>(buffer.size() * sizeof(float));
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
    const auto first = s.at(0).get<std::int64_t>();
    const auto count = s.at(1).get<std::int64_t>();
    if (first < 0 || count < 0 || first + count > tensor.numel) {
      throw core::bad_input("a slice in the manifest lies outside the tensor",
                            {.file = file, .tensor = tensor.name});
    }
    const std::span<const float> part =
        values.subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(count));
    if (to_hex(xxh64(std::as_bytes(part))) != s.at(2).get<std::string>()) {
      throw core::bad_input(
          fmt::format("checksum mismatch in elements [{}, {}): the file is damaged", first,
                      first + count),
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
      const auto first = s.at(0).get<std::int64_t>();
      const auto count = s.at(1).get<std::int64_t>();
      if (first < 0 || count < 0 || first + count > known->numel) {
        throw core::bad_input("a slice in the manifest lies outside the tensor",
                              {.file = file, .tensor = name});
      }
      buffer.resize(static_cast<std::size_t>(count));
      model_file.read(name, known->shape, first, buffer);
      if (to_hex(xxh64(std::as_bytes(std::span<const float>(buffer)))) !=
          s.at(2).get<std::string>()) {
        throw core::bad_input(
            fmt::format("checksum mismatch in elements [{}, {}): the file is damaged", first,
                        first + count),
            {.file = file, .tensor = name});
      }
    }
  }
}

}  // namespace l3::ckpt
