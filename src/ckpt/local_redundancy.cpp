#include "ckpt/local_redundancy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.hpp"

namespace l3::ckpt {

std::string_view redundancy_name(Redundancy r) noexcept {
  switch (r) {
    case Redundancy::none:
      return "none";
    case Redundancy::partner:
      return "partner";
    case Redundancy::xor_parity:
      return "xor";
  }
  return "none";
}

Redundancy parse_redundancy(std::string_view text) {
  if (text == "none") return Redundancy::none;
  if (text == "partner") return Redundancy::partner;
  if (text == "xor") return Redundancy::xor_parity;
  throw core::usage_error(
      fmt::format("--ckpt-redundancy must be partner, xor or none, not '{}'", text));
}

namespace {

// The ranks node by node (ascending rank within a node), and each rank's index on its node.
struct NodeOrder {
  std::vector<int> ranks;
  std::vector<int> local_index;
  int widest = 0;  // most ranks on one node
};

NodeOrder node_order(const dist::NodeMap& nodes) {
  NodeOrder o;
  const int n = nodes.ranks();
  o.ranks.resize(static_cast<std::size_t>(n));
  std::iota(o.ranks.begin(), o.ranks.end(), 0);
  std::stable_sort(o.ranks.begin(), o.ranks.end(), [&](int a, int b) {
    return nodes.node_of[static_cast<std::size_t>(a)] < nodes.node_of[static_cast<std::size_t>(b)];
  });
  o.local_index.assign(static_cast<std::size_t>(n), 0);
  std::vector<int> count(static_cast<std::size_t>(nodes.nodes()), 0);
  for (const int r : o.ranks) {
    int& c = count[static_cast<std::size_t>(nodes.node_of[static_cast<std::size_t>(r)])];
    o.local_index[static_cast<std::size_t>(r)] = c++;
    o.widest = std::max(o.widest, c);
  }
  return o;
}

RedundancyPlan none_because(std::string why) {
  RedundancyPlan p;
  p.downgraded = std::move(why);
  return p;
}

}  // namespace

std::string RedundancyPlan::describe() const {
  switch (kind) {
    case Redundancy::none:
      return downgraded.empty() ? "no copies on other nodes (--ckpt-redundancy none)"
                                : fmt::format("no copies on other nodes: {}", downgraded);
    case Redundancy::partner:
      return "a copy of each rank's state on another node (partner)";
    case Redundancy::xor_parity: {
      std::size_t smallest = sets.empty() ? 0 : sets.front().size();
      std::size_t largest = smallest;
      for (const auto& s : sets) {
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      return fmt::format("XOR parity over {} set{} of {} ranks on as many nodes", sets.size(),
                         sets.size() == 1 ? "" : "s",
                         smallest == largest ? fmt::format("{}", smallest)
                                             : fmt::format("{}-{}", smallest, largest));
    }
  }
  return {};
}

RedundancyPlan plan_redundancy(Redundancy requested, const dist::NodeMap& nodes, int xor_set_size) {
  if (requested == Redundancy::none) return {};
  if (nodes.nodes() < 2) {
    return none_because(
        "the run is on a single node (the node-local level still restarts a crashed rank)");
  }
  const NodeOrder order = node_order(nodes);
  const int n = nodes.ranks();
  RedundancyPlan plan;
  plan.kind = requested;
  if (requested == Redundancy::partner) {
    plan.copy_holder.assign(static_cast<std::size_t>(n), -1);
    plan.copy_source.assign(static_cast<std::size_t>(n), -1);
    for (int i = 0; i < n; ++i) {
      const int rank = order.ranks[static_cast<std::size_t>(i)];
      const int holder = order.ranks[static_cast<std::size_t>((i + order.widest) % n)];
      if (nodes.node_of[static_cast<std::size_t>(holder)] ==
          nodes.node_of[static_cast<std::size_t>(rank)]) {
        return none_because(fmt::format(
            "rank {} has no partner on another node (one node holds more than half the ranks)",
            rank));
      }
      plan.copy_holder[static_cast<std::size_t>(rank)] = holder;
      plan.copy_source[static_cast<std::size_t>(holder)] = rank;
    }
    return plan;
  }
  // XOR: sets keyed by (local index, group of set_size consecutive nodes); a last group of
  // fewer nodes than set_size joins the one before it when it would be a single node.
  const int set_size = std::max(2, xor_set_size);
  const int groups = std::max(1, nodes.nodes() / set_size);
  std::vector<std::vector<int>> by_key;
  std::vector<std::pair<int, int>> keys;
  plan.set_of.assign(static_cast<std::size_t>(n), -1);
  plan.position_in_set.assign(static_cast<std::size_t>(n), -1);
  for (const int rank : order.ranks) {
    const int group =
        std::min(nodes.node_of[static_cast<std::size_t>(rank)] / set_size, groups - 1);
    const std::pair<int, int> key{order.local_index[static_cast<std::size_t>(rank)], group};
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      by_key.emplace_back();
      it = keys.end() - 1;
    }
    by_key[static_cast<std::size_t>(it - keys.begin())].push_back(rank);
  }
  for (std::size_t s = 0; s < by_key.size(); ++s) {
    if (by_key[s].size() < 2) {
      return none_because(fmt::format(
          "rank {} has no XOR set on other nodes (the nodes run different numbers of ranks)",
          by_key[s].front()));
    }
    for (std::size_t p = 0; p < by_key[s].size(); ++p) {
      plan.set_of[static_cast<std::size_t>(by_key[s][p])] = static_cast<int>(s);
      plan.position_in_set[static_cast<std::size_t>(by_key[s][p])] = static_cast<int>(p);
    }
  }
  plan.sets = std::move(by_key);
  return plan;
}

std::int64_t xor_chunk_bytes(std::int64_t longest, int members) noexcept {
  const std::int64_t chunks = std::max(1, members - 1);
  const std::int64_t c = (longest + chunks - 1) / chunks;
  return std::max<std::int64_t>(8, (c + 7) / 8 * 8);
}

void xor_into(std::span<std::byte> dst, std::span<const std::byte> src) noexcept {
  const std::size_t n = std::min(dst.size(), src.size());
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t a = 0;
    std::uint64_t b = 0;
    std::memcpy(&a, dst.data() + i, 8);
    std::memcpy(&b, src.data() + i, 8);
    a ^= b;
    std::memcpy(dst.data() + i, &a, 8);
  }
  for (; i < n; ++i) dst[i] ^= src[i];
}

}  // namespace l3::ckpt
