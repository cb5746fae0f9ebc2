// The typed MPI wrappers of src/dist (collectives, point to point, requests, communicators) on
// a World of the whole job. Run with 2 and 3 ranks (an odd count: the rings wrap unevenly).
#include "dist/collectives.hpp"

#include <mpi.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "dist/communicator.hpp"
#include "dist/library_versions.hpp"
#include "dist/mpi_type.hpp"
#include "dist/point_to_point.hpp"
#include "dist/request.hpp"
#include "dist/thread_budget.hpp"
#include "dist/wait_policy.hpp"
#include "dist/world.hpp"

namespace dist = l3::dist;
using dist::ReduceOp;

TEST_CASE("element types map to MPI's datatypes", "[dist]") {
  CHECK(dist::mpi_type<float>() == MPI_FLOAT);
  CHECK(dist::mpi_type<double>() == MPI_DOUBLE);
  CHECK(dist::mpi_type<const int>() == MPI_INT);
  CHECK(dist::mpi_type<std::int64_t>() == MPI_INT64_T);
  CHECK(dist::mpi_type<std::uint64_t>() == MPI_UINT64_T);
  CHECK(dist::mpi_type<char>() == MPI_CHAR);
  CHECK(dist::mpi_type<std::byte>() == MPI_BYTE);
  if constexpr (!std::is_same_v<long long, std::int64_t>) {
    CHECK(dist::mpi_type<long long>() == MPI_LONG_LONG);
  }
  CHECK(dist::mpi_op(ReduceOp::bitwise_xor) == MPI_BXOR);
  CHECK_THROWS_AS(dist::mpi_count(static_cast<std::size_t>(std::numeric_limits<int>::max()) + 1,
                                  "MPI_Send", "too much"),
                  l3::core::Error);
}

TEST_CASE("all_reduce with every op, in place and on one value", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.comm();
  const int n = world.size();
  const int r = world.rank();
  CHECK(dist::all_reduce(comm, r + 1, ReduceOp::sum) == n * (n + 1) / 2);
  CHECK(dist::all_reduce(comm, r, ReduceOp::max) == n - 1);
  CHECK(dist::all_reduce(comm, r + 5, ReduceOp::min) == 5);
  CHECK(dist::all_reduce(comm, 1 << r, ReduceOp::bitwise_or) == (1 << n) - 1);
  // 1 ^ 1 ^ ... : 1 for an odd count of ranks, 0 for an even one.
  CHECK(dist::all_reduce(comm, std::uint64_t{1}, ReduceOp::bitwise_xor) ==
        static_cast<std::uint64_t>(n % 2));
  CHECK(dist::all_reduce(comm, static_cast<long long>(r), ReduceOp::sum) ==
        static_cast<long long>(n) * (n - 1) / 2);

  std::vector<double> values{0.5 * r, 1.0, -static_cast<double>(r)};
  dist::all_reduce(comm, std::span(values), ReduceOp::sum, "test doubles");
  CHECK(values ==
        std::vector<double>{0.25 * n * (n - 1), static_cast<double>(n), -0.5 * n * (n - 1)});
  std::array<std::int64_t, 2> extremes{r, -r};
  dist::all_reduce(comm, std::span<std::int64_t>(extremes), ReduceOp::max);
  CHECK(extremes == std::array<std::int64_t, 2>{n - 1, 0});
}

