// gemm_repack_avx512.cpp — NVFP4 in the Nvfp4X4 layout (kernels.h) on AVX-512 BW + VNNI
// (compiled with -mavx512*; reached only through the AVX-512 KernelSet, dispatch.cpp).
//
// Two full chunks (c, c+1: 256 values of K, sixteen 16-blocks) per step. A row's chunk is
// [part 0 | part 1] (32 bytes each, int32 lane j of a part = 16-block j, gemm_repack.h); one
// lane shuffle per vector turns the two 64-byte chunk loads into
//   W0 = [part 0 of c | part 0 of c+1],  W1 = [part 1 of c | part 1 of c+1],
// so int32 lane L of both is 16-block L % 8 of chunk c + L / 8: sixteen distinct 16-blocks.
// Per step and (weight row, activation row): four vpdpbusd (u = 2*e2m1 + 12 in [0, 24] from a
// vpshufb table, u8 x s8 -> int32, exact) onto the offset correction (-12 * the 16-block's
// activation sum), then one convert, one scale product and one FMA for 256 values (the AVX2
// reader: 4 maddubs + madd + add + the float step per 128). Scales: the E4M3 magnitude bits
// << 7 read as f16 (value * 2^-8, exact; the sign was folded into the codes at repack), the
// 2^8 and the 1/2 of 2*e2m1 in the packed d_a * 128, as in gemm_repack_avx2.cpp.
// An odd last full chunk runs as a pair with zeros; the tail chunk (1-3 32-blocks, 16t code
// bytes in stored order) is one 16-lane step on plain loads.
// Decode (M = 1): the 4 rows of a group (one stream). Prefill: one weight row x kRowsM
// activation rows (the decode of a weight step is shared by kRowsM rows; 8 accumulators and
// the row's 5 weight vectors fit the 32 zmm), over activation blocks sized to stay in L1.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_repack.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx512.h"

// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own "undefined" vectors.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kRowsM = 8;              // GEMM tile: 1 weight row x 8 activation rows (remainder: 4, then 1)
constexpr int kL1ActBytes = 32 << 10;  // packed activation rows per block: this many bytes (L1d 48 KiB)
constexpr int kPrefetchBytes = 4096;   // GEMV software prefetch distance in the group stream

// Chunks c, c+1 of one activation row (c+1 zero for an odd last chunk), matching W0 / W1:
// lane L = 16-block j = L % 8 of chunk c + L / 8. The tail slot uses e0 / o0 only, in the
// tail's stored lane order (gemm_repack.h: lane L = part L / 2t of 16-block L % 2t).
struct alignas(64) PairActs {
  int8_t e0[64];     // lane L, bytes 4L+i: q[16j + 2i]      (part 0, even elements)
  int8_t e1[64];     //                     q[16j + 8 + 2i]  (part 1, even)
  int8_t o0[64];     //                     q[16j + 2i + 1]  (part 0, odd)
  int8_t o1[64];     //                     q[16j + 8 + 2i + 1]
  int32_t corr[16];  // lane L: -12 * the 16-block's activation sum (tail: part-0 lanes only)
  float d[16];       // lane L: d_a of the 32-block holding the 16-block, * 128
};

struct PairGeom {
  int pairs;  // full pairs: C / 2
  bool odd;   // C odd: one more slot, chunk C-1 and zeros
  int t;      // tail 32-blocks (X4Geom::t): one more slot when > 0
  explicit PairGeom(const X4Geom& g) : pairs(g.C / 2), odd(g.C % 2 != 0), t(g.t) {}
  int slots() const { return pairs + odd + (t > 0); }
};

// Rows [m0, m0 + mb) of xq -> out [mb, slots].
void pack_pairs(const ActQ8& xq, const X4Geom& geo, int m0, int mb, PairActs* out) {
  static_assert(offsetof(PairActs, e1) == 64 && offsetof(PairActs, o0) == 128 && offsetof(PairActs, o1) == 192,
                "e0, e1, o0, o1 back to back");
  const PairGeom pg(geo);
  const int Kp = xq.Kp, nb = Kp / kQ8Block, ns = pg.slots();
  // block bytes -> [e part 0 | e part 1 | o part 0 | o part 1], 4 bytes each
  const __m128i spread = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i bias = _mm_set1_epi8(char(0x80));
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int8_t* q = xq.q + size_t(m) * Kp;  // [Kp]
    const float* dm = xq.d + size_t(m) * nb;  // [nb]
    PairActs* row = out + size_t(mi) * ns;
    auto block_sum = [&](int jb) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * jb));
      const __m128i s = _mm_sad_epu8(_mm_xor_si128(v, bias), _mm_setzero_si128());
      return _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128;
    };
    if (pg.odd) std::memset(&row[pg.pairs], 0, sizeof(PairActs));
    for (int c = 0; c < geo.C; ++c) {
      PairActs& pk = row[c / 2];
      auto* base = reinterpret_cast<uint8_t*>(&pk);
      for (int j = 0; j < 8; ++j) {
        const int jb = 8 * c + j, L = 8 * (c % 2) + j;
        const __m128i p = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * jb)), spread);
        const int32_t dw[4] = {_mm_cvtsi128_si32(p), _mm_extract_epi32(p, 1), _mm_extract_epi32(p, 2),
                               _mm_extract_epi32(p, 3)};
        for (int h = 0; h < 4; ++h) std::memcpy(base + 64 * h + 4 * L, &dw[h], 4);
        pk.corr[L] = -kNvfp4Offset * block_sum(jb);
        pk.d[L] = dm[jb / 2] * 128.0f;
      }
    }
    if (pg.t > 0) {
      PairActs& pk = row[ns - 1];
      std::memset(&pk, 0, sizeof(PairActs));
      const int nt = 2 * pg.t;
      for (int L = 0; L < 2 * nt; ++L) {  // tail lanes in stored order
        const int h = L / nt, j = L % nt, jb = 8 * geo.C + j;
        const int8_t* qb = q + 16 * jb + 8 * h;  // [8]
        for (int i = 0; i < 4; ++i) pk.e0[4 * L + i] = qb[2 * i], pk.o0[4 * L + i] = qb[2 * i + 1];
        pk.corr[L] = h == 0 ? -kNvfp4Offset * block_sum(jb) : 0;
        pk.d[L] = dm[jb / 2] * 128.0f;
      }
    }
  }
}

