// Rows of f16 <-> f32 (ops_cpu.h): F16C where the CPU has it (checked once), the scalar
// formats.h conversion otherwise; both round to nearest even, so the bytes are the same.
#include <cstdint>

#include "kvdeck/formats.h"
#include "kvdeck/ops_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace kvdeck::cpu {

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t* h, float* f,
                                                                  int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) f[i] = _cvtsh_ss(h[i]);
}
__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(const float* f, uint16_t* h,
                                                                  int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) h[i] = _cvtss_sh(f[i], _MM_FROUND_TO_NEAREST_INT);
}
static const bool kHasF16C = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
#endif

void f16_to_f32_row(const uint16_t* h, float* f, int n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (kHasF16C) return f16_to_f32_f16c(h, f, n);
#endif
  for (int i = 0; i < n; ++i) f[i] = f16_to_f32(h[i]);
}

void f32_to_f16_row(const float* f, uint16_t* h, int n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (kHasF16C) return f32_to_f16_f16c(f, h, n);
#endif
  for (int i = 0; i < n; ++i) h[i] = f32_to_f16(f[i]);
}

}  // namespace kvdeck::cpu