TEST_CASE("all_gather, all_gatherv and broadcast_value", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.comm();
  const int n = world.size();
  const int r = world.rank();

  const std::vector<int> ranks = dist::all_gather(comm, r * 10);
  REQUIRE(ranks.size() == static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) CHECK(ranks[static_cast<std::size_t>(k)] == k * 10);

  const std::array<char, 2> mine{static_cast<char>('a' + r), '!'};
  std::vector<char> all(static_cast<std::size_t>(2 * n));
  dist::all_gather(comm, std::span<const char>(mine), std::span(all), "letters");
  for (int k = 0; k < n; ++k) {
    CHECK(all[static_cast<std::size_t>(2 * k)] == 'a' + k);
    CHECK(all[static_cast<std::size_t>(2 * k + 1)] == '!');
  }

  // Rank k owns k + 1 values at the triangular offset; every rank ends with all of them.
  std::vector<int> counts(static_cast<std::size_t>(n));
  std::vector<int> displacements(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    counts[static_cast<std::size_t>(k)] = k + 1;
    displacements[static_cast<std::size_t>(k)] = k * (k + 1) / 2;
  }
  std::vector<float> buffer(static_cast<std::size_t>(n * (n + 1) / 2), -1.0F);
  const auto offset = [](int k) { return static_cast<std::size_t>(k * (k + 1) / 2); };
  for (int i = 0; i <= r; ++i)
    buffer[offset(r) + static_cast<std::size_t>(i)] = static_cast<float>(r);
  dist::all_gatherv(comm, std::span(buffer), counts, displacements, "pieces");
  for (int k = 0; k < n; ++k)
    for (int i = 0; i <= k; ++i)
      CHECK(buffer[offset(k) + static_cast<std::size_t>(i)] == static_cast<float>(k));

  CHECK(dist::broadcast_value(comm, r == n - 1 ? 42 : -1, n - 1) == 42);
}

TEST_CASE("reduce_scatter and reduce_scatter_block", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.comm();
  const int n = world.size();
  const int r = world.rank();

  // Block k (k + 1 values) of every rank holds that rank's number; rank k gets their sum.
  std::vector<int> counts(static_cast<std::size_t>(n));
  std::iota(counts.begin(), counts.end(), 1);
  std::vector<float> send(static_cast<std::size_t>(n * (n + 1) / 2), static_cast<float>(r));
  std::vector<float> piece(static_cast<std::size_t>(r + 1), -1.0F);
  dist::reduce_scatter(comm, std::span<const float>(send), std::span(piece), counts, ReduceOp::sum,
                       "floats");
  const int rank_sum = n * (n - 1) / 2;
  for (const float v : piece) CHECK(v == static_cast<float>(rank_sum));

  // XOR parity: block k of rank j is (j + 1) << k; rank k gets the XOR over j.
  std::vector<std::uint64_t> blocks(2 * static_cast<std::size_t>(n));
  for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k) {
    blocks[2 * k] = static_cast<std::uint64_t>(r + 1) << k;
    blocks[2 * k + 1] = 0xFFU;
  }
  std::array<std::uint64_t, 2> parity{};
  dist::reduce_scatter_block(comm, std::span<const std::uint64_t>(blocks),
                             std::span<std::uint64_t>(parity), ReduceOp::bitwise_xor, "parity");
  std::uint64_t expected = 0;
  for (int j = 0; j < n; ++j) expected ^= static_cast<std::uint64_t>(j + 1) << r;
  CHECK(parity[0] == expected);
  CHECK(parity[1] == (n % 2 == 1 ? 0xFFU : 0U));
}

TEST_CASE("gather_bytes of a struct", "[dist]") {
  struct Record {
    std::int64_t line;
    double score;
  };
  const dist::World world(MPI_COMM_WORLD);
  const std::vector<Record> all =
      dist::gather_bytes(world.comm(), Record{world.rank() + 1, 0.5 * world.rank()}, 0, "records");
  if (!world.is_root()) {
    CHECK(all.empty());
    return;
  }
  REQUIRE(all.size() == static_cast<std::size_t>(world.size()));
  for (int k = 0; k < world.size(); ++k) {
    CHECK(all[static_cast<std::size_t>(k)].line == k + 1);
    CHECK(all[static_cast<std::size_t>(k)].score == 0.5 * k);
  }
}

