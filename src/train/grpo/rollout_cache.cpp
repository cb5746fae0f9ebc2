#include "train/grpo/rollout_cache.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "core/durable_file.hpp"
#include "core/error.hpp"

namespace l3::train::grpo {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "step-";
constexpr std::string_view kSuffix = ".json";

// What an entry is, for a message.
std::string_view kind_of(const struct stat& info) {
  if (S_ISLNK(info.st_mode)) return "a symbolic link";
  if (S_ISDIR(info.st_mode)) return "a directory";
  if (!S_ISREG(info.st_mode)) return "not a regular file";
  if (info.st_nlink > 1) return "a file with other names (hard links)";
  return "";
}

}  // namespace

std::optional<std::int64_t> rollout_file_step(std::string_view name) {
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const std::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() < 8 || digits.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  std::int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (rollout_file_name(step) != name) return std::nullopt;  // "step-000000012.json": not ours
  return step;
}

std::string rollout_file_name(std::int64_t step) { return fmt::format("step-{:08}.json", step); }

void check_rollout_cache(const fs::path& dir) {
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0) return;  // nothing yet
  if (!S_ISDIR(info.st_mode)) {
    throw core::bad_input(
        fmt::format("is {}, where llama3-hpc keeps GRPO's generation batches (a real directory "
                    "of its own): nothing is written through it or deleted; move it out of "
                    "--ckpt-dir",
                    S_ISLNK(info.st_mode) ? "a symbolic link" : "not a directory"),
        {.file = dir.string()});
  }
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (core::is_temporary_name(name)) continue;  // a write a crash interrupted
    struct stat entry {};
    if (::lstat(it->path().c_str(), &entry) != 0) continue;  // gone meanwhile
    const std::string_view kind = kind_of(entry);
    if (kind.empty() && rollout_file_step(name)) continue;
    throw core::bad_input(
        fmt::format("not a generation batch of llama3-hpc ({}), in the directory of its own "
                    "where it keeps them (step-NNNNNNNN.json files only): never deleted; move it "
                    "out",
                    kind.empty() ? std::string_view("another name") : kind),
        {.file = it->path().string()});
  }
  if (ec) {
    throw core::bad_input(fmt::format("cannot list: {}", ec.message()), {.file = dir.string()});
  }
}

void prune_rollout_cache(const fs::path& dir, std::int64_t keep) {
  prune_rollout_cache(dir, [keep](std::int64_t step) { return step >= keep; });
}

void prune_rollout_cache(const fs::path& dir, const std::function<bool(std::int64_t)>& kept) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<std::int64_t> step = rollout_file_step(it->path().filename().string());
    struct stat entry {};
    if (!step || kept(*step) || ::lstat(it->path().c_str(), &entry) != 0 || !kind_of(entry).empty())
      continue;
    if (::unlink(it->path().c_str()) != 0 && errno != ENOENT) {
      throw core::internal_error(fmt::format("cannot remove: {}", core::errno_text(errno)),
                                 {.file = it->path().string()});
    }
  }
}

}  // namespace l3::train::grpo
