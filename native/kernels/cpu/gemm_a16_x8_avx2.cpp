// gemm_a16_x8_avx2.cpp — GGUF Q4_1 (W4A8 + mins, group 32) in the Q41X8 layout (kernels.h)
// on 16-bit activations, AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c; reached only
// through a KernelSet whose CPU has them; the AVX-512 set uses it too). Contract and scalar
// reference: gemm_a16.cpp (the integer block sums are exact, tests/native/test_a16.py).
//
// Why a layout: on the file layout (gemm_a16_avx2.cpp) every pair of 32-blocks pays its own
// widening (two madd), conversion, scale product and two FMAs; the decode GEMV was compute
// bound (perf: 44% of a decode step). Q41X8 puts block j of a chunk of eight in int32 lane j
// of each of four 32-byte code vectors, so per chunk (256 weights) and activation row:
//   * high plane: 8 maddubs (nibble u8 x high byte s8), summed in int16 (8 * 2*15*128 = 30720);
//   * low plane: 8 maddubs (low byte u8 x nibble), two int16 sums of 4 (4 * 2*255*15 = 30600);
//   * s32 = 256 * high + the two low sums added as u16, widened by shifts and masks (no
//     multiply): block j's exact sum in lane j;
//   * one convert, one scale product (scales as 8 f16 in a row: the file's own), one FMA, and
//     the minimum's term d_a * s * min as one more FMA per eight blocks (no second pass).
// The nb % 8 blocks after the last chunk stay in the file order and run in pairs as in
// gemm_a16_avx2.cpp (lanes [b x4 | b+1 x4]). Activations are packed per call (the planes
// in chunk order), in blocks of rows that stay in L1 while every weight row passes.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kRowsM = 4;               // GEMM tile: 1 weight row x 4 activation rows
constexpr int kL1ActBytes = 24 << 10;   // packed activation rows per block: at most this many bytes
constexpr int kPrefetchBytes = 2048;    // GEMV software prefetch distance in the code stream

// ============================================================================
// Packed activations
// ============================================================================
// One row, one chunk of eight 32-blocks: int32 lane j of every vector belongs to block j.
struct alignas(32) X8Acts {
  int8_t eh[4][32];   // vector v, byte 4j + k: high byte of q[block j][8v + 2k]
  int8_t oh[4][32];   // ... of q[block j][8v + 2k + 1]
  uint8_t el[4][32];  // the low bytes, same order
  uint8_t ol[4][32];
  float d[8];         // d_a of block j
  float ds[8];        // d_a * s of block j (the minimum's term)
};

// One row, a tail pair of blocks (b, b+1) in the file layout: lanes [b x4 | b+1 x4].
struct alignas(32) PairActs {
  int8_t even_hi[32];   // [hi of q[b][0,2,..,30] | of q[b+1][0,2,..,30]]
  int8_t odd_hi[32];
  uint8_t even_lo[32];
  uint8_t odd_lo[32];
  float ds4[8];         // d_a * s / 4 per lane
  float d[8];
};

// The 32 int16 of one block -> its four 16-byte planes (even lo, odd lo, even hi, odd hi).
inline void block_planes(const int16_t* qb, __m128i& elo, __m128i& olo, __m128i& ehi, __m128i& ohi) {
  // per 128-bit lane gather [even lo | odd lo | even hi | odd hi] 4 bytes each, then regroup
  const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15,
                                      0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
  const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i t0 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)), sh);
  const __m256i t1 = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 16)), sh);
  const __m256i p0 = _mm256_permutevar8x32_epi32(t0, idx);  // [A0 A1 B0 B1 | C0 C1 D0 D1]
  const __m256i p1 = _mm256_permutevar8x32_epi32(t1, idx);  // [A2 A3 B2 B3 | C2 C3 D2 D3]
  const __m256i ev = _mm256_unpacklo_epi64(p0, p1);         // [even lo | even hi]
  const __m256i od = _mm256_unpackhi_epi64(p0, p1);         // [odd lo | odd hi]
  elo = _mm256_castsi256_si128(ev), ehi = _mm256_extracti128_si256(ev, 1);
  olo = _mm256_castsi256_si128(od), ohi = _mm256_extracti128_si256(od, 1);
}

