// vec_avx2.h — small AVX2 + FMA math shared by the *_avx2.cpp kernels (include only from
// files compiled with -mavx2 -mfma).
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

namespace kvdeck::cpu {

// Sum of the 8 lanes (a fixed order: the halves, then pairs; kernels rely on it being the same
// everywhere for bit-identical decode and prefill).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One 32-value activation block of row xr (K values) starting at k0, zero-padded past K
// through tmp [32]: its four vectors in v and the block's max |x| (the quantisers' scale).
inline float load_block_amax(const float* xr, int k0, int K, float* tmp, __m256 v[4]) {
  const float* src = xr + k0;
  if (k0 + 32 > K) {
    for (int i = 0; i < 32; ++i) tmp[i] = k0 + i < K ? xr[k0 + i] : 0.0f;
    src = tmp;
  }
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(src + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
  }
  __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
  a4 = _mm_max_ss(a4, _mm_movehdup_ps(a4));
  return _mm_cvtss_f32(a4);
}

// e^x for 8 lanes: range reduction x = n ln2 + r, degree-6 polynomial (Cephes expf),
// 2^n through the exponent bits. ~1 ulp on [-87, 88]; inputs below -87 give exactly 0 (no
// denormal results: they make the FMAs that consume them many times slower).
inline __m256 exp256(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
