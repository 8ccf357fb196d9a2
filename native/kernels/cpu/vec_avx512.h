// vec_avx512.h — small AVX-512 helpers shared by the *_avx512.cpp kernels (include only from
// files compiled with -mavx512f -mavx512dq).
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

namespace kvdeck::cpu {

// The sum of one accumulator's 16 lanes: 256-bit halves, 128-bit halves, then within the 128
// bits (store_sum4's additions, so a row of a prefill tile and the same row alone agree).
inline float sum16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  x = _mm_add_ps(x, _mm_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_add_ps(x, _mm_shuffle_ps(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(x);
}

// *y[m] = sum16(acc[m]) * scale for four accumulators at once, bit for bit (the same
// additions, transposed: 11 vector instructions for the four).
inline void store_sum4(const __m512* acc, float scale, float* const* y) {
  // x01: [acc0 lo256 + hi256 | acc1 lo256 + hi256]
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[0], acc[1], 0x44), _mm512_shuffle_f32x4(acc[0], acc[1], 0xEE));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[3], 0x44), _mm512_shuffle_f32x4(acc[2], acc[3], 0xEE));
  // 128-bit lane m of z: acc m folded to 4 values
  __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(1, 0, 3, 2)));
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(2, 3, 0, 1)));
  z = _mm512_mul_ps(z, _mm512_set1_ps(scale));
  alignas(64) float out[16];
  _mm512_store_ps(out, z);
  for (int m = 0; m < 4; ++m) *y[m] = out[4 * m];
}

// RM accumulators: store_sum4 by fours, else one by one (same bits either way).
template <int RM>
inline void store_sums(const __m512 (&acc)[RM], float scale, float* const (&y)[RM]) {
  if constexpr (RM % 4 == 0) {
    for (int m = 0; m < RM; m += 4) store_sum4(acc + m, scale, y + m);
  } else {
    for (int m = 0; m < RM; ++m) *y[m] = sum16(acc[m]) * scale;
  }
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
