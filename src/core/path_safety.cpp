#include "core/path_safety.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <system_error>

#include "core/bounded_read.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"

namespace l3::core {

namespace {

// Inside every staging and set-aside directory while it exists: what proves that this program
// made it, naming the directory itself, its host and its process (a copy or a rename of it
// under another name proves nothing).
constexpr std::string_view kStagingMarker = ".llama3-hpc-staging";
constexpr std::uintmax_t kLargestMarkerFile = 64U << 20U;  // index.json, config.json

// An Error for a failed file-system call on `path`: exit 2 when the system refused it for
// permissions or a read-only file system (the user's path), else an internal error.
Error filesystem_failure(const std::error_code& ec, const std::string& what, const fs::path& path) {
  const std::string text = fmt::format("{}: {}", what, ec.message());
  const bool refused = ec == std::errc::permission_denied ||
                       ec == std::errc::operation_not_permitted ||
                       ec == std::errc::read_only_file_system || ec == std::errc::not_a_directory ||
                       ec == std::errc::no_such_file_or_directory;
  return refused ? bad_input(text, {.file = path.string()})
                 : internal_error(text, {.file = path.string()});
}

// Whether `a` is `b` or a directory above it (both absolute and normal).
bool same_or_above(const fs::path& a, const fs::path& b) {
  auto ai = a.begin();
  auto bi = b.begin();
  for (; ai != a.end(); ++ai, ++bi) {
    if (ai->empty()) continue;  // the empty last element of "a/b/"
    if (bi == b.end() || *ai != *bi) return false;
  }
  return true;
}

// A JSON object read from a regular file (not a link), or a discarded value.
nlohmann::json read_marker(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(file, ec)) || ec)
    return nlohmann::json::value_t::discarded;
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec || size > kLargestMarkerFile) return nlohmann::json::value_t::discarded;
  try {
    nlohmann::json value = parse_json_or_discard(read_text_file(file.string(), "a marker file"));
    if (value.is_object()) return value;
  } catch (const Error&) {  // unreadable: not a marker of ours
  }
  return nlohmann::json::value_t::discarded;
}

bool is_dataset_index(const fs::path& file) {
  const nlohmann::json index = read_marker(file);
  if (index.is_discarded()) return false;
  const auto format = index.find("format");
  return format != index.end() && format->is_string() &&
         format->get_ref<const std::string&>().starts_with("llama3-hpc/");
}

bool is_export_config(const fs::path& file) {
  const nlohmann::json config = read_marker(file);
  return !config.is_discarded() && config.contains("llama3_hpc") &&
         config.at("llama3_hpc").is_object();
}

// The entries of `dir` with their types (links not followed); an unreadable directory: Error.
struct Entry {
  std::string name;
  fs::file_type type = fs::file_type::none;
};
std::vector<Entry> list_entries(const fs::path& dir) {
  std::vector<Entry> entries;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw filesystem_failure(ec, "cannot read the directory", dir);
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    entries.push_back({it->path().filename().string(), it->symlink_status(ec).type()});
  }
  if (ec) throw filesystem_failure(ec, "cannot read the directory", dir);
  return entries;
}

std::string entry_kind(fs::file_type type) {
  switch (type) {
    case fs::file_type::symlink:
      return "a symbolic link";
    case fs::file_type::directory:
      return "a directory";
    case fs::file_type::regular:
      return "a file";
    default:
      return "a special file";
  }
}

// Why the flat dataset directory `dir` (index.json + shards) is not ours, or "".
std::string flat_dataset_problem(const fs::path& dir, const std::string& shown) {
  static const std::regex shard(R"(part-[0-9]+-[0-9]+\.h5)");
  bool index = false;
  for (const Entry& e : list_entries(dir)) {
    if (e.type == fs::file_type::regular && e.name == "index.json") {
      index = true;
    } else if (!(e.type == fs::file_type::regular && std::regex_match(e.name, shard))) {
      return fmt::format("it holds {}{}, {} that llama3-hpc does not write into a dataset", shown,
                         e.name, entry_kind(e.type));
    }
  }
  if (!index || !is_dataset_index(dir / "index.json")) {
    return fmt::format("{}index.json is missing or is not a llama3-hpc dataset index", shown);
  }
  return {};
}

