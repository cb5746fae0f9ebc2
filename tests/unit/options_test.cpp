#include "core/options.hpp"

#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "temp_dir.hpp"

namespace po = boost::program_options;

namespace {

struct Fixture {
  Fixture() {
    options.add_options()("config", po::value<std::string>(), "config file")("help,h", "help")(
        "lr", po::value<double>()->default_value(3e-4), "learning rate")(
        "lr-min", po::value<double>(), "minimum learning rate")(
        "steps", po::value<int>()->default_value(10), "steps")(
        "data", po::value<std::string>(), "data dir")("recompute", po::bool_switch(), "recompute")(
        "tag", po::value<std::vector<std::string>>()->composing(), "tags");
    positional.add("action", 1);
    options.add_options()("action", po::value<std::string>(), "action");
  }
  [[nodiscard]] po::variables_map parse(std::vector<std::string> args) const {
    return l3::core::parse_options(options, positional, args);
  }
  po::options_description options;
  po::positional_options_description positional;
};

// The exit-code class and text of what parse() throws.
std::pair<l3::core::ErrorKind, std::string> failure(const Fixture& f,
                                                    std::vector<std::string> args) {
  try {
    (void)f.parse(std::move(args));
  } catch (const l3::core::Error& e) {
    return {e.kind(), e.what()};
  }
  FAIL("parse did not throw");
  return {};
}

}  // namespace

TEST_CASE("command line options and positionals", "[options]") {
  const Fixture f;
  const auto values = f.parse({"list", "--lr", "0.01", "--steps=5", "--recompute"});
  CHECK(values["action"].as<std::string>() == "list");
  CHECK(values["lr"].as<double>() == 0.01);
  CHECK(values["steps"].as<int>() == 5);
  CHECK(values["recompute"].as<bool>());
  CHECK(values.count("data") == 0);
}

TEST_CASE("a config file supplies options and the command line wins", "[options]") {
  const l3::test::TempDir dir;
  const std::string path = dir.write("run.ini",
                                     "# a comment\n"
                                     "lr = 0.5   # trailing comments are fine too\n"
                                     "steps = 7\n"
                                     "\n"
                                     "data = /scratch/my data\n"
                                     "recompute = true\n"
                                     "tag = a\n"
                                     "tag = b\n");
  const Fixture f;
  const auto values = f.parse({"--config", path, "--steps", "99"});
  CHECK(values["lr"].as<double>() == 0.5);
  CHECK(values["steps"].as<int>() == 99);
  CHECK(values["data"].as<std::string>() == "/scratch/my data");
  CHECK(values["recompute"].as<bool>());
  CHECK(values["tag"].as<std::vector<std::string>>() == std::vector<std::string>{"a", "b"});
}

TEST_CASE("config file errors name the file", "[options]") {
  const l3::test::TempDir dir;
  const Fixture f;

  const std::string unknown = dir.write("unknown.ini", "lr = 1\nwarmup = 5\n");
  auto [kind, text] = failure(f, {"--config", unknown});
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with(unknown + ": "));
  CHECK(text.find("warmup") != std::string::npos);

  const std::string bad_value = dir.write("bad.ini", "steps = many\n");
  std::tie(kind, text) = failure(f, {"--config", bad_value});
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text.starts_with(bad_value + ": "));

  const std::string sections = dir.write("sections.ini", "lr = 1\n[train]\nsteps = 3\n");
  std::tie(kind, text) = failure(f, {"--config", sections});
  CHECK(text.find("line 2") != std::string::npos);
  CHECK(text.find("sections") != std::string::npos);

  const std::string nested = dir.write("nested.ini", "config = other.ini\n");
  std::tie(kind, text) = failure(f, {"--config", nested});
  CHECK(text.find("another config file") != std::string::npos);

  const std::string missing = (dir.path() / "missing.ini").string();
  std::tie(kind, text) = failure(f, {"--config", missing});
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == missing + ": cannot read config file");
}

TEST_CASE("command line errors are usage errors", "[options]") {
  const Fixture f;
  auto [kind, text] = failure(f, {"--no-such-option"});
  CHECK(kind == l3::core::ErrorKind::usage);
  CHECK(text.find("no-such-option") != std::string::npos);

  std::tie(kind, text) = failure(f, {"--steps", "ten"});
  CHECK(kind == l3::core::ErrorKind::usage);

  // Abbreviations are refused: `--data` must not silently mean a longer option one day.
  std::tie(kind, text) = failure(f, {"--rec"});
  CHECK(kind == l3::core::ErrorKind::usage);
  std::tie(kind, text) = failure(f, {"list", "extra"});
  CHECK(kind == l3::core::ErrorKind::usage);
}
