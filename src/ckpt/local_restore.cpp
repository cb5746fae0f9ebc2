#include "ckpt/local_restore.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/local_checkpoint_writer.hpp"
#include "ckpt/local_redundancy.hpp"
#include "core/error.hpp"
#include "core/first_failure.hpp"
#include "core/log.hpp"
#include "core/path_safety.hpp"
#include "dist/collectives.hpp"
#include "dist/point_to_point.hpp"
#include "dist/world.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using core::FirstFailure;

constexpr std::int64_t kPieceBytes = std::int64_t{16} << 20;
constexpr int kSendTag = 7311;
constexpr int kXorTag = 7312;

// Every rank's text, on every rank.
std::vector<std::string> all_strings(const dist::World& world, const std::string& mine) {
  const std::vector<std::string> gathered = dist::gather_strings(world.comm(), mine);
  json all = json::array();
  for (const std::string& s : gathered) all.push_back(s);
  const json agreed = json::parse(dist::broadcast_string(world.comm(), all.dump()));
  return agreed.get<std::vector<std::string>>();
}

// This rank's part of the inventory: the files of its directory, those it checks (the ranks
// sharing a directory split the checking) with the verdict.
}  // namespace

json local_inventory(const std::string& directory, int reader, int share, int shares,
                     bool checksums) {
  json found = json::array();
  std::vector<std::pair<std::int64_t, std::string>> files;
  for (const std::int64_t step : local_steps(directory)) {
    std::error_code ec;
    std::vector<std::string> names;
    for (const fs::directory_entry& e :
         fs::directory_iterator(fs::path(directory) / step_dir_name(step), ec))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) files.emplace_back(step, n);
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(shares)) != share) continue;
    LocalFileKind kind{};
    int owner = 0;
    if (!parse_local_file_name(files[i].second, kind, owner)) continue;  // temporaries and strays
    const std::string path =
        (fs::path(directory) / step_dir_name(files[i].first) / files[i].second).string();
    const LocalFileCheck check = check_local_file(path, checksums);
    json e = {{"step", files[i].first},  {"kind", local_kind_name(kind)},
              {"owner", owner},          {"path", path},
              {"reader", reader},        {"ok", check.ok},
              {"problem", check.problem}};
    if (check.ok) {
      e["world_size"] = check.header.value("world_size", 0);
      // Whose run the file is of: a state's manifest says, a parity file its own header.
      e["run_key"] = kind == LocalFileKind::parity
                         ? check.header.value("run_key", "")
                         : check.header.value("manifest", json::object()).value("run_key", "");
      if (check.header.value("step", std::int64_t{-1}) != files[i].first ||
          check.header.value("rank", -1) != owner) {
        e["ok"] = false;
        e["problem"] = fmt::format("{}: its header is of another step or rank", path);
      }
      if (kind == LocalFileKind::parity) {
        e["set"] = check.header.at("set");
        e["position"] = check.header.at("position");
        e["lengths"] = check.header.at("lengths");
        e["chunk"] = check.header.at("chunk");
        e["payload"] = check.payload_offset;
      }
    }
    found.push_back(std::move(e));
  }
  return found;
}