std::string dataset_problem(const fs::path& dir, const std::vector<Entry>& entries) {
  bool splits = false;
  for (const Entry& e : entries) splits = splits || e.name == "train" || e.name == "val";
  if (!splits) return flat_dataset_problem(dir, "");
  for (const Entry& e : entries) {
    if ((e.name != "train" && e.name != "val") || e.type != fs::file_type::directory) {
      return fmt::format("it holds {}, {} that llama3-hpc does not write next to train/ and val/",
                         e.name, entry_kind(e.type));
    }
    if (std::string why = flat_dataset_problem(dir / e.name, e.name + "/"); !why.empty())
      return why;
  }
  return {};
}

std::string export_problem(const fs::path& dir, const std::vector<Entry>& entries) {
  static const std::regex allowed(
      R"(config\.json|generation_config\.json|model\.safetensors|model\.safetensors\.index\.json|)"
      R"(model-[0-9]{5}-of-[0-9]{5}\.safetensors|tokenizer\.json|tokenizer_config\.json|)"
      R"(special_tokens_map\.json)");
  for (const Entry& e : entries) {
    if (e.name == "original" && e.type == fs::file_type::directory) {
      for (const Entry& inner : list_entries(dir / e.name)) {
        if (inner.name != "tokenizer.model" || inner.type != fs::file_type::regular) {
          return fmt::format("it holds original/{}, {} that llama3-hpc does not export", inner.name,
                             entry_kind(inner.type));
        }
      }
      continue;
    }
    if (e.type != fs::file_type::regular || !std::regex_match(e.name, allowed)) {
      return fmt::format("it holds {}, {} that llama3-hpc does not export", e.name,
                         entry_kind(e.type));
    }
  }
  if (!is_export_config(dir / "config.json"))
    return "its config.json is missing or was not written by llama3-hpc export";
  return {};
}

