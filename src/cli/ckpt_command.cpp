#include "cli/ckpt_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"

namespace l3::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Entry {
  std::string name;
  fs::path path;
  std::int64_t step = -1;
  std::string state;  // complete, partial, damaged
};

std::int64_t directory_bytes(const fs::path& dir) {
  std::int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += static_cast<std::int64_t>(e.file_size(ec));
  }
  return total;
}

// Step directories of a root, newest first; or the one step directory given.
std::vector<Entry> entries_of(const std::string& dir) {
  std::vector<Entry> entries;
  const fs::path p(dir);
  if (!fs::is_directory(p)) throw core::bad_input("no such directory", {.file = dir});
  const std::string own_name = p.filename().string();
  if (fs::is_regular_file(p / ckpt::kManifestFile)) {
    entries.push_back({own_name, p, ckpt::parse_step_dir_name(own_name).value_or(-1), "complete"});
    return entries;
  }
  if (const auto step = ckpt::parse_step_dir_name(own_name)) {  // a step directory, broken
    entries.push_back({own_name, p, *step, "incomplete"});
    return entries;
  }
  for (const fs::directory_entry& e : fs::directory_iterator(p)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    std::string base = name;
    std::string state = "complete";
    if (const auto dot = name.find('.'); dot != std::string::npos) {
      base = name.substr(0, dot);
      const std::string suffix = name.substr(dot);
      state = suffix == ckpt::kPartialSuffix             ? "partial"
              : suffix.starts_with(ckpt::kDamagedSuffix) ? "damaged"
                                                         : "other";
    }
    const auto step = ckpt::parse_step_dir_name(base);
    if (!step || state == "other") continue;
    if (state == "complete" && !fs::is_regular_file(e.path() / ckpt::kManifestFile))
      state = "incomplete";
    entries.push_back({name, e.path(), *step, state});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.step != b.step ? a.step > b.step : a.name < b.name;
  });
  if (entries.empty()) {
    throw core::bad_input("no checkpoints here (no step-NNNNNNNN directories)", {.file = dir});
  }
  return entries;
}

int list(const std::string& dir, bool as_json) {
  const std::string latest = ckpt::read_latest(dir);
  json out = json::array();
  std::string text = fmt::format("{:<26} {:>10} {:<7} {:>6} {:>10}  {}\n", "checkpoint", "step",
                                 "phase", "ranks", "size", "state");
  for (const Entry& e : entries_of(dir)) {
    std::string phase = "-";
    int ranks = 0;
    std::string state = e.state;
    if (e.state == "complete") {
      try {
        const ckpt::Manifest m = ckpt::read_manifest(e.path.string());
        phase = m.phase;
        ranks = m.world_size;
        if (!m.resumable()) state = "complete (model only)";
        if (m.finished) state += ", finished";
      } catch (const core::Error& error) {
        state = fmt::format("unreadable manifest: {}", error.message());
      }
    }
    if (e.name == latest) state += ", latest";
    const std::int64_t bytes = directory_bytes(e.path);
    out.push_back({{"name", e.name},
                   {"step", e.step},
                   {"phase", phase},
                   {"world_size", ranks},
                   {"bytes", bytes},
                   {"state", state}});
    text += fmt::format("{:<26} {:>10} {:<7} {:>6} {:>8.1f}MB  {}\n", e.name, e.step, phase,
                        ranks == 0 ? std::string("-") : std::to_string(ranks),
                        static_cast<double>(bytes) / 1e6, state);
  }
  std::cout << (as_json ? out.dump() + "\n" : text) << std::flush;
  return core::kExitOk;
}

