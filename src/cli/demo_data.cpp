#include "cli/demo_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

namespace l3::cli {

namespace {

constexpr std::array<const char*, 24> kWords = {
    "apple",  "river",  "stone",  "cloud",  "maple",  "tiger",  "piano",  "ocean",
    "lemon",  "candle", "forest", "silver", "garden", "rocket", "pencil", "window",
    "planet", "butter", "orange", "castle", "dragon", "summer", "winter", "bridge"};

constexpr std::uint64_t kSeed = 20260101;

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::vector<DemoTask> demo_tasks(int count, int stream) {
  const core::CounterRng rng(kSeed, core::RngPurpose::demo_data,
                             static_cast<std::uint32_t>(stream));
  std::uint64_t draw = 0;
  auto below = [&](std::uint64_t n) { return rng.below(draw++, n); };
  std::vector<DemoTask> tasks;
  tasks.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    const std::string word = kWords[below(kWords.size())];
    switch (below(5)) {
      case 0: {
        std::string reversed(word.rbegin(), word.rend());
        std::string scrambled = word;
        std::rotate(scrambled.begin(), scrambled.begin() + 1 + static_cast<long>(below(3)),
                    scrambled.end());
        tasks.push_back({fmt::format("Reverse the word {}.", word), reversed, scrambled});
        break;
      }
      case 1:
        tasks.push_back({fmt::format("Write {} in capital letters.", word), upper(word),
                         upper(word.substr(0, word.size() / 2)) + word.substr(word.size() / 2)});
        break;
      case 2: {
        const auto a = static_cast<int>(below(10));
        const auto b = static_cast<int>(below(10));
        const int wrong = a + b + 1 + static_cast<int>(below(3));
        tasks.push_back({fmt::format("What is {} plus {}?", a, b), std::to_string(a + b),
                         std::to_string(wrong)});
        break;
      }
      case 3:
        tasks.push_back({fmt::format("Repeat the word {} three times.", word),
                         fmt::format("{0} {0} {0}", word), fmt::format("{0} {0}", word)});
        break;
      default:
        tasks.push_back({fmt::format("What is the first letter of {}?", word),
                         std::string(1, word.front()), std::string(1, word.back())});
        break;
    }
  }
  return tasks;
}

void write_demo_sft(const std::string& path, int count) {
  std::string text;
  for (const DemoTask& t : demo_tasks(count, 0))
    text += nlohmann::json{{"prompt", t.prompt}, {"completion", t.answer}}.dump() + '\n';
  core::write_file_atomically(path, text);
}

void write_demo_preferences(const std::string& path, int count) {
  std::string text;
  for (const DemoTask& t : demo_tasks(count, 1)) {
    text +=
        nlohmann::json{{"prompt", t.prompt}, {"chosen", t.answer}, {"rejected", t.mistake}}.dump() +
        '\n';
  }
  core::write_file_atomically(path, text);
}

void write_demo_prompts(const std::string& path, int count) {
  std::string text;
  for (const DemoTask& t : demo_tasks(count, 2))
    text += nlohmann::json{{"prompt", t.prompt}, {"answer", t.answer}}.dump() + '\n';
  core::write_file_atomically(path, text);
}

}  // namespace l3::cli
