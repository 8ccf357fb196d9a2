// gemm_repack_avx512.cpp — NVFP4 in the Nvfp4X4 layout (kernels.h) on AVX-512 (F/BW/VL) +
// VNNI (compiled with the AVX-512 flags; reached only through the AVX-512 KernelSet, whose
// cpuid check includes AVX2/FMA/F16C).
//
// The scheme of gemm_repack_avx2.cpp with one 64-byte load per row and chunk ([part 0 |
// part 1], both halves' lane j = 16-block j): two vpdpbusd (u8 x s8 -> int32) over the even
// and odd elements, the two 256-bit halves added, then the same 8-lane float step (offset
// correction, E4M3 scales by f16 bit placement, FMA). Tails use 256-bit vpdpbusd (AVX512VL).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_repack.h"
#include "kernels/cpu/kernels_impl.h"

// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own "undefined" vectors.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kRowsM = 8;              // GEMM tile: 1 weight row x 8 activation rows (of 32 registers)
constexpr int kL1ActBytes = 24 << 10;  // packed activation rows per block (L1 is 32-48 KiB)
constexpr int kPrefetchBytes = 4096;   // GEMV software prefetch distance in the group stream

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 16-entry u table (a function, not a global: a global would be built with AVX-512
// instructions at library load, on any CPU).
inline __m128i lut16() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }

// Eight E4M3 magnitudes (bytes, lane order) -> f32 value * 2^-8 (see gemm_repack_avx2.cpp).
inline __m256 chunk_scales(__m128i bytes) {
  return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 7));
}

// One decoded weight chunk: u = 2*e2m1 + 12 of the even (lo) and odd (hi) elements, both parts.
struct WChunk {
  __m512i lo, hi;
  __m256 ws;
};

inline WChunk decode_chunk(const uint8_t* codes, __m256 ws) {
  const __m512i nib = _mm512_set1_epi8(0x0F), lut = _mm512_broadcast_i32x4(lut16());
  const __m512i c = _mm512_loadu_si512(codes);
  return WChunk{_mm512_shuffle_epi8(lut, _mm512_and_si512(c, nib)),
                _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(c, 4), nib)), ws};
}

// acc += (int32 chunk dot + correction) * (ws * d_a), one activation row.
inline void chunk_step(const WChunk& w, const X4Acts* a, __m256& acc) {
  __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.lo, _mm512_load_si512(a->e));
  s = _mm512_dpbusd_epi32(s, w.hi, _mm512_load_si512(a->o));
  const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1)),
                                      _mm256_load_si256(reinterpret_cast<const __m256i*>(a->corr)));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(w.ws, _mm256_load_ps(a->d)), acc);
}

// A tail vector (32 code bytes in stored order, part-0 activations of a), 256-bit VNNI.
inline void half_step(__m256i codes, __m256 ws, const X4Acts* a, __m256& acc) {
  const __m256i nib = _mm256_set1_epi8(0x0F), lut = _mm256_broadcastsi128_si256(lut16());
  const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(codes, nib));
  const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(codes, 4), nib));
  __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(a->corr));
  s = _mm256_dpbusd_epi32(s, lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(a->e[0])));
  s = _mm256_dpbusd_epi32(s, hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(a->o[0])));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(ws, _mm256_load_ps(a->d)), acc);
}

// The tail chunk of one row against RM activation rows (a[m]: the row's first tail pack).
template <int RM>
inline void tail_steps(const uint8_t* codes, const uint8_t* scales, int t, const X4Acts* const (&a)[RM],
                       __m256 (&acc)[RM]) {
  const __m128i raw = _mm_cvtsi64_si128(int64_t(x4_tail_scale_bytes(scales, t)));
  auto spread = [&](int v) {
    return chunk_scales(_mm_shuffle_epi8(raw, _mm_load_si128(reinterpret_cast<const __m128i*>(kX4TailSpread[t - 1][v]))));
  };
  const __m256i c0 = t == 1 ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)))
                            : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  const __m256 ws0 = spread(0);
  for (int m = 0; m < RM; ++m) half_step(c0, ws0, a[m], acc[m]);
  if (t == 3) {
    const __m256i c1 = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 32)));
    const __m256 ws1 = spread(1);
    for (int m = 0; m < RM; ++m) half_step(c1, ws1, a[m] + 1, acc[m]);
  }
}

