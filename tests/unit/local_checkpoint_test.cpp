// The node-local checkpoint level's pure parts: the placement of partner copies and XOR sets,
// the XOR parity arithmetic (encode, lose any one member, rebuild), and the local files
// (round trip, and truncation or a flipped bit caught), and the restore plan.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "catch.hpp"
#include "ckpt/local_checkpoint_writer.hpp"
#include "ckpt/local_files.hpp"
#include "ckpt/local_redundancy.hpp"
#include "ckpt/local_restore.hpp"
#include "ckpt/manifest.hpp"
#include "dist/node_map.hpp"
#include "model/model_config.hpp"
#include "temp_dir.hpp"

using l3::ckpt::Redundancy;
using l3::dist::NodeMap;

namespace {

// `per_node[n]` ranks on node n, numbered node by node.
NodeMap nodes_of(const std::vector<int>& per_node) {
  std::vector<int> node_of;
  std::vector<std::string> names;
  for (std::size_t n = 0; n < per_node.size(); ++n) {
    names.push_back("n" + std::to_string(n));
    for (int i = 0; i < per_node[n]; ++i) node_of.push_back(static_cast<int>(n));
  }
  return NodeMap::from(node_of, names);
}

}  // namespace

TEST_CASE("partner copies live on the next node, never on their own", "[local]") {
  const auto plan = l3::ckpt::plan_redundancy(Redundancy::partner, nodes_of({2, 2}), 8);
  REQUIRE(plan.kind == Redundancy::partner);
  CHECK(plan.copy_holder == std::vector<int>{2, 3, 0, 1});
  CHECK(plan.copy_source == std::vector<int>{2, 3, 0, 1});
  const auto three = l3::ckpt::plan_redundancy(Redundancy::partner, nodes_of({2, 2, 2}), 8);
  CHECK(three.copy_holder == std::vector<int>{2, 3, 4, 5, 0, 1});
  CHECK(three.copy_source == std::vector<int>{4, 5, 0, 1, 2, 3});

  const auto single = l3::ckpt::plan_redundancy(Redundancy::partner, nodes_of({4}), 8);
  CHECK(single.kind == Redundancy::none);
  CHECK_THAT(single.downgraded, Catch::Contains("single node"));
  // One node with more than half the ranks: some rank would keep its copy at home.
  const auto lopsided = l3::ckpt::plan_redundancy(Redundancy::partner, nodes_of({3, 1}), 8);
  CHECK(lopsided.kind == Redundancy::none);
  CHECK_THAT(lopsided.downgraded, Catch::Contains("no partner on another node"));
  CHECK(l3::ckpt::plan_redundancy(Redundancy::none, nodes_of({2, 2}), 8).downgraded.empty());
}

TEST_CASE("XOR sets: one rank per node, ranks of the same local index", "[local]") {
  const auto all = l3::ckpt::plan_redundancy(Redundancy::xor_parity, nodes_of({2, 2, 2, 2}), 8);
  REQUIRE(all.kind == Redundancy::xor_parity);
  CHECK(all.sets == std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}});
  const auto pairs = l3::ckpt::plan_redundancy(Redundancy::xor_parity, nodes_of({2, 2, 2, 2}), 2);
  CHECK(pairs.sets == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(pairs.set_of == std::vector<int>{0, 1, 0, 1, 2, 3, 2, 3});
  CHECK(pairs.position_in_set == std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1});
  // Five nodes in sets of two: the fifth joins the last group rather than standing alone.
  const auto five = l3::ckpt::plan_redundancy(Redundancy::xor_parity, nodes_of({1, 1, 1, 1, 1}), 2);
  CHECK(five.sets == std::vector<std::vector<int>>{{0, 1}, {2, 3, 4}});
  const auto uneven = l3::ckpt::plan_redundancy(Redundancy::xor_parity, nodes_of({2, 1}), 8);
  CHECK(uneven.kind == Redundancy::none);
  CHECK_THAT(uneven.downgraded, Catch::Contains("no XOR set"));
}

