// l3::RunConfig: the public face of a training run's options. It keeps the command line (phase,
// then options) and the parse of it, so that every change goes through the same declarations,
// defaults and checks as `llama3-hpc sft|reward` and a config file means the same in both.
#include <fmt/format.h>

#include <algorithm>
#include <boost/any.hpp>
#include <cstdint>
#include <exception>
#include <vector>

#include "api/public_errors.hpp"
#include "api/run_config_parsed.hpp"
#include "api/train_options.hpp"
#include "core/error.hpp"
#include "core/option_suggestion.hpp"
#include "core/options.hpp"
#include "core/phase.hpp"
#include "l3/l3.hpp"

namespace l3 {

namespace {

namespace po = boost::program_options;

train::Phase phase_from_name(std::string_view name) {
  if (const std::optional<Phase> phase = core::parse_phase(name)) return *phase;
  throw core::usage_error(fmt::format(
      "a run is 'sft', 'reward', 'dpo' or 'grpo' (the first word of the arguments), not '{}'",
      name));
}

struct Declared {
  explicit Declared(train::Phase phase) {
    api::declare_train_options(all, phase);
    api::declare_config_and_log_options(all);
  }
  po::options_description all;
  po::positional_options_description positional;
};

// Whether an option takes no value (a switch such as --recompute).
bool is_switch(const po::option_description& option) {
  return option.semantic()->max_tokens() == 0;
}

// The stored value as the command line shows it.
std::string show(const boost::any& value) {
  if (value.empty()) return {};
  if (const auto* v = boost::any_cast<std::string>(&value)) return *v;
  if (const auto* v = boost::any_cast<bool>(&value)) return *v ? "true" : "false";
  if (const auto* v = boost::any_cast<std::int64_t>(&value)) return std::to_string(*v);
  if (const auto* v = boost::any_cast<std::uint64_t>(&value)) return std::to_string(*v);
  if (const auto* v = boost::any_cast<int>(&value)) return std::to_string(*v);
  if (const auto* v = boost::any_cast<double>(&value)) return fmt::format("{}", *v);
  if (const auto* v = boost::any_cast<float>(&value)) return fmt::format("{}", *v);
  return {};
}

}  // namespace

RunConfig::RunConfig(std::vector<std::string> args) : args_(std::move(args)) {
  api::rethrow_as_public([&] {
    if (args_.empty())
      throw core::usage_error("no arguments: the first one is 'sft', 'reward', 'dpo' or 'grpo'");
    const train::Phase phase = phase_from_name(args_.front());
    const Declared declared(phase);
    auto parsed = std::make_unique<Parsed>();
    parsed->values = core::parse_options(declared.all, declared.positional,
                                         std::span<const std::string>(args_).subspan(1));
    parsed->train = api::train_config_from(parsed->values, phase, /*data_may_come_from_host=*/true);
    parsed->log = api::log_config_from(parsed->values);
    parsed_ = std::move(parsed);
  });
}

RunConfig RunConfig::from_args(const std::vector<std::string>& args) { return RunConfig(args); }

RunConfig RunConfig::from_args(std::initializer_list<std::string_view> args) {
  return RunConfig(std::vector<std::string>(args.begin(), args.end()));
}

RunConfig RunConfig::from_file(const std::string& path, Phase phase) {
  return RunConfig({std::string(train::phase_name(phase)), "--config", path});
}

RunConfig& RunConfig::set(std::string_view option, std::string_view value) {
  api::rethrow_as_public([&] {
    const Declared declared(phase());
    const po::option_description* found =
        declared.all.find_nothrow(std::string(option), /*approx=*/false);
    if (found == nullptr) {
      throw core::usage_error(fmt::format("unknown option '{}' for a {} run",
                                          core::shown_name(option), train::phase_name(phase())));
    }
    const std::string flag = fmt::format("--{}", option);
    const bool flag_switch = is_switch(*found);
    if (flag_switch && value != "true" && value != "false") {
      throw core::usage_error(
          fmt::format("option '{}' is a switch: set it to true or false, not '{}'", option, value));
    }
    // The earlier occurrences go ("--opt VALUE", "--opt=VALUE", or a bare switch).
    std::vector<std::string> args{args_.front()};
    for (std::size_t i = 1; i < args_.size(); ++i) {
      if (args_[i] == flag) {
        if (!flag_switch) ++i;
        continue;
      }
      if (args_[i].starts_with(flag + "=")) continue;
      args.push_back(args_[i]);
    }
    if (!flag_switch) {
      args.push_back(flag);
      args.emplace_back(value);
    } else if (value == "true") {
      args.push_back(flag);
    }
    *this = RunConfig(std::move(args));  // parsed and checked; *this unchanged on an error
  });
  return *this;
}

RunConfig& RunConfig::set(std::string_view option, const char* value) {
  return set(option, std::string_view(value));
}
RunConfig& RunConfig::set(std::string_view option, double value) {
  return set(option, std::string_view(fmt::format("{}", value)));
}
RunConfig& RunConfig::set(std::string_view option, std::int64_t value) {
  return set(option, std::string_view(std::to_string(value)));
}
RunConfig& RunConfig::set(std::string_view option, int value) {
  return set(option, static_cast<std::int64_t>(value));
}
RunConfig& RunConfig::set(std::string_view option, bool value) {
  return set(option, std::string_view(value ? "true" : "false"));
}

std::string RunConfig::get(std::string_view option) const {
  std::string shown;
  api::rethrow_as_public([&] {
    const Declared declared(phase());
    if (declared.all.find_nothrow(std::string(option), false) == nullptr)
      throw core::usage_error(fmt::format("unknown option '{}'", core::shown_name(option)));
    const auto at = parsed_->values.find(std::string(option));
    if (at != parsed_->values.end()) shown = show(at->second.value());
  });
  return shown;
}

Phase RunConfig::phase() const noexcept { return parsed_->train.phase; }
std::vector<std::string> RunConfig::args() const { return args_; }
std::string RunConfig::to_json() const { return parsed_->train.to_json().dump(); }

RunConfig::RunConfig(const RunConfig& other)
    : args_(other.args_), parsed_(std::make_unique<Parsed>(*other.parsed_)) {}
RunConfig& RunConfig::operator=(const RunConfig& other) {
  if (this != &other) {
    auto parsed = std::make_unique<Parsed>(*other.parsed_);
    args_ = other.args_;
    parsed_ = std::move(parsed);
  }
  return *this;
}
RunConfig::RunConfig(RunConfig&& other) noexcept = default;
RunConfig& RunConfig::operator=(RunConfig&& other) noexcept = default;
RunConfig::~RunConfig() = default;

}  // namespace l3
