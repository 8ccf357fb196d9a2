// gemm_repack_avx2.cpp — NVFP4 in the Nvfp4X4 layout (kernels.h) on AVX2 + FMA + F16C
// (compiled with -mavx2 -mfma -mf16c; reached only through the AVX2 KernelSet).
//
// One chunk = 128 values of K = eight 16-blocks; a row's chunk is two 32-byte loads (parts),
// and int32 lane j of either part belongs to 16-block j, so per chunk and row:
//   * codes -> u = 2*e2m1 + 12 in [0, 24] (a vpshufb table), low nibbles = even elements;
//   * four maddubs (u8 x s8) summed in int16: |u| <= 24, |a| <= 127 -> 4 * 2*24*127 = 24384,
//     below 32767 (each maddubs pair sum is at most 6096: no saturation), one madd to int32;
//   * + the offset correction (-12 * the 16-block's activation sum, precomputed per lane);
//   * the eight E4M3 scales in lane order: magnitude bits << 7 read as f16 is the value
//     * 2^-8, exactly (normals and subnormals; the sign was moved into the codes at repack);
//     the 2^8 (and the 1/2 of 2*e2m1) go into the packed activation scale: d_a * 128.
// So the float work (convert, scale, FMA) is one 8-lane step per 128 values, not per 64.
// Decode (M = 1): the 4 rows of a group (one contiguous stream). Prefill: one weight row x
// kRowsM activation rows in registers, over activation blocks sized to stay in L1.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_repack.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kRowsM = 4;             // GEMM tile: 1 weight row x 4 activation rows (5 or 6 spill accumulators: 16 ymm)
constexpr int kL1ActBytes = 20 << 10;  // packed activation rows per block: this many bytes (L1 is 32 KiB)
constexpr int kPrefetchBytes = 4096;  // GEMV software prefetch distance in the group stream

// u = 2*e2m1 + 12 of the 64 codes in a part: lo = even elements, hi = odd.
inline void decode_part(__m256i c, __m256i& lo, __m256i& hi) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                       12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(c, nib));
  hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(c, 4), nib));
}

// Eight E4M3 magnitudes (bytes, lane order) -> f32 value * 2^-8.
inline __m256 chunk_scales(__m128i bytes) {
  return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 7));
}

// One decoded weight chunk: the four u vectors and the lane scales.
struct WChunk {
  __m256i lo0, hi0, lo1, hi1;
  __m256 ws;
};

inline WChunk load_chunk(const uint8_t* codes, const uint8_t* scales) {
  WChunk w;
  decode_part(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)), w.lo0, w.hi0);
  decode_part(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32)), w.lo1, w.hi1);
  w.ws = chunk_scales(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
  return w;
}

// acc += (int32 chunk dot + correction) * (ws * d_a), one activation row.
inline void chunk_step(const WChunk& w, const X4Acts* a, __m256& acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  auto ld = [](const int8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); };
  const __m256i s16 = _mm256_add_epi16(
      _mm256_add_epi16(_mm256_maddubs_epi16(w.lo0, ld(a->e[0])), _mm256_maddubs_epi16(w.hi0, ld(a->o[0]))),
      _mm256_add_epi16(_mm256_maddubs_epi16(w.lo1, ld(a->e[1])), _mm256_maddubs_epi16(w.hi1, ld(a->o[1]))));
  const __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(s16, ones),
                                       _mm256_load_si256(reinterpret_cast<const __m256i*>(a->corr)));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(w.ws, _mm256_load_ps(a->d)), acc);
}

// acc += (int32 dot of one code vector + correction) * (ws * d_a): a tail vector (part 0 only).
inline void half_step(__m256i codes, __m256 ws, const X4Acts* a, __m256& acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo, hi;
  decode_part(codes, lo, hi);
  const __m256i s16 = _mm256_add_epi16(
      _mm256_maddubs_epi16(lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(a->e[0]))),
      _mm256_maddubs_epi16(hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(a->o[0]))));
  const __m256i s32 = _mm256_add_epi32(_mm256_madd_epi16(s16, ones),
                                       _mm256_load_si256(reinterpret_cast<const __m256i*>(a->corr)));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(ws, _mm256_load_ps(a->d)), acc);
}