TEST_CASE("split, comm_rank and comm_size", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  CHECK(dist::comm_rank(world.comm()) == world.rank());
  CHECK(dist::comm_size(world.comm()) == world.size());
  // Odd and even ranks, each part in reverse rank order.
  const dist::UniqueComm part = dist::split(world.comm(), world.rank() % 2, -world.rank(), "test");
  REQUIRE(part);
  const int members = (world.size() + 1 - world.rank() % 2) / 2;
  CHECK(dist::comm_size(part.get()) == members);
  CHECK(dist::comm_rank(part.get()) == members - 1 - world.rank() / 2);
  CHECK(dist::all_reduce(part.get(), 1, ReduceOp::sum) == members);
  const dist::UniqueComm none = dist::split(world.comm(), MPI_UNDEFINED, 0);
  CHECK_FALSE(none);
}

TEST_CASE("send, receive and send_receive around a ring", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.comm();
  const int n = world.size();
  const int r = world.rank();
  const int next = (r + 1) % n;
  const int previous = (r + n - 1) % n;
  constexpr int kTag = 5;

  // Even ranks send first, so that the blocking ring cannot deadlock with any count of ranks
  // (rank 0 and rank n-1 of an odd ring are both even: rank 0 receives from n-1 last).
  std::array<std::byte, 3> out{std::byte{1}, std::byte{2}, static_cast<std::byte>(r)};
  std::array<std::byte, 3> in{};
  if (r % 2 == 0 && r != n - 1) {
    dist::send(comm, std::span<const std::byte>(out), next, kTag, "bytes");
    dist::receive(comm, std::span<std::byte>(in), previous, kTag, "bytes");
  } else {
    dist::receive(comm, std::span<std::byte>(in), previous, kTag, "bytes");
    dist::send(comm, std::span<const std::byte>(out), next, kTag, "bytes");
  }
  CHECK(in[2] == static_cast<std::byte>(previous));

  if (r == 0) dist::send_value(comm, std::int64_t{1} << 40, n - 1, kTag);
  if (r == n - 1) CHECK(dist::receive_value<std::int64_t>(comm, 0, kTag) == std::int64_t{1} << 40);

  CHECK(dist::send_receive_value(comm, r * 3, next, previous, kTag, "ring") == previous * 3);
  std::vector<double> sent(static_cast<std::size_t>(r + 1), static_cast<double>(r));
  std::vector<double> received(static_cast<std::size_t>(previous + 1), -1.0);
  dist::send_receive(comm, std::span<const double>(sent), next, std::span(received), previous, kTag,
                     "ring of doubles");
  for (const double v : received) CHECK(v == static_cast<double>(previous));
}

TEST_CASE("MPI failures name the call and what it moved", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);  // MPI_ERRORS_RETURN on its communicator
  try {
    dist::send_value(world.comm(), 1, world.size() + 7, 0, "to nobody");
    FAIL("sent to a rank that does not exist");
  } catch (const l3::core::Error& e) {
    CHECK(std::string(e.what()).find("MPI_Send(to nobody) failed") != std::string::npos);
  }
}

TEST_CASE("Request: wait, test, wait_all, cancel and a barrier", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.comm();
  const int n = world.size();
  const int r = world.rank();
  const int next = (r + 1) % n;
  const int previous = (r + n - 1) % n;
  constexpr int kTag = 9;

  int from = -1;
  dist::Request receive = dist::start_receive(comm, std::span(&from, 1), previous, kTag, "ring");
  CHECK(receive.active());
  std::vector<dist::Request> sends;
  sends.push_back(dist::start_send(comm, std::span(&r, 1), next, kTag, "ring"));
  while (!receive.test("ring")) {
  }
  CHECK_FALSE(receive.active());
  CHECK(from == previous);
  dist::Request::wait_all(sends, "ring");
  CHECK_FALSE(sends[0].active());
  receive.wait();  // inactive: returns at once, as MPI_Wait on MPI_REQUEST_NULL

  // A receive nobody matches: cancelled, then inactive; another one left to the destructor.
  int never = -1;
  dist::Request unmatched =
      dist::start_receive(comm, std::span(&never, 1), MPI_ANY_SOURCE, kTag + 1, "nothing");
  unmatched.cancel("nothing");
  CHECK_FALSE(unmatched.active());
  CHECK(never == -1);
  {
    int also_never = -1;
    const dist::Request dropped =
        dist::start_receive(comm, std::span(&also_never, 1), MPI_ANY_SOURCE, kTag + 2, "nothing");
  }

  dist::Request barrier = dist::start_barrier(comm, "test");
  barrier.wait("test");
  CHECK_FALSE(barrier.active());
  // Moved-from Requests are inactive; the moved-to one completes.
  dist::Request first = dist::start_barrier(comm);
  dist::Request second = std::move(first);
  // NOLINTNEXTLINE(bugprone-use-after-move,clang-analyzer-cplusplus.Move): the moved-from state
  CHECK_FALSE(first.active());
  while (!second.test()) {
  }
}

