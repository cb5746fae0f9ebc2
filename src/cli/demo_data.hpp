// The demo's built-in datasets: short instructions with one right answer each (reverse a word,
// capitalise it, add two digits, repeat a word, name its first letter), as SFT records
// {"prompt", "completion"} and as preference records whose rejected answer is a plausible
// mistake (a scramble, a wrong sum, the last letter instead of the first...). Generated from
// a fixed seed, so every run of the demo sees the same data.
#pragma once

#include <string>
#include <vector>

namespace l3::cli {

struct DemoTask {
  std::string prompt;
  std::string answer;
  std::string mistake;  // a wrong answer of the same kind
};

[[nodiscard]] std::vector<DemoTask> demo_tasks(int count, int stream);

// Writes `count` records as JSONL: SFT (prompt, completion), preference (prompt, chosen,
// rejected) or prompts (prompt, answer). Internal Error naming the file when it cannot be written.
void write_demo_sft(const std::string& path, int count);
void write_demo_preferences(const std::string& path, int count);
// GRPO's prompts with their exact answers: {"prompt", "answer"} (another draw of the tasks).
void write_demo_prompts(const std::string& path, int count);

}  // namespace l3::cli
