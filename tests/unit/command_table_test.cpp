#include <set>
#include <string>

#include "catch.hpp"
#include "cli/command.hpp"

TEST_CASE("every subcommand of the design is registered once, with help texts", "[cli]") {
  std::set<std::string> names;
  for (const l3::cli::Command& command : l3::cli::command_table()) {
    INFO(command.name);
    CHECK(names.insert(std::string(command.name)).second);
    CHECK_FALSE(command.summary.empty());
    CHECK(command.usage.starts_with(command.name));
    CHECK_FALSE(command.description.empty());
    // Either it runs, or it says which part of the roadmap brings it.
    CHECK((command.run != nullptr) != !command.planned.empty());
  }
  for (const char* name : {"prep", "sft", "reward", "eval", "generate", "score", "export",
                           "tokenize", "ckpt", "demo", "info"}) {
    INFO(name);
    CHECK(names.count(name) == 1);
    REQUIRE(l3::cli::find_command(name) != nullptr);
    CHECK(l3::cli::find_command(name)->name == name);
  }
  CHECK(l3::cli::find_command("train") == nullptr);
  CHECK(l3::cli::find_command("demo")->run != nullptr);
}
