// gemm_w8a8_avx2.cpp — 8-bit weights (GGUF Q8_0 kept exactly) and the Q4_1 minimum term, on
// AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c; reached only through the KernelSet of
// a CPU that has them; the AVX-512 set has its own W8A8, gemm_w8a8_avx512.cpp, and fuses the mins).
//
// W8A8: int8 x int8 per 32-block. maddubs multiplies unsigned by signed bytes, so
//   sum(w * a) = sum(|w| * (a * sign(w)))   (sign_epi8 twice, as llama.cpp's Q8_0 dot does);
//   |w| <= 128 and |a| <= 127 keep each pair sum within int16 (2 * 128 * 127 < 32768).
// Mins: y += sum_b d_a[b] * s_a[b] * (min[b] + 8 * scale[b]), eight blocks per step.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"

namespace kvdeck::cpu {
namespace {

// sum over the 32 bytes of w * a as 8 int32 lanes
inline __m256i dot32(__m256i w, __m256i a) {
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

}  // namespace

void gemm_w8a8_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const auto* codes = static_cast<const int8_t*>(w.data);       // [N, Kp]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  for (int n = n0; n < n1; ++n) {
    const int8_t* wr = codes + size_t(n) * Kp;                   // [Kp]
    const uint16_t* sr = scales + size_t(n) * nb;                // [nb]
    for (int m = 0; m < M; ++m) {
      const int8_t* qa = xq.q + size_t(m) * Kp;                  // [Kp]
      const float* da = xq.d + size_t(m) * nb;                   // [nb]
      __m256 acc = _mm256_setzero_ps();
      for (int b = 0; b < nb; ++b) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr + b * 32));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + b * 32));
        const float dd = da[b] * _cvtsh_ss(sr[b]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(wv, av)), _mm256_set1_ps(dd), acc);
      }
      y[size_t(m) * ldy + n] = hsum(acc);
    }
  }
}

void w4a8_mins_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int nb = w.Kp / kQ8Block, nb8 = nb / 8 * 8;
  const auto* mins = static_cast<const uint16_t*>(w.mins);      // f16 [N, nb]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  for (int m = 0; m < M; ++m) {
    const float* da = xq.d + size_t(m) * nb;                     // [nb]
    const int32_t* sa = xq.s + size_t(m) * nb;                   // [nb]
    for (int n = n0; n < n1; ++n) {
      const uint16_t* mr = mins + size_t(n) * nb;
      const uint16_t* sr = scales + size_t(n) * nb;
      __m256 acc = _mm256_setzero_ps();
      int b = 0;
      for (; b < nb8; b += 8) {
        const __m256 off = _mm256_fmadd_ps(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sr + b))), _mm256_set1_ps(8.0f),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mr + b))));
        const __m256 ds = _mm256_mul_ps(_mm256_loadu_ps(da + b),
                                        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sa + b))));
        acc = _mm256_fmadd_ps(ds, off, acc);
      }
      float tail = 0.0f;
      for (; b < nb; ++b) tail += da[b] * float(sa[b]) * (_cvtsh_ss(mr[b]) + 8.0f * _cvtsh_ss(sr[b]));
      y[size_t(m) * ldy + n] += hsum(acc) + tail;
    }
  }
}

}  // namespace kvdeck::cpu