// y[m] for one weight row x RM activation rows (a[m]: the row's chunk 0).
template <int RM>
void row_tile(const X4Row& w, const X4Geom& geo, const X4Acts* const (&a)[RM], float out_scale,
              float* const (&y)[RM] /*offset to column n*/) {
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  const uint8_t* cp = w.codes;
  const uint8_t* sp = w.scales;
  for (int c = 0; c < geo.C; ++c, cp += w.cstride, sp += w.sstride) {
    const WChunk wc = decode_chunk(cp, chunk_scales(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp))));
    for (int m = 0; m < RM; ++m) chunk_step(wc, a[m] + c, acc[m]);
  }
  if (geo.t > 0) {
    const X4Acts* at[RM];
    for (int m = 0; m < RM; ++m) at[m] = a[m] + geo.C;
    tail_steps<RM>(w.tcodes, w.tscales, geo.t, at, acc);
  }
  for (int m = 0; m < RM; ++m) *y[m] = hsum256(acc[m]) * out_scale;
}

// Decode: the 4 rows of a whole group against one activation row; y[0..3].
void group_gemv(const uint8_t* gc, const uint8_t* gs, const X4Geom& geo, const X4Acts* a, float out_scale,
                float* y) {
  __m256 acc[kX4Rows];
  for (int r = 0; r < kX4Rows; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* cp = gc;
  const uint8_t* sp = gs;
  for (int c = 0; c < geo.C; ++c, cp += kX4Rows * kX4ChunkBytes, sp += kX4Rows * 8) {
    for (int r = 0; r < kX4Rows; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes + r * kX4ChunkBytes), _MM_HINT_T0);
      const WChunk wc = decode_chunk(cp + r * kX4ChunkBytes,
                                     chunk_scales(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp + 8 * r))));
      chunk_step(wc, a + c, acc[r]);
    }
  }
  if (geo.t > 0) {
    const X4Acts* at[1] = {a + geo.C};
    for (int r = 0; r < kX4Rows; ++r) {
      __m256 one[1] = {acc[r]};
      tail_steps<1>(cp + r * 16 * geo.t, sp + r * 2 * geo.t, geo.t, at, one);
      acc[r] = one[0];
    }
  }
  for (int r = 0; r < kX4Rows; ++r) y[r] = hsum256(acc[r]) * out_scale;
}

void row_vs_block(const X4Row& r, const X4Geom& geo, const X4Acts* A, int npk, int mb, float out_scale,
                  float* y /*column n of block row 0*/, int ldy) {
  int m = 0;
  for (; m + kRowsM <= mb; m += kRowsM) {
    const X4Acts* a[kRowsM];
    float* yp[kRowsM];
    for (int i = 0; i < kRowsM; ++i) a[i] = A + size_t(m + i) * npk, yp[i] = y + size_t(m + i) * ldy;
    row_tile<kRowsM>(r, geo, a, out_scale, yp);
  }
  for (; m < mb; ++m) {
    const X4Acts* a[1] = {A + size_t(m) * npk};
    float* yp[1] = {y + size_t(m) * ldy};
    row_tile<1>(r, geo, a, out_scale, yp);
  }
}

std::vector<X4Acts>& scratch() {
  thread_local std::vector<X4Acts> s;
  return s;
}

}  // namespace

void gemm_nvfp4_x4_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const X4Geom geo(w.Kp);
  const int npk = x4_packed_chunks(geo);
  const int per_row = npk * int(sizeof(X4Acts));
  const int mblock = M == 1 ? 1 : std::max(kRowsM, kL1ActBytes / per_row / kRowsM * kRowsM);
  std::vector<X4Acts>& S = scratch();
  S.resize(size_t(std::min(M, mblock)) * npk);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  for (int m0 = 0; m0 < M; m0 += mblock) {
    const int mb = std::min(mblock, M - m0);
    pack_acts_x4(xq, geo, m0, mb, S.data());
    const X4Acts* A = S.data();
    float* yb = y + size_t(m0) * ldy;
    int n = n0;
    while (n < n1) {
      const bool whole = n % kX4Rows == 0 && n + kX4Rows <= n1 && x4_group_rows(w.N, n) == kX4Rows;
      if (mb == 1 && whole) {
        group_gemv(codes + size_t(n) * (w.Kp / 2), scales + size_t(n) * (w.Kp / kNvfp4Block), geo, A, w.tscale,
                   yb + n);
        n += kX4Rows;
      } else {
        row_vs_block(x4_row(w, n), geo, A, npk, mb, w.tscale, yb + n, ldy);
        ++n;
      }
    }
  }
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