// u = 2*e2m1 + 12 of 128 codes: lo = even elements, hi = odd.
inline void decode(__m512i c, __m512i& lo, __m512i& hi) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(c, nib));
  hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(c, 4), nib));
}

// Sixteen E4M3 magnitudes (bytes, lane order) -> f32 value * 2^-8.
inline __m512 scales16(__m128i bytes) {
  return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 7));
}

// One decoded weight step: u of W0 (even, odd) and W1 (even, odd), and the lane scales.
struct WStep {
  __m512i u[4];
  __m512 ws;
};

// Chunks at c0 and c1 (c1 null: zeros), scales at s0 / s1 (8 bytes each).
inline WStep load_pair(const uint8_t* c0, const uint8_t* c1, const uint8_t* s0, const uint8_t* s1) {
  const __m512i a = _mm512_loadu_si512(c0);
  const __m512i b = c1 ? _mm512_loadu_si512(c1) : _mm512_setzero_si512();
  WStep w;
  decode(_mm512_shuffle_i64x2(a, b, 0x44), w.u[0], w.u[1]);  // [a.lo256 | b.lo256]: part 0 of c, c+1
  decode(_mm512_shuffle_i64x2(a, b, 0xEE), w.u[2], w.u[3]);  // part 1
  const __m128i sb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s0));
  w.ws = scales16(s1 ? _mm_unpacklo_epi64(sb, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s1))) : sb);
  return w;
}

// Scale byte per lane of the tail step (-1: zero), per t = 1..3.
alignas(16) const int8_t kTailSpread[3][16] = {{0, 1, 0, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
                                               {0, 1, 2, 3, 0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1},
                                               {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, -1, -1, -1, -1}};

// The tail chunk: its 16t code bytes in plain loads (no over-read), lanes in stored order.
inline WStep load_tail(const uint8_t* codes, const uint8_t* scales, int t) {
  __m512i c;
  if (t == 1)
    c = _mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  else if (t == 2)
    c = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
  else
    c = _mm512_inserti32x4(_mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes))),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 32)), 2);
  WStep w;
  decode(c, w.u[0], w.u[1]);
  w.u[2] = w.u[3] = _mm512_setzero_si512();
  const __m128i raw = _mm_cvtsi64_si128(int64_t(x4_tail_scale_bytes(scales, t)));
  w.ws = scales16(_mm_shuffle_epi8(raw, _mm_load_si128(reinterpret_cast<const __m128i*>(kTailSpread[t - 1]))));
  return w;
}

// acc += (int32 dot + correction) * (ws * d_a) for one activation row; kTail: e0 / o0 only.
template <bool kTail = false>
inline void step(const WStep& w, const PairActs* a, __m512& acc) {
  auto ld = [](const int8_t* p) { return _mm512_load_si512(p); };
  __m512i s = _mm512_load_si512(a->corr);
  s = _mm512_dpbusd_epi32(s, w.u[0], ld(a->e0));
  s = _mm512_dpbusd_epi32(s, w.u[1], ld(a->o0));
  if (!kTail) {
    s = _mm512_dpbusd_epi32(s, w.u[2], ld(a->e1));
    s = _mm512_dpbusd_epi32(s, w.u[3], ld(a->o1));
  }
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w.ws, _mm512_load_ps(a->d)), acc);
}

