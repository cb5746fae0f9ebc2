// cuDNN's fused attention graphs, compiled for an H200 (sm_90) described by its device-properties
// JSON, on a machine without a GPU (the CI): cuDNN checks the operation graphs, finds a fused
// engine and compiles its kernels with NVRTC, then stops at loading the module (no driver). This
// catches a graph cuDNN would refuse (a wrong dtype, stride or mask wiring that no engine
// supports) before a GPU session is spent on it; it says nothing about the numbers, which the
// GPU tests check. Needs a libcuda.so.1 resolving to the toolkit's stub (the test's environment
// points LD_LIBRARY_PATH at one); SKIP (77) when cuDNN is older than 9.11 or the device file is
// missing.
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "kernels/cuda/cudnn_attention.hpp"

namespace {

std::string device_json() {
  const char* path = std::getenv("L3_CUDNN_DEVICE_JSON");
  std::ifstream in(path != nullptr ? path : "");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("cuDNN compiles the fused attention graphs for sm_90 without a GPU", "[cudnn]") {
  const std::string json = device_json();
  if (json.empty() || cudnnGetVersion() < 91100) {
    WARN("SKIP: no device description (L3_CUDNN_DEVICE_JSON) or cuDNN older than 9.11");
    std::exit(77);  // NOLINT(concurrency-mt-unsafe): ctest's skip code, before anything runs
  }
  struct Case {
    const char* what;
    l3::kernels::AttentionShape shape;
    bool deterministic;
  };
  // {tokens, heads, kv heads, head_dim, segments, longest}
  const Case cases[] = {
      {"GQA 8/2, head_dim 64, 5 packed segments", {420, 8, 2, 64, 5, 260}, false},
      {"GQA 8/2, head_dim 128", {300, 8, 2, 128, 5, 129}, false},
      {"MQA 8/1, 10 short segments", {349, 8, 1, 128, 10, 129}, false},
      {"Llama-3-8B layout, one 2048-token document", {2048, 32, 8, 128, 1, 2048}, false},
      {"Llama-3.2-1B layout, 4 documents", {4096, 32, 8, 64, 4, 2048}, false},
      {"deterministic backward", {555, 8, 2, 128, 3, 300}, true},
      // The tiny model of gpu/training's cuDNN check (4/2 heads, head_dim 16), 2 rows of 128.
      {"tiny model, head_dim 16", {256, 4, 2, 16, 2, 128}, false},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    l3::cuda::CudnnAttentionOptions options;
    options.deterministic = c.deterministic;
    std::string plans;
    const std::string problem =
        l3::cuda::CudnnAttention::compile_offline(json, c.shape, options, &plans);
    INFO(plans);
    CHECK(problem.empty());
    if (problem.empty()) std::printf("%s:\n%s", c.what, plans.c_str());
  }
}
