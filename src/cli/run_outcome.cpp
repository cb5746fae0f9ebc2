#include "cli/run_outcome.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/request.hpp"

namespace l3::cli {

namespace {
int severity(int code) noexcept {
  switch (code) {
    case core::kExitOk:
      return 0;
    case core::kExitCheckpointed:
      return 1;
    case core::kExitInternal:
      return 3;
    case core::kExitBadInput:
      return 4;
    default:
      return 2;
  }
}
}  // namespace

int combine_exit_codes(std::span<const int> codes) noexcept {
  int combined = core::kExitOk;
  for (const int code : codes) {
    const int a = severity(code);
    const int b = severity(combined);
    if (a > b || (a == b && code > combined)) combined = code;
  }
  return combined;
}

std::string format_rank_list(std::span<const int> sorted_ranks) {
  std::string text;
  for (std::size_t i = 0; i < sorted_ranks.size();) {
    std::size_t j = i;
    while (j + 1 < sorted_ranks.size() && sorted_ranks[j + 1] == sorted_ranks[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += j == i ? fmt::format("{}", sorted_ranks[i])
                   : fmt::format("{}-{}", sorted_ranks[i], sorted_ranks[j]);
    i = j + 1;
  }
  return text;
}

std::vector<std::string> error_lines(std::span<const RankOutcome> outcomes, std::size_t max_lines) {
  // message -> ranks that reported it, listed in the order of each message's lowest rank
  std::map<std::string, std::vector<int>> by_message;
  std::vector<std::string> order;
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    const std::string& message = outcomes[r].message;
    if (message.empty()) continue;
    auto [it, inserted] = by_message.try_emplace(message);
    if (inserted) order.push_back(message);
    it->second.push_back(static_cast<int>(r));
  }

  std::vector<std::string> lines;
  if (order.size() == 1 && by_message[order[0]].size() == outcomes.size()) {
    lines.push_back("error: " + order[0]);
    return lines;
  }
  for (const std::string& message : order) {
    if (lines.size() == max_lines) {
      lines.push_back(
          fmt::format("error: ... and {} more distinct error messages", order.size() - max_lines));
      break;
    }
    const std::vector<int>& ranks = by_message[message];
    lines.push_back(fmt::format("error: [rank{} {}] {}", ranks.size() > 1 ? "s" : "",
                                format_rank_list(ranks), message));
  }
  return lines;
}

int conclude_run(MPI_Comm comm, MPI_Comm abort_comm, const RankOutcome& mine, double grace_seconds,
                 const core::LogSink& out) {
  const int rank = dist::comm_rank(comm);
  const int size = dist::comm_size(comm);

  // Phase 1: is everybody here? A rank with nothing to report waits as long as it takes.
  dist::Request arrived = dist::start_barrier(comm);
  const bool failed = mine.exit_code != core::kExitOk && mine.exit_code != core::kExitCheckpointed;
  if (!failed) {
    arrived.wait();
  } else {
    const core::Stopwatch waited;
    bool done = false;
    while (true) {
      done = arrived.test();
      if (done || waited.seconds() >= grace_seconds) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!done) {
      if (out) {
        out(
            fmt::format("error: [rank {}/{}] {} (other ranks did not finish within {:.0f} s; "
                        "aborting the job)\n",
                        rank, size, mine.message.empty() ? "failed" : mine.message, grace_seconds));
      }
      // Give the launcher a moment to forward the line before the abort tears the job down
      // (Hydra drops output still in flight when it kills the processes).
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      dist::abort_job(abort_comm, mine.exit_code);
    }
  }

  // Phase 2: everybody is here, so plain collectives are safe.
  const std::vector<int> codes = dist::all_gather(comm, mine.exit_code, "exit codes");
  const int job_code = combine_exit_codes(codes);
  const bool any_message =
      std::any_of(codes.begin(), codes.end(), [](int c) { return c != core::kExitOk; });
  if (any_message) {
    const std::vector<std::string> messages = dist::gather_strings(comm, mine.message, 0);
    if (rank == 0 && out) {
      std::vector<RankOutcome> outcomes;
      outcomes.reserve(messages.size());
      for (std::size_t r = 0; r < messages.size(); ++r) outcomes.push_back({codes[r], messages[r]});
      if (job_code != core::kExitCheckpointed) {
        for (const std::string& line : error_lines(outcomes)) out(line + "\n");
      } else {
        // A stop (exit 75) that a rank explained (a signal while a verifier or an environment
        // answered): said once, not as an error. A run stopped at a checkpoint said it itself.
        std::vector<std::string> said;
        for (const RankOutcome& o : outcomes) {
          if (o.message.empty() || std::find(said.begin(), said.end(), o.message) != said.end())
            continue;
          said.push_back(o.message);
          out(o.message + " (exit 75)\n");
        }
      }
    }
  }
  return job_code;
}

double error_grace_seconds() {
  const char* text = std::getenv("L3_ERROR_GRACE_SECONDS");
  if (text == nullptr || *text == '\0') return 10.0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || value < 0) {
    throw core::usage_error(
        fmt::format("L3_ERROR_GRACE_SECONDS='{}' is not a number of seconds >= 0", text));
  }
  return value;
}

}  // namespace l3::cli