TEST_CASE("library versions: MPI's first, then core's", "[dist]") {
  const std::vector<l3::core::LibraryVersion> all = dist::library_versions();
  const std::vector<l3::core::LibraryVersion> core = l3::core::library_versions();
  REQUIRE(all.size() == core.size() + 1);
  CHECK(all[0].name == "MPI");
  CHECK(all[0].version.find("(MPI ") != std::string::npos);
  for (std::size_t i = 0; i < core.size(); ++i) CHECK(all[i + 1].name == core[i].name);
}

// The passive wait policy runs each collective as its nonblocking twin polled with sleeps
// (dist/wait_policy.hpp). A run may resume under the other policy (another node shape), so the
// reductions must give the active policy's bits: float sums of values whose rounding depends on
// the order of the terms, from one value to beyond MPICH's switch to its large-message
// algorithms, and every collective and point-to-point call the library makes.
TEST_CASE("the passive wait policy gives the active policy's bits", "[dist]") {
  const dist::World world(MPI_COMM_WORLD);
  const MPI_Comm comm = world.comm();
  const int n = world.size();
  const int r = world.rank();
  REQUIRE(dist::wait_policy() == dist::WaitPolicy::active);
  // Values of very different magnitudes per rank and element: their sum rounds differently in
  // another order (seeded by rank and element: the same numbers every run).
  const auto value = [&](std::size_t i) {
    const std::uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(r + 1)
                                                                  << 40U;
    const double unit = static_cast<double>(h >> 11U) * 0x1.0p-53;
    return static_cast<float>((unit - 0.5) * std::ldexp(1.0, static_cast<int>(h % 40U) - 20));
  };
  struct Results {
    std::vector<std::vector<float>> sums, pieces, blocks;
    std::vector<float> gathered;
    std::vector<std::string> texts;
    std::string broadcast;
    int ring = -1;
    int failure_seen = -1;
  };
  const auto run_all = [&] {
    Results out;
    for (const std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{1000},
                                   std::size_t{70000}, std::size_t{600000}}) {
      std::vector<float> values(size);
      for (std::size_t i = 0; i < size; ++i) values[i] = value(i);
      dist::all_reduce(comm, std::span(values), ReduceOp::sum, "sums");
      out.sums.push_back(values);

      // Uneven pieces (rank k gets k + 1 parts of size / n) and even blocks of the same values.
      std::vector<int> counts(static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k)
        counts[static_cast<std::size_t>(k)] = static_cast<int>(size) / n * (k + 1) / n + 1;
      const auto total = static_cast<std::size_t>(std::accumulate(counts.begin(), counts.end(), 0));
      std::vector<float> send(total);
      for (std::size_t i = 0; i < total; ++i) send[i] = value(i);
      std::vector<float> piece(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
      dist::reduce_scatter(comm, std::span<const float>(send), std::span(piece), counts,
                           ReduceOp::sum, "pieces");
      out.pieces.push_back(piece);
      const std::size_t block_size = size / static_cast<std::size_t>(n) + 1;
      std::vector<float> block_send(block_size * static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < block_send.size(); ++i) block_send[i] = value(i);
      std::vector<float> block(block_size);
      dist::reduce_scatter_block(comm, std::span<const float>(block_send), std::span(block),
                                 ReduceOp::sum, "blocks");
      out.blocks.push_back(block);
    }
    out.gathered.assign(static_cast<std::size_t>(n) * 3, 0.0F);
    for (std::size_t i = 0; i < 3; ++i)
      out.gathered[static_cast<std::size_t>(r) * 3 + i] = value(i);
    const std::vector<int> counts(static_cast<std::size_t>(n), 3);
    std::vector<int> displacements(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) displacements[static_cast<std::size_t>(k)] = 3 * k;
    dist::all_gatherv(comm, std::span(out.gathered), counts, displacements, "gathered");
    out.texts = dist::gather_strings(comm, "rank " + std::to_string(r), 0);
    out.broadcast = dist::broadcast_string(comm, r == 0 ? "from rank 0" : "", 0);
    out.ring = dist::send_receive_value(comm, r, (r + 1) % n, (r + n - 1) % n, 5, "ring");
    try {
      dist::agree_on_failure(world, nullptr);
      out.failure_seen = 0;
    } catch (...) {
      out.failure_seen = 1;
    }
    return out;
  };
  const Results active = run_all();
  dist::set_wait_policy(dist::WaitPolicy::passive);
  Results passive;
  try {
    passive = run_all();
  } catch (...) {
    dist::set_wait_policy(dist::WaitPolicy::active);
    throw;
  }
  dist::set_wait_policy(dist::WaitPolicy::active);
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (std::size_t k = 0; k < active.sums.size(); ++k) {
    INFO("size case " << k);
    CHECK(same_bits(active.sums[k], passive.sums[k]));
    CHECK(same_bits(active.pieces[k], passive.pieces[k]));
    CHECK(same_bits(active.blocks[k], passive.blocks[k]));
  }
  CHECK(same_bits(active.gathered, passive.gathered));
  CHECK(active.texts == passive.texts);
  CHECK(passive.broadcast == "from rank 0");
  CHECK(passive.ring == (r + n - 1) % n);
  CHECK(passive.failure_seen == 0);
}