int verify(const std::string& dir, bool quick, bool as_json) {
  json out = json::array();
  std::string damaged;
  for (const Entry& e : entries_of(dir)) {
    if (e.state == "incomplete") {  // committed once (no suffix), its manifest is gone
      const std::string problem = fmt::format("no {}", ckpt::kManifestFile);
      out.push_back({{"name", e.name}, {"ok", false}, {"bytes_checked", 0}, {"problem", problem}});
      damaged += fmt::format("{}{}", damaged.empty() ? "" : ", ", e.name);
      if (!as_json) std::cout << fmt::format("DAMAGED  {}: {}\n", e.name, problem);
      continue;
    }
    if (e.state != "complete") {  // being written, or set aside already: not a resume candidate
      if (!as_json) std::cout << fmt::format("{:<8} {} (not checked)\n", e.state, e.name);
      continue;
    }
    const ckpt::Verification v = ckpt::verify_checkpoint(e.path.string(), !quick);
    json item = {{"name", e.name}, {"ok", v.ok}, {"bytes_checked", v.bytes}};
    if (!v.ok) {
      item["problem"] = v.problem;
      damaged += fmt::format("{}{}", damaged.empty() ? "" : ", ", e.name);
    }
    if (!v.digests.empty()) item["digests"] = v.digests;
    out.push_back(item);
    if (!as_json) {
      std::cout << (v.ok ? fmt::format("ok       {} ({:.1f} MB checked)\n", e.name,
                                       static_cast<double>(v.bytes) / 1e6)
                         : fmt::format("DAMAGED  {}: {}\n", e.name, v.problem));
    }
  }
  if (as_json) std::cout << out.dump() << '\n';
  std::cout << std::flush;
  if (!damaged.empty())
    throw core::bad_input(fmt::format("damaged checkpoint(s): {}", damaged), {.file = dir});
  return core::kExitOk;
}

int prune(const std::string& dir, int keep_last) {
  if (fs::is_regular_file(fs::path(dir) / ckpt::kManifestFile))
    throw core::usage_error("prune takes a checkpoint root (the run's --ckpt-dir), not a step");
  if (keep_last < 2)
    throw core::usage_error("--keep-last must be at least 2 (the newest may be the one in use)");
  if (!fs::is_directory(dir)) throw core::bad_input("no such directory", {.file = dir});
  if (ckpt::step_directories(dir).empty()) {
    throw core::bad_input("no checkpoints here (no step-NNNNNNNN directories)", {.file = dir});
  }
  // A .partial directory may belong to a run writing it right now: left alone here (the run's
  // own next checkpoint removes stale ones).
  const ckpt::PruneReport report =
      ckpt::prune_checkpoints(dir, keep_last, ckpt::PartialDirectories::keep);
  for (const std::string& name : report.removed) std::cout << "removed " << name << '\n';
  std::cout << fmt::format("kept the newest {} complete checkpoints; {} removed\n", keep_last,
                           report.removed.size())
            << std::flush;
  if (!report.failed.empty()) {
    std::string failed;
    for (const std::string& f : report.failed) failed += (failed.empty() ? "" : "; ") + f;
    throw core::bad_input(fmt::format("{} not removed: {}", report.failed.size(), failed),
                          {.file = dir});
  }
  return core::kExitOk;
}

}  // namespace

void declare_ckpt_options(po::options_description& options,
                          po::positional_options_description& positional) {
  options.add_options()("action", po::value<std::string>()->value_name("list|verify|prune"),
                        "what to do (positional)")(
      "dir", po::value<std::string>()->value_name("DIR"),
      "a checkpoint root (a run's --ckpt-dir) or one step directory (positional)")(
      "quick", po::bool_switch(), "verify: manifest, files, sizes and structure, no checksums")(
      "keep-last", core::number<int>(core::between(2, 1e6))->default_value(3)->value_name("K"),
      "prune: keep the newest K complete checkpoints (at least 2)")(
      "json", po::bool_switch(), "list/verify: one JSON document (verify: with digests)");
  positional.add("action", 1).add("dir", 1);
}

int run_ckpt(const CommandContext& context) {
  const po::variables_map& o = context.options;
  if (o.count("action") == 0) throw core::usage_error("say what to do: ckpt list|verify|prune DIR");
  const std::string action = o["action"].as<std::string>();
  if (action != "list" && action != "verify" && action != "prune") {
    throw core::usage_error(
        fmt::format("unknown ckpt action '{}' (use list, verify or prune)", action));
  }
  if (o.count("dir") == 0) throw core::usage_error(fmt::format("ckpt {} needs a DIR", action));
  if (!context.world.is_root()) return core::kExitOk;
  const std::string dir = o["dir"].as<std::string>();
  if (action == "list") return list(dir, o["json"].as<bool>());
  if (action == "verify") return verify(dir, o["quick"].as<bool>(), o["json"].as<bool>());
  return prune(dir, o["keep-last"].as<int>());
}

}  // namespace l3::cli
