// GRPO's host-side parts: advantages against hand computations (GRPO and RLOO, group and batch
// scaling, ties and groups of equal rewards), the verifier command's every failure, and the
// prompt shards' round trip.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "core/error.hpp"
#include "io/data/shard_format.hpp"
#include "temp_dir.hpp"
#include "train/grpo/advantages.hpp"
#include "train/grpo/environment.hpp"
#include "train/grpo/reward_command.hpp"
#include "train/grpo_settings.hpp"

using l3::train::AdvantageEstimator;
using l3::train::RewardScaling;
using l3::train::grpo::compute_advantages;

namespace {

std::string failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const l3::core::Error& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return true;
  UNSCOPED_INFO(text);
  return false;
}

}  // namespace

TEST_CASE("GRPO advantages: the group's mean and unbiased std, + 1e-4", "[grpo]") {
  // Two groups of 4: rewards 1,0,0,1 (mean 0.5, std sqrt(1/3)) and 2,2,2,2 (no signal).
  const std::vector<double> r = {1, 0, 0, 1, 2, 2, 2, 2};
  const auto a = compute_advantages(r, 4, AdvantageEstimator::grpo, RewardScaling::group);
  const double std0 = std::sqrt(1.0 / 3.0);
  REQUIRE(a.values.size() == 8);
  CHECK(a.values[0] == Approx(0.5 / (std0 + 1e-4)).epsilon(1e-12));
  CHECK(a.values[1] == Approx(-0.5 / (std0 + 1e-4)).epsilon(1e-12));
  for (int i = 4; i < 8; ++i) CHECK(a.values[static_cast<std::size_t>(i)] == 0.0);
  CHECK(a.group_std[0] == Approx(std0).epsilon(1e-12));
  CHECK(a.group_std[1] == 0.0);
  CHECK(a.frac_zero_std == 0.5);

  // No scaling: the differences themselves; batch scaling: the std of all eight.
  const auto none = compute_advantages(r, 4, AdvantageEstimator::grpo, RewardScaling::none);
  CHECK(none.values[0] == 0.5);
  CHECK(none.values[2] == -0.5);
  const auto batch = compute_advantages(r, 4, AdvantageEstimator::grpo, RewardScaling::batch);
  // mean 1.25; squares: 0.0625 x 2 + 1.5625 x 2 + 0.5625 x 4 = 5.5; / 7
  const double batch_std = std::sqrt(5.5 / 7.0);
  CHECK(batch.batch_std == Approx(batch_std).epsilon(1e-12));
  CHECK(batch.values[0] == Approx(0.5 / (batch_std + 1e-4)).epsilon(1e-12));
  CHECK(batch.frac_zero_std == 0.0);
}

TEST_CASE("RLOO advantages: the mean of the group's other completions", "[grpo]") {
  // 3, 1, 2: baselines (1+2)/2, (3+2)/2, (3+1)/2 -> 1.5, -1.5, 0.
  const std::vector<double> r = {3, 1, 2};
  const auto a = compute_advantages(r, 3, AdvantageEstimator::rloo, RewardScaling::none);
  CHECK(a.values[0] == 1.5);
  CHECK(a.values[1] == -1.5);
  CHECK(a.values[2] == 0.0);
  // It is G/(G-1) times GRPO's difference: scaled by the group std the same way.
  const auto scaled = compute_advantages(r, 3, AdvantageEstimator::rloo, RewardScaling::group);
  CHECK(scaled.values[0] == Approx(1.5 / (1.0 + 1e-4)).epsilon(1e-12));
  // Ties: equal rewards give 0 whatever the estimator.
  const std::vector<double> ties = {0.5, 0.5};
  for (const auto e : {AdvantageEstimator::grpo, AdvantageEstimator::rloo}) {
    const auto t = compute_advantages(ties, 2, e, RewardScaling::group);
    CHECK(t.values[0] == 0.0);
    CHECK(t.values[1] == 0.0);
    CHECK(t.frac_zero_std == 1.0);
  }
}

