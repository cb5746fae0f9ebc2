// Which node each rank of a world runs on, for what must survive the loss of a node (the
// node-local checkpoint level and its copies on other nodes). Nodes come from
// MPI_Comm_split_type(SHARED) (World) and are numbered in the order of their lowest rank.
//
// Tests run many "nodes" on one machine: with L3_PRETEND_NODES=N in the environment, rank r is
// taken to run on node r*N/size (contiguous blocks), named "<host>-node<k>". Only the
// checkpoint levels read this map; devices and shared memory still follow the real nodes.
#pragma once

#include <string>
#include <vector>

namespace l3::dist {

class World;

struct NodeMap {
  std::vector<int> node_of;        // per rank of the world: its node (0 .. nodes()-1)
  std::vector<std::string> names;  // per node: its host name
  bool pretended = false;          // from L3_PRETEND_NODES

  [[nodiscard]] int nodes() const noexcept { return static_cast<int>(names.size()); }
  [[nodiscard]] int ranks() const noexcept { return static_cast<int>(node_of.size()); }
  [[nodiscard]] const std::string& name_of_rank(int rank) const {
    return names.at(node_of.at(rank));
  }

  // Collective over `world`. usage Error for a malformed L3_PRETEND_NODES.
  [[nodiscard]] static NodeMap of(const World& world);
  // The map of ranks placed as `node_of` says (nodes numbered from 0 in order of first rank).
  [[nodiscard]] static NodeMap from(std::vector<int> node_of, std::vector<std::string> names);
};

// `pattern` with every "%h" replaced by `node` ("%%" is a literal '%').
[[nodiscard]] std::string expand_node_pattern(const std::string& pattern, const std::string& node);

}  // namespace l3::dist
