// activation_avx2.cpp — SiLU·mul with the vector exp of vec_avx2.h (compiled with -mavx2 -mfma;
// reached through silu_mul_row in ops_cpu.cpp only when cpuid reports AVX2 + FMA).
// Reference: the scalar loop of silu_mul_row (libm expf); agreement ~2 ulp.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"

namespace kvdeck::cpu {

// y[:] = a / (1 + e^-a) * b                              a, b, y: f32 [n]
void silu_mul_row_avx2(const float* a, const float* b, int n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    const __m256 den = _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, x)));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(x, den), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) y[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