TEST_CASE("A verifier command answers in order, and each failure is one line naming it", "[grpo]") {
  const l3::test::TempDir dir;
  const std::string script = (dir.path() / "verifier.sh").string();
  // Echo the length of the completion field as the reward (a shell verifier, no python needed).
  {
    std::ofstream f(script);
    f << "while IFS= read -r line; do\n"
         "  n=$(printf '%s' \"$line\" | wc -c)\n"
         "  printf '{\"reward\": %s}\\n' \"$n\"\n"
         "done\n";
  }
  {
    l3::train::grpo::RewardCommand good("sh " + script, 10);
    // The request as sent carries its id, counted from 1: {"completion": "ab", "id": 1}.
    CHECK(good.score(R"({"completion": "ab"})", "prompt 0") ==
          static_cast<double>(std::string_view(R"({"completion": "ab", "id": 1})").size()));
    CHECK(good.score(R"({"completion": "abc"})", "prompt 1") ==
          static_cast<double>(std::string_view(R"({"completion": "abc", "id": 2})").size()));
  }
  const auto failure = [](const std::string& command, double timeout) {
    return failure_of([&] {
      l3::train::grpo::RewardCommand c(command, timeout);
      (void)c.score(R"({"completion": "x"})", "prompt 7 of DIR");
    });
  };
  const std::string died = failure("exit 3", 10);
  CHECK(contains(died, "--reward-command \"exit 3\""));
  CHECK(contains(died, "prompt 7 of DIR"));
  CHECK(contains(died, "before answering"));
  CHECK(contains(failure("sleep 30", 0.3), "no answer within"));
  CHECK_THAT(failure("read l; echo not json", 10), Catch::Matchers::Contains("not JSON"));
  CHECK_THAT(failure("read l; echo '{\"score\": 1}'", 10),
             Catch::Matchers::Contains("not {\"reward\": NUMBER}"));
  CHECK_THAT(failure("read l; echo '{\"reward\": \"1\"}'", 10),
             Catch::Matchers::Contains("not {\"reward\": NUMBER}"));
  CHECK_THAT(failure("read l; echo '{\"reward\": 1e999}'", 10), Catch::Matchers::Contains("not"));
  CHECK_THAT(failure("read l; echo '[1]'", 10), Catch::Matchers::Contains("not {\"reward\""));
  // No newline before it exits: the partial answer is not taken.
  CHECK_THAT(failure("read l; printf '{\"reward\": 1}'", 10),
             Catch::Matchers::Contains("before answering"));
  CHECK(failure("no-such-command-xyz", 10).find("before answering") != std::string::npos);
  for (const std::string& message : {died, failure("sleep 30", 0.2)})
    CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("An environment answers with messages or a reward, and each failure is one line",
          "[grpo]") {
  using l3::train::grpo::Environment;
  using l3::train::grpo::EnvironmentReply;
  const nlohmann::json request = {{"record", {{"answer", "4"}}},
                                  {"messages", nlohmann::json::array()},
                                  {"turn", 1},
                                  {"final", false},
                                  {"truncated", false}};
  {
    // A tool result, then a reward (a shell environment, no python needed).
    Environment env(
        R"(read l; echo '{"messages": [{"role": "ipython", "content": "4"}]}'; read l; )"
        R"(echo '{"reward": 0.5, "id": 2}')",
        10);
    const EnvironmentReply first = env.step(request, false, "prompt 0 (sample 0), turn 1");
    CHECK_FALSE(first.reward);
    REQUIRE(first.messages.size() == 1);
    CHECK(first.messages[0].role == "ipython");
    CHECK(first.messages[0].content == "4");
    const EnvironmentReply second = env.step(request, true, "prompt 0 (sample 0), turn 2");
    CHECK(second.reward == 0.5);
  }
  const auto failure = [&](const std::string& command, bool final = false) {
    return failure_of([&] {
      Environment env(command, 0.5);
      (void)env.step(request, final, "prompt 7 of DIR (sample 1), turn 2");
    });
  };
  const auto answering = [](const std::string& answer) { return "read l; echo '" + answer + "'"; };
  for (const auto& [command, final, expected] :
       std::vector<std::tuple<std::string, bool, std::string>>{
           {"exit 3", false, "before answering"},
           {"sleep 30", false, "no answer within --reward-timeout 0.5 s"},
           {answering("not json"), false, "not JSON"},
           {answering("[1]"), false, "the answer is not {\"messages\""},
           {answering(R"({"score": 1})"), false, "neither is there"},
           {answering(R"({"reward": 1, "messages": []})"), false, "not both"},
           {answering(R"({"reward": "1"})"), false, "is not a number"},
           {answering(R"({"reward": 1e999})"), false, "not"},
           {answering(R"({"messages": []})"), false, "non-empty list"},
           {answering(R"({"messages": ["4"]})"), false, "messages[0] is not"},
           {answering(R"({"messages": [{"role": "assistant", "content": "4"}]})"), false,
            "the policy is the assistant"},
           {answering(R"({"messages": [{"role": "tool", "content": "4"}]})"), false,
            "names tool results \"ipython\""},
           {answering(R"({"messages": [{"role": "ipython", "content": 4}]})"), false,
            "messages[0] is not"},
           {answering(R"({"messages": [{"role": "user", "content": "go on"}]})"), true,
            "no turn left"},
       }) {
    const std::string message = failure(command, final);
    INFO(command);
    CHECK(contains(message, "--environment \"" + command + "\""));
    CHECK(contains(message, "prompt 7 of DIR (sample 1), turn 2"));
    CHECK(contains(message, expected));
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("A verifier's late second answer is caught when its input ends", "[grpo]") {
  // What it writes after its input ended answers no request: finish() finds it.
  const std::string after_end = failure_of([] {
    l3::train::grpo::RewardCommand c(
        "while read -r l; do echo '{\"reward\": 1}'; done; echo '{\"reward\": 9}'", 10);
    CHECK(c.score(R"({"completion": "a"})", "prompt 0") == 1.0);
    c.finish();
  });
  CHECK(contains(after_end, "beyond its answers"));
  CHECK(contains(after_end, "1 sent"));
  CHECK(contains(after_end, "{\"reward\": 9}"));
  // A second answer 0.2 s late: the next request is usually out by then and takes it (nothing
  // tells them apart without an echoed id), and finish() finds the answer left over; on a
  // loaded machine the next request may go later and find it waiting. Caught either way.
  const std::string late = failure_of([] {
    l3::train::grpo::RewardCommand c(
        "while read -r l; do echo '{\"reward\": 1}'; sleep 0.2; echo '{\"reward\": 2}'; done", 10);
    (void)c.score(R"({"completion": "a"})", "prompt 0");
    (void)c.score(R"({"completion": "b"})", "prompt 1");
    c.finish();
  });
  CHECK(contains(late, "answer each request once"));
  // A verifier that answers once each ends with its input: no error, no wait.
  l3::train::grpo::RewardCommand good("while read -r l; do echo '{\"reward\": 3}'; done", 10);
  CHECK(good.score(R"({"completion": "a"})", "prompt 0") == 3.0);
  const auto started = std::chrono::steady_clock::now();
  good.finish();
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}

TEST_CASE("A stuck verifier is killed with everything it started", "[grpo]") {
  // The shell's background child would otherwise outlive the run, holding its stderr (ctest
  // waited 30 s for a `sleep 30` here). It must be gone (or a zombie its new parent reaps) soon
  // after the timeout.
  const l3::test::TempDir dir;
  const std::string pid_file = (dir.path() / "child.pid").string();
  const std::string message = failure_of([&] {
    l3::train::grpo::RewardCommand c("sleep 60 & echo $! > '" + pid_file + "'; wait", 0.3);
    (void)c.score(R"({"completion": "x"})", "prompt 0");
  });
  CHECK(contains(message, "no answer within"));
  int child = 0;
  std::ifstream(pid_file) >> child;
  REQUIRE(child > 0);
  const auto alive = [&] {
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string pid, name, state;
    return stat >> pid >> name >> state && state != "Z";
  };
  for (int i = 0; i < 200 && alive(); ++i) ::usleep(10000);
  CHECK_FALSE(alive());
}

TEST_CASE("Prompt shards round-trip their prompts and records", "[grpo][shards]") {
  const l3::test::TempDir dir;
  l3::data::Prompts p;
  p.add(std::vector<std::int32_t>{1, 2, 3}, R"({"prompt":"a","answer":"4"})");
  p.add(std::vector<std::int32_t>{5}, R"({"messages":[],"x":[1,2]})");
  const std::string path = (dir.path() / "p.h5").string();
  l3::data::write_prompt_shard(path, p, {"llama3-hpc/prompts", 1, "abc", 300});
  const auto shard = l3::data::read_prompt_shard(path);
  REQUIRE(shard.prompts.count() == 2);
  CHECK(shard.prompts.documents.tokens == p.documents.tokens);
  CHECK(shard.prompts.record(0) == R"({"prompt":"a","answer":"4"})");
  CHECK(shard.prompts.record(1) == R"({"messages":[],"x":[1,2]})");
  CHECK(l3::data::content_digest(shard.prompts) == l3::data::content_digest(p));
  // The wrong format is named.
  l3::data::Documents d;
  d.add(std::vector<std::int32_t>{1}, std::vector<std::uint8_t>{0});
  const std::string sft = (dir.path() / "s.h5").string();
  l3::data::write_sft_shard(sft, d, {"llama3-hpc/sft", 1, "abc", 300});
  CHECK_THAT(failure_of([&] { (void)l3::data::read_prompt_shard(sft); }),
             Catch::Matchers::Contains("llama3-hpc/prompts"));
}

TEST_CASE("GRPO's rewards: their names in weight order, and settings that cannot work", "[grpo]") {
  l3::train::GrpoSettings s;
  CHECK_THROWS_WITH(s.validate(), Catch::Matchers::Contains("--reward-model CKPT"));
  s.reward_match_answer = true;
  s.reward_command = "python3 verify.py";
  s.reward_model = "ckpt/rm";
  CHECK(s.reward_names() == std::vector<std::string>{"answer_match", "command", "reward_model"});
  s.reward_weights = {1.0, 0.5};
  CHECK_THROWS_WITH(s.validate(), Catch::Matchers::Contains("answer_match, command, reward_model"));
  s.reward_weights = {1.0, 0.5, 0.25};
  CHECK_NOTHROW(s.validate());
  s.reward_model.clear();
  s.reward_weights.clear();
  s.reward_adapter = "adapters/rm";
  CHECK_THROWS_WITH(s.validate(),
                    Catch::Matchers::Contains("--reward-adapter DIR needs --reward-model"));
}

TEST_CASE("GRPO's importance-sampling settings: TRL's defaults, names, bounds", "[grpo]") {
  using l3::train::ImportanceSamplingMode;
  l3::train::GrpoSettings s;
  // TRL 1.10's GRPOConfig: vllm_importance_sampling_correction True, mode sequence_mask,
  // clip_max 3.0, clip_min None.
  CHECK(s.importance_sampling_correction);
  CHECK(s.importance_sampling_mode == ImportanceSamplingMode::sequence_mask);
  CHECK(s.importance_sampling_clip_max == 3.0);
  CHECK(!s.importance_sampling_clip_min.has_value());
  for (const ImportanceSamplingMode mode :
       {ImportanceSamplingMode::sequence_mask, ImportanceSamplingMode::sequence_truncate,
        ImportanceSamplingMode::token_mask, ImportanceSamplingMode::token_truncate}) {
    CHECK(l3::train::parse_importance_sampling_mode(
              l3::train::importance_sampling_mode_name(mode)) == mode);
  }
  CHECK_THROWS_WITH(l3::train::parse_importance_sampling_mode("sequence"),
                    Catch::Matchers::Contains("sequence_mask, sequence_truncate"));
  const auto bound = [](std::string_view text) {
    return l3::train::parse_importance_sampling_bound("importance-sampling-clip-max", text);
  };
  CHECK(!bound("none").has_value());
  CHECK(bound("3") == 3.0);
  CHECK(bound("0.5") == 0.5);
  CHECK(bound("0") == 0.0);
  for (const std::string_view bad : {"-1", "3x", "", "inf", "nan", "None"}) {
    INFO(bad);
    CHECK_THROWS_WITH(bound(bad), Catch::Matchers::Contains("--importance-sampling-clip-max"));
  }
  s.reward_match_answer = true;
  s.importance_sampling_clip_min = 0.5;
  CHECK_NOTHROW(s.validate());
  s.importance_sampling_clip_max = 0.4;
  CHECK_THROWS_WITH(s.validate(), Catch::Matchers::Contains("--importance-sampling-clip-min"));
  s.importance_sampling_clip_max.reset();  // no upper bound
  CHECK_NOTHROW(s.validate());
  nlohmann::json j;
  s.importance_sampling_mode = ImportanceSamplingMode::token_truncate;
  s.add_to(j);
  CHECK(j["importance_sampling_correction"] == true);
  CHECK(j["importance_sampling_mode"] == "token_truncate");
  CHECK(j["importance_sampling_clip_max"].is_null());
  CHECK(j["importance_sampling_clip_min"] == 0.5);
}