// The "__metadata__" of a safetensors file's header (a regular file, not a link), or a
// discarded value.
nlohmann::json safetensors_metadata(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(file, ec)) || ec)
    return nlohmann::json::value_t::discarded;
  std::ifstream in(file, std::ios::binary);
  std::array<unsigned char, 8> prefix{};
  if (!in.read(reinterpret_cast<char*>(prefix.data()), 8))  // NOLINT: bytes
    return nlohmann::json::value_t::discarded;
  std::uint64_t length = 0;
  for (std::size_t i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(prefix.at(i)) << (8 * i);
  if (length == 0 || length > kLargestMarkerFile) return nlohmann::json::value_t::discarded;
  std::string header(static_cast<std::size_t>(length), '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(length)))
    return nlohmann::json::value_t::discarded;
  nlohmann::json parsed = parse_json_or_discard(header);
  if (!parsed.is_object() || !parsed.contains("__metadata__") ||
      !parsed["__metadata__"].is_object())
    return nlohmann::json::value_t::discarded;
  return parsed["__metadata__"];
}

// A LoRA adapter directory written by llama3-hpc: its two files only, adapter_config.json of a
// LoRA adapter, and the adapter's safetensors metadata naming llama3-hpc. A directory PEFT
// wrote (its model card, no such metadata) is not ours, whatever it holds.
std::string adapter_problem(const fs::path& dir, const std::vector<Entry>& entries) {
  for (const Entry& e : entries) {
    if (e.type != fs::file_type::regular ||
        (e.name != "adapter_config.json" && e.name != "adapter_model.safetensors")) {
      return fmt::format("it holds {}, {} that llama3-hpc does not write into an adapter", e.name,
                         entry_kind(e.type));
    }
  }
  const nlohmann::json config = read_marker(dir / "adapter_config.json");
  if (config.is_discarded() || !config.is_object() || config.value("peft_type", "") != "LORA")
    return "its adapter_config.json is missing or not a LoRA adapter's";
  const nlohmann::json metadata = safetensors_metadata(dir / "adapter_model.safetensors");
  if (metadata.is_discarded() || !metadata.contains(kAdapterMetadataKey))
    return fmt::format(
        "its adapter_model.safetensors is missing or was not written by "
        "llama3-hpc export (no \"{}\" in its metadata)",
        kAdapterMetadataKey);
  return {};
}

std::string_view kind_name(OwnedKind kind) {
  switch (kind) {
    case OwnedKind::dataset:
      return "a dataset written by llama3-hpc prep";
    case OwnedKind::hf_export:
      return "a model written by llama3-hpc export";
    case OwnedKind::peft_adapter:
      return "a LoRA adapter directory";
  }
  return "";
}

// "<name>.<what>-<host>-<pid>-<n>" next to `target`.
fs::path sibling_name(const fs::path& target, std::string_view what) {
  static std::atomic<std::uint64_t> counter{0};
  return target.parent_path() / fmt::format("{}.{}-{}-{}-{}", target.filename().string(), what,
                                            host_name(), ::getpid(), counter++);
}

// The pid in a staging name's tail "<host>-<pid>-<n>" when the host is this one.
std::optional<pid_t> local_pid(std::string_view tail) {
  const std::size_t last = tail.rfind('-');
  if (last == std::string_view::npos) return std::nullopt;
  const std::string_view head = tail.substr(0, last);
  const std::size_t before = head.rfind('-');
  if (before == std::string_view::npos || head.substr(0, before) != host_name())
    return std::nullopt;
  const std::string_view pid_text = head.substr(before + 1);
  pid_t pid = 0;
  const auto [end, error] =
      std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
  if (error != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0)
    return std::nullopt;
  return pid;
}

// Creates `dir` exclusively (false: something is there already) with its staging marker.
bool create_marked_directory(const fs::path& dir, std::error_code& ec) {
  if (!fs::create_directory(dir, ec) || ec) return false;
  const nlohmann::json marker = {
      {"staging", dir.filename().string()}, {"host", host_name()}, {"pid", ::getpid()}};
  const std::string text = marker.dump() + "\n";
  bool written = false;
  try {
    const int fd = create_exclusive((dir / kStagingMarker).string());
    written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
  } catch (const Error&) {  // a full disk, a quota: reported below as the directory's failure
  }
  if (!written) {
    // Without its marker it could never be proved ours later: not left behind.
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    ec = std::make_error_code(std::errc::io_error);
    return false;
  }
  return true;
}

// Whether `dir` (a real directory) holds the marker this host's process `pid` wrote into it
// under this very name.
bool marked_as_ours(const fs::path& dir, pid_t pid) {
  const nlohmann::json marker = read_marker(dir / kStagingMarker);
  if (marker.is_discarded()) return false;
  const auto text = [&](const char* key) {
    const auto it = marker.find(key);
    return it != marker.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const auto recorded = marker.find("pid");
  return text("staging") == dir.filename().string() && text("host") == host_name() &&
         recorded != marker.end() && recorded->is_number_integer() &&
         recorded->get<std::int64_t>() == pid;
}

}  // namespace

fs::path output_directory(std::string_view option, const std::string& value) {
  if (value.empty()) throw usage_error(fmt::format("{} is empty: name a directory", option));
  std::error_code ec;
  fs::path path = fs::absolute(value, ec).lexically_normal();
  if (ec) throw usage_error(fmt::format("{} {}: {}", option, value, ec.message()));
  while (!path.has_filename() && path != path.root_path()) path = path.parent_path();
  if (path == path.root_path())
    throw usage_error(fmt::format("{} {}: the root directory cannot be an output", option, value));
  const fs::path here = fs::weakly_canonical(fs::current_path(ec), ec);
  const fs::path resolved = fs::weakly_canonical(path, ec);
  if (!ec && (same_or_above(resolved, here) || same_or_above(path, here))) {
    throw usage_error(fmt::format(
        "{} {}: that is the current directory or holds it; name a new directory of its own", option,
        value));
  }
  return path;
}

bool entry_exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

bool is_real_directory(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(fs::symlink_status(path, ec));
}

std::string why_not_ours(const fs::path& dir, OwnedKind kind) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(dir, ec);
  if (fs::is_symlink(status)) return "it is a symbolic link (name the directory itself)";
  if (!fs::is_directory(status)) return "it is not a directory";
  const std::vector<Entry> entries = list_entries(dir);
  if (entries.empty()) return {};
  switch (kind) {
    case OwnedKind::dataset:
      return dataset_problem(dir, entries);
    case OwnedKind::hf_export:
      return export_problem(dir, entries);
    case OwnedKind::peft_adapter:
      return adapter_problem(dir, entries);
  }
  return "unknown kind";
}

