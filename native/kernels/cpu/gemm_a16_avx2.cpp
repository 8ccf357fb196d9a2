// gemm_a16_avx2.cpp — 16-bit activations (ActQ8::q16) on AVX2 + FMA + F16C: the quantiser
// and the W4A8 (GGUF Q4_0 / Q4_1) and W8A8 (Q8_0) products. Compiled with -mavx2 -mfma
// -mf16c; reached only through a KernelSet whose CPU has them (the AVX-512 set reuses both).
// Contracts and the scalar reference: gemm_a16.cpp.
//
// W4A8: each 16-bit activation is split exactly into two byte planes, q = 256 * hi + lo with
// hi = q >> 8 (signed) and lo = q & 255 (unsigned), so a block's dot product is two u8 x s8
// dot products over the same decoded weight nibbles (weights read and decoded once):
//   sum(nib * q) = 256 * sum(nib * hi) + sum(lo * nib)
//   maddubs(nib u8, hi s8): pair <= 2*15*128 = 3840; (lo u8, nib as s8 0..15): <= 2*255*15 =
//   7650; the even and odd halves are added in int16 (7680 / 15300 < 32767), then widened to
//   int32 by madd with 256 and with 1. The planes are packed per call like gemm_avx2.cpp's
//   PairPack (even / odd elements of two 32-blocks meet one 32-byte load of codes).
// W8A8: the int8 weights sign-extended to int16, madd with the int16 activations.
// Floats as gemm_avx2.cpp: int32 lanes converted and scaled per block (not bit-identical with
// the scalar order of float sums; the integer sums are exact, tests/native/test_a16.py).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"

namespace kvdeck::cpu {

// ============================================================================
// Quantiser (bit-exact with quantize_act_q16_scalar: the same float ops, RNE)
// ============================================================================
void quantize_act_q16_avx2(const float* x /*[M,K]*/, int M, int K, ActQ8& out) {
  const int Kp = out.Kp, nb = Kp / kQ8Block;
  const __m256 lim = _mm256_set1_ps(kA16Max), nlim = _mm256_set1_ps(-kA16Max);
  alignas(32) float tmp[kQ8Block];  // zero-padded copy of a partial block
  for (int m = 0; m < M; ++m) {
    const float* xr = x + size_t(m) * K;      // [K]
    int16_t* q = out.q16 + size_t(m) * Kp;    // [Kp]
    for (int b = 0; b < nb; ++b) {
      const int k0 = b * kQ8Block;
      __m256 v[4];
      const float am = load_block_amax(xr, k0, K, tmp, v);
      const __m256 vid = _mm256_set1_ps(am > 0.0f ? kA16Max / am : 0.0f);
      __m256i qi[4];
      for (int i = 0; i < 4; ++i)
        qi[i] = _mm256_cvtps_epi32(_mm256_max_ps(nlim, _mm256_min_ps(lim, _mm256_mul_ps(v[i], vid))));
      const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
      for (int i = 0; i < 2; ++i)  // packs interleaves 128-bit lanes: 0xD8 restores element order
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0 + 16 * i),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2 * i], qi[2 * i + 1]), 0xD8));
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
      out.d[size_t(m) * nb + b] = am / kA16Max;
      out.s[size_t(m) * nb + b] = _mm_cvtsi128_si32(s);
    }
  }
}