void pack_rows(const ActQ8& xq, int m0, int mb, int C, int P, X8Acts* A /*[mb, C]*/, PairActs* Q /*[mb, P]*/) {
  const int Kp = xq.Kp, nb = Kp / kQ8Block;
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int16_t* q = xq.q16 + size_t(m) * Kp;  // [Kp]
    const float* d = xq.d + size_t(m) * nb;
    const int32_t* s = xq.s + size_t(m) * nb;
    for (int c = 0; c < C; ++c) {
      X8Acts& o = A[size_t(mi) * C + c];
      alignas(16) uint32_t t[4][kX8Blocks][4];  // plane (el, ol, eh, oh), block j, dword v
      for (int j = 0; j < kX8Blocks; ++j) {
        const int b = c * kX8Blocks + j;
        __m128i p[4];
        block_planes(q + b * kQ8Block, p[0], p[1], p[2], p[3]);
        for (int i = 0; i < 4; ++i) _mm_store_si128(reinterpret_cast<__m128i*>(t[i][j]), p[i]);
        o.d[j] = d[b];
        o.ds[j] = d[b] * float(s[b]);
      }
      void* planes[4] = {o.el, o.ol, o.eh, o.oh};
      for (int i = 0; i < 4; ++i) {  // dword v of block j -> vector v, lane j
        auto* dst = static_cast<uint32_t*>(planes[i]);
        for (int v = 0; v < 4; ++v)
          for (int j = 0; j < kX8Blocks; ++j) dst[v * kX8Blocks + j] = t[i][j][v];
      }
    }
    for (int p = 0; p < P; ++p) {
      PairActs& o = Q[size_t(mi) * P + p];
      for (int h = 0; h < 2; ++h) {
        const int b = C * kX8Blocks + 2 * p + h;
        if (b >= nb) {  // odd tail: zero second half
          std::memset(o.even_hi + 16 * h, 0, 16), std::memset(o.odd_hi + 16 * h, 0, 16);
          std::memset(o.even_lo + 16 * h, 0, 16), std::memset(o.odd_lo + 16 * h, 0, 16);
          for (int j = 0; j < 4; ++j) o.ds4[4 * h + j] = 0.0f, o.d[4 * h + j] = 0.0f;
          continue;
        }
        __m128i elo, olo, ehi, ohi;
        block_planes(q + b * kQ8Block, elo, olo, ehi, ohi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o.even_lo + 16 * h), elo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o.odd_lo + 16 * h), olo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o.even_hi + 16 * h), ehi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o.odd_hi + 16 * h), ohi);
        for (int j = 0; j < 4; ++j) o.ds4[4 * h + j] = d[b] * float(s[b]) * 0.25f, o.d[4 * h + j] = d[b];
      }
    }
  }
}

// ============================================================================
// Kernels
// ============================================================================
inline __m256i ld(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }

// Two f16 (blocks b, b+1) -> lanes [b x4 | b+1 x4].
inline __m256 pair_f16(uint32_t bits) {
  const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(int(bits)));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

// Pair sums of int16 lanes as int32 without a multiply (the GEMM is bound by the multiply
// ports: the 16 maddubs of a chunk are its only multiplies; with madd for the two widenings it
// measured 0.90-0.95x at M = 64). widen_u16: lanes read as unsigned (< 2^16: the low plane's
// two sums of 4, each <= 30600 and >= 0, added in int16); widen_s16_x256: signed, times 256.
inline __m256i widen_u16(__m256i v) {
  return _mm256_add_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(v, 16));
}
inline __m256i widen_s16_x256(__m256i v) {
  return _mm256_slli_epi32(_mm256_add_epi32(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16), _mm256_srai_epi32(v, 16)), 8);
}

