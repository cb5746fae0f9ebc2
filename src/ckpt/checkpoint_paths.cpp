#include "ckpt/checkpoint_paths.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "core/bounded_read.hpp"
#include "core/error.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;

std::string step_dir_name(std::int64_t step) { return fmt::format("step-{:08}", step); }

std::optional<std::int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (!name.starts_with(kPrefix) || name.size() < kPrefix.size() + 8) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size());
  std::int64_t step = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  return step;
}

namespace {

// Directory names under `root` whose part before the first '.' is "step-N" and whose suffix
// satisfies `keep`, newest first.
template <typename Keep>
std::vector<std::string> step_entries(const std::string& root, Keep keep) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec)) continue;
    const std::string name = e.path().filename().string();
    const std::size_t dot = name.find('.');
    const auto step = parse_step_dir_name(std::string_view(name).substr(0, dot));
    if (step &&
        keep(dot == std::string::npos ? std::string_view() : std::string_view(name).substr(dot)))
      found.emplace_back(*step, name);
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> names;
  names.reserve(found.size());
  for (auto& [step, name] : found) names.push_back(std::move(name));
  return names;
}

}  // namespace

std::vector<std::string> step_directories(const std::string& root) {
  return step_entries(root, [](std::string_view suffix) { return suffix.empty(); });
}

std::vector<std::string> damaged_directories(const std::string& root) {
  return step_entries(root,
                      [](std::string_view suffix) { return suffix.starts_with(kDamagedSuffix); });
}

std::string read_latest(const std::string& root) {
  const fs::path latest = fs::path(root) / kLatestFile;
  std::error_code ec;
  if (!fs::exists(latest, ec)) return {};
  constexpr std::size_t kLargestLatest = 4096;  // "step-00001200\n"
  std::string name =
      core::read_text_file(latest.string(), "a checkpoint's latest file", kLargestLatest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r'))
    name.pop_back();
  return name;
}

bool is_checkpoint(const std::string& path) {
  return fs::is_regular_file(fs::path(path) / kManifestFile) ||
         fs::is_regular_file(fs::path(path) / kLatestFile);
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p / kManifestFile)) return p.string();
  const fs::path latest = p / kLatestFile;
  if (!fs::exists(p)) throw core::bad_input("no such checkpoint", {.file = path});
  if (!fs::is_regular_file(latest)) {
    throw core::bad_input(
        fmt::format("not a checkpoint: no {} (a step directory) and no {} (a checkpoint root)",
                    kManifestFile, kLatestFile),
        {.file = path});
  }
  const std::string name = read_latest(path);
  if (!parse_step_dir_name(name)) {
    throw core::bad_input(fmt::format("does not name a step directory ('{}')", name),
                          {.file = latest.string()});
  }
  const fs::path step = p / name;
  if (!fs::is_regular_file(step / kManifestFile)) {
    throw core::bad_input(fmt::format("names {}, which has no {}", name, kManifestFile),
                          {.file = latest.string()});
  }
  return step.string();
}

}  // namespace l3::ckpt
