// gemm_w8a8_avx512.cpp — 8-bit weights (GGUF Q8_0 kept exactly: the tied head and embedding of
// the default model's folders) on AVX-512 BW + VNNI (compiled with -mavx512*; reached only
// through the AVX-512 KernelSet, dispatch.cpp).
//
// vpdpbusd multiplies unsigned by signed bytes, so the weights are made unsigned by one xor:
//   u = w ^ 0x80 = w + 128,  sum(w * a) = sum(u * a) - 128 * s   (s: the 32-block's sum of a),
// exact in int32; the -128 * s goes in as -16 * s on each of the block's eight lanes. One
// 64-byte step covers two 32-blocks (lanes 0-7 block 2v, 8-15 block 2v+1): xor, vpdpbusd onto
// the correction, convert, and one FMA against the product d_a * scale, which is formed for
// eight blocks at once (one f16 convert and one multiply) and spread to a step's lanes with one
// permute. Four weight rows (four streams, software-prefetched) share each activation load;
// activation rows run one after the other over the same four rows (in L1 by then).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx512.h"

// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own "undefined" vectors.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kRows = 4;              // weight rows per strip
constexpr int kPrefetchBytes = 4096;  // software prefetch distance in each row's stream
constexpr int kGroup = 8;             // 32-blocks per scale product (four steps)

// y[m][n .. n+RN) for RN weight rows (codes w + r * Kp, f16 scales sc + r * nb) and one
// activation row (q [Kp], d [nb], corr: -16 * s per block [nb]).
template <int RN>
void strip(const int8_t* w, const uint16_t* sc, int Kp, int nb, const int8_t* q, const float* d,
           const int32_t* corr, float* y) {
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  // step v of a group: lanes 0-7 block 2v, 8-15 block 2v+1
  const __m512i spread[4] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                             _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                             _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
                             _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)};
  __m512 acc[RN];
  for (int r = 0; r < RN; ++r) acc[r] = _mm512_setzero_ps();
  for (int b0 = 0; b0 < nb; b0 += kGroup) {
    const int n = std::min(kGroup, nb - b0);  // blocks in this group
    const __mmask8 bm = __mmask8((1u << n) - 1);
    const __m256 dg = _mm256_maskz_loadu_ps(bm, d + b0);
    const __m256i cg = _mm256_maskz_loadu_epi32(bm, corr + b0);
    __m512 p[RN];  // d_a * scale of the group's blocks, lanes 0..7
    for (int r = 0; r < RN; ++r)
      p[r] = _mm512_zextps256_ps512(_mm256_mul_ps(dg, _mm256_cvtph_ps(_mm_maskz_loadu_epi16(bm, sc + size_t(r) * nb + b0))));
    const __m512i cz = _mm512_zextsi256_si512(cg);
    for (int v = 0; 2 * v < n; ++v) {
      const size_t k = size_t(b0 + 2 * v) * kQ8Block;
      const bool pair = 2 * v + 1 < n;  // else the row's last, single block: 32 bytes
      const __mmask64 km = pair ? ~__mmask64(0) : __mmask64(0xFFFFFFFFu);
      const __m512i a = _mm512_maskz_loadu_epi8(km, q + k);
      const __m512i c = _mm512_permutexvar_epi32(spread[v], cz);
      for (int r = 0; r < RN; ++r) {
        const int8_t* wp = w + size_t(r) * Kp + k;
        _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchBytes), _MM_HINT_T0);
        const __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(km, wp), bias);
        // a single block's upper lanes: u = 0x80 against a = 0 and correction 0: nothing
        const __m512i s = _mm512_dpbusd_epi32(c, u, a);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(spread[v], p[r]), acc[r]);
      }
    }
  }
  if constexpr (RN == 4) {
    float* const yp[4] = {y, y + 1, y + 2, y + 3};
    store_sum4(acc, 1.0f, yp);
  } else {
    for (int r = 0; r < RN; ++r) y[r] = sum16(acc[r]);
  }
}

std::vector<int32_t>& scratch() {
  thread_local std::vector<int32_t> s;  // [M, nb]: -16 * s per block
  return s;
}

}  // namespace

void gemm_w8a8_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const auto* codes = static_cast<const int8_t*>(w.data);       // [N, Kp]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  std::vector<int32_t>& corr = scratch();
  corr.resize(size_t(M) * nb);
  for (size_t i = 0; i < corr.size(); ++i) corr[i] = -16 * xq.s[i];
  auto rows = [&](auto rn_tag, int n) {
    constexpr int RN = decltype(rn_tag)::value;
    for (int m = 0; m < M; ++m)
      strip<RN>(codes + size_t(n) * Kp, scales + size_t(n) * nb, Kp, nb, xq.q + size_t(m) * Kp, xq.d + size_t(m) * nb,
                corr.data() + size_t(m) * nb, y + size_t(m) * ldy + n);
  };
  int n = n0;
  for (; n + kRows <= n1; n += kRows) rows(std::integral_constant<int, kRows>{}, n);
  for (; n < n1; ++n) rows(std::integral_constant<int, 1>{}, n);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
