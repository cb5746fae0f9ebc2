#include "core/options.hpp"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "core/option_domain.hpp"
#include "core/option_suggestion.hpp"

namespace l3::core {

namespace {

constexpr auto kCommandLineStyle =
    po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

// The long names of `options`, for suggestions.
std::vector<std::string> long_names(const po::options_description& options) {
  std::vector<std::string> names;
  for (const auto& option : options.options()) names.push_back(option->long_name());
  return names;
}

// An unknown option's message with what it probably meant: "unrecognised option '--warm'; did
// you mean --warmup?". `dashes`: "--" on the command line, "" for a config file's keys.
std::string unknown_option_message(const po::unknown_option& e,
                                   const po::options_description& options,
                                   std::string_view dashes) {
  const std::string name = e.get_option_name();
  const std::string text = name.size() <= 64
                               ? std::string(e.what())
                               : fmt::format("unrecognised option '{}'", shown_name(name));
  return text + did_you_mean(name, long_names(options), dashes);
}

// Boost accepts INI sections and turns them into dotted names; we want a flat file and a clear
// message instead of "unrecognised option 'section.key'".
void reject_sections(const std::string& path, const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const auto first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line[first] == '[') {
      throw bad_input(fmt::format("line {}: sections ('{}') are not supported; write "
                                  "'key = value' lines with the long option names",
                                  number, one_line(line)),
                      {.file = path});
    }
  }
}

po::parsed_options parse_config_file(const std::string& path,
                                     const po::options_description& options) {
  const std::string text = read_text_file(path, "a config file", kMaxConfigFileBytes);
  reject_sections(path, text);
  try {
    std::istringstream stream(text);
    po::parsed_options parsed = po::parse_config_file(stream, options, false);
    for (const po::option& option : parsed.options) {
      if (option.string_key == "config") {
        throw bad_input("a config file cannot name another config file ('config = ...')",
                        {.file = path});
      }
      if (option.string_key == "help") {
        throw bad_input("'help' is a command-line flag, not a config key", {.file = path});
      }
    }
    return parsed;
  } catch (const po::unknown_option& e) {
    throw bad_input(unknown_option_message(e, options, ""), {.file = path});
  } catch (const po::error& e) {
    throw bad_input(e.what(), {.file = path});
  }
}

// The value as the user wrote it, near enough for a message.
std::string shown(const boost::any& value, double number) {
  if (const auto* v = boost::any_cast<std::int64_t>(&value)) return std::to_string(*v);
  if (const auto* v = boost::any_cast<std::uint64_t>(&value)) return std::to_string(*v);
  if (const auto* v = boost::any_cast<int>(&value)) return std::to_string(*v);
  return fmt::format("{}", number);
}

// Boost reads "-1" as an unsigned number by wrapping it to 2^64 - 1: a negative value given to an
// unsigned option is refused from its text, before that happens silently.
void reject_negative_unsigned(const po::options_description& options,
                              const po::parsed_options& parsed, const std::string& config) {
  for (const po::option& given : parsed.options) {
    const po::option_description* option = options.find_nothrow(given.string_key, false);
    const auto* typed = option != nullptr
                            ? dynamic_cast<const po::typed_value_base*>(option->semantic().get())
                            : nullptr;
    if (typed == nullptr || typed->value_type() != typeid(std::uint64_t)) continue;
    for (const std::string& value : given.value) {
      const auto first = value.find_first_not_of(" \t");
      if (first == std::string::npos || value[first] != '-') continue;
      const std::string text =
          fmt::format("--{} {}: must be a number >= 0", given.string_key, value);
      if (config.empty()) throw usage_error(text);
      throw bad_input(text, {.file = config});
    }
  }
}

// Every number given (not defaulted) within its declared domain, every floating-point one finite.
void check_domains(const po::options_description& options, const po::variables_map& values,
                   const std::set<std::string>& from_command_line, const std::string& config) {
  for (const auto& [name, variable] : values) {
    if (variable.defaulted()) continue;
    const std::optional<double> number = stored_number(variable.value());
    if (!number) continue;
    const po::option_description* option = options.find_nothrow(name, false);
    const Domain* domain = option != nullptr ? declared_domain(*option) : nullptr;
    const bool finite_needed = is_floating(variable.value());
    if ((!finite_needed || std::isfinite(*number)) &&
        (domain == nullptr || domain->contains(*number)))
      continue;
    std::string expected = domain != nullptr ? domain->describe() : std::string("a number");
    if (finite_needed) expected.insert(expected.find("number"), "finite ");
    const std::string text =
        fmt::format("--{} {}: must be {}", name, shown(variable.value(), *number), expected);
    if (from_command_line.contains(name) || config.empty()) throw usage_error(text);
    throw bad_input(text, {.file = config});
  }
}

}  // namespace

po::variables_map parse_options(const po::options_description& options,
                                const po::positional_options_description& positional,
                                std::span<const std::string> args) {
  po::variables_map values;
  std::set<std::string> from_command_line;
  try {
    const std::vector<std::string> words(args.begin(), args.end());
    const po::parsed_options parsed = po::command_line_parser(words)
                                          .options(options)
                                          .positional(positional)
                                          .style(kCommandLineStyle)
                                          .run();
    for (const po::option& option : parsed.options) from_command_line.insert(option.string_key);
    reject_negative_unsigned(options, parsed, "");
    po::store(parsed, values);
  } catch (const po::unknown_option& e) {
    throw usage_error(unknown_option_message(e, options, "--"));
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }

  // store() keeps values already present, so the command line (stored first) wins.
  std::string config;
  if (values.count("config") != 0U && options.find_nothrow("config", false) != nullptr) {
    config = values["config"].as<std::string>();
    const po::parsed_options from_file = parse_config_file(config, options);
    reject_negative_unsigned(options, from_file, config);
    try {
      po::store(from_file, values);  // converts the values: a bad number is reported here
    } catch (const po::error& e) {
      throw bad_input(e.what(), {.file = config});
    }
  }
  check_domains(options, values, from_command_line, config);

  try {
    po::notify(values);
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }
  return values;
}

}  // namespace l3::core
