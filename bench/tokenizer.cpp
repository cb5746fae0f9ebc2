// Tokenizer throughput, one thread: MB/s of UTF-8 in and tokens/s, next to the Llama 3
// pre-tokenizer regex alone on the same text in the same run (the ratio is what BPE costs on
// top of the split).
//
//   l3-bench-tokenizer [--tokenizer FILE] [--megabytes N] [--json FILE]
// Without --tokenizer: $L3_LLAMA3_TOKENIZER, else only the bytes tokenizer is measured.
#include "io/tokenizer/tokenizer.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "core/timer.hpp"
#include "io/tokenizer/pretokenizer.hpp"

namespace {

// A mixed corpus: English prose, numbers, code, and some non-Latin text.
std::string make_corpus(std::size_t bytes) {
  static const std::vector<std::string> kWords = {"the",
                                                  "of",
                                                  "and",
                                                  "to",
                                                  "in",
                                                  "is",
                                                  "that",
                                                  "for",
                                                  "it",
                                                  "as",
                                                  "with",
                                                  "was",
                                                  "on",
                                                  "be",
                                                  "parallel",
                                                  "rank",
                                                  "checkpoint",
                                                  "gradient",
                                                  "tokenizer",
                                                  "supercomputer",
                                                  "Llama",
                                                  "MPI_Allreduce",
                                                  "throughput",
                                                  "don't",
                                                  "it's",
                                                  "they've",
                                                  "HPC",
                                                  "GPU",
                                                  "bandwidth",
                                                  "latency",
                                                  "émigré",
                                                  "naïve",
                                                  "数据",
                                                  "加载",
                                                  "분산",
                                                  "학습",
                                                  "данные",
                                                  "🦙",
                                                  "2026",
                                                  "1234567",
                                                  "3.14159",
                                                  "x = f(y) + 1;",
                                                  "return x ** 2  # square",
                                                  "if (rank == 0) {",
                                                  "}",
                                                  "\n",
                                                  "\n\n",
                                                  "  ",
                                                  "\t"};
  const l3::core::CounterRng rng(5, l3::core::RngPurpose::test);
  std::string text;
  std::uint64_t i = 0;
  while (text.size() < bytes) {
    text += kWords[rng.below(i++, kWords.size())];
    text += rng.below(i++, 8) == 0 ? ". " : " ";
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string tokenizer_path =
      std::getenv("L3_LLAMA3_TOKENIZER") != nullptr ? std::getenv("L3_LLAMA3_TOKENIZER") : "";
  std::size_t megabytes = 16;
  std::string json_path;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--tokenizer") == 0 && a + 1 < argc)
      tokenizer_path = argv[++a];
    else if (std::strcmp(argv[a], "--megabytes") == 0 && a + 1 < argc)
      megabytes = std::stoul(argv[++a]);
    else if (std::strcmp(argv[a], "--json") == 0 && a + 1 < argc)
      json_path = argv[++a];
    else {
      fmt::print(stderr, "usage: {} [--tokenizer FILE] [--megabytes N] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  const std::string corpus = make_corpus(megabytes << 20U);
  const double mb = static_cast<double>(corpus.size()) / 1e6;
  nlohmann::json results = {{"benchmark", "tokenizer"}, {"megabytes", mb}};

  const l3::tokenizer::Pretokenizer split;
  l3::core::Stopwatch watch;
  std::size_t pieces = 0;
  split.split(corpus, [&](std::string_view) { ++pieces; });
  const double split_mbs = mb / watch.seconds();
  fmt::print("pre-tokenizer regex alone (baseline): {:8.1f} MB/s ({} pieces)\n", split_mbs, pieces);
  results["regex_mb_per_s"] = split_mbs;

  auto measure = [&](const l3::tokenizer::Tokenizer& t, const std::string& label) {
    watch.reset();
    const auto ids = t.encode(corpus);
    const double seconds = watch.seconds();
    fmt::print(
        "{:<36} {:8.1f} MB/s  {:10.0f} tokens/s  ({:.2f} bytes/token)  = {:.2f} x the regex\n",
        label, mb / seconds, static_cast<double>(ids.size()) / seconds,
        static_cast<double>(corpus.size()) / static_cast<double>(ids.size()),
        mb / seconds / split_mbs);
    results[label] = {{"mb_per_s", mb / seconds},
                      {"tokens_per_s", static_cast<double>(ids.size()) / seconds},
                      {"ratio_to_regex", mb / seconds / split_mbs}};
  };
  measure(l3::tokenizer::Tokenizer::bytes(), "bytes tokenizer");
  if (!tokenizer_path.empty())
    measure(l3::tokenizer::Tokenizer::load(tokenizer_path), "llama3 tokenizer (BPE)");
  if (!json_path.empty()) std::ofstream(json_path) << results.dump(2) << '\n';
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