// y[m] for one weight row x RM activation rows (a[m]: the row's slot 0) over the row.
template <int RM>
void row_tile(const X4Row& w, const X4Geom& geo, const PairActs* const (&a)[RM], float out_scale,
              float* const (&y)[RM] /*offset to column n*/) {
  const PairGeom pg(geo);
  __m512 acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = _mm512_setzero_ps();
  const uint8_t* cp = w.codes;
  const uint8_t* sp = w.scales;
  for (int p = 0; p < pg.pairs; ++p, cp += 2 * w.cstride, sp += 2 * w.sstride) {
    const WStep ws = load_pair(cp, cp + w.cstride, sp, sp + w.sstride);
    for (int m = 0; m < RM; ++m) step(ws, a[m] + p, acc[m]);
  }
  if (pg.odd) {
    const WStep ws = load_pair(cp, nullptr, sp, nullptr);
    for (int m = 0; m < RM; ++m) step(ws, a[m] + pg.pairs, acc[m]);
  }
  if (pg.t > 0) {
    const WStep ws = load_tail(w.tcodes, w.tscales, pg.t);
    for (int m = 0; m < RM; ++m) step<true>(ws, a[m] + pg.slots() - 1, acc[m]);
  }
  store_sums<RM>(acc, out_scale, y);
}

// Decode: the 4 rows of a whole group (one stream: 256 code + 32 scale bytes per chunk)
// against one activation row; y[0..3].
void group_gemv(const uint8_t* gc, const uint8_t* gs, const X4Geom& geo, const PairActs* a, float out_scale,
                float* y) {
  const PairGeom pg(geo);
  constexpr size_t kCS = kX4Rows * kX4ChunkBytes, kSS = kX4Rows * 8;  // group chunk strides
  __m512 acc[kX4Rows];
  for (int r = 0; r < kX4Rows; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* cp = gc;
  const uint8_t* sp = gs;
  for (int p = 0; p < pg.pairs; ++p, cp += 2 * kCS, sp += 2 * kSS) {
    for (int l = 0; l < 8; ++l) _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes + 64 * l), _MM_HINT_T0);
    for (int r = 0; r < kX4Rows; ++r) {
      const WStep ws = load_pair(cp + r * kX4ChunkBytes, cp + kCS + r * kX4ChunkBytes, sp + 8 * r, sp + kSS + 8 * r);
      step(ws, a + p, acc[r]);
    }
  }
  if (pg.odd)
    for (int r = 0; r < kX4Rows; ++r) {
      const WStep ws = load_pair(cp + r * kX4ChunkBytes, nullptr, sp + 8 * r, nullptr);
      step(ws, a + pg.pairs, acc[r]);
    }
  if (pg.t > 0) {
    cp += pg.odd * kCS, sp += pg.odd * kSS;  // the tail chunk of the group
    for (int r = 0; r < kX4Rows; ++r) {
      const WStep ws = load_tail(cp + r * 16 * pg.t, sp + r * 2 * pg.t, pg.t);
      step<true>(ws, a + pg.slots() - 1, acc[r]);
    }
  }
  float* const yp[4] = {y, y + 1, y + 2, y + 3};
  store_sum4(acc, out_scale, yp);
}

// One weight row against activation rows [0, mb) of a packed block: kRowsM, then 4, then 1.
void row_vs_block(const X4Row& r, const X4Geom& geo, const PairActs* A, int ns, int mb, float out_scale,
                  float* y /*column n of block row 0*/, int ldy) {
  int m = 0;
  auto tile = [&](auto rm_tag) {
    constexpr int RM = decltype(rm_tag)::value;
    for (; m + RM <= mb; m += RM) {
      const PairActs* a[RM];
      float* yp[RM];
      for (int i = 0; i < RM; ++i) a[i] = A + size_t(m + i) * ns, yp[i] = y + size_t(m + i) * ldy;
      row_tile<RM>(r, geo, a, out_scale, yp);
    }
  };
  tile(std::integral_constant<int, kRowsM>{});
  tile(std::integral_constant<int, 4>{});
  tile(std::integral_constant<int, 1>{});
}

std::vector<PairActs>& scratch() {
  thread_local std::vector<PairActs> s;
  return s;
}

}  // namespace

void gemm_nvfp4_x4_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const X4Geom geo(w.Kp);
  const int ns = PairGeom(geo).slots();
  // Activation rows per block: their packed slots stay in L1 while every weight row passes.
  const int per_row = ns * int(sizeof(PairActs));
  const int mblock = M == 1 ? 1 : std::max(kRowsM, kL1ActBytes / per_row / kRowsM * kRowsM);
  std::vector<PairActs>& S = scratch();
  S.resize(size_t(std::min(M, mblock)) * ns);
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  for (int m0 = 0; m0 < M; m0 += mblock) {
    const int mb = std::min(mblock, M - m0);
    pack_pairs(xq, geo, m0, mb, S.data());
    const PairActs* A = S.data();
    float* yb = y + size_t(m0) * ldy;
    int n = n0;
    while (n < n1) {
      const bool whole = n % kX4Rows == 0 && n + kX4Rows <= n1 && x4_group_rows(w.N, n) == kX4Rows;
      if (mb == 1 && whole) {  // decode: the group's 4 rows share each activation load
        group_gemv(codes + size_t(n) * (w.Kp / 2), scales + size_t(n) * (w.Kp / kNvfp4Block), geo, A, w.tscale,
                   yb + n);
        n += kX4Rows;
      } else {
        row_vs_block(x4_row(w, n), geo, A, ns, mb, w.tscale, yb + n, ldy);
        ++n;
      }
    }
  }
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