// The tail chunk of one row against RM activation rows (a[m]: the row's first tail pack):
// its 16t code bytes in one or two plain loads (no over-read), the scales spread to the lanes
// of the stored order (X4Acts) with a byte shuffle.
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

// *y[m] = hsum(acc[m]) * scale for four accumulators at once: the same additions in the same
// order as hsum (halves, then lanes (0,2) and (1,3), then those two), so bit for bit what four
// hsum calls give (a row of a prefill tile == the same row through the M % 4 or decode path),
// in 11 vector instructions instead of 24.
inline void store_hsum4(const __m256 (&acc)[4], float scale, float* const (&y)[4]) {
  // [b0 | b1] and [b2 | b3]: b_m lane i = acc[m] lane i + lane i + 4
  const __m256 c01 = _mm256_add_ps(_mm256_permute2f128_ps(acc[0], acc[1], 0x20), _mm256_permute2f128_ps(acc[0], acc[1], 0x31));
  const __m256 c23 = _mm256_add_ps(_mm256_permute2f128_ps(acc[2], acc[3], 0x20), _mm256_permute2f128_ps(acc[2], acc[3], 0x31));
  // per half: [b0 02, b2 02, b0 13, b2 13 | b1 02, b3 02, b1 13, b3 13] (02: lane 0 + lane 2)
  const __m256 x = _mm256_add_ps(_mm256_unpacklo_ps(c01, c23), _mm256_unpackhi_ps(c01, c23));
  // lanes 0, 1 | 4, 5: rows 0, 2 | 1, 3
  const __m256 t = _mm256_mul_ps(_mm256_add_ps(x, _mm256_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2))), _mm256_set1_ps(scale));
  const __m128 lo = _mm256_castps256_ps128(t), hi = _mm256_extractf128_ps(t, 1);
  _mm_store_ss(y[0], lo);
  _mm_store_ss(y[2], _mm_movehdup_ps(lo));
  _mm_store_ss(y[1], hi);
  _mm_store_ss(y[3], _mm_movehdup_ps(hi));
}

// y[m] for one weight row x RM activation rows (a[m]: the row's chunk 0) over the row.
template <int RM>
void row_tile(const X4Row& w, const X4Geom& geo, const X4Acts* const (&a)[RM], float out_scale,
              float* const (&y)[RM] /*offset to column n*/) {
  __m256 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm256_setzero_ps();
  const uint8_t* cp = w.codes;
  const uint8_t* sp = w.scales;
  for (int c = 0; c < geo.C; ++c, cp += w.cstride, sp += w.sstride) {
    const WChunk wc = load_chunk(cp, sp);
    for (int m = 0; m < RM; ++m) chunk_step(wc, a[m] + c, acc[m]);
  }
  if (geo.t > 0) {
    const X4Acts* at[RM];
    for (int m = 0; m < RM; ++m) at[m] = a[m] + geo.C;
    tail_steps<RM>(w.tcodes, w.tscales, geo.t, at, acc);
  }
  if constexpr (RM == 4) {
    store_hsum4(acc, out_scale, y);
  } else {
    for (int m = 0; m < RM; ++m) *y[m] = hsum(acc[m]) * out_scale;
  }
}

// Decode: the 4 rows of a whole group (one stream: 256 code + 32 scale bytes per chunk)
// against one activation row; y[0..3].
void group_gemv(const uint8_t* gc, const uint8_t* gs, const X4Geom& geo, const X4Acts* a, float out_scale,
                float* y) {
  __m256 acc[kX4Rows];
  for (int r = 0; r < kX4Rows; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* cp = gc;
  const uint8_t* sp = gs;
  for (int c = 0; c < geo.C; ++c, cp += kX4Rows * kX4ChunkBytes, sp += kX4Rows * 8) {
    for (int r = 0; r < kX4Rows; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes + r * kX4ChunkBytes), _MM_HINT_T0);
    // scales of rows (0,1) and (2,3): one widening + shift per pair of rows
    __m256 ws[kX4Rows];
    for (int p = 0; p < 2; ++p) {
      const __m256i h16 = _mm256_slli_epi16(
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 16 * p))), 7);
      ws[2 * p] = _mm256_cvtph_ps(_mm256_castsi256_si128(h16));
      ws[2 * p + 1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h16, 1));
    }
    for (int r = 0; r < kX4Rows; ++r) {
      WChunk wc;
      decode_part(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp + r * kX4ChunkBytes)), wc.lo0, wc.hi0);
      decode_part(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp + r * kX4ChunkBytes + 32)), wc.lo1, wc.hi1);
      wc.ws = ws[r];
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
  for (int r = 0; r < kX4Rows; ++r) y[r] = hsum(acc[r]) * out_scale;
}