namespace {

// ---- tuning constants (as gemm_avx2.cpp's W4A8 path) -------------------------------
// GEMM tiles measured at M = 64 (2026-12-01, load 4; a16 time / a8 time, Q4_1 and Q4_0):
// 2x4 1.84 / 1.59, 2x3 1.85 / 1.58, 1x4 2.11 / 1.96: 2x4 kept.
constexpr int kGemvRows = 4;   // weight rows per GEMV step
constexpr int kGemmRowsN = 2;  // weight rows x activation rows per GEMM register tile
constexpr int kGemmRowsM = 4;
constexpr int kMBlock = 64;    // activation rows packed at once
constexpr int kPrefetchBytes = 4096;

// ============================================================================
// W4A8: packed byte planes and the register-tiled kernel
// ============================================================================
// One activation row, two 32-blocks (b = 2p, 2p+1), to meet a 32-byte load of weight codes.
struct alignas(32) Pack16 {
  int8_t even_hi[32];   // [hi of q[b][0,2,..,30] | of q[b+1][0,2,..,30]]
  int8_t odd_hi[32];
  uint8_t even_lo[32];  // the low bytes, same order
  uint8_t odd_lo[32];
  int32_t corr[8];      // -8 * s / 4 per int32 lane; with mins the f32 bits of d_a * s / 4
  float d[8];           // [d_a[b] x4 | d_a[b+1] x4]
};

template <bool kMins>
void pack16(const ActQ8& xq, int m0, int mb, int P, Pack16* out /*[mb, P]*/) {
  const int Kp = xq.Kp, nb = Kp / kQ8Block;
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int16_t* q = xq.q16 + size_t(m) * Kp;  // [Kp]
    for (int p = 0; p < P; ++p) {
      Pack16& pk = out[size_t(mi) * P + p];
      for (int h = 0; h < 2; ++h) {
        const int b = 2 * p + h;
        if (b >= nb) {  // odd block count: zero second half
          std::memset(pk.even_hi + 16 * h, 0, 16), std::memset(pk.odd_hi + 16 * h, 0, 16);
          std::memset(pk.even_lo + 16 * h, 0, 16), std::memset(pk.odd_lo + 16 * h, 0, 16);
          for (int j = 0; j < 4; ++j) pk.corr[4 * h + j] = 0, pk.d[4 * h + j] = 0.0f;
          continue;
        }
        // the 64 bytes of the block's 32 int16 -> its four 16-byte planes: per 128-bit lane gather
        // [even lo | odd lo | even hi | odd hi] 4 bytes each (A B C D), then regroup the lanes
        const int16_t* qb = q + b * kQ8Block;  // [32]
        const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15,
                                            0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
        const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        const __m256i t0 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)), sh);
        const __m256i t1 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 16)), sh);
        const __m256i p0 = _mm256_permutevar8x32_epi32(t0, idx);  // [A0 A1 B0 B1 | C0 C1 D0 D1]
        const __m256i p1 = _mm256_permutevar8x32_epi32(t1, idx);  // [A2 A3 B2 B3 | C2 C3 D2 D3]
        const __m256i ev = _mm256_unpacklo_epi64(p0, p1);         // [even lo | even hi]
        const __m256i od = _mm256_unpackhi_epi64(p0, p1);         // [odd lo | odd hi]
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pk.even_lo + 16 * h), _mm256_castsi256_si128(ev));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pk.even_hi + 16 * h), _mm256_extracti128_si256(ev, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pk.odd_lo + 16 * h), _mm256_castsi256_si128(od));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(pk.odd_hi + 16 * h), _mm256_extracti128_si256(od, 1));
        const float d = xq.d[size_t(m) * nb + b];
        const int32_t s = xq.s[size_t(m) * nb + b];
        if (kMins) {
          const float ds = d * float(s) * 0.25f;
          for (int j = 0; j < 4; ++j) std::memcpy(&pk.corr[4 * h + j], &ds, 4);
        } else {
          for (int j = 0; j < 4; ++j) pk.corr[4 * h + j] = -kW4a8Offset / 4 * s;
        }
        for (int j = 0; j < 4; ++j) pk.d[4 * h + j] = d;
      }
    }
  }
}

struct QRow {
  const uint8_t* codes;   // [Kp/2]: 32 bytes per pair of 32-blocks
  const uint16_t* scales; // f16 [nb]
  const uint16_t* mins;   // f16 [nb] or null
};

// Two f16 (blocks b, b+1) -> lanes [b x4 | b+1 x4].
inline __m256 pair_f16(uint32_t bits) {
  const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(int(bits)));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

