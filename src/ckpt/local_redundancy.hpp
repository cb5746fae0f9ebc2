// How the node-local checkpoint level survives the loss of nodes (docs/HPC.md): which rank
// holds a copy of which rank's state (partner), or which ranks form the XOR parity sets, and
// the arithmetic of XOR parity. Pure functions of the node map, the same on every rank.
//
// Partner: ranks are listed node by node; rank at position i of that list keeps a copy of the
// rank at position i - s, where s is the largest number of ranks on a node. With equal nodes
// that is the rank of the same local index on the previous node: node n's copies live on node
// n+1 (the last node's on node 0). A node's loss is survived unless the node holding its copies
// is lost too.
//
// XOR: the ranks of the same local index on up to `set_size` consecutive nodes form a set of G
// members. Each member's state (its file's bytes, zero-padded to (G-1)·C bytes, C the set's chunk
// size) is cut into G-1 chunks; member k keeps the parity segment
//     P_k = XOR over members m != k of chunk c(m, k) of member m,   c(m, k) = (k - m - 1) mod G,
// so every member's chunks are spread over the other G-1 members' segments (RAID-5 rotation).
// Any one member of each set can be rebuilt from the others' states and segments; each rank
// stores 1/(G-1) of a state extra, where a partner copy stores a whole one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dist/node_map.hpp"

namespace l3::ckpt {

enum class Redundancy : std::uint8_t { none, partner, xor_parity };
[[nodiscard]] std::string_view redundancy_name(Redundancy r) noexcept;  // none, partner, xor
// usage Error naming --ckpt-redundancy for anything else.
[[nodiscard]] Redundancy parse_redundancy(std::string_view text);

struct RedundancyPlan {
  Redundancy kind = Redundancy::none;  // what is done (none when the request cannot be met)
  std::string downgraded;              // why the request became none ("" when it did not)
  // partner: copy_holder[r] keeps rank r's copy; copy_source[h] is whose copy rank h keeps.
  std::vector<int> copy_holder;
  std::vector<int> copy_source;
  // xor: the sets (members in set order: by node) and each rank's set and position in it.
  std::vector<std::vector<int>> sets;
  std::vector<int> set_of;
  std::vector<int> position_in_set;

  [[nodiscard]] std::string describe() const;  // one line for the log
};

// What `requested` becomes on this placement of ranks. A single node, or a placement where a
// rank would have to keep its copy (or share a set) on its own node, gives none with the reason.
[[nodiscard]] RedundancyPlan plan_redundancy(Redundancy requested, const dist::NodeMap& nodes,
                                             int xor_set_size);

// The chunk of member `m` that member `k`'s segment holds (k != m) in a set of `members`.
[[nodiscard]] constexpr int xor_chunk(int m, int k, int members) noexcept {
  return (k - m - 1 + 2 * members) % members;
}
// The chunk size of a set whose largest state has `longest` bytes: a multiple of 8 bytes with
// (members-1) chunks covering it.
[[nodiscard]] std::int64_t xor_chunk_bytes(std::int64_t longest, int members) noexcept;

// dst ^= src, byte for byte (the sizes must match).
void xor_into(std::span<std::byte> dst, std::span<const std::byte> src) noexcept;

}  // namespace l3::ckpt
