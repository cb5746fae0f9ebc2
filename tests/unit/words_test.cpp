// Counts and ordinals in messages (core/words.hpp), and option defaults shown in their shortest
// form (core/option_domain.hpp).
#include "core/words.hpp"

#include <boost/program_options.hpp>
#include <sstream>

#include "catch.hpp"
#include "core/option_domain.hpp"

TEST_CASE("counts and ordinals read as English", "[words]") {
  using l3::core::count_of;
  using l3::core::ordinal;
  CHECK(count_of(1, "step") == "1 step");
  CHECK(count_of(0, "step") == "0 steps");
  CHECK(count_of(2, "copy", "copies") == "2 copies");
  CHECK(count_of(1, "copy", "copies") == "1 copy");
  CHECK(ordinal(1) == "1st");
  CHECK(ordinal(2) == "2nd");
  CHECK(ordinal(3) == "3rd");
  CHECK(ordinal(4) == "4th");
  CHECK(ordinal(11) == "11th");
  CHECK(ordinal(12) == "12th");
  CHECK(ordinal(13) == "13th");
  CHECK(ordinal(21) == "21st");
  CHECK(ordinal(102) == "102nd");
  CHECK(ordinal(111) == "111th");
}

TEST_CASE("option defaults print in the shortest form that reads back", "[words]") {
  using l3::core::shortest_text;
  CHECK(shortest_text(2e-5) == "2e-05");
  CHECK(shortest_text(0.9F) == "0.9");
  CHECK(shortest_text(1e-8F) == "1e-08");
  CHECK(shortest_text(std::int64_t{300}) == "300");
  // And as --help shows them; the values themselves are unchanged.
  namespace po = boost::program_options;
  po::options_description options;
  options.add_options()("lr", l3::core::number<double>(l3::core::at_least(0))->default_value(2e-5),
                        "x")(
      "beta1", l3::core::number<float>(l3::core::at_least(0))->default_value(0.9F), "y");
  std::ostringstream help;
  help << options;
  CHECK(help.str().find("(=2e-05)") != std::string::npos);
  CHECK(help.str().find("(=0.9)") != std::string::npos);
  po::variables_map values;
  po::store(po::command_line_parser(std::vector<std::string>{}).options(options).run(), values);
  CHECK(values["lr"].as<double>() == 2e-5);
  CHECK(values["beta1"].as<float>() == 0.9F);
}