TEST_CASE("XOR parity rebuilds any one lost member of a set", "[local]") {
  std::mt19937_64 random(20261203);
  for (const int g : {2, 3, 5}) {
    std::vector<std::vector<std::byte>> states;
    std::int64_t longest = 0;
    for (int m = 0; m < g; ++m) {
      std::vector<std::byte> s(
          static_cast<std::size_t>(1000 + 37 * m + static_cast<int>(random() % 50)));
      for (std::byte& b : s) b = static_cast<std::byte>(random());
      longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(s.size()));
      states.push_back(std::move(s));
    }
    const std::int64_t chunk = l3::ckpt::xor_chunk_bytes(longest, g);
    REQUIRE(chunk % 8 == 0);
    REQUIRE(chunk * (g - 1) >= longest);
    // Chunk j of member m, zero-padded.
    const auto chunk_of = [&](int m, int j) {
      std::vector<std::byte> out(static_cast<std::size_t>(chunk), std::byte{0});
      const auto& s = states[static_cast<std::size_t>(m)];
      for (std::int64_t i = 0; i < chunk; ++i) {
        const std::int64_t at = j * chunk + i;
        if (at < static_cast<std::int64_t>(s.size()))
          out[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(at)];
      }
      return out;
    };
    std::vector<std::vector<std::byte>> parity(
        static_cast<std::size_t>(g), std::vector<std::byte>(static_cast<std::size_t>(chunk)));
    for (int k = 0; k < g; ++k) {
      for (int m = 0; m < g; ++m) {
        if (m != k)
          l3::ckpt::xor_into(parity[static_cast<std::size_t>(k)],
                             chunk_of(m, l3::ckpt::xor_chunk(m, k, g)));
      }
    }
    for (int lost = 0; lost < g; ++lost) {
      // Each of the lost member's chunks is in one other member's segment.
      std::vector<std::byte> rebuilt(static_cast<std::size_t>(chunk * (g - 1)));
      for (int k = 0; k < g; ++k) {
        if (k == lost) continue;
        std::vector<std::byte> piece = parity[static_cast<std::size_t>(k)];
        for (int m = 0; m < g; ++m) {
          if (m != k && m != lost)
            l3::ckpt::xor_into(piece, chunk_of(m, l3::ckpt::xor_chunk(m, k, g)));
        }
        std::copy(
            piece.begin(), piece.end(),
            rebuilt.begin() + static_cast<std::ptrdiff_t>(l3::ckpt::xor_chunk(lost, k, g) * chunk));
      }
      rebuilt.resize(states[static_cast<std::size_t>(lost)].size());
      CHECK(rebuilt == states[static_cast<std::size_t>(lost)]);
    }
  }
}