// How every rank's state of `step` can be had from `entries` (good files of that step), or why
// not (`missing`).
std::vector<RankRestore> plan_local_step(const std::vector<json>& entries,
                                         const std::vector<std::string>& directories,
                                         int world_size, std::string& missing) {
  static const std::string none;
  const auto dir_of = [&](int rank) -> const std::string& {
    return rank >= 0 && rank < static_cast<int>(directories.size())
               ? directories[static_cast<std::size_t>(rank)]
               : none;
  };
  const auto find = [&](std::string_view kind, int owner) -> const json* {
    for (const json& e : entries)
      if (e.at("kind") == kind && e.at("owner").get<int>() == owner) return &e;
    return nullptr;
  };
  std::vector<RankRestore> ranks;
  for (int x = 0; x < world_size && missing.empty(); ++x) {
    if (const json* own = find("state", x);
        own && dir_of(own->at("reader").get<int>()) == dir_of(x)) {
      ranks.push_back({.mode = RestoreMode::direct, .path = own->at("path").get<std::string>()});
    } else if (const json* any = own ? own : find("copy", x)) {
      ranks.push_back({.mode = own ? RestoreMode::moved : RestoreMode::copy,
                       .path = any->at("path").get<std::string>(),
                       .reader = any->at("reader").get<int>()});
    } else if (const json* parity = [&]() -> const json* {
                 for (const json& e : entries) {
                   if (e.at("kind") != "xor") continue;
                   const auto set = e.at("set").get<std::vector<int>>();
                   if (std::find(set.begin(), set.end(), x) != set.end()) return &e;
                 }
                 return nullptr;
               }()) {
      const auto set = parity->at("set").get<std::vector<int>>();
      std::vector<XorContributor> contributors;
      for (std::size_t m = 0; m < set.size() && missing.empty(); ++m) {
        if (set[m] == x) continue;
        const json* p = find("xor", set[m]);
        const json* s = find("state", set[m]);
        if (!p || !s || dir_of(p->at("reader").get<int>()) != dir_of(s->at("reader").get<int>())) {
          missing = fmt::format(
              "rank {}'s state is lost and its XOR set misses rank {}'s files too", x, set[m]);
          break;
        }
        contributors.push_back({.position = static_cast<int>(m),
                                .reader = p->at("reader").get<int>(),
                                .state = s->at("path").get<std::string>(),
                                .parity = p->at("path").get<std::string>(),
                                .payload = p->at("payload").get<std::int64_t>()});
      }
      const auto position = std::find(set.begin(), set.end(), x) - set.begin();
      ranks.push_back(
          {.mode = RestoreMode::xor_rebuild,
           .position = static_cast<int>(position),
           .members = static_cast<int>(set.size()),
           .length =
               parity->at("lengths").at(static_cast<std::size_t>(position)).get<std::int64_t>(),
           .chunk = parity->at("chunk").get<std::int64_t>(),
           .contributors = std::move(contributors)});
    } else {
      missing = fmt::format("rank {}'s state is on no node (no file, copy or parity)", x);
    }
  }
  return ranks;
}