template <bool kMins, int RN, int RM>
inline void step16(const __m256i (&c)[RN], const uint32_t (&sb)[RN], const uint32_t (&mb)[RN],
                   const Pack16* const (&a)[RM], __m256 (&acc)[RN][RM]) {
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), k256 = _mm256_set1_epi16(256);
  for (int n = 0; n < RN; ++n) {
    const __m256i lo = _mm256_and_si256(c[n], nib);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c[n], 4), nib);
    const __m256 ws = pair_f16(sb[n]);
    const __m256 mv = kMins ? pair_f16(mb[n]) : _mm256_setzero_ps();
    for (int m = 0; m < RM; ++m) {
      const auto* A = a[m];
      const __m256i eh = _mm256_load_si256(reinterpret_cast<const __m256i*>(A->even_hi));
      const __m256i oh = _mm256_load_si256(reinterpret_cast<const __m256i*>(A->odd_hi));
      const __m256i el = _mm256_load_si256(reinterpret_cast<const __m256i*>(A->even_lo));
      const __m256i ol = _mm256_load_si256(reinterpret_cast<const __m256i*>(A->odd_lo));
      const __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, eh), _mm256_maddubs_epi16(hi, oh));
      const __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(el, lo), _mm256_maddubs_epi16(ol, hi));
      __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(sh, k256), _mm256_madd_epi16(sl, ones));
      if (!kMins) s32 = _mm256_add_epi32(s32, _mm256_load_si256(reinterpret_cast<const __m256i*>(A->corr)));
      acc[n][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws, _mm256_load_ps(A->d)), acc[n][m]);
      if (kMins)
        acc[n][m] = _mm256_fmadd_ps(_mm256_load_ps(reinterpret_cast<const float*>(A->corr)), mv, acc[n][m]);
    }
  }
}

template <bool kMins, int RN, int RM>
void tile16(const QRow (&w)[RN], const Pack16* const (&a0)[RM], int nb, float* const (&y)[RM]) {
  __m256 acc[RN][RM];
  for (int n = 0; n < RN; ++n)
    for (int m = 0; m < RM; ++m) acc[n][m] = _mm256_setzero_ps();
  const Pack16* a[RM];
  for (int m = 0; m < RM; ++m) a[m] = a0[m];
  const int P = (nb + 1) / 2;
  for (int p = 0; p < P; ++p) {
    const bool half = 2 * p + 1 >= nb;  // the last single 32-block of an odd count
    __m256i c[RN];
    uint32_t sb[RN], mb[RN] = {};
    for (int n = 0; n < RN; ++n) {
      const uint8_t* cp = w[n].codes + 32 * size_t(p);
      if (RM == 1) _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes), _MM_HINT_T0);
      if (half) {
        c[n] = _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128(reinterpret_cast<const __m128i*>(cp)), 0);
        sb[n] = w[n].scales[2 * p];
        if (kMins) mb[n] = w[n].mins[2 * p];
      } else {
        c[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp));
        std::memcpy(&sb[n], w[n].scales + 2 * p, 4);
        if (kMins) std::memcpy(&mb[n], w[n].mins + 2 * p, 4);
      }
    }
    step16<kMins, RN, RM>(c, sb, mb, a, acc);
    for (int m = 0; m < RM; ++m) ++a[m];
  }
  for (int n = 0; n < RN; ++n)
    for (int m = 0; m < RM; ++m) y[m][n] = hsum(acc[n][m]);
}

std::vector<Pack16>& pack_scratch() {
  thread_local std::vector<Pack16> v;
  return v;
}