TEST_CASE("node-local files: round trip, and damage caught", "[local]") {
  const l3::test::TempDir dir;
  const l3::model::ModelConfig config = l3::model::resolve_model("tiny");
  const l3::model::ParameterLayout layout(config, l3::model::HeadKind::language_model);
  l3::ckpt::RunFacts facts;
  facts.step = 12;
  facts.phase = l3::Phase::sft;
  facts.model = config;
  facts.world_size = 2;
  facts.data_epoch = 1;
  facts.data_step = 3;
  facts.adamw_step = 11;
  const l3::ckpt::Manifest manifest = l3::ckpt::describe_checkpoint(facts);
  l3::ckpt::RankState state;
  state.allocate({{0, layout.total() / 3}, {layout.total() / 2, layout.total()}});
  std::iota(state.master.begin(), state.master.end(), 0.5F);
  std::fill(state.exp_avg.begin(), state.exp_avg.end(), 0.25F);
  std::fill(state.exp_avg_sq.begin(), state.exp_avg_sq.end(), 1e-6F);

  const l3::ckpt::StateImage image(layout, manifest, state, 1, 2, "n0");
  const std::string path = (dir.path() / "rank-00001.state").string();
  image.write_file(path);
  REQUIRE(static_cast<std::int64_t>(std::filesystem::file_size(path)) == image.size());
  // The image's bytes are the file's.
  std::vector<std::byte> from_image(static_cast<std::size_t>(image.size()) + 16);
  image.copy(0, from_image);
  std::vector<std::byte> from_file(from_image.size());
  l3::ckpt::read_file_bytes(path, 0, from_file);
  CHECK(from_image == from_file);

  const l3::ckpt::LocalFileCheck ok = l3::ckpt::check_local_file(path, true);
  CHECK(ok.ok);
  CHECK(ok.header.at("rank") == 1);
  const l3::ckpt::LocalState back = l3::ckpt::read_local_state(path);
  CHECK(back.rank == 1);
  CHECK(back.world_size == 2);
  CHECK(back.manifest.step == 12);
  CHECK(back.manifest.adamw_step == 11);
  CHECK(back.manifest.data_step == 3);
  CHECK(back.state.ranges == state.ranges);
  CHECK(back.state.master == state.master);
  CHECK(back.state.exp_avg_sq == state.exp_avg_sq);

  SECTION("a flipped bit in the data: caught by the checksums, not by the quick check") {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-7, std::ios::end);
    f.put('\x5a');
    f.close();
    CHECK(l3::ckpt::check_local_file(path, false).ok);
    const auto bad = l3::ckpt::check_local_file(path, true);
    CHECK_FALSE(bad.ok);
    CHECK_THAT(bad.problem, Catch::Contains("checksum mismatch") && Catch::Contains(path));
    CHECK_THROWS_WITH(l3::ckpt::read_local_state(path), Catch::Contains("checksum mismatch"));
  }
  SECTION("truncated: caught by its size") {
    std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
    const auto bad = l3::ckpt::check_local_file(path, false);
    CHECK_FALSE(bad.ok);
    CHECK_THAT(bad.problem, Catch::Contains("its header says"));
  }
  SECTION("a flipped bit in the header") {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('#');
    f.close();
    CHECK_THAT(l3::ckpt::check_local_file(path, false).problem, Catch::Contains("header checksum"));
  }
  SECTION("a parity file's segment is checked") {
    const std::string parity = (dir.path() / "rank-00001.xor").string();
    {
      l3::ckpt::ParityFileWriter w(parity, {{"format", "llama3-hpc/local-parity"},
                                            {"version", 1},
                                            {"step", 12},
                                            {"rank", 1},
                                            {"chunk", 16}});
      w.append(std::as_bytes(std::span(state.master.data(), 4)));
      w.commit();
    }
    CHECK(l3::ckpt::check_local_file(parity, true).ok);
    std::fstream f(parity, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-12, std::ios::end);
    f.put('\x01');
    f.close();
    CHECK_THAT(l3::ckpt::check_local_file(parity, true).problem,
               Catch::Contains("parity checksum"));
  }
}

TEST_CASE("node-local names and paths", "[local]") {
  CHECK(l3::dist::expand_node_pattern("/local/%h/x%%y", "nid0042") == "/local/nid0042/x%y");
  CHECK(l3::ckpt::local_file_name(l3::ckpt::LocalFileKind::copy, 3) == "rank-00003.copy");
  l3::ckpt::LocalFileKind kind{};
  int rank = -1;
  CHECK(l3::ckpt::parse_local_file_name("rank-00012.xor", kind, rank));
  CHECK((kind == l3::ckpt::LocalFileKind::parity && rank == 12));
  CHECK_FALSE(l3::ckpt::parse_local_file_name("rank-00012.state.tmp-1-2", kind, rank));
  CHECK_FALSE(l3::ckpt::parse_local_file_name("rank-12.state", kind, rank));
  // Runs into different --ckpt-dir never share a directory of the level.
  const std::string a = l3::ckpt::local_level_directory("/l/%h", "n1", "/runs/a");
  CHECK(a.starts_with("/l/n1/llama3-hpc."));
  CHECK(a != l3::ckpt::local_level_directory("/l/%h", "n1", "/runs/b"));
  CHECK(a == l3::ckpt::local_level_directory("/l/%h", "n1", "/runs/./a/"));
}

