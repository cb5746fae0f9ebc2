#include "cli/ckpt_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/local_checkpoint_writer.hpp"
#include "ckpt/local_restore.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "core/phase.hpp"
#include "dist/collectives.hpp"
#include "dist/node_map.hpp"
#include "dist/world.hpp"

namespace l3::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Entry {
  std::string name;
  fs::path path;
  std::int64_t step = -1;
  std::string state;  // complete, incomplete, partial, damaged, link
};

std::int64_t directory_bytes(const fs::path& dir) {
  std::int64_t total = 0;
  std::error_code ec;
  // Links are not followed; an unreadable entry ends the count (it is a size for display).
  for (fs::recursive_directory_iterator it(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code entry_ec;
    if (it->symlink_status(entry_ec).type() == fs::file_type::regular)
      total += static_cast<std::int64_t>(it->file_size(entry_ec));
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
  std::error_code ec;
  for (fs::directory_iterator it(p, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::error_code type_ec;
    const fs::file_type type = e.symlink_status(type_ec).type();
    const std::string name = e.path().filename().string();
    if (type == fs::file_type::symlink) {  // never followed: a loop, or a link to "/"
      if (const auto step = ckpt::parse_step_dir_name(name.substr(0, name.find('.'))))
        entries.push_back({name, e.path(), *step, "link"});
      continue;
    }
    if (type != fs::file_type::directory) continue;
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
  if (ec)
    throw core::bad_input(fmt::format("cannot read the directory: {}", ec.message()),
                          {.file = dir});
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.step != b.step ? a.step > b.step : a.name < b.name;
  });
  if (entries.empty()) {
    throw core::bad_input("no checkpoints here (no step-NNNNNNNN directories)", {.file = dir});
  }
  return entries;
}

// The node names a --ckpt-local pattern has directories for, found by matching the first path
// component holding "%h" against what its parent directory holds (a shared file system, or
// this node's own storage).
std::vector<std::string> nodes_matching(const std::string& pattern) {
  const fs::path p(pattern);
  fs::path parent;
  for (const fs::path& part : p) {
    const std::string text = part.string();
    if (text.find("%h") == std::string::npos) {
      parent /= part;
      continue;
    }
    // The component as a regex: "%h" any name, everything else literal.
    std::string re;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 2, "%h") == 0) {
        re += "(.+)";
        ++i;
      } else if (std::string_view("\\^$.|?*+()[]{}").find(text[i]) != std::string_view::npos) {
        re += std::string("\\") + text[i];
      } else {
        re += text[i];
      }
    }
    const std::regex component(re);
    std::vector<std::string> names;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
      std::smatch m;
      const std::string name = e.path().filename().string();
      if (std::regex_match(name, m, component)) names.push_back(m[1].str());
    }
    return names;
  }
  return {""};  // no %h: one directory for every node
}

// ranges "0-3, 5" of sorted ranks.
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out +=
        fmt::format("{}{}", out.empty() ? "" : ",",
                    i == j ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return out;
}

// The node-local level of the run writing `dir`: each directory's steps and files, and whether
// each step can be restored on the ranks that wrote it.
json list_local_level(const std::vector<std::string>& directories, std::string& text) {
  std::map<std::int64_t, std::vector<json>, std::greater<>> by_step;
  json out = json::array();
  for (std::size_t d = 0; d < directories.size(); ++d) {
    for (json& e : ckpt::local_inventory(directories[d], static_cast<int>(d), 0, 1, false))
      by_step[e.at("step").get<std::int64_t>()].push_back(std::move(e));
  }
  for (const auto& [step, entries] : by_step) {
    json step_json = {{"step", step}, {"directories", json::array()}};
    int world_size = 0;
    std::vector<json> good;
    for (std::size_t d = 0; d < directories.size(); ++d) {
      std::map<std::string, std::vector<int>> kinds;
      std::int64_t bytes = 0;
      std::vector<std::string> damaged;
      for (const json& e : entries) {
        if (e.at("reader").get<std::size_t>() != d) continue;
        if (!e.at("ok").get<bool>()) {
          damaged.push_back(e.at("problem").get<std::string>());
          continue;
        }
        good.push_back(e);
        world_size = std::max(world_size, e.at("world_size").get<int>());
        kinds[e.at("kind").get<std::string>()].push_back(e.at("owner").get<int>());
        std::error_code ec;
        bytes += static_cast<std::int64_t>(fs::file_size(e.at("path").get<std::string>(), ec));
      }
      if (kinds.empty() && damaged.empty()) continue;
      std::string files;
      for (const auto& [kind, owners] : kinds)
        files += fmt::format("{}{} {}", files.empty() ? "" : "; ",
                             kind == "state"  ? "states"
                             : kind == "copy" ? "copies"
                                              : "parity",
                             rank_list(owners));
      if (!damaged.empty()) files += fmt::format("; {} damaged", damaged.size());
      text += fmt::format("  {:<14} {:>8.1f}MB  {}  in {}\n", ckpt::step_dir_name(step),
                          static_cast<double>(bytes) / 1e6, files, directories[d]);
      for (const std::string& why : damaged) text += fmt::format("      damaged: {}\n", why);
      step_json["directories"].push_back({{"path", directories[d]},
                                          {"states", kinds["state"]},
                                          {"copies", kinds["copy"]},
                                          {"parity", kinds["xor"]},
                                          {"damaged", damaged},
                                          {"bytes", bytes}});
    }
    std::string missing;
    if (world_size > 0) (void)ckpt::plan_local_step(good, directories, world_size, missing);
    if (world_size == 0) missing = "no good file";
    step_json["world_size"] = world_size;
    step_json["restorable"] = missing.empty();
    step_json["problem"] = missing;
    text += missing.empty()
                ? fmt::format("  step {}: every one of the {} ranks' states can be had\n", step,
                              world_size)
                : fmt::format("  step {}: cannot be restored: {}\n", step, missing);
    out.push_back(std::move(step_json));
  }
  if (out.empty()) text += "  (no steps)\n";
  return out;
}