template <bool kMins>
void gemm_q4a16(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, P = (nb + 1) / 2;
  auto row = [&](int n) -> QRow {
    return {static_cast<const uint8_t*>(w.data) + size_t(n) * (Kp / 2),
            static_cast<const uint16_t*>(w.scales) + size_t(n) * nb,
            kMins ? static_cast<const uint16_t*>(w.mins) + size_t(n) * nb : nullptr};
  };
  std::vector<Pack16>& S = pack_scratch();
  S.resize(size_t(std::min(M, kMBlock)) * P);
  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int mb = std::min(kMBlock, M - m0);
    pack16<kMins>(xq, m0, mb, P, S.data());
    const Pack16* A = S.data();  // [mb, P]
    if (mb == 1) {  // decode GEMV: kGemvRows rows share each activation load
      int n = n0;
      for (; n + kGemvRows <= n1; n += kGemvRows) {
        QRow r[kGemvRows];
        for (int i = 0; i < kGemvRows; ++i) r[i] = row(n + i);
        const Pack16* a[1] = {A};
        float* yp[1] = {y + size_t(m0) * ldy + n};
        tile16<kMins, kGemvRows, 1>(r, a, nb, yp);
      }
      for (; n < n1; ++n) {
        QRow r[1] = {row(n)};
        const Pack16* a[1] = {A};
        float* yp[1] = {y + size_t(m0) * ldy + n};
        tile16<kMins, 1, 1>(r, a, nb, yp);
      }
      continue;
    }
    int n = n0;  // GEMM: kGemmRowsN weight rows stay in L1 across the m tiles of this block
    for (; n + kGemmRowsN <= n1; n += kGemmRowsN) {
      QRow r[kGemmRowsN];
      for (int i = 0; i < kGemmRowsN; ++i) r[i] = row(n + i);
      int m = 0;
      constexpr int RM = kGemmRowsM;
      for (; m + RM <= mb; m += RM) {
        const Pack16* a[RM];
        float* yp[RM];
        for (int i = 0; i < RM; ++i) a[i] = A + size_t(m + i) * P, yp[i] = y + size_t(m0 + m + i) * ldy + n;
        tile16<kMins, kGemmRowsN, RM>(r, a, nb, yp);
      }
      for (; m < mb; ++m) {
        const Pack16* a[1] = {A + size_t(m) * P};
        float* yp[1] = {y + size_t(m0 + m) * ldy + n};
        tile16<kMins, kGemmRowsN, 1>(r, a, nb, yp);
      }
    }
    for (; n < n1; ++n) {
      QRow r[1] = {row(n)};
      for (int m = 0; m < mb; ++m) {
        const Pack16* a[1] = {A + size_t(m) * P};
        float* yp[1] = {y + size_t(m0 + m) * ldy + n};
        tile16<kMins, 1, 1>(r, a, nb, yp);
      }
    }
  }
}

// ============================================================================
// W8A8 on 16-bit activations
// ============================================================================
// sum over 32 int8 weights x 32 int16 activations as 8 int32 lanes (|lane| <= 4*128*32767)
inline __m256i dot32_w8a16(const int8_t* w, const int16_t* a) {
  const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
  return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                          _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16))));
}

void gemm_w8a16(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const auto* codes = static_cast<const int8_t*>(w.data);       // [N, Kp]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  for (int n = n0; n < n1; ++n) {
    const int8_t* wr = codes + size_t(n) * Kp;
    const uint16_t* sr = scales + size_t(n) * nb;
    if (M == 1) _mm_prefetch(reinterpret_cast<const char*>(wr + kPrefetchBytes), _MM_HINT_T0);
    for (int m = 0; m < M; ++m) {
      const int16_t* qa = xq.q16 + size_t(m) * Kp;
      const float* da = xq.d + size_t(m) * nb;
      __m256 acc = _mm256_setzero_ps();
      for (int b = 0; b < nb; ++b)
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32_w8a16(wr + b * 32, qa + b * 32)),
                              _mm256_set1_ps(da[b] * _cvtsh_ss(sr[b])), acc);
      y[size_t(m) * ldy + n] = hsum(acc);
    }
  }
}

}  // namespace

void gemm_a16_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  check_a16_weight(w);
  if (w.layout == WeightLayout::Q41X8)  // GGUF Q4_1 repacked at load (gemm_a16_x8_avx2.cpp)
    gemm_q41x8_a16_avx2(w, xq, M, y, ldy, n0, n1);
  else if (w.dtype == DType::W8A8)
    gemm_w8a16(w, xq, M, y, ldy, n0, n1);
  else if (w.group != kQ8Block)
    gemm_a16_scalar(w, xq, M, y, ldy, n0, n1);
  else if (w.mins && M == 1)  // decode: the minimum's term fused into the GEMV
    gemm_q4a16<true>(w, xq, M, y, ldy, n0, n1);
  else if (w.mins) {  // GEMM: as Q4_0 (t - 8 s), then + d_a s (min + 8 scale) 8 blocks a step
    gemm_q4a16<false>(w, xq, M, y, ldy, n0, n1);
    w4a8_mins_avx2(w, xq, M, y, ldy, n0, n1);
  }
  else
    gemm_q4a16<false>(w, xq, M, y, ldy, n0, n1);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