TEST_CASE("restrict_state copies the ranges asked for", "[local]") {
  l3::ckpt::RankState s;
  s.allocate({{0, 4}, {10, 14}});
  std::iota(s.master.begin(), s.master.end(), 0.0F);
  const l3::ckpt::RankState r = l3::ckpt::restrict_state(s, {{2, 4}, {11, 13}});
  CHECK(r.master == std::vector<float>{2, 3, 5, 6});
  CHECK_THROWS(l3::ckpt::restrict_state(s, {{3, 6}}));
}

TEST_CASE("restore plan: each rank's state from its file, a copy, elsewhere or XOR", "[local]") {
  using l3::ckpt::RestoreMode;
  using nlohmann::json;
  // Inventory entries as local_inventory makes them (the good files of one step).
  const auto file = [](const std::string& kind, int owner, int reader) {
    return json{{"kind", kind},
                {"owner", owner},
                {"reader", reader},
                {"path", fmt::format("d{}/{}-{}", reader, kind, owner)}};
  };
  const auto parity = [&](int owner, int reader) {
    json e = file("xor", owner, reader);
    e.update({{"set", {0, 1, 2}}, {"lengths", {100, 90, 80}}, {"chunk", 56}, {"payload", 4096}});
    return e;
  };
  const std::vector<std::string> directories{"a", "b", "c", "d"};
  std::string missing;
  // Rank 0 reads its own state; rank 1's state is read in rank 0's directory (moved); rank 2
  // has only its partner copy, held by rank 3; rank 3 reads its own.
  const std::vector<l3::ckpt::RankRestore> plan = l3::ckpt::plan_local_step(
      {file("state", 0, 0), file("state", 1, 0), file("copy", 2, 3), file("state", 3, 3)},
      directories, 4, missing);
  CHECK(missing.empty());
  REQUIRE(plan.size() == 4);
  CHECK((plan[0].mode == RestoreMode::direct && plan[0].path == "d0/state-0"));
  CHECK((plan[1].mode == RestoreMode::moved && plan[1].reader == 0));
  CHECK((plan[2].mode == RestoreMode::copy && plan[2].reader == 3 && plan[2].path == "d3/copy-2"));
  CHECK(plan[3].mode == RestoreMode::direct);

  // Rank 1 of the XOR set {0, 1, 2} is lost: rebuilt from ranks 0's and 2's files.
  const std::vector<l3::ckpt::RankRestore> rebuilt = l3::ckpt::plan_local_step(
      {file("state", 0, 0), parity(0, 0), file("state", 2, 2), parity(2, 2)}, directories, 3,
      missing);
  CHECK(missing.empty());
  REQUIRE(rebuilt.size() == 3);
  const l3::ckpt::RankRestore& lost = rebuilt[1];
  CHECK(lost.mode == RestoreMode::xor_rebuild);
  CHECK((lost.position == 1 && lost.members == 3 && lost.length == 90 && lost.chunk == 56));
  REQUIRE(lost.contributors.size() == 2);
  CHECK((lost.contributors[1].position == 2 && lost.contributors[1].reader == 2));
  CHECK((lost.contributors[1].state == "d2/state-2" && lost.contributors[1].parity == "d2/xor-2"));
  CHECK(lost.contributors[1].payload == 4096);

  // Without rank 2's parity, rank 1 cannot be rebuilt.
  (void)l3::ckpt::plan_local_step({file("state", 0, 0), parity(0, 0), file("state", 2, 2)},
                                  directories, 3, missing);
  CHECK_THAT(missing, Catch::Contains("misses rank 2's files"));
}
