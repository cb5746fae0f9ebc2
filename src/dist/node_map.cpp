#include "dist/node_map.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"

namespace l3::dist {

namespace {

// L3_PRETEND_NODES: 0 when unset.
int pretend_nodes(int world_size) {
  const char* text = std::getenv("L3_PRETEND_NODES");
  if (text == nullptr || *text == '\0') return 0;
  const std::string_view value(text);
  int nodes = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), nodes);
  if (error != std::errc() || end != value.data() + value.size() || nodes < 1 ||
      nodes > world_size) {
    throw core::usage_error(fmt::format(
        "L3_PRETEND_NODES={}: a number of nodes from 1 to the {} ranks", value, world_size));
  }
  return nodes;
}

}  // namespace

NodeMap NodeMap::from(std::vector<int> node_of, std::vector<std::string> names) {
  NodeMap map;
  map.node_of = std::move(node_of);
  map.names = std::move(names);
  return map;
}

NodeMap NodeMap::of(const World& world) {
  NodeMap map;
  const int size = world.size();
  map.node_of.resize(static_cast<std::size_t>(size));
  if (const int pretend = pretend_nodes(size); pretend > 0) {
    map.pretended = true;
    for (int r = 0; r < size; ++r)
      map.node_of[static_cast<std::size_t>(r)] =
          static_cast<int>(static_cast<long long>(r) * pretend / size);
    for (int n = 0; n < pretend; ++n)
      map.names.push_back(fmt::format("{}-node{}", world.host_name(), n));
    return map;
  }
  int node = world.node_id();
  check_mpi(MPI_Allgather(&node, 1, MPI_INT, map.node_of.data(), 1, MPI_INT, world.comm()),
            "MPI_Allgather(node ids)");
  // Each node's name: its leader's host name, in node order.
  const std::vector<std::string> hosts = gather_strings(world.comm(), world.host_name());
  std::string joined;
  if (world.is_root()) {
    std::vector<std::string> names(static_cast<std::size_t>(world.node_count()));
    for (int r = size - 1; r >= 0; --r)
      names[static_cast<std::size_t>(map.node_of[static_cast<std::size_t>(r)])] =
          hosts[static_cast<std::size_t>(r)];
    for (const std::string& n : names) joined += n + '\n';
  }
  joined = broadcast_string(world.comm(), joined);
  for (std::size_t at = 0, next = 0; (next = joined.find('\n', at)) != std::string::npos;
       at = next + 1)
    map.names.push_back(joined.substr(at, next - at));
  return map;
}

std::string expand_node_pattern(const std::string& pattern, const std::string& node) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') {
      out += node;
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == '%') {
      out += '%';
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

}  // namespace l3::dist
