#include "kernels/cpu/swiglu.hpp"

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vector_math.hpp"

namespace l3::kernels::cpu {

namespace {

L3_VECTOR_CLONES void swiglu_range(float* out, const float* gate, const float* up, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0F + exp_approx(-g)) * up[i];
  }
}

L3_VECTOR_CLONES void swiglu_backward_range(float* dgate, float* dup, const float* dout,
                                            const float* gate, const float* up, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float d = dout[i];  // read first: dgate may alias dout
    const float sig = 1.0F / (1.0F + exp_approx(-g));
    dgate[i] = d * up[i] * sig * (1.0F + g * (1.0F - sig));
    dup[i] = d * g * sig;
  }
}

}  // namespace

void swiglu(std::span<float> out, std::span<const float> gate, std::span<const float> up) {
  const auto n = static_cast<std::int64_t>(out.size());
  require_size(gate.size(), n, "swiglu", "gate");
  require_size(up.size(), n, "swiglu", "up");
#pragma omp parallel
  {
    const Range r = static_share(n, omp_get_thread_num(), omp_get_num_threads());
    swiglu_range(out.data() + r.begin, gate.data() + r.begin, up.data() + r.begin, r.end - r.begin);
  }
}

void swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     std::span<const float> gate, std::span<const float> up) {
  const auto n = static_cast<std::int64_t>(dout.size());
  require_size(dgate.size(), n, "swiglu_backward", "dgate");
  require_size(dup.size(), n, "swiglu_backward", "dup");
  require_size(gate.size(), n, "swiglu_backward", "gate");
  require_size(up.size(), n, "swiglu_backward", "up");
#pragma omp parallel
  {
    const Range r = static_share(n, omp_get_thread_num(), omp_get_num_threads());
    swiglu_backward_range(dgate.data() + r.begin, dup.data() + r.begin, dout.data() + r.begin,
                          gate.data() + r.begin, up.data() + r.begin, r.end - r.begin);
  }
}

}  // namespace l3::kernels::cpu
