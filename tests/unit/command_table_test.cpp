#include <optional>
#include <set>
#include <string>
#include <typeinfo>

#include "catch.hpp"
#include "cli/command.hpp"
#include "core/option_domain.hpp"

TEST_CASE("every subcommand of the design is registered once, with help texts", "[cli]") {
  std::set<std::string> names;
  for (const l3::cli::Command& command : l3::cli::command_table()) {
    INFO(command.name);
    CHECK(names.insert(std::string(command.name)).second);
    CHECK_FALSE(command.summary.empty());
    CHECK(command.usage.starts_with(command.name));
    CHECK_FALSE(command.description.empty());
    CHECK(command.run != nullptr);
  }
  for (const char* name : {"prep", "sft", "reward", "eval", "generate", "score", "export",
                           "tokenize", "ckpt", "report", "demo", "info"}) {
    INFO(name);
    CHECK(names.count(name) == 1);
    REQUIRE(l3::cli::find_command(name) != nullptr);
    CHECK(l3::cli::find_command(name)->name == name);
  }
  CHECK(l3::cli::find_command("train") == nullptr);
  CHECK(l3::cli::find_command("demo")->run != nullptr);
}

TEST_CASE("every numeric option of every command declares its domain, and its default is in it",
          "[cli]") {
  for (const l3::cli::Command& command : l3::cli::command_table()) {
    if (command.declare == nullptr) continue;
    boost::program_options::options_description options;
    boost::program_options::positional_options_description positional;
    command.declare(options, positional);
    for (const auto& option : options.options()) {
      const auto* typed =
          dynamic_cast<const boost::program_options::typed_value_base*>(option->semantic().get());
      if (typed == nullptr) continue;
      const std::type_info& type = typed->value_type();
      const bool numeric = type == typeid(int) || type == typeid(std::int64_t) ||
                           type == typeid(std::uint64_t) || type == typeid(double) ||
                           type == typeid(float);
      if (!numeric) continue;
      INFO(command.name << " --" << option->long_name());
      const l3::core::Domain* domain = l3::core::declared_domain(*option);
      REQUIRE(domain != nullptr);
      boost::any fallback;
      if (option->semantic()->apply_default(fallback)) {
        const std::optional<double> value = l3::core::stored_number(fallback);
        REQUIRE(value);
        CHECK(domain->contains(*value));
      }
    }
  }
}
