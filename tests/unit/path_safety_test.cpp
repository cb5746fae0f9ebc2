// What the program may create, replace and remove (core/path_safety.hpp, core/durable_file.hpp):
// outputs named by options, directories that prove they are ours, staging directories, removal
// that never follows a link, files created exclusively.
#include "core/path_safety.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "catch.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;
using l3::core::OwnedKind;

namespace {

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The kind of Error `f` throws.
template <typename F>
l3::core::ErrorKind thrown_kind(F&& f) {
  try {
    f();
  } catch (const l3::core::Error& e) {
    return e.kind();
  }
  FAIL("no Error thrown");
  return l3::core::ErrorKind::internal;
}

// Restores the working directory at scope exit.
class InDirectory {
 public:
  explicit InDirectory(const fs::path& dir) : saved_(fs::current_path()) { fs::current_path(dir); }
  ~InDirectory() { fs::current_path(saved_); }
  InDirectory(const InDirectory&) = delete;
  InDirectory& operator=(const InDirectory&) = delete;
  InDirectory(InDirectory&&) = delete;
  InDirectory& operator=(InDirectory&&) = delete;

 private:
  fs::path saved_;
};

void make_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "index.json") << R"({"format": "llama3-hpc/sft", "shards": []})";
  std::ofstream(dir / "part-00000-00000.h5") << "shard";
}

}  // namespace

TEST_CASE("an output directory is absolute and normal, never the current one or above it",
          "[path-safety]") {
  const l3::test::TempDir tmp;
  fs::create_directories(tmp.path() / "w" / "inner");
  const InDirectory here(tmp.path() / "w");
  const fs::path w = fs::current_path();
  // One directory, however it is spelled.
  for (const char* spelling : {"out", "out/", "out/.", "./out", "out//", "inner/../out"}) {
    INFO(spelling);
    CHECK(l3::core::output_directory("--output", spelling) == w / "out");
  }
  // The current directory, its parents, the root: refused before anything is touched.
  for (const char* refused : {".", "./", "..", "../w", "../w/", "inner/..", "/", "//"}) {
    INFO(refused);
    CHECK(thrown_kind([&] { (void)l3::core::output_directory("--output", refused); }) ==
          l3::core::ErrorKind::usage);
  }
  CHECK(thrown_kind([] { (void)l3::core::output_directory("--output", ""); }) ==
        l3::core::ErrorKind::usage);
  // Through a link to the current directory: still the current directory.
  fs::create_directory_symlink(w, tmp.path() / "alias");
  CHECK(thrown_kind([&] {
          (void)l3::core::output_directory("--output", (tmp.path() / "alias").string());
        }) == l3::core::ErrorKind::usage);
}