int list(const std::string& dir, bool as_json, const std::vector<std::string>& local_dirs,
         const std::string& local_pattern) {
  std::string local_text;
  json local = json::array();
  if (!local_dirs.empty()) {
    local_text = fmt::format("node-local level (--ckpt-local {}), {} director{}:\n", local_pattern,
                             local_dirs.size(), local_dirs.size() == 1 ? "y" : "ies");
    local = list_local_level(local_dirs, local_text);
    if (!fs::is_directory(dir) || ckpt::step_directories(dir).empty()) {
      std::cout << (as_json ? json{{"checkpoints", json::array()}, {"local", local}}.dump() + "\n"
                            : fmt::format("no checkpoints in {}\n{}", dir, local_text))
                << std::flush;
      return core::kExitOk;
    }
  }
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
        phase = core::phase_name(m.phase);
        ranks = m.world_size;
        if (!m.resumable()) state = "complete (model only)";
        if (m.finished) state += ", finished";
      } catch (const core::Error& error) {
        state = fmt::format("unreadable manifest: {}", error.message());
      }
    }
    if (e.state == "link") state = "a symbolic link, not a checkpoint (not followed)";
    if (e.name == latest) state += ", latest";
    const std::int64_t bytes = e.state == "link" ? 0 : directory_bytes(e.path);
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
  if (local_dirs.empty()) {
    std::cout << (as_json ? out.dump() + "\n" : text) << std::flush;
  } else {
    std::cout << (as_json ? json{{"checkpoints", out}, {"local", local}}.dump() + "\n"
                          : text + local_text)
              << std::flush;
  }
  return core::kExitOk;
}

int verify(const std::string& dir, bool quick, bool as_json) {
  json out = json::array();
  std::string damaged;
  for (const Entry& e : entries_of(dir)) {
    if (e.state == "incomplete" || e.state == "link") {  // its manifest is gone, or no directory
      const std::string problem = e.state == "link"
                                      ? "a symbolic link, not a checkpoint (not followed)"
                                      : fmt::format("no {}", ckpt::kManifestFile);
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
      std::cout << (!v.ok   ? fmt::format("DAMAGED  {}: {}\n", e.name, v.problem)
                    : quick ? fmt::format("ok       {} (manifest, files and sizes; no checksums "
                                          "with --quick)\n",
                                          e.name)
                            : fmt::format("ok       {} ({:.1f} MB checked)\n", e.name,
                                          static_cast<double>(v.bytes) / 1e6));
    }
  }
  if (as_json) std::cout << out.dump() << '\n';
  std::cout << std::flush;
  if (!damaged.empty())
    throw core::bad_input(fmt::format("damaged checkpoint(s): {}", damaged), {.file = dir});
  return core::kExitOk;
}

int prune(const std::string& dir, int keep_last, bool quick) {
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
  // The newest are verified as `ckpt verify` does (checksums unless --quick): a damaged one
  // is kept for you to look at, and never counts among the K kept.
  const ckpt::PruneReport report = ckpt::prune_checkpoints(
      dir, keep_last, ckpt::PartialDirectories::keep, [quick](const std::string& step_dir) {
        const ckpt::Verification v = ckpt::verify_checkpoint(step_dir, !quick);
        return v.ok ? std::string() : v.problem;
      });
  for (const std::string& name : report.removed) std::cout << "removed " << name << '\n';
  for (const std::string& why : report.ignored) std::cout << "not a checkpoint: " << why << '\n';
  std::cout << fmt::format("kept the newest {} complete checkpoints that verify; {} removed\n",
                           keep_last, report.removed.size())
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
      "quick", po::bool_switch(),
      "verify, prune: check the manifest, files, sizes and structure, not the checksums")(
      "keep-last", core::number<int>(core::between(2, 1e6))->default_value(3)->value_name("K"),
      "prune: keep the newest K complete checkpoints (at least 2)")(
      "json", po::bool_switch(), "list/verify: one JSON document (verify: with digests)")(
      "ckpt-local", po::value<std::string>()->value_name("DIR"),
      "list: also the node-local level of the run (its --ckpt-local; the directories of every "
      "node name found for %h, and of each rank's node under mpiexec/srun)");
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
  const std::string dir = o["dir"].as<std::string>();
  std::vector<std::string> local_dirs;
  const std::string pattern = o.count("ckpt-local") != 0 ? o["ckpt-local"].as<std::string>() : "";
  if (!pattern.empty()) {
    if (action != "list") throw core::usage_error("--ckpt-local goes with ckpt list");
    // Each rank's own node, and every node name found under the pattern's parent.
    const dist::NodeMap nodes = dist::NodeMap::of(context.world);
    const std::vector<std::string> all = dist::gather_strings(
        context.world.comm(),
        ckpt::local_level_directory(pattern, nodes.name_of_rank(context.world.rank()), dir));
    std::set<std::string> unique(all.begin(), all.end());
    for (const std::string& node : nodes_matching(pattern))
      unique.insert(ckpt::local_level_directory(pattern, node, dir));
    for (const std::string& d : unique)
      if (fs::is_directory(d)) local_dirs.push_back(d);
  }
  if (!context.world.is_root()) return core::kExitOk;
  if (action == "list") return list(dir, o["json"].as<bool>(), local_dirs, pattern);
  if (action == "verify") return verify(dir, o["quick"].as<bool>(), o["json"].as<bool>());
  return prune(dir, o["keep-last"].as<int>(), o["quick"].as<bool>());
}

}  // namespace l3::cli
