#include "cli/info_command.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "cli/run_outcome.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "dist/library_versions.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/node_map.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"

namespace l3::cli {

namespace {

using nlohmann::json;

// Past this many ranks the human report lists nodes, not ranks (--json always has every rank).
constexpr int kMaxRanksListed = 64;

std::string cpu_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "?";
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return format_rank_list(cpus);
}

json rank_report(const dist::World& world) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return json{{"rank", world.rank()},
              {"host", world.host_name()},
              {"node", world.node_id()},
              {"local_rank", world.local_rank()},
              {"local_size", world.local_size()},
              {"pid", static_cast<long>(getpid())},
              {"cpus", cpu_affinity()},
              {"omp_threads", omp_get_max_threads()},
              {"cuda_devices", kernels::visible_cuda_devices()},
              {"cuda_visible_devices", visible == nullptr ? "" : visible}};
}

struct WorldCheck {
  bool ok = true;
  std::vector<std::string> findings;
};

// The training process grid --tensor-parallel T and --context-parallel C would put the ranks
// on (model::Placement): rank = (data group x C + context rank) x T + tensor rank.
struct Grid {
  int tensor = 1;
  int context = 1;
  [[nodiscard]] json of_rank(int rank) const {
    return {{"data", rank / (tensor * context)},
            {"context", (rank / tensor) % context},
            {"tensor", rank % tensor}};
  }
  [[nodiscard]] bool used() const noexcept { return tensor > 1 || context > 1; }
};

Grid grid_of(const CommandContext& context) {
  const Grid grid{.tensor = context.options["tensor-parallel"].as<int>(),
                  .context = context.options["context-parallel"].as<int>()};
  const int ranks = context.world.size();
  if (ranks % (grid.tensor * grid.context) != 0) {
    throw core::usage_error(fmt::format(
        "--tensor-parallel {} --context-parallel {}: the {} ranks must split into groups of {}",
        grid.tensor, grid.context, ranks, grid.tensor * grid.context));
  }
  return grid;
}

// Whether every group of `size` ranks that differ only in the axis of `stride` (the tensor
// groups: consecutive ranks; the context groups: ranks T apart) lies on one node of `nodes`.
bool groups_inside_nodes(const dist::NodeMap& nodes, int size, int stride) {
  for (int rank = 0; rank < nodes.ranks(); ++rank) {
    const int first = rank / (size * stride) * (size * stride) + rank % stride;
    if (nodes.node_of.at(static_cast<std::size_t>(rank)) !=
        nodes.node_of.at(static_cast<std::size_t>(first)))
      return false;
  }
  return true;
}

// What the grid's groups span, for the check's findings (the nodes as the checkpoint levels see
// them: L3_PRETEND_NODES applies).
void describe_grid(const Grid& grid, const dist::NodeMap& nodes, WorldCheck& check) {
  if (!grid.used()) return;
  const int data = nodes.ranks() / (grid.tensor * grid.context);
  std::string text =
      fmt::format("grid: tensor parallel {} x context parallel {} x data parallel {}", grid.tensor,
                  grid.context, data);
  for (const auto& [name, size, stride] :
       {std::tuple{"tensor", grid.tensor, 1}, std::tuple{"context", grid.context, grid.tensor}}) {
    if (size <= 1) continue;
    text +=
        groups_inside_nodes(nodes, size, stride)
            ? fmt::format("; every {} group inside one node", name)
            : fmt::format("; warning: {} groups span nodes (their exchanges leave the node)", name);
  }
  if (nodes.pretended) text += " (nodes pretended by L3_PRETEND_NODES)";
  check.findings.push_back(text);
}

// The collective self-check: a reduction gives the known answer, and the node layout every
// rank computed on its own is consistent with what the others computed.
WorldCheck check_world(const dist::World& world, const std::vector<json>& ranks) {
  WorldCheck check;
  const long long mine = world.rank() + 1;
  const long long sum = dist::all_reduce(world.comm(), mine, dist::ReduceOp::sum);
  const long long expected = static_cast<long long>(world.size()) * (world.size() + 1) / 2;
  if (sum != expected) {
    check.ok = false;
    check.findings.push_back(fmt::format("allreduce returned {} instead of {}", sum, expected));
  } else {
    check.findings.push_back(fmt::format("allreduce over {} ranks: ok", world.size()));
  }
  if (!world.is_root()) return check;

  std::map<int, std::pair<std::string, int>> nodes;  // node -> (host, ranks counted)
  bool layout_ok = true;
  for (const json& r : ranks) {
    auto [it, inserted] =
        nodes.try_emplace(r.at("node").get<int>(), r.at("host").get<std::string>(), 0);
    ++it->second.second;
    if (it->second.first != r.at("host").get<std::string>()) layout_ok = false;
  }
  for (const json& r : ranks) {
    if (nodes.at(r.at("node").get<int>()).second != r.at("local_size").get<int>())
      layout_ok = false;
  }
  if (static_cast<int>(nodes.size()) != world.node_count()) layout_ok = false;
  check.ok = check.ok && layout_ok;
  check.findings.emplace_back(layout_ok
                                  ? "node layout consistent on every rank: ok"
                                  : "node layout inconsistent between ranks (see ranks above)");
  if (world.thread_level() != MPI_THREAD_MULTIPLE) {
    check.findings.push_back(fmt::format(
        "warning: MPI granted {} only; background I/O will be serialised through the main thread",
        dist::thread_level_name(world.thread_level())));
  }
  return check;
}

