// --attention: the names, and the attention a CUDA backend runs for each choice, --deterministic
// and what cuDNN supports on the GPU (kernels::choose_attention is pure: no GPU needed).
#include <string>

#include "catch.hpp"
#include "core/error.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/backends.hpp"
#include "train/train_config.hpp"

using l3::kernels::Attention;
using l3::kernels::AttentionChoice;
using l3::kernels::CudnnSupport;

namespace {

// The usage error's text, or empty when none was thrown.
std::string usage_error_of(Attention attention, bool deterministic) {
  try {
    (void)l3::kernels::choose_attention(attention, deterministic, {});
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::usage);
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("the --attention names round-trip and anything else names the choices", "[attention]") {
  for (const Attention a : {Attention::automatic, Attention::cudnn,
                            Attention::cudnn_nondeterministic, Attention::fallback}) {
    CHECK(l3::kernels::parse_attention(l3::kernels::attention_name(a)) == a);
  }
  CHECK(l3::kernels::attention_name(Attention::automatic) == "auto");
  CHECK(l3::kernels::attention_name(Attention::cudnn_nondeterministic) == "cudnn-nondeterministic");
  try {
    (void)l3::kernels::parse_attention("cudnn-fast");
    FAIL("parsed an unknown attention");
  } catch (const l3::core::Error& e) {
    CHECK(e.kind() == l3::core::ErrorKind::usage);
    CHECK(std::string(e.what()) ==
          "--attention takes auto, cudnn, cudnn-nondeterministic or fallback");
  }
  // Training's default is auto (deterministic); other callers of make_ops keep the fallback.
  CHECK(l3::train::TrainConfig{}.attention == Attention::automatic);
  CHECK(l3::kernels::BackendOptions{}.attention == Attention::fallback);
}

TEST_CASE("auto is cuDNN with its deterministic backward where the GPU has it", "[attention]") {
  const CudnnSupport hopper{};
  const CudnnSupport old_cudnn{.unavailable = "cuDNN runtime 90100 is older than 91002",
                               .deterministic_unavailable = {}};
  const CudnnSupport blackwell{.unavailable = {},
                               .deterministic_unavailable =
                                   "a deterministic backward on sm_100 (cuDNN attention here: "
                                   "sm_90)"};
  for (const bool deterministic : {false, true}) {
    INFO("--deterministic " << deterministic);
    const AttentionChoice on_hopper =
        l3::kernels::choose_attention(Attention::automatic, deterministic, hopper);
    CHECK(on_hopper.cudnn);
    CHECK(on_hopper.deterministic_backward);
    CHECK(on_hopper.fallback_reason.empty());
    // Where cuDNN (or its deterministic backward) is not there: the fallback, saying why.
    const AttentionChoice with_old =
        l3::kernels::choose_attention(Attention::automatic, deterministic, old_cudnn);
    CHECK_FALSE(with_old.cudnn);
    CHECK(with_old.fallback_reason == old_cudnn.unavailable);
    const AttentionChoice on_blackwell =
        l3::kernels::choose_attention(Attention::automatic, deterministic, blackwell);
    CHECK_FALSE(on_blackwell.cudnn);
    CHECK(on_blackwell.deterministic_backward);
    CHECK(on_blackwell.fallback_reason == blackwell.deterministic_unavailable);
    // cudnn by name: cuDNN, deterministic, whatever the GPU (cuDNN declines call by call).
    const AttentionChoice named =
        l3::kernels::choose_attention(Attention::cudnn, deterministic, blackwell);
    CHECK(named.cudnn);
    CHECK(named.deterministic_backward);
    const AttentionChoice fallback =
        l3::kernels::choose_attention(Attention::fallback, deterministic, hopper);
    CHECK_FALSE(fallback.cudnn);
    CHECK(fallback.deterministic_backward);
  }
  const AttentionChoice fast =
      l3::kernels::choose_attention(Attention::cudnn_nondeterministic, false, hopper);
  CHECK(fast.cudnn);
  CHECK_FALSE(fast.deterministic_backward);
}

TEST_CASE("cudnn-nondeterministic with --deterministic is a usage error", "[attention]") {
  const std::string error = usage_error_of(Attention::cudnn_nondeterministic, true);
  CHECK(error.find("--attention cudnn-nondeterministic") != std::string::npos);
  CHECK(error.find("--deterministic") != std::string::npos);
  CHECK(error.find('\n') == std::string::npos);
  CHECK(usage_error_of(Attention::cudnn_nondeterministic, false).empty());
  CHECK(usage_error_of(Attention::automatic, true).empty());
  CHECK(usage_error_of(Attention::cudnn, true).empty());
}

TEST_CASE("the start line says which attention runs and whether it is deterministic",
          "[attention]") {
  const std::string automatic = l3::kernels::describe_attention(
      Attention::automatic, l3::kernels::choose_attention(Attention::automatic, false, {}));
  CHECK(
      automatic.starts_with("attention (--attention auto): cuDNN fused attention with its "
                            "deterministic backward"));
  CHECK(automatic.find("bit-identical reruns and restarts") != std::string::npos);
  const std::string fast = l3::kernels::describe_attention(
      Attention::cudnn_nondeterministic,
      l3::kernels::choose_attention(Attention::cudnn_nondeterministic, false, {}));
  CHECK(fast.find("non-deterministic backward") != std::string::npos);
  CHECK(fast.find("not bit-identical") != std::string::npos);
  const std::string fallback = l3::kernels::describe_attention(
      Attention::automatic,
      l3::kernels::choose_attention(Attention::automatic, false,
                                    {.unavailable = "GPU sm_80 (cuDNN attention here: sm_90 or "
                                                    "sm_100)",
                                     .deterministic_unavailable = {}}));
  CHECK(fallback ==
        "attention (--attention auto): the fallback (cuBLAS GEMMs and softmax kernels), "
        "deterministic backward; cuDNN not used: GPU sm_80 (cuDNN attention here: sm_90 or "
        "sm_100)");
}
