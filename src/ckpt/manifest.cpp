#include "ckpt/manifest.hpp"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_paths.hpp"
#include "core/bounded_read.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "dist/library_versions.hpp"

namespace l3::ckpt {

using nlohmann::json;

namespace {

// A manifest's size: its tensor table has a slice per tensor and rank boundary, some 100,000
// values for a 405B model on 16,384 ranks; anything far beyond is not a manifest of ours, and is
// refused before it takes the memory its parsed form would.
constexpr std::size_t kMaxManifestBytes = std::size_t{64} << 20U;
constexpr std::int64_t kMaxManifestValues = std::int64_t{1} << 22U;

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

}  // namespace

Manifest describe_checkpoint(const RunFacts& run) {
  Manifest m;
  m.step = run.step;
  m.phase = run.phase;
  m.head = run.head;
  m.model = run.model;
  m.world_size = run.world_size;
  m.data_epoch = run.data_epoch;
  m.data_step = run.data_step;
  m.finished = run.finished;
  m.tokenizer_sha256 = run.tokenizer_sha256;
  m.tokenizer = run.tokenizer;
  m.config = run.config;
  const core::BuildInfo build = core::build_info();
  m.program_version = build.version;
  m.git_commit = build.git_commit;
  for (const core::LibraryVersion& library : dist::library_versions())
    m.libraries[library.name] = library.version;
  m.created_utc = utc_now();
  m.adamw_step = run.adamw_step;
  m.skipped_steps = run.skipped_steps;
  m.trained_tokens = run.trained_tokens;
  m.trained_seconds = run.trained_seconds;
  // What the schedule and the random streams need is the step and the data position above;
  // these say so explicitly, for readers and for checks on resume.
  m.schedule = {{"kind", "linear warmup, cosine decay"},   {"lr", run.schedule.lr},
                {"min_lr", run.schedule.min_lr},           {"warmup", run.schedule.warmup},
                {"total_steps", run.schedule.total_steps}, {"next_lr", run.schedule.next_lr}};
  m.rng = {{"generator", "philox4x32-10"},
           {"seed", run.seed},
           {"state",
            "counter-based: every draw is keyed by (seed, purpose, stream, index) and the data "
            "order by (seed, epoch); nothing else to save"}};
  m.metrics = run.metrics;
  m.lora = run.lora;
  m.base = run.base;
  m.base_xxh64 = run.base_xxh64;
  m.reference = run.reference;
  m.run_key = run.run_key;
  m.run_id = run.run_id;
  return m;
}

model::ParameterLayout Manifest::layout() const {
  return lora ? model::ParameterLayout(model, head, *lora) : model::ParameterLayout(model, head);
}

std::string_view head_name(model::HeadKind head) noexcept {
  return head == model::HeadKind::reward ? "reward" : "language_model";
}

json Manifest::to_json() const {
  json out = {{"format", kCheckpointFormat},
              {"version", kCheckpointVersion},
              {"step", step},
              {"phase", core::phase_name(phase)},
              {"head", head_name(head)},
              {"model", model.to_hf_json()},
              {"world_size", world_size},
              {"data_position", {{"epoch", data_epoch}, {"step", data_step}}},
              {"finished", finished},
              {"tokenizer", {{"sha256", tokenizer_sha256}, {"name", tokenizer}}},
              {"config", config},
              {"program", {{"version", program_version}, {"git_commit", git_commit}}},
              {"libraries", libraries},
              {"created_utc", created_utc},
              {"optimizer", {{"adamw_step", adamw_step}}},
              {"progress",
               {{"skipped_steps", skipped_steps},
                {"trained_tokens", trained_tokens},
                {"trained_seconds", trained_seconds}}},
              {"lr_schedule", schedule},
              {"rng", rng},
              {"metrics", metrics},
              {"files", files},
              {"tensors", tensors}};
  if (!reference.empty()) out["reference"] = reference;
  if (!run_key.empty()) out["run_key"] = run_key;
  if (!run_id.empty()) out["run_id"] = run_id;
  if (lora) {
    out["lora"] = {{"r", lora->rank},
                   {"alpha", lora->alpha},
                   {"rslora", lora->rslora},
                   {"dropout", lora->dropout},
                   {"targets", lora->targets_text()},
                   {"base", {{"init", base}, {"tensors_xxh64", base_xxh64}}}};
  }
  return out;
}

Manifest Manifest::from_json(const json& j, const std::string& origin) {
  try {
    if (j.value("format", "") != kCheckpointFormat) {
      throw core::bad_input(
          fmt::format("not a checkpoint manifest (format is not \"{}\")", kCheckpointFormat),
          {.file = origin});
    }
    if (j.at("version").get<std::int64_t>() != kCheckpointVersion) {
      throw core::bad_input(
          fmt::format("checkpoint version {} is not supported", j.at("version").dump()),
          {.file = origin});
    }
    Manifest m;
    m.step = j.at("step").get<std::int64_t>();
    const std::string phase = j.at("phase").get<std::string>();
    const std::optional<Phase> parsed = core::parse_phase(phase);
    if (!parsed) throw core::bad_input(fmt::format("unknown phase '{}'", phase), {.file = origin});
    m.phase = *parsed;
    const std::string head = j.at("head").get<std::string>();
    if (head != "reward" && head != "language_model") {
      throw core::bad_input(fmt::format("unknown head '{}'", head), {.file = origin});
    }
    m.head = head == "reward" ? model::HeadKind::reward : model::HeadKind::language_model;
    m.model = model::from_hf_config(j.at("model"), origin);
    m.world_size = j.at("world_size").get<int>();
    m.data_epoch = j.at("data_position").at("epoch").get<std::int64_t>();
    m.data_step = j.at("data_position").at("step").get<std::int64_t>();
    m.finished = j.value("finished", false);
    const json tokenizer = j.value("tokenizer", json::object());
    m.tokenizer_sha256 = tokenizer.value("sha256", "");
    m.tokenizer = tokenizer.value("name", "");
    m.config = j.value("config", json::object());
    const json program = j.value("program", json::object());
    m.program_version = program.value("version", "");
    m.git_commit = program.value("git_commit", "");
    m.created_utc = j.value("created_utc", "");
    m.libraries = j.value("libraries", json::object());
    m.adamw_step = j.value("optimizer", json::object()).value("adamw_step", std::int64_t{0});
    const json progress = j.value("progress", json::object());
    m.skipped_steps = progress.value("skipped_steps", std::int64_t{0});
    m.trained_tokens = progress.value("trained_tokens", std::int64_t{0});
    m.trained_seconds = progress.value("trained_seconds", 0.0);
    m.schedule = j.value("lr_schedule", json::object());
    m.rng = j.value("rng", json::object());
    m.metrics = j.value("metrics", json::object());
    m.files = j.value("files", json::object());
    if (!m.files.is_object()) m.files = json::object();
    if (const auto lora = j.find("lora"); lora != j.end() && !lora->is_null()) {
      model::LoraConfig c;
      c.rank = lora->at("r").get<int>();
      c.alpha = lora->at("alpha").get<double>();
      c.rslora = lora->value("rslora", false);
      c.dropout = lora->value("dropout", 0.0);
      try {
        c.targets = model::parse_lora_targets(lora->at("targets").get<std::string>());
        c.validate();
      } catch (const core::Error& e) {
        throw core::bad_input(fmt::format("malformed manifest: \"lora\": {}", e.message()),
                              {.file = origin});
      }
      m.lora = c;
      const json base = lora->value("base", json::object());
      m.base = base.value("init", "");
      // Empty for the whole-buffer digest ("weights_xxh64") of earlier versions: not comparable.
      m.base_xxh64 = base.value("tensors_xxh64", "");
    }
    m.run_key = j.value("run_key", "");
    if (const auto id = j.find("run_id"); id != j.end()) {
      if (!id->is_string() || id->get_ref<const std::string&>().size() > 64)
        throw core::bad_input("malformed manifest: \"run_id\" is not a short string",
                              {.file = origin});
      m.run_id = id->get<std::string>();
    }
    m.reference = j.value("reference", json::object());
    if (!m.reference.is_object())
      throw core::bad_input("malformed manifest: \"reference\" is not an object", {.file = origin});
    m.tensors = j.value("tensors", json::array());
    if (!m.tensors.is_array())
      throw core::bad_input("malformed manifest: \"tensors\" is not a list", {.file = origin});
    // Counts that no run could have written are a damaged or foreign manifest, not a position
    // to resume from.
    if (m.step < 0 || m.world_size < 1 || m.data_epoch < 0 || m.data_step < 0 || m.adamw_step < 0 ||
        m.adamw_step > m.step || m.skipped_steps < 0) {
      throw core::bad_input(
          fmt::format("malformed manifest: step {}, world_size {}, data_position {}/{}, "
                      "adamw_step {} cannot describe a run",
                      m.step, m.world_size, m.data_epoch, m.data_step, m.adamw_step),
          {.file = origin});
    }
    return m;
  } catch (const json::exception& e) {
    throw core::bad_input(fmt::format("malformed manifest: {}", e.what()), {.file = origin});
  }
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = (std::filesystem::path(step_dir) / kManifestFile).string();
  Manifest manifest = Manifest::from_json(
      core::read_json_object(path, "a checkpoint manifest", kMaxManifestBytes, kMaxManifestValues),
      path);
  // A step directory's name is its step: a copy or a rename under another step's name would be
  // taken for that step (resuming picks the highest, then overwrites the real later ones).
  std::filesystem::path dir = std::filesystem::path(step_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  if (const auto named = parse_step_dir_name(dir.filename().string());
      named && *named != manifest.step) {
    throw core::bad_input(fmt::format("the directory is named for step {}, its manifest is of "
                                      "step {} (a copy or a renamed directory)",
                                      *named, manifest.step),
                          {.file = path});
  }
  return manifest;
}

}  // namespace l3::ckpt