TEST_CASE("a directory is ours only when its content proves it", "[path-safety]") {
  const l3::test::TempDir tmp;
  const fs::path data = tmp.path() / "data";
  make_dataset(data);
  CHECK(l3::core::why_not_ours(data, OwnedKind::dataset).empty());
  // With train/ and val/ (prep --val-fraction).
  make_dataset(tmp.path() / "split" / "train");
  make_dataset(tmp.path() / "split" / "val");
  CHECK(l3::core::why_not_ours(tmp.path() / "split", OwnedKind::dataset).empty());
  // An empty directory holds nothing to lose.
  fs::create_directory(tmp.path() / "empty");
  CHECK(l3::core::why_not_ours(tmp.path() / "empty", OwnedKind::hf_export).empty());

  // One foreign file, and it is named.
  std::ofstream(data / "notes.txt") << "keep";
  CHECK(l3::core::why_not_ours(data, OwnedKind::dataset).find("notes.txt") != std::string::npos);
  CHECK(thrown_kind([&] { l3::core::require_ours(data, OwnedKind::dataset, "--output"); }) ==
        l3::core::ErrorKind::bad_input);
  fs::remove(data / "notes.txt");
  // An index of someone else's format, a link among the entries, a link as the directory.
  std::ofstream(data / "index.json") << R"({"format": "something/else"})";
  CHECK_FALSE(l3::core::why_not_ours(data, OwnedKind::dataset).empty());
  make_dataset(data);
  fs::create_symlink("/etc/passwd", data / "part-00000-00001.h5");
  CHECK_FALSE(l3::core::why_not_ours(data, OwnedKind::dataset).empty());
  fs::remove(data / "part-00000-00001.h5");
  fs::create_directory_symlink(data, tmp.path() / "link");
  CHECK(l3::core::why_not_ours(tmp.path() / "link", OwnedKind::dataset).find("symbolic link") !=
        std::string::npos);
  // A home directory is nobody's dataset.
  fs::create_directories(tmp.path() / "home" / ".ssh");
  std::ofstream(tmp.path() / "home" / ".bashrc") << "";
  CHECK_FALSE(l3::core::why_not_ours(tmp.path() / "home", OwnedKind::dataset).empty());

  // An export: its config.json says llama3_hpc.
  const fs::path model = tmp.path() / "model";
  fs::create_directories(model / "original");
  std::ofstream(model / "config.json") << R"({"llama3_hpc": {"step": 3}})";
  std::ofstream(model / "model.safetensors") << "";
  std::ofstream(model / "original" / "tokenizer.model") << "";
  CHECK(l3::core::why_not_ours(model, OwnedKind::hf_export).empty());
  std::ofstream(model / "config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  CHECK_FALSE(l3::core::why_not_ours(model, OwnedKind::hf_export).empty());
  std::ofstream(model / "config.json") << "[]";
  CHECK_FALSE(l3::core::why_not_ours(model, OwnedKind::hf_export).empty());
}

TEST_CASE("a staging directory is new, next to its target, and removed unless installed",
          "[path-safety]") {
  const l3::test::TempDir tmp;
  const fs::path target = tmp.path() / "out";
  fs::path kept;
  {
    const l3::core::StagingDirectory a(target, OwnedKind::dataset, "--output");
    const l3::core::StagingDirectory b(target, OwnedKind::dataset, "--output");
    CHECK(a.path() != b.path());
    CHECK(a.path().parent_path() == tmp.path());
    CHECK(a.path().filename().string().starts_with("out.partial-"));
    CHECK(l3::core::is_real_directory(a.path()));
    kept = a.path();
  }
  CHECK_FALSE(l3::core::entry_exists(kept));  // an error on the way leaves nothing behind

  // Installed: the target appears; an existing one of ours is replaced, a foreign one is not.
  {
    l3::core::StagingDirectory s(target, OwnedKind::dataset, "--output");
    make_dataset(s.path());
    s.install(false);
  }
  CHECK(fs::exists(target / "index.json"));
  {
    l3::core::StagingDirectory s(target, OwnedKind::dataset, "--output");
    make_dataset(s.path());
    CHECK(thrown_kind([&] { s.install(false); }) == l3::core::ErrorKind::usage);
    std::ofstream(s.path() / "part-00000-00009.h5") << "new";
    s.install(true);
  }
  CHECK(fs::exists(target / "part-00000-00009.h5"));
  std::ofstream(target / "notes.txt") << "keep";
  {
    l3::core::StagingDirectory s(target, OwnedKind::dataset, "--output");
    make_dataset(s.path());
    CHECK(thrown_kind([&] { s.install(true); }) == l3::core::ErrorKind::bad_input);
  }
  CHECK(read(target / "notes.txt") == "keep");
  // Nothing left next to it but the target.
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  CHECK(entries == 1);
}

TEST_CASE("abandoned staging directories are removed only when their marker proves them ours",
          "[path-safety]") {
  const l3::test::TempDir tmp;
  const fs::path target = tmp.path() / "out";
  const std::string host = l3::core::host_name();
  // What a killed run leaves: its directory with the marker naming it, this host and its pid.
  const auto staged = [&](const std::string& name, const std::string& marked_name, long long pid) {
    const fs::path dir = tmp.path() / name;
    fs::create_directory(dir);
    std::ofstream(dir / ".llama3-hpc-staging")
        << R"({"staging": ")" << marked_name << R"(", "host": ")" << host << R"(", "pid": )" << pid
        << "}\n";
    std::ofstream(dir / "part-00000-00000.h5") << "data";
    return dir;
  };
  // A pid no process has (above the kernel's pid_max, 2^22 at most).
  const std::string dead_name = "out.partial-" + host + "-99999999-0";
  const std::string dead_old_name = "out.old-" + host + "-99999999-3";
  const fs::path dead = staged(dead_name, dead_name, 99999999);
  const fs::path dead_old = staged(dead_old_name, dead_old_name, 99999999);
  // Not provably ours: the user's own directories of such names, a copy of a staging directory
  // under another name, an earlier version's (no marker), a live process's, another host's.
  const fs::path users_old = tmp.path() / "out.old-2024-06";
  const fs::path users_partial = tmp.path() / "out.partial-2024-11";
  const fs::path users_hosted = tmp.path() / ("out.partial-" + host + "-99999999-7");
  const fs::path copy = staged("out.partial-" + host + "-99999999-5", dead_name, 99999999);
  const fs::path wrong_pid = staged("out.partial-" + host + "-99999999-6",
                                    "out.partial-" + host + "-99999999-6", 99999998);
  const fs::path older_version = tmp.path() / "out.partial-99999999-12";
  const std::string alive_name = "out.partial-" + host + "-" + std::to_string(::getppid()) + "-0";
  const fs::path alive = staged(alive_name, alive_name, ::getppid());
  const fs::path other_host = tmp.path() / "out.partial-elsewhere.example-99999999-0";
  const fs::path other_target = tmp.path() / ("outer.partial-" + host + "-99999999-0");
  for (const fs::path& p :
       {users_old, users_partial, users_hosted, older_version, other_host, other_target}) {
    fs::create_directory(p);
    std::ofstream(p / "keep") << "keep";
  }
  fs::create_directory(tmp.path() / "victim");
  std::ofstream(tmp.path() / "victim" / "keep") << "keep";
  fs::create_directory_symlink(tmp.path() / "victim",
                               tmp.path() / ("out.partial-" + host + "-99999998-0"));

  const std::vector<std::string> removed = l3::core::remove_abandoned_staging(target);
  CHECK(removed.size() == 2);
  CHECK_FALSE(fs::exists(dead));
  CHECK_FALSE(fs::exists(dead_old));
  for (const fs::path& p : {users_old, users_partial, users_hosted, older_version, other_host,
                            other_target, copy, wrong_pid, alive}) {
    INFO(p.filename().string());
    CHECK(fs::exists(p));
  }
  CHECK(read(tmp.path() / "victim" / "keep") == "keep");  // a link is never followed
}

TEST_CASE("a staging directory is marked while it is staged, and the target is not",
          "[path-safety]") {
  const l3::test::TempDir tmp;
  const fs::path target = tmp.path() / "out";
  {
    l3::core::StagingDirectory s(target, OwnedKind::dataset, "--output");
    CHECK(fs::is_regular_file(s.path() / ".llama3-hpc-staging"));
    make_dataset(s.path());
    s.install(false);
  }
  CHECK_FALSE(fs::exists(target / ".llama3-hpc-staging"));
  CHECK(l3::core::why_not_ours(target, OwnedKind::dataset).empty());
  {  // replaced: the old one goes through a marked directory and is gone afterwards
    l3::core::StagingDirectory s(target, OwnedKind::dataset, "--output");
    make_dataset(s.path());
    s.install(true);
  }
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  CHECK(entries == 1);
}

TEST_CASE("removal never follows a link", "[path-safety]") {
  const l3::test::TempDir tmp;
  fs::create_directories(tmp.path() / "victim");
  std::ofstream(tmp.path() / "victim" / "keep") << "keep";
  fs::create_directories(tmp.path() / "tree" / "sub");
  fs::create_directory_symlink(tmp.path() / "victim", tmp.path() / "tree" / "sub" / "link");
  fs::create_directory_symlink(tmp.path() / "victim", tmp.path() / "top-link");
  l3::core::remove_tree(tmp.path() / "tree");
  l3::core::remove_tree(tmp.path() / "top-link");
  l3::core::remove_tree(tmp.path() / "missing");  // nothing there: nothing done
  CHECK_FALSE(l3::core::entry_exists(tmp.path() / "tree"));
  CHECK_FALSE(l3::core::entry_exists(tmp.path() / "top-link"));
  CHECK(read(tmp.path() / "victim" / "keep") == "keep");
}

TEST_CASE("a directory that cannot be written is found before any work", "[path-safety]") {
  const l3::test::TempDir tmp;
  l3::core::check_writable_directory(tmp.path() / "new" / "deeper", "--ckpt-dir");
  CHECK(l3::core::is_real_directory(tmp.path() / "new" / "deeper"));
  std::size_t entries = 0;  // the probe is gone
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path() / "new" / "deeper"))
    ++entries;
  CHECK(entries == 0);
  std::ofstream(tmp.path() / "file") << "x";
  CHECK(thrown_kind([&] {
          l3::core::check_writable_directory(tmp.path() / "file" / "ckpt", "--ckpt-dir");
        }) == l3::core::ErrorKind::bad_input);
  CHECK(thrown_kind([&] {
          l3::core::check_writable_directory(tmp.path() / "file", "--ckpt-dir");
        }) == l3::core::ErrorKind::bad_input);
}