namespace {

// The modes' names in the plan as broadcast (RestorePlan's JSON), in the order the log lists them
// (by name, as it always has).
constexpr std::array<std::pair<RestoreMode, std::string_view>, 4> kModeNames{{
    {RestoreMode::copy, "copy"},
    {RestoreMode::direct, "direct"},
    {RestoreMode::moved, "moved"},
    {RestoreMode::xor_rebuild, "xor"},
}};

std::string_view mode_name(RestoreMode mode) {
  for (const auto& [m, name] : kModeNames)
    if (m == mode) return name;
  throw core::internal_error("node-local restore: a mode without a name");
}

RestoreMode parse_mode(std::string_view text) {
  for (const auto& [mode, name] : kModeNames)
    if (name == text) return mode;
  throw core::internal_error(fmt::format("node-local restore plan: no mode \"{}\"", text));
}

// The plan as rank 0 sends it to the others: null for no plan.
json plan_to_json(const std::optional<RestorePlan>& plan) {
  if (!plan) return nullptr;
  json ranks = json::array();
  for (const RankRestore& r : plan->ranks) {
    json how = {{"mode", mode_name(r.mode)}};
    if (r.mode == RestoreMode::xor_rebuild) {
      json contributors = json::array();
      for (const XorContributor& c : r.contributors) {
        contributors.push_back({{"position", c.position},
                                {"reader", c.reader},
                                {"state", c.state},
                                {"parity", c.parity},
                                {"payload", c.payload}});
      }
      how.update({{"position", r.position},
                  {"members", r.members},
                  {"length", r.length},
                  {"chunk", r.chunk},
                  {"contributors", std::move(contributors)}});
    } else {
      how["path"] = r.path;
      if (r.mode != RestoreMode::direct) how["reader"] = r.reader;
    }
    ranks.push_back(std::move(how));
  }
  return {{"step", plan->step}, {"ranks", std::move(ranks)}};
}

std::optional<RestorePlan> plan_from_json(const json& j) {
  if (j.is_null()) return std::nullopt;
  RestorePlan plan{.step = j.at("step").get<std::int64_t>(), .ranks = {}};
  for (const json& how : j.at("ranks")) {
    RankRestore& r = plan.ranks.emplace_back();
    r.mode = parse_mode(how.at("mode").get<std::string>());
    if (r.mode == RestoreMode::xor_rebuild) {
      r.position = how.at("position").get<int>();
      r.members = how.at("members").get<int>();
      r.length = how.at("length").get<std::int64_t>();
      r.chunk = how.at("chunk").get<std::int64_t>();
      for (const json& c : how.at("contributors")) {
        r.contributors.push_back({.position = c.at("position").get<int>(),
                                  .reader = c.at("reader").get<int>(),
                                  .state = c.at("state").get<std::string>(),
                                  .parity = c.at("parity").get<std::string>(),
                                  .payload = c.at("payload").get<std::int64_t>()});
      }
    } else {
      r.path = how.at("path").get<std::string>();
      if (r.mode != RestoreMode::direct) r.reader = how.at("reader").get<int>();
    }
  }
  return plan;
}

// Rank 0: the newest step every rank can be restored from, and how; nothing when none.
std::optional<RestorePlan> plan_restore(const std::vector<json>& inventories,
                                        const std::vector<std::string>& directories, int world_size,
                                        std::int64_t not_before, const std::string& run_key,
                                        std::vector<std::string>& notes) {
  std::map<std::int64_t, std::vector<json>, std::greater<>> by_step;
  std::vector<std::string> foreign;  // files of another run
  for (const json& part : inventories) {
    for (const json& e : part) {
      if (!e.at("ok").get<bool>()) {
        notes.push_back(fmt::format("damaged, not used: {}", e.at("problem").get<std::string>()));
        continue;
      }
      if (e.at("run_key").get<std::string>() != run_key) {
        foreign.push_back(e.at("path").get<std::string>());
        continue;
      }
      if (e.at("world_size").get<int>() != world_size) continue;
      by_step[e.at("step").get<std::int64_t>()].push_back(e);
    }
  }
  if (!foreign.empty()) {
    notes.push_back(fmt::format(
        "{} node-local file{} of another run (its --init, --seed, --model, --data or LoRA "
        "options differ, or an earlier version wrote {}), not used: {}{}",
        foreign.size(), foreign.size() == 1 ? "" : "s", foreign.size() == 1 ? "it" : "them",
        foreign.front(), foreign.size() > 1 ? ", ..." : ""));
  }
  for (const auto& [step, entries] : by_step) {
    if (step < not_before) break;
    std::string missing;
    std::vector<RankRestore> ranks = plan_local_step(entries, directories, world_size, missing);
    if (missing.empty()) return RestorePlan{.step = step, .ranks = std::move(ranks)};
    notes.push_back(fmt::format("node-local step {} cannot be restored: {}", step, missing));
  }
  return std::nullopt;
}

// Rank r sends the file at `path` to `destination` in pieces; a read failure sends zeros (the
// target must not wait forever) and is remembered.
void send_file(const std::string& path, std::int64_t bytes, int destination, MPI_Comm comm,
               FirstFailure& f) {
  std::vector<std::byte> piece(
      static_cast<std::size_t>(std::min(kPieceBytes, std::max<std::int64_t>(bytes, 1))));
  for (std::int64_t at = 0; at < bytes; at += kPieceBytes) {
    const std::int64_t n = std::min(kPieceBytes, bytes - at);
    const std::span<std::byte> part(piece.data(), static_cast<std::size_t>(n));
    f.run([&] { read_file_bytes(path, at, part); });
    dist::send(comm, part, destination, kSendTag, "local state");
  }
}

std::string own_path(const std::string& directory, std::int64_t step, int rank) {
  return (fs::path(directory) / step_dir_name(step) / local_file_name(LocalFileKind::state, rank))
      .string();
}

// Executes the plan's transfers, in rank order on every rank; returns this rank's state file.
std::string carry_out(const dist::World& world, const RestorePlan& plan,
                      const std::string& directory, FirstFailure& f) {
  const int me = world.rank();
  const std::int64_t step = plan.step;
  const MPI_Comm comm = world.comm();
  std::string mine;
  for (int x = 0; x < world.size(); ++x) {
    const RankRestore& how = plan.ranks.at(static_cast<std::size_t>(x));
    if (how.mode == RestoreMode::direct) {
      if (x == me) mine = how.path;
      continue;
    }
    const std::string target = own_path(directory, step, x);
    if (how.mode == RestoreMode::moved || how.mode == RestoreMode::copy) {
      const int reader = how.reader;
      const std::string& path = how.path;
      std::int64_t bytes = 0;
      if (me == reader) {
        f.run([&] { bytes = static_cast<std::int64_t>(fs::file_size(path)); });
        if (reader != x) dist::send_value(comm, bytes, x, kSendTag);
        if (reader != x) send_file(path, bytes, x, comm, f);
      }
      if (me == x) {
        if (reader != x) bytes = dist::receive_value<std::int64_t>(comm, reader, kSendTag);
        std::unique_ptr<LocalFileWriter> out;
        f.run([&] {
          core::make_real_directory(fs::path(target).parent_path(), "--ckpt-local");
          out = std::make_unique<LocalFileWriter>(target);
        });
        std::vector<std::byte> piece(
            static_cast<std::size_t>(std::min(kPieceBytes, std::max<std::int64_t>(bytes, 1))));
        for (std::int64_t at = 0; at < bytes; at += kPieceBytes) {
          const std::int64_t n = std::min(kPieceBytes, bytes - at);
          const std::span<std::byte> part(piece.data(), static_cast<std::size_t>(n));
          if (reader == x) {
            f.run([&] { read_file_bytes(path, at, part); });
          } else {
            dist::receive(comm, part, reader, kSendTag, "local state");
          }
          if (out) f.run([&] { out->write_at(at, part); });
        }
        if (out) f.run([&] { out->commit(); });
        mine = target;
      }
      continue;
    }
    // XOR: every contributor sends its G blocks of each piece; x XORs them
    // (ckpt/local_redundancy.hpp).
    const int g = how.members;
    const int lost = how.position;
    const std::int64_t chunk = how.chunk;
    const std::int64_t piece = std::min(chunk, std::max<std::int64_t>(8, kPieceBytes / g / 8 * 8));
    std::vector<std::byte> blocks(static_cast<std::size_t>(piece * g));
    std::vector<std::byte> sum(static_cast<std::size_t>(piece * g));
    std::unique_ptr<LocalFileWriter> out;
    if (me == x) {
      f.run([&] {
        core::make_real_directory(fs::path(target).parent_path(), "--ckpt-local");
        out = std::make_unique<LocalFileWriter>(target);
      });
    }
    for (std::int64_t at = 0; at < chunk; at += piece) {
      const std::int64_t n = std::min(piece, chunk - at);
      const auto bytes = static_cast<std::size_t>(n * g);
      if (me == x) std::fill(sum.begin(), sum.end(), std::byte{0});
      for (const XorContributor& c : how.contributors) {
        const int reader = c.reader;
        if (me != reader && me != x) continue;
        if (me == reader) {
          const int m = c.position;
          for (int k = 0; k < g; ++k) {
            const std::span<std::byte> block(blocks.data() + static_cast<std::ptrdiff_t>(k * n),
                                             static_cast<std::size_t>(n));
            std::fill(block.begin(), block.end(), std::byte{0});
            if (k == lost) continue;
            f.run([&] {
              if (k == m) {
                read_file_bytes(c.parity, c.payload + at, block);
              } else {
                read_file_bytes(c.state, xor_chunk(m, k, g) * chunk + at, block);
              }
            });
          }
          if (reader != x) dist::send(comm, std::span(blocks.data(), bytes), x, kXorTag, "XOR");
        }
        if (me == x) {
          if (reader != x)
            dist::receive(comm, std::span(blocks.data(), bytes), reader, kXorTag, "XOR");
          xor_into(std::span(sum.data(), bytes), std::span(blocks.data(), bytes));
        }
      }
      if (me == x && out) {
        for (int k = 0; k < g; ++k) {
          if (k == lost) continue;
          f.run([&] {
            out->write_at(xor_chunk(lost, k, g) * chunk + at,
                          std::span(sum.data() + static_cast<std::ptrdiff_t>(k * n),
                                    static_cast<std::size_t>(n)));
          });
        }
      }
    }
    if (me == x) {
      if (out) {
        f.run([&] {
          out->truncate(how.length);
          out->commit();
        });
      }
      mine = target;
    }
  }
  return mine;
}

std::string describe(const RestorePlan& plan) {
  std::string text;
  const auto list = [](const std::vector<int>& r) { return fmt::format("{}", fmt::join(r, ", ")); };
  for (const auto& [mode, name] : kModeNames) {
    std::vector<int> which;
    for (std::size_t x = 0; x < plan.ranks.size(); ++x)
      if (plan.ranks[x].mode == mode) which.push_back(static_cast<int>(x));
    if (which.empty()) continue;
    if (!text.empty()) text += "; ";
    switch (mode) {
      case RestoreMode::direct:
        text += which.size() == 1 ? "1 rank from its own file"
                                  : fmt::format("{} ranks from their own files", which.size());
        break;
      case RestoreMode::moved:
        text += which.size() == 1
                    ? fmt::format("rank {} from its file on another node", list(which))
                    : fmt::format("ranks {} from their files on other nodes", list(which));
        break;
      case RestoreMode::copy:
        text += fmt::format("rank{} {} from partner cop{}", which.size() == 1 ? "" : "s",
                            list(which), which.size() == 1 ? "y" : "ies");
        break;
      case RestoreMode::xor_rebuild:
        text += fmt::format("rank{} {} rebuilt from XOR parity", which.size() == 1 ? "" : "s",
                            list(which));
        break;
    }
  }
  return text;
}

}  // namespace