void print_human(const dist::World& world, const std::vector<json>& ranks,
                 const WorldCheck& check) {
  const core::BuildInfo build = core::build_info();
  std::string text = fmt::format(
      "llama3-hpc {} (commit {}, {}, {}{})\n", build.version, build.git_commit, build.build_type,
      build.compiler, build.sanitizers.empty() ? "" : ", sanitizers " + build.sanitizers);
  text += fmt::format("world:     {} rank{} on {} node{}, MPI thread level {}\n", world.size(),
                      world.size() == 1 ? "" : "s", world.node_count(),
                      world.node_count() == 1 ? "" : "s",
                      dist::thread_level_name(world.thread_level()));

  std::map<int, std::vector<int>> ranks_of_node;
  for (const json& r : ranks)
    ranks_of_node[r.at("node").get<int>()].push_back(r.at("rank").get<int>());
  for (const auto& [node, members] : ranks_of_node) {
    text += fmt::format(
        "node {:<4}  {}: ranks {}\n", node,
        ranks.at(static_cast<std::size_t>(members.front())).at("host").get<std::string>(),
        format_rank_list(members));
  }
  if (world.size() <= kMaxRanksListed) {
    for (const json& r : ranks) {
      text += fmt::format(
          "rank {:<4}  node {} local {}/{}  pid {}  cpus {}  omp {}  cuda devices {}{}\n",
          r.at("rank").get<int>(), r.at("node").get<int>(), r.at("local_rank").get<int>(),
          r.at("local_size").get<int>(), r.at("pid").get<long>(), r.at("cpus").get<std::string>(),
          r.at("omp_threads").get<int>(), r.at("cuda_devices").get<int>(),
          r.at("cuda_visible_devices").get<std::string>().empty()
              ? ""
              : " (CUDA_VISIBLE_DEVICES=" + r.at("cuda_visible_devices").get<std::string>() + ")");
    }
  }
  for (const kernels::BackendReport& b : kernels::describe_backends()) {
    text += fmt::format("backend:   {:<5} {}\n", kernels::backend_name(b.backend), b.summary);
    if (!b.warning.empty()) text += fmt::format("warning:   {}\n", b.warning);
  }
  for (const core::LibraryVersion& lib : dist::library_versions()) {
    text += fmt::format("library:   {:<14} {}\n", lib.name, lib.version);
  }
  for (const std::string& finding : check.findings) text += fmt::format("check:     {}\n", finding);
  std::cout << text << std::flush;
}

json to_json(const dist::World& world, const std::vector<json>& ranks, const WorldCheck& check) {
  const core::BuildInfo build = core::build_info();
  json backends = json::array();
  for (const kernels::BackendReport& b : kernels::describe_backends()) {
    json backend = {{"name", kernels::backend_name(b.backend)},
                    {"compiled", b.compiled},
                    {"usable", b.usable},
                    {"summary", b.summary}};
    if (!b.warning.empty()) backend["warning"] = b.warning;
    backends.push_back(std::move(backend));
  }
  json libraries = json::object();
  for (const core::LibraryVersion& lib : dist::library_versions())
    libraries[lib.name] = lib.version;
  return json{{"version", build.version},
              {"commit", build.git_commit},
              {"build_type", build.build_type},
              {"compiler", build.compiler},
              {"world_size", world.size()},
              {"nodes", world.node_count()},
              {"mpi_thread_level", dist::thread_level_name(world.thread_level())},
              {"ranks", ranks},
              {"backends", backends},
              {"libraries", libraries},
              {"checks_ok", check.ok},
              {"checks", check.findings}};
}

// Gathers every rank's report, checks the world, prints on rank 0; true if the checks passed.
bool report(const CommandContext& context) {
  const dist::World& world = context.world;
  const std::vector<std::string> gathered =
      dist::gather_strings(world.comm(), rank_report(world).dump(), 0);
  std::vector<json> ranks;
  ranks.reserve(gathered.size());
  for (const std::string& text : gathered) ranks.push_back(json::parse(text));

  const Grid grid = grid_of(context);
  if (grid.used()) {
    for (std::size_t r = 0; r < ranks.size(); ++r)
      ranks[r]["grid"] = grid.of_rank(static_cast<int>(r));
  }
  WorldCheck check = check_world(world, ranks);
  if (grid.used()) {
    const dist::NodeMap nodes = dist::NodeMap::of(world);  // collective
    if (world.is_root()) describe_grid(grid, nodes, check);
  }
  if (world.is_root()) {
    if (context.options["json"].as<bool>()) {
      std::cout << to_json(world, ranks, check).dump() << '\n' << std::flush;
    } else {
      print_human(world, ranks, check);
    }
  }
  return dist::broadcast_value(world.comm(), check.ok ? 1 : 0, 0) != 0;
}

}  // namespace

void declare_info_options(po::options_description& options,
                          po::positional_options_description& /*positional*/) {
  options.add_options()("json", po::bool_switch(),
                        "print one JSON object on stdout instead of the human report")(
      "tensor-parallel",
      core::number<int>(core::between(1, 1 << 10))->default_value(1)->value_name("T"),
      "show the process grid a training run with --tensor-parallel T would use: each rank's "
      "tensor, context and data-parallel index, and whether each group stays inside a node")(
      "context-parallel",
      core::number<int>(core::between(1, 1 << 16))->default_value(1)->value_name("C"),
      "the same for --context-parallel C");
}

int run_info(const CommandContext& context) {
  if (!report(context)) throw core::internal_error("the MPI world self-check failed (see above)");
  return core::kExitOk;
}

}  // namespace l3::cli
