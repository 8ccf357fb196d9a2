// activation_neon.cpp — SiLU·mul with the vector exp of vec_neon.h (compiled with
// -march=armv8.2-a+dotprod -ffp-contract=off on aarch64 only; silu_mul_row in ops_cpu.cpp
// routes here while the neon kernel set is active). Reference: the scalar loop of silu_mul_row
// (libm expf); kernel_check states the bound.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_neon.h"

namespace kvdeck::cpu {

// y[:] = a / (1 + e^-a) * b                              a, b, y: f32 [n]
void silu_mul_row_neon(const float* a, const float* b, int n, float* y) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t x = vld1q_f32(a + i);
    const float32x4_t den = vaddq_f32(one, neon::exp4(vnegq_f32(x)));
    vst1q_f32(y + i, vmulq_f32(vdivq_f32(x, den), vld1q_f32(b + i)));
  }
  for (; i < n; ++i) y[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

}  // namespace kvdeck::cpu
#endif  // __aarch64__