TEST_CASE("threads per rank: the fewest cores the mask, a quota, Slurm or the node's share allow",
          "[dist]") {
  using dist::CpuView;
  const auto budget = [](const CpuView& v, const char* omp = nullptr) {
    return dist::thread_budget(v, omp);
  };
  // An unbound rank: its share of the node.
  CHECK(budget({.affinity_cpus = 16, .node_cpus = 16, .ranks_on_node = 2}).threads == 8);
  CHECK(budget({.affinity_cpus = 16, .node_cpus = 16, .ranks_on_node = 2}).reason ==
        "16 cpus / 2 ranks on the node");
  CHECK(budget({.affinity_cpus = 2, .node_cpus = 2, .ranks_on_node = 4}).threads == 1);
  // Bound by the launcher: all of its mask.
  CHECK(budget({.affinity_cpus = 4, .node_cpus = 64, .ranks_on_node = 8}).threads == 4);
  CHECK(budget({.affinity_cpus = 4, .node_cpus = 64, .ranks_on_node = 8}).reason ==
        "bound to 4 cpus");
  // A container's quota on a larger host: the quota's share, the mask notwithstanding.
  const CpuView docker{.affinity_cpus = 64, .node_cpus = 64, .ranks_on_node = 1, .quota_cpus = 2.5};
  CHECK(budget(docker).threads == 2);
  CHECK(budget(docker).reason == "a CPU quota of 2.5 cpus (cgroup cpu.max) / 1 rank");
  CHECK(docker.shared_cpus() == 2);
  CHECK(
      budget({.affinity_cpus = 64, .node_cpus = 64, .ranks_on_node = 4, .quota_cpus = 2}).threads ==
      1);
  // Slurm's allocation without binding.
  const CpuView slurm{
      .affinity_cpus = 32, .node_cpus = 32, .ranks_on_node = 2, .slurm_cpus_per_task = 6};
  CHECK(budget(slurm).threads == 6);
  CHECK(budget(slurm).reason == "SLURM_CPUS_PER_TASK=6");
  // OMP_NUM_THREADS wins; nonsense in it does not.
  CHECK(budget(slurm, "3").threads == 3);
  CHECK(budget(slurm, "3").reason == "OMP_NUM_THREADS");
  CHECK(budget(slurm, "x").threads == 6);
  CHECK(budget({.affinity_cpus = 0, .node_cpus = 0, .ranks_on_node = 0}).threads == 1);
}