// One weight row against activation rows [0, mb) of a packed block, kRowsM at a time.
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

// Rows [m0, m0 + mb) of xq -> out [mb, x4_packed_chunks] (gemm_repack.h). A full chunk's
// 16-block j is one 16-byte load: a byte shuffle gives its four code-part dwords
// (e[0], e[1], o[0], o[1] lane j), stored as four dwords; its sum is a psadbw of the bytes
// + 128 (the 16 * 128 taken off again). The tail chunk's lanes go one by one (at most 12).
void pack_acts_x4(const ActQ8& xq, const X4Geom& geo, int m0, int mb, X4Acts* out /*[mb, packed]*/) {
  static_assert(offsetof(X4Acts, e) == 0 && offsetof(X4Acts, o) == 64, "e[0], e[1], o[0], o[1] back to back");
  const int Kp = xq.Kp, nb = Kp / kQ8Block, npk = x4_packed_chunks(geo);
  // block bytes -> [e part 0 | e part 1 | o part 0 | o part 1], 4 bytes each
  const __m128i spread = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i bias = _mm_set1_epi8(char(0x80));
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int8_t* q = xq.q + size_t(m) * Kp;  // [Kp]
    const float* dm = xq.d + size_t(m) * nb;  // [nb]
    X4Acts* row = out + size_t(mi) * npk;
    auto block_sum = [&](int jb) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * jb));
      const __m128i s = _mm_sad_epu8(_mm_xor_si128(v, bias), _mm_setzero_si128());
      return _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128;
    };
    for (int c = 0; c < geo.C; ++c) {
      X4Acts& pk = row[c];
      auto* e = reinterpret_cast<uint8_t*>(&pk);  // e[0], e[1], then o[0], o[1] (32 bytes each)
      for (int j = 0; j < 8; ++j) {
        const int jb = 8 * c + j;
        const __m128i p = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * jb)), spread);
        const int32_t dw[4] = {_mm_cvtsi128_si32(p), _mm_extract_epi32(p, 1), _mm_extract_epi32(p, 2),
                               _mm_extract_epi32(p, 3)};
        for (int h = 0; h < 4; ++h) std::memcpy(e + 32 * h + 4 * j, &dw[h], 4);
        pk.corr[j] = -kNvfp4Offset * block_sum(jb);
        pk.d[j] = dm[jb / 2] * 128.0f;
      }
    }
    const int nt = 2 * geo.t;
    if (nt > 0) std::memset(row + geo.C, 0, sizeof(X4Acts) * (npk - geo.C));
    for (int L = 0; L < 2 * nt; ++L) {  // tail lanes in stored order
      X4Acts& pk = row[geo.C + L / 8];
      const int l = L % 8, h = L / nt, j = L % nt, jb = 8 * geo.C + j;
      const int8_t* qb = q + 16 * jb + 8 * h;  // [8]
      for (int i = 0; i < 4; ++i) pk.e[0][4 * l + i] = qb[2 * i], pk.o[0][4 * l + i] = qb[2 * i + 1];
      pk.corr[l] = h == 0 ? -kNvfp4Offset * block_sum(jb) : 0;
      pk.d[l] = dm[jb / 2] * 128.0f;
    }
  }
}

void gemm_nvfp4_x4_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const X4Geom geo(w.Kp);
  const int npk = x4_packed_chunks(geo);
  // Activation rows per block: their packed chunks stay in L1 while every weight row passes.
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
      if (mb == 1 && whole) {  // decode: the group's 4 rows share each activation load
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
