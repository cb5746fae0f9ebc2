#include "core/option_domain.hpp"

#include <fmt/format.h>

#include <cmath>

namespace l3::core {

bool Domain::contains(double value) const noexcept {
  if (std::isnan(value)) return false;
  if (lowest_excluded ? !(value > lowest) : !(value >= lowest)) return false;
  return highest_excluded ? value < highest : value <= highest;
}

std::string Domain::describe() const {
  const bool low = std::isfinite(lowest);
  const bool high = std::isfinite(highest);
  if (low && high && !lowest_excluded && !highest_excluded)
    return fmt::format("a number in [{}, {}]", lowest, highest);
  std::string text = "a number";
  if (low) text += fmt::format(" {} {}", lowest_excluded ? ">" : ">=", lowest);
  if (low && high) text += " and";
  if (high) text += fmt::format(" {} {}", highest_excluded ? "<" : "<=", highest);
  return text;
}

Domain at_least(double lowest) { return {.lowest = lowest}; }
Domain above(double lowest) { return {.lowest = lowest, .lowest_excluded = true}; }
Domain between(double lowest, double highest) { return {.lowest = lowest, .highest = highest}; }

const Domain* declared_domain(const po::option_description& option) {
  const auto* check = dynamic_cast<const DomainCheck*>(option.semantic().get());
  return check != nullptr ? &check->domain() : nullptr;
}

std::optional<double> stored_number(const boost::any& value) {
  if (const auto* v = boost::any_cast<double>(&value)) return *v;
  if (const auto* v = boost::any_cast<float>(&value)) return static_cast<double>(*v);
  if (const auto* v = boost::any_cast<std::int64_t>(&value)) return static_cast<double>(*v);
  if (const auto* v = boost::any_cast<std::uint64_t>(&value)) return static_cast<double>(*v);
  if (const auto* v = boost::any_cast<int>(&value)) return static_cast<double>(*v);
  return std::nullopt;
}

bool is_floating(const boost::any& value) {
  return boost::any_cast<double>(&value) != nullptr || boost::any_cast<float>(&value) != nullptr;
}

}  // namespace l3::core