TEST_CASE("cgroup v2 cpu.max: the quota in cpus, 0 without one", "[dist]") {
  const std::string file =
      std::filesystem::temp_directory_path() / ("l3-cpu-max-" + std::to_string(::getpid()));
  const auto quota = [&](const char* text) {
    std::ofstream(file) << text;
    return dist::cgroup_cpu_quota(file.c_str());
  };
  CHECK(quota("200000 100000\n") == 2.0);
  CHECK(quota("150000 100000\n") == 1.5);
  CHECK(quota("max 100000\n") == 0.0);
  CHECK(quota("garbage\n") == 0.0);
  CHECK(quota("-5 100000\n") == 0.0);
  std::filesystem::remove(file);
  CHECK(dist::cgroup_cpu_quota(file.c_str()) == 0.0);  // no file: no quota known
}

TEST_CASE("a busy node: the other running threads, and the advice when they take the cores",
          "[dist]") {
  const std::string file =
      std::filesystem::temp_directory_path() / ("l3-stat-" + std::to_string(::getpid()));
  std::ofstream(file) << "cpu  1 2 3\nintr 5 6\nprocs_running 5\nprocs_blocked 0\n";
  CHECK(dist::other_running_threads(2, file.c_str()) == 3);  // 5 running, 2 of them ours
  CHECK(dist::other_running_threads(8, file.c_str()) == 0);
  std::ofstream(file) << "cpu  1 2 3\n";
  CHECK(dist::other_running_threads(1, file.c_str()) == 0);  // nothing to read: not busy
  std::filesystem::remove(file);
  CHECK(dist::other_running_threads(1, file.c_str()) == 0);
  CHECK(dist::other_running_threads(1) >= 0);          // this machine's, whatever it is
  CHECK(dist::busy_node_advice(0, 2, 1, 2).empty());   // idle
  CHECK(dist::busy_node_advice(3, 2, 2, 1).empty());   // one thread: nothing to advise
  CHECK(dist::busy_node_advice(1, 16, 2, 4).empty());  // 2 x 4 + 1 fit 16 cpus
  const std::string advice = dist::busy_node_advice(1, 2, 1, 2);
  CHECK_THAT(advice, Catch::Contains("1 other thread was running beside this job's 1 rank on 2 "
                                     "cpus"));
  CHECK_THAT(advice, Catch::Contains("OMP_NUM_THREADS=1 avoids that"));
  CHECK_THAT(dist::busy_node_advice(6, 16, 2, 8), Catch::Contains("OMP_NUM_THREADS=5"));
}

TEST_CASE("the wait policy's rule: passive when a node's ranks would share cores", "[dist]") {
  using dist::WaitPolicy;
  CHECK(dist::wait_wish(2, 2, 1, nullptr).policy == WaitPolicy::active);
  CHECK(dist::wait_wish(2, 4, 1, nullptr).policy == WaitPolicy::passive);
  CHECK(dist::wait_wish(2, 4, 1, nullptr).reason == "4 ranks x 1 thread on 2 cpus");
  CHECK(dist::wait_wish(8, 2, 4, "auto").policy == WaitPolicy::active);
  CHECK(dist::wait_wish(8, 2, 8, "").policy == WaitPolicy::passive);
  CHECK(dist::wait_wish(2, 4, 1, "active").policy == WaitPolicy::active);
  CHECK(dist::wait_wish(64, 1, 1, "passive").policy == WaitPolicy::passive);
  CHECK_THROWS_WITH(dist::wait_wish(2, 1, 1, "spin"),
                    Catch::Contains("L3_WAIT_POLICY=spin: expected active, passive or auto"));
}