// y[m] for one weight row (codes, scales, mins of row n) x RM activation rows.
template <int RM>
void row_tile(const uint8_t* codes, const uint16_t* sc, const uint16_t* mn, int C, int T,
              const X8Acts* const (&a)[RM], const PairActs* const (&pa)[RM], float* const (&y)[RM]) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  for (int c = 0; c < C; ++c) {
    const uint8_t* cp = codes + size_t(c) * kX8ChunkBytes;
    if (RM == 1) {
      _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes + 64), _MM_HINT_T0);
    }
    __m256i lo[4], hi[4];
    for (int v = 0; v < 4; ++v) {
      const __m256i cv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp + 32 * v));
      lo[v] = _mm256_and_si256(cv, nib);
      hi[v] = _mm256_and_si256(_mm256_srli_epi16(cv, 4), nib);
    }
    const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + kX8Blocks * c)));
    const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + kX8Blocks * c)));
    for (int m = 0; m < RM; ++m) {  // one dependency chain per sum: few live registers
      const X8Acts& A = a[m][c];
      __m256i h = _mm256_maddubs_epi16(lo[0], ld(A.eh[0]));
      h = _mm256_add_epi16(h, _mm256_maddubs_epi16(hi[0], ld(A.oh[0])));
      for (int v = 1; v < 4; ++v) {
        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(lo[v], ld(A.eh[v])));
        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(hi[v], ld(A.oh[v])));
      }
      __m256i l[2];
      for (int i = 0; i < 2; ++i) {
        const int v = 2 * i;
        l[i] = _mm256_maddubs_epi16(ld(A.el[v]), lo[v]);
        l[i] = _mm256_add_epi16(l[i], _mm256_maddubs_epi16(ld(A.ol[v]), hi[v]));
        l[i] = _mm256_add_epi16(l[i], _mm256_maddubs_epi16(ld(A.el[v + 1]), lo[v + 1]));
        l[i] = _mm256_add_epi16(l[i], _mm256_maddubs_epi16(ld(A.ol[v + 1]), hi[v + 1]));
      }
      const __m256i s32 = _mm256_add_epi32(widen_s16_x256(h), widen_u16(_mm256_add_epi16(l[0], l[1])));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws, _mm256_load_ps(A.d)), acc[m]);
      acc[m] = _mm256_fmadd_ps(mv, _mm256_load_ps(A.ds), acc[m]);
    }
  }
  for (int p = 0; 2 * p < T; ++p) {  // the tail, pairs of file-layout blocks
    const int b = C * kX8Blocks + 2 * p;
    const uint8_t* cp = codes + size_t(b) * 16;
    const bool half = 2 * p + 1 >= T;
    const __m256i cv = half ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cp)))
                            : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp));
    uint32_t sb = sc[b], mb = mn[b];
    if (!half) std::memcpy(&sb, sc + b, 4), std::memcpy(&mb, mn + b, 4);
    const __m256i lo = _mm256_and_si256(cv, nib), hi = _mm256_and_si256(_mm256_srli_epi16(cv, 4), nib);
    const __m256 ws = pair_f16(sb), mv = pair_f16(mb);
    for (int m = 0; m < RM; ++m) {
      const PairActs& A = pa[m][p];
      const __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ld(A.even_hi)), _mm256_maddubs_epi16(hi, ld(A.odd_hi)));
      const __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(ld(A.even_lo), lo), _mm256_maddubs_epi16(ld(A.odd_lo), hi));
      const __m256i s32 = _mm256_add_epi32(widen_s16_x256(sh), widen_u16(sl));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws, _mm256_load_ps(A.d)), acc[m]);
      acc[m] = _mm256_fmadd_ps(mv, _mm256_load_ps(A.ds4), acc[m]);
    }
  }
  for (int m = 0; m < RM; ++m) *y[m] = hsum(acc[m]);
}

struct Scratch {
  std::vector<X8Acts> a;
  std::vector<PairActs> p;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

void gemm_q41x8_a16_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, C = nb / kX8Blocks, T = nb - C * kX8Blocks, P = (T + 1) / 2;
  const int row_bytes = C * int(sizeof(X8Acts)) + P * int(sizeof(PairActs));
  const int mblock = M == 1 ? 1 : std::max(kRowsM, kL1ActBytes / row_bytes / kRowsM * kRowsM);
  Scratch& S = scratch();
  S.a.resize(size_t(std::min(M, mblock)) * C + 1);
  S.p.resize(size_t(std::min(M, mblock)) * P + 1);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const uint16_t*>(w.scales);
  const auto* mins = static_cast<const uint16_t*>(w.mins);
  for (int m0 = 0; m0 < M; m0 += mblock) {
    const int mb = std::min(mblock, M - m0);
    pack_rows(xq, m0, mb, C, P, S.a.data(), S.p.data());
    for (int n = n0; n < n1; ++n) {
      const uint8_t* cr = codes + size_t(n) * (Kp / 2);
      const uint16_t* sr = scales + size_t(n) * nb;
      const uint16_t* mr = mins + size_t(n) * nb;
      float* yc = y + size_t(m0) * ldy + n;
      int m = 0;
      for (; m + kRowsM <= mb; m += kRowsM) {
        const X8Acts* a[kRowsM];
        const PairActs* pa[kRowsM];
        float* yp[kRowsM];
        for (int i = 0; i < kRowsM; ++i)
          a[i] = S.a.data() + size_t(m + i) * C, pa[i] = S.p.data() + size_t(m + i) * P, yp[i] = yc + size_t(m + i) * ldy;
        row_tile<kRowsM>(cr, sr, mr, C, T, a, pa, yp);
      }
      for (; m < mb; ++m) {
        const X8Acts* a[1] = {S.a.data() + size_t(m) * C};
        const PairActs* pa[1] = {S.p.data() + size_t(m) * P};
        float* yp[1] = {yc + size_t(m) * ldy};
        row_tile<1>(cr, sr, mr, C, T, a, pa, yp);
      }
    }
  }
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