bool local_level_has_steps(const dist::World& world, const std::string& directory) {
  return dist::all_reduce(world.comm(), local_steps(directory).empty() ? 0 : 1,
                          dist::ReduceOp::max) != 0;
}

void discard_local_steps_after(const dist::World& world, const std::string& directory,
                               std::int64_t step) {
  std::exception_ptr failure;
  if (prunes_directory(world.comm(), directory)) {
    try {
      remove_local_steps(directory, [step](std::int64_t s) { return s > step; });
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
}

std::optional<LocalResume> resume_from_local_level(const dist::World& world,
                                                   const core::Logger& log,
                                                   const std::string& directory,
                                                   std::int64_t not_before, bool checksums,
                                                   const std::string& run_key) {
  const std::vector<std::string> directories = all_strings(world, directory);
  int share = 0;
  int shares = 0;
  for (int r = 0; r < world.size(); ++r) {
    if (directories[static_cast<std::size_t>(r)] != directory) continue;
    if (r < world.rank()) ++share;
    ++shares;
  }
  const json mine = local_inventory(directory, world.rank(), share, shares, checksums);
  const std::vector<std::string> gathered = dist::gather_strings(world.comm(), mine.dump());
  std::optional<RestorePlan> planned;
  std::vector<std::string> notes;
  if (world.is_root()) {
    std::vector<json> parts;
    parts.reserve(gathered.size());
    for (const std::string& text : gathered) parts.push_back(json::parse(text));
    planned = plan_restore(parts, directories, world.size(), not_before, run_key, notes);
  }
  for (const std::string& n : notes) log.warn("{}", n);
  // Rank 0's plan reaches the others as JSON; every rank, rank 0 too, carries out the plan it
  // parses back, so that all of them follow the same one.
  const std::optional<RestorePlan> agreed = plan_from_json(
      json::parse(dist::broadcast_string(world.comm(), plan_to_json(planned).dump())));
  if (!agreed) return std::nullopt;
  const RestorePlan& plan = *agreed;

  FirstFailure f;
  const std::string path = carry_out(world, plan, directory, f);
  LocalResume resume;
  f.run([&] { resume.state = read_local_state(path); });
  std::string problem = f.text;
  if (problem.empty() &&
      (resume.state.rank != world.rank() || resume.state.world_size != world.size() ||
       resume.state.manifest.step != plan.step))
    problem = fmt::format("{}: holds rank {} of {} at step {}", path, resume.state.rank,
                          resume.state.world_size, resume.state.manifest.step);
  const std::vector<std::string> problems = dist::gather_strings(world.comm(), problem);
  std::string first;
  for (const std::string& p : problems)
    if (first.empty() && !p.empty()) first = p;
  first = dist::broadcast_string(world.comm(), first);
  if (!first.empty()) {
    log.warn("the node-local level could not be restored ({}); using --ckpt-dir", first);
    return std::nullopt;
  }
  resume.step = plan.step;
  resume.description = describe(plan);
  resume.rebuilt = std::any_of(plan.ranks.begin(), plan.ranks.end(),
                               [](const RankRestore& r) { return r.mode != RestoreMode::direct; });
  return resume;
}

}  // namespace l3::ckpt
