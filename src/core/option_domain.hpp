// The domain of a numeric option, declared with the option and checked once, where options are
// parsed (core::parse_options), whichever way the value came: on the command line (usage Error)
// or from a config file (bad_input Error naming the file), e.g. "--lr inf: must be a finite
// number >= 0". Every floating-point option must also be finite, declared with a domain or not.
//
//   options.add_options()("lr", core::number<double>(core::at_least(0))->default_value(1e-5), ..)
#pragma once

#include <array>
#include <boost/program_options.hpp>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace l3::core {

namespace po = boost::program_options;

// An interval of the real line (integers are compared as doubles: exact far beyond any bound
// used here).
struct Domain {
  double lowest = -std::numeric_limits<double>::infinity();
  bool lowest_excluded = false;
  double highest = std::numeric_limits<double>::infinity();
  bool highest_excluded = false;

  [[nodiscard]] bool contains(double value) const noexcept;
  // "a number >= 0", "a number in [1, 16777216]", "a number > 0 and < 1"
  [[nodiscard]] std::string describe() const;
};

[[nodiscard]] Domain at_least(double lowest);
[[nodiscard]] Domain above(double lowest);
[[nodiscard]] Domain between(double lowest, double highest);  // both included

// What parse_options asks of a declared option.
class DomainCheck {
 public:
  DomainCheck() = default;
  DomainCheck(const DomainCheck&) = default;
  DomainCheck& operator=(const DomainCheck&) = default;
  DomainCheck(DomainCheck&&) = default;
  DomainCheck& operator=(DomainCheck&&) = default;
  virtual ~DomainCheck() = default;
  [[nodiscard]] virtual const Domain& domain() const noexcept = 0;
};

// The shortest text that reads back to the same value of type T (std::to_chars): 2e-05 for
// the double 2e-5, 0.9 for the float 0.9f, where printing with all digits gives
// 2.0000000000000002e-05 and 0.899999976.
template <typename T>
[[nodiscard]] std::string shortest_text(T value) {
  std::array<char, 64> buffer{};
  const auto [end, error] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return error == std::errc() ? std::string(buffer.data(), end) : std::string();
}

// po::value<T>() that carries its domain.
template <typename T>
class DomainValue final : public po::typed_value<T>, public DomainCheck {
 public:
  explicit DomainValue(Domain domain) : po::typed_value<T>(nullptr), domain_(domain) {}
  [[nodiscard]] const Domain& domain() const noexcept override { return domain_; }
  // The default as --help shows it: shortest_text, not Boost's every digit. The value itself
  // is kept as it is.
  po::typed_value<T>* default_value(const T& value) {
    return po::typed_value<T>::default_value(value, shortest_text(value));
  }
  po::typed_value<T>* default_value(const T& value, const std::string& text) {
    return po::typed_value<T>::default_value(value, text);
  }

 private:
  Domain domain_;
};

template <typename T>
[[nodiscard]] DomainValue<T>* number(Domain domain) {
  static_assert(std::is_arithmetic_v<T>, "a domain is for numbers");
  return new DomainValue<T>(domain);  // NOLINT(cppcoreguidelines-owning-memory): Boost owns it
}

// The domain an option was declared with (nullptr: none).
[[nodiscard]] const Domain* declared_domain(const po::option_description& option);
// A stored number as a double (nullopt: not a number).
[[nodiscard]] std::optional<double> stored_number(const boost::any& value);
// Whether the stored value is floating point.
[[nodiscard]] bool is_floating(const boost::any& value);

}  // namespace l3::core