TEST_CASE("files are created exclusively and replaced by rename, never written through a link",
          "[path-safety]") {
  const l3::test::TempDir tmp;
  const fs::path victim = tmp.path() / "victim";
  std::ofstream(victim) << "precious";
  const fs::path dir = tmp.path() / "ckpt";
  fs::create_directory(dir);

  // A link planted where a file is created exclusively: refused, the target untouched.
  fs::create_symlink(victim, dir / "planted");
  CHECK(thrown_kind([&] { (void)l3::core::create_exclusive((dir / "planted").string()); }) ==
        l3::core::ErrorKind::bad_input);
  // A link at the final name: replaced by the new file, its target untouched. Links planted
  // under the old fixed temporary names are never used.
  fs::create_symlink(victim, dir / "latest");
  fs::create_symlink(victim, dir / "latest.tmp");
  l3::core::write_file_atomically((dir / "latest").string(), "step-00000004\n");
  CHECK(read(victim) == "precious");
  CHECK_FALSE(fs::is_symlink(dir / "latest"));
  CHECK(read(dir / "latest") == "step-00000004\n");

  // Temporary names are fresh each time, recognisable, and gone after the write.
  const std::string a = l3::core::temporary_name_for((dir / "x").string());
  const std::string b = l3::core::temporary_name_for((dir / "x").string());
  CHECK(a != b);
  CHECK(l3::core::is_temporary_name(fs::path(a).filename().string()));
  CHECK_FALSE(l3::core::is_temporary_name("latest"));
  CHECK_FALSE(l3::core::is_temporary_name("latest.tmp"));
  CHECK_FALSE(l3::core::is_temporary_name("step-00000001.tmp-x-1"));
  for (const auto& e : fs::directory_iterator(dir)) {
    INFO(e.path());
    CHECK_FALSE(l3::core::is_temporary_name(e.path().filename().string()));
  }
  {  // not committed: nothing left
    l3::core::AtomicFile file((dir / "manifest.json").string());
    file.write("{}");
  }
  CHECK_FALSE(l3::core::entry_exists(dir / "manifest.json"));
}