fs::path replaceable_output(std::string_view option, const std::string& value, OwnedKind kind,
                            bool overwrite) {
  fs::path out = output_directory(option, value);
  if (entry_exists(out)) {
    if (!overwrite) {
      throw usage_error(
          fmt::format("{} exists: choose another {}, or pass --overwrite", out.string(), option));
    }
    require_ours(out, kind, option);
  }
  (void)remove_abandoned_staging(out);
  return out;
}

void require_ours(const fs::path& dir, OwnedKind kind, std::string_view option) {
  const std::string why = why_not_ours(dir, kind);
  if (!why.empty()) {
    throw bad_input(fmt::format("{} names a directory that is not {}, so it is left as it is: {}",
                                option, kind_name(kind), why),
                    {.file = dir.string()});
  }
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);  // never follows links: a link is removed itself
  if (ec) throw filesystem_failure(ec, "cannot remove", path);
}

void make_real_directory(const fs::path& dir, std::string_view option) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(dir, ec))) {
    // unlink() removes a link (or a file), never a directory another process made meanwhile.
    if (::unlink(dir.c_str()) != 0 && errno != ENOENT && errno != EISDIR) {
      throw bad_input(fmt::format("{}: cannot remove a symbolic link planted here: {}", option,
                                  errno_text(errno)),
                      {.file = dir.string()});
    }
  }
  fs::create_directory(dir, ec);  // false, no error: it exists
  if (!is_real_directory(dir)) {
    throw bad_input(fmt::format("{}: cannot make a directory here ({})", option,
                                ec ? ec.message() : "something else is in the way"),
                    {.file = dir.string()});
  }
}

void refuse_link(const fs::path& path, std::string_view option) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    throw bad_input(fmt::format("{}: is a symbolic link; llama3-hpc never writes through a link "
                                "it did not create (remove it)",
                                option),
                    {.file = path.string()});
  }
}

void check_writable_directory(const fs::path& dir, std::string_view option) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw bad_input(fmt::format("{}: cannot create the directory: {}", option, ec.message()),
                    {.file = dir.string()});
  }
  if (!fs::is_directory(dir, ec)) {
    throw bad_input(fmt::format("{}: not a directory", option), {.file = dir.string()});
  }
  static std::atomic<std::uint64_t> counter{0};
  const fs::path probe =
      dir / fmt::format(".llama3-hpc-probe-{}-{}-{}", host_name(), ::getpid(), counter++);
  int fd = -1;
  try {
    fd = create_exclusive(probe.string());
  } catch (const Error& e) {
    throw bad_input(fmt::format("{}: cannot write in this directory ({})", option, e.message()),
                    {.file = dir.string()});
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return {};
  std::string text(name.data());
  for (char& c : text) {
    if (c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = '_';
  }
  return text;
}

StagingDirectory::StagingDirectory(fs::path target, OwnedKind kind, std::string option)
    : target_(std::move(target)), kind_(kind), option_(std::move(option)) {
  const fs::path parent = target_.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    throw bad_input(
        fmt::format("{}: cannot create the parent directory: {}", option_, ec.message()),
        {.file = parent.string()});
  }
  for (int attempt = 0;; ++attempt) {
    const fs::path candidate = sibling_name(target_, "partial");
    if (create_marked_directory(candidate, ec)) {  // false: it existed (not ours): next name
      path_ = candidate;
      return;
    }
    if (ec || attempt > 100) {
      throw bad_input(fmt::format("{}: cannot create a directory next to {}: {}", option_,
                                  target_.filename().string(),
                                  ec ? ec.message() : std::string("every name is taken")),
                      {.file = parent.string()});
    }
  }
}

