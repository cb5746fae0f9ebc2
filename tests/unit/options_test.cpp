#include "core/options.hpp"

#include <string>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "core/option_suggestion.hpp"
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
  CHECK(text == missing + ": cannot read: No such file or directory");
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

TEST_CASE("numbers are checked against their declared domains wherever they come from",
          "[options]") {
  po::options_description options;
  options.add_options()("config", po::value<std::string>(), "config file")(
      "lr", l3::core::number<double>(l3::core::at_least(0))->default_value(1e-5), "rate")(
      "eps", l3::core::number<float>(l3::core::above(0))->default_value(1e-8F), "epsilon")(
      "batch", l3::core::number<std::int64_t>(l3::core::between(1, 64))->default_value(4), "b")(
      "scale", po::value<double>()->default_value(1.0), "no declared domain: finite only");
  const po::positional_options_description positional;
  const auto parse = [&](std::vector<std::string> args) {
    return l3::core::parse_options(options, positional, args);
  };
  const auto failure =
      [&](std::vector<std::string> args) -> std::pair<l3::core::ErrorKind, std::string> {
    try {
      (void)parse(std::move(args));
    } catch (const l3::core::Error& e) {
      return {e.kind(), e.what()};
    }
    return {l3::core::ErrorKind::internal, "accepted"};
  };
  CHECK(parse({"--lr", "0", "--eps", "1e-6", "--batch", "64"})["batch"].as<std::int64_t>() == 64);
  CHECK(
      failure({"--lr", "inf"}) ==
      std::pair{l3::core::ErrorKind::usage, std::string("--lr inf: must be a finite number >= 0")});
  CHECK(failure({"--lr", "nan"}).second == "--lr nan: must be a finite number >= 0");
  CHECK(failure({"--lr", "-1"}).second == "--lr -1: must be a finite number >= 0");
  CHECK(failure({"--eps", "-1"}).second == "--eps -1: must be a finite number > 0");
  CHECK(failure({"--eps", "0"}).first == l3::core::ErrorKind::usage);
  CHECK(failure({"--batch", "0"}).second == "--batch 0: must be a number in [1, 64]");
  CHECK(failure({"--batch", "1000000000"}).first == l3::core::ErrorKind::usage);
  CHECK(failure({"--scale", "inf"}).second == "--scale inf: must be a finite number");
  CHECK(failure({"--scale", "-inf"}).first == l3::core::ErrorKind::usage);

  // From a config file: the file is named (exit 2 either way).
  const l3::test::TempDir dir;
  const std::string path = dir.write("run.ini", "lr = inf\n");
  const auto [kind, text] = failure({"--config", path});
  CHECK(kind == l3::core::ErrorKind::bad_input);
  CHECK(text == path + ": --lr inf: must be a finite number >= 0");
  // The command line wins, and is what is checked.
  CHECK(parse({"--config", path, "--lr", "0.5"})["lr"].as<double>() == 0.5);
  // A directory or an endless file is not a config file.
  CHECK(failure({"--config", dir.path().string()}).second.find("is a directory") !=
        std::string::npos);
  CHECK(failure({"--config", "/dev/zero"}).second.find("is a character device") !=
        std::string::npos);
}

TEST_CASE("a mistyped option: what it probably meant", "[options]") {
  const std::vector<std::string> known = {"warmup",           "lr",           "min-lr",
                                          "seq-len",          "seed",         "shard-gradients",
                                          "shard-parameters", "steps",        "shard-group-size",
                                          "micro-batch",      "global-batch", "lora-rank"};
  using l3::core::likely_options;
  using V = std::vector<std::string>;
  CHECK(likely_options("--warm", known) == V{"warmup"});                       // cut short
  CHECK(likely_options("--learning-rate", known) == V{"lr"});                  // HF's name
  CHECK(likely_options("--shard-parameter", known) == V{"shard-parameters"});  // cut short
  CHECK(likely_options("--seq_len", known) == V{"seq-len"});                   // '_' for '-'
  CHECK(likely_options("--Seed", known) == V{"seed"});
  CHECK(likely_options("--sede", known) == V{"seed"});  // a transposition
  CHECK(likely_options("--per_device_train_batch_size", known) == V{"micro-batch"});
  CHECK(likely_options("--shard", known) ==
        V{"shard-gradients", "shard-group-size", "shard-parameters"});
  CHECK(likely_options("--xyzzy", known).empty());
  CHECK(likely_options("--", known).empty());
  CHECK(likely_options("--lora_r", known) == V{"lora-rank"});
  CHECK(l3::core::did_you_mean("--warm", known, "--") == "; did you mean --warmup?");
  CHECK(l3::core::did_you_mean("stpes", known, "") == "; did you mean steps?");
  CHECK(l3::core::did_you_mean("--xyzzy", known, "--").empty());
  // Other tools' spellings (torchtitan, Megatron, llm.c, Hugging Face's generate()).
  CHECK(likely_options("--lr-warmup", known) == V{"warmup"});
  CHECK(likely_options("--lr_min", known) == V{"min-lr"});
  CHECK(likely_options("--micro_batch_size", known) == V{"micro-batch"});
  CHECK(likely_options("--global-batch-size", known) == V{"global-batch"});
  CHECK(likely_options("--train-iters", known) == V{"steps"});
  // Subcommands, as the program's top level suggests them.
  const std::vector<std::string> commands = {"prep", "sft", "reward", "dpo", "grpo", "generate"};
  CHECK(likely_options("sfft", commands) == V{"sft"});
  CHECK(likely_options("grp", commands) == V{"grpo"});
  CHECK(likely_options("genrate", commands) == V{"generate"});
  CHECK(likely_options("train", commands).empty());
}
