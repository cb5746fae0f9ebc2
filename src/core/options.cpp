#include "core/options.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace l3::core {

namespace {

constexpr auto kCommandLineStyle =
    po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

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
  std::ifstream in(path);
  if (!in) throw bad_input("cannot read config file", {.file = path});
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw bad_input("error reading config file", {.file = path});
  reject_sections(path, text.str());
  try {
    std::istringstream stream(text.str());
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
  } catch (const po::error& e) {
    throw bad_input(e.what(), {.file = path});
  }
}

}  // namespace

po::variables_map parse_options(const po::options_description& options,
                                const po::positional_options_description& positional,
                                std::span<const std::string> args) {
  po::variables_map values;
  try {
    const std::vector<std::string> words(args.begin(), args.end());
    po::store(po::command_line_parser(words)
                  .options(options)
                  .positional(positional)
                  .style(kCommandLineStyle)
                  .run(),
              values);
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }

  // store() keeps values already present, so the command line (stored first) wins.
  if (values.count("config") != 0U && options.find_nothrow("config", false) != nullptr) {
    const auto path = values["config"].as<std::string>();
    const po::parsed_options from_file = parse_config_file(path, options);
    try {
      po::store(from_file, values);  // converts the values: a bad number is reported here
    } catch (const po::error& e) {
      throw bad_input(e.what(), {.file = path});
    }
  }

  try {
    po::notify(values);
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }
  return values;
}

}  // namespace l3::core