StagingDirectory::~StagingDirectory() {
  if (installed_ || path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_,
                 ec);  // best effort: a later run removes what is left (remove_abandoned_staging)
}

void StagingDirectory::install(bool replace) {
  // The replaced directory is moved into a marked directory of its own, so that what a crash
  // leaves of it can be proved ours and removed by a later run.
  fs::path old;
  fs::path previous;
  if (entry_exists(target_)) {
    if (!replace) {
      throw usage_error(fmt::format("{} {} exists; choose another one or add --overwrite", option_,
                                    target_.string()));
    }
    require_ours(target_, kind_, option_);
    std::error_code ec;
    for (int attempt = 0; old.empty(); ++attempt) {
      const fs::path candidate = sibling_name(target_, "old");
      if (create_marked_directory(candidate, ec)) old = candidate;
      if (ec || attempt > 100) {
        throw bad_input(fmt::format("{}: cannot create a directory next to {}: {}", option_,
                                    target_.filename().string(),
                                    ec ? ec.message() : std::string("every name is taken")),
                        {.file = target_.parent_path().string()});
      }
    }
    previous = old / target_.filename();
    try {
      rename_path(target_.string(), previous.string());
    } catch (...) {
      fs::remove_all(old, ec);  // empty but for its marker
      throw;
    }
  }
  try {
    if (::unlink((path_ / kStagingMarker).c_str()) != 0 && errno != ENOENT)
      throw internal_error(fmt::format("cannot remove: {}", errno_text(errno)),
                           {.file = (path_ / kStagingMarker).string()});
    rename_path(path_.string(), target_.string());
  } catch (...) {
    if (!old.empty()) (void)std::rename(previous.c_str(), target_.c_str());  // put it back
    throw;
  }
  installed_ = true;
  fsync_path(target_.parent_path().string());
  if (!old.empty()) {
    std::error_code ec;
    fs::remove_all(old, ec);  // left behind on failure: remove_abandoned_staging takes it later
  }
}

std::vector<std::string> remove_abandoned_staging(const fs::path& target) {
  const std::string name = target.filename().string();
  std::vector<fs::path> abandoned;  // collected first: not removed while the directory is read
  std::error_code ec;
  fs::directory_iterator it(target.parent_path(), ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    std::string_view tail;
    for (const std::string_view what : {".partial-", ".old-"}) {
      if (entry.size() > name.size() + what.size() && entry.starts_with(name) &&
          std::string_view(entry).substr(name.size()).starts_with(what))
        tail = std::string_view(entry).substr(name.size() + what.size());
    }
    if (tail.empty() || !is_real_directory(it->path())) continue;
    const std::optional<pid_t> pid = local_pid(tail);
    if (!pid || *pid == ::getpid() || ::kill(*pid, 0) == 0 || errno != ESRCH) continue;
    // The name alone proves nothing (a user's "out.old-2024-06"): the marker must name it.
    if (!marked_as_ours(it->path(), *pid)) continue;
    abandoned.push_back(it->path());
  }
  std::vector<std::string> removed;
  for (const fs::path& path : abandoned) {
    std::error_code removal;
    fs::remove_all(path, removal);
    if (!removal) removed.push_back(path.filename().string());
  }
  return removed;
}

std::string unknown_entry(const fs::path& dir, std::span<const KnownEntry> known,
                          std::string_view owner) {
  for (const Entry& e : list_entries(dir)) {
    const bool listed = std::ranges::any_of(known, [&](const KnownEntry& k) {
      return k.name == e.name &&
             (k.directory ? e.type == fs::file_type::directory : e.type == fs::file_type::regular);
    });
    if (!listed)
      return fmt::format("it holds {}, {} that {} does not write", e.name, entry_kind(e.type),
                         owner);
  }
  return {};
}

std::string read_small_regular_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(file, ec)) || ec) return {};
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec || size > kLargestMarkerFile) return {};
  try {
    return read_text_file(file.string(), "a marker file");
  } catch (const Error&) {
    return {};
  }
}

}  // namespace l3::core
