// gemm_avx2.cpp — AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; only
// reached when cpuid reports them, see dispatch.cpp).
//
// Quantised formats (W4A8, NVFP4) run on u8 x s8 integer dot products (maddubs + madd):
//   * weights become unsigned: W4A8 nibble (q+8) as is; NVFP4 via a 16-entry vpshufb table
//     to u = 2*e2m1 + 12 in [0, 24]. The offsets are undone exactly in int32 with the
//     activation block sums (a per-lane correction precomputed in the packed activations).
//   * int16 bound: maddubs pairs |u| <= 24, |a| <= 127: 2*24*127 = 6096; the even and odd
//     halves are added in int16 (12192 < 32767), then madd with ones widens to int32.
//   * activations are repacked once per call ("PairPack") so a 32-byte load of weight codes
//     (two 32-blocks, low nibbles = even elements, high = odd) meets matching int8 vectors.
// Decode (M = 1) processes kGemvRows weight rows at once (one activation load serves all);
// prefill tiles kGemmRowsN weight rows x kGemmRowsM activation rows in registers, over
// activation blocks of kMBlock rows kept in L2. The engine's NVFP4 weights are repacked at
// load and run in gemm_repack_avx2.cpp; the NVFP4 path here reads the file layout. Dense
// formats: gemm_dense_avx2.cpp.
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
constexpr int kGemvRows = 4;   // weight rows per GEMV step (activation reuse, 4 streams)
constexpr int kGemmRowsN = 2;  // weight rows per GEMM register tile
// Activation rows per GEMM register tile (2x4 = 8 accumulators). For NVFP4 (file layout) one
// accumulator spills each pair, yet 2x3 without a spill measured 0.93-0.95x its speed at M = 64
// (2026-12-01): kept. The engine's NVFP4 runs the repacked kernel (no spill).
constexpr int kGemmRowsM = 4;
constexpr int kMBlock = 64;    // activation rows packed at once (64 x Kp x 2.5 B stays in L2)
constexpr int kPrefetchBytes = 4096;  // GEMV software prefetch distance (rows are contiguous: ~memory latency x bandwidth ahead)

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

// ============================================================================
// Activation quantisation (bit-exact with the scalar path: same float ops, RNE)
// ============================================================================

void quantize_act_q8_avx2(const float* x /*[M,K]*/, int M, int K, ActQ8& out) {
  const int Kp = out.Kp, nb = Kp / kQ8Block;
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  alignas(32) float tmp[kQ8Block];  // zero-padded copy of a partial block
  for (int m = 0; m < M; ++m) {
    const float* xr = x + size_t(m) * K;  // [K]
    int8_t* q = out.q + size_t(m) * Kp;   // [Kp]
    for (int b = 0; b < nb; ++b) {
      const int k0 = b * kQ8Block;
      __m256 v[4];
      const float am = load_block_amax(xr, k0, K, tmp, v);
      const float id = am > 0.0f ? 127.0f / am : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i qi[4];
      // clamp to +-127 only matters where 127/amax overflows (amax < ~3.7e-37, unspecified)
      const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
      for (int i = 0; i < 4; ++i)
        qi[i] = _mm256_cvtps_epi32(_mm256_max_ps(nlim, _mm256_min_ps(lim, _mm256_mul_ps(v[i], vid))));
      const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]),
                                           _mm256_add_epi32(qi[2], qi[3]));
      const __m256i q16a = _mm256_packs_epi32(qi[0], qi[1]);
      const __m256i q16b = _mm256_packs_epi32(qi[2], qi[3]);
      const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), unshuffle);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0), q8);
      out.d[size_t(m) * nb + b] = am / 127.0f;
      out.s[size_t(m) * nb + b] = hsum_epi32(s32);
    }
  }
}

namespace {

// ============================================================================
// Quantised formats: packed activations and the register-tiled integer kernel
// ============================================================================

// One activation row, two 32-blocks (b = 2p, 2p+1) = 64 values of K, laid out to meet a
// 32-byte load of weight codes [16 bytes of block b | 16 bytes of block b+1]:
struct alignas(32) PairPack {
  int8_t even[32];   // [q[b][0,2,..,30] | q[b+1][0,2,..,30]]
  int8_t odd[32];    // [q[b][1,3,..,31] | q[b+1][1,3,..,31]]
  int32_t corr[8];   // int32 lane corrections undoing the weight offset (sum over lanes = -off*s);
                     // W4A8 with mins: instead the f32 bits of d_a * s / 4 (see pack_acts)
  float d[8];        // [d_a[b] x4 | d_a[b+1] x4]
};

// After maddubs + madd, int32 lane j (0..3) of a block's 128-bit half covers elements
// 8j..8j+7 of that block (4 even + 4 odd). W4A8: each lane gets -8*s/4 = -2*s (s = 32-block
// sum). NVFP4: lanes 0,1 are 16-block 0 and lanes 2,3 16-block 1: each gets -12*s16/2.
// W4A8 with mins (GGUF Q4_1, w = scale * nibble + min): sum(w * a) = scale * sum(nibble * a)
// + min * s, so no offset correction; each lane carries d_a * s / 4 for the min's FMA.
template <bool kNvfp4, bool kMins = false>
void pack_acts(const ActQ8& xq, int m0, int mb, int P, PairPack* out /*[mb, P]*/) {
  const int Kp = xq.Kp, nb = Kp / kQ8Block;
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int8_t* q = xq.q + size_t(m) * Kp;  // [Kp]
    for (int p = 0; p < P; ++p) {
      PairPack& pk = out[size_t(mi) * P + p];
      for (int h = 0; h < 2; ++h) {
        const int b = 2 * p + h;
        if (b >= nb) {  // odd block count: zero second half
          std::memset(pk.even + 16 * h, 0, 16);
          std::memset(pk.odd + 16 * h, 0, 16);
          for (int j = 0; j < 4; ++j) pk.corr[4 * h + j] = 0, pk.d[4 * h + j] = 0.0f;
          continue;
        }
        const int8_t* qb = q + b * kQ8Block;  // [32]
        for (int i = 0; i < 16; ++i) pk.even[16 * h + i] = qb[2 * i], pk.odd[16 * h + i] = qb[2 * i + 1];
        const float d = xq.d[size_t(m) * nb + b];
        if (kNvfp4) {
          int s0 = 0, s1 = 0;
          for (int i = 0; i < 16; ++i) s0 += qb[i], s1 += qb[16 + i];
          pk.corr[4 * h + 0] = pk.corr[4 * h + 1] = -kNvfp4Offset / 2 * s0;
          pk.corr[4 * h + 2] = pk.corr[4 * h + 3] = -kNvfp4Offset / 2 * s1;
        } else if (kMins) {
          const float ds = d * float(xq.s[size_t(m) * nb + b]) * 0.25f;
          for (int j = 0; j < 4; ++j) std::memcpy(&pk.corr[4 * h + j], &ds, 4);
        } else {
          const int s = xq.s[size_t(m) * nb + b];
          for (int j = 0; j < 4; ++j) pk.corr[4 * h + j] = -kW4a8Offset / 4 * s;
        }
        for (int j = 0; j < 4; ++j) pk.d[4 * h + j] = d;
      }
    }
  }
}

// A weight row of a quantised format, as the tile kernel reads it.
struct QRow {
  const uint8_t* codes;   // [Kp/2]: 32 bytes per pair of 32-blocks
  const uint8_t* scales;  // 4 bytes per pair: W4A8 2 x f16 (one per 32-block), NVFP4 4 x e4m3
  const uint8_t* mins = nullptr;  // W4A8 with mins: 4 bytes per pair, 2 x f16
};

// Unsigned 4-bit weights of one pair from 32 code bytes: lo = even elements, hi = odd.
template <bool kNvfp4>
inline void decode_pair(__m256i c, __m256i& lo, __m256i& hi) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  lo = _mm256_and_si256(c, nib);
  hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), nib);
  if (kNvfp4) {
    // u = 2*e2m1(code) + 12, replicated in both 128-bit lanes for vpshufb.
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    lo = _mm256_shuffle_epi8(lut, lo);
    hi = _mm256_shuffle_epi8(lut, hi);
  }
}

// Per-lane weight scale of one pair, from its 4 scale bytes (layout of PairPack::d).
template <bool kNvfp4>
inline __m256 pair_scale(uint32_t bits) {
  const __m128i raw = _mm_cvtsi32_si128(int(bits));
  if (kNvfp4) {
    // E4M3 -> f32 by bit placement: (e,m) moved to bit 20 reads as value * 2^-120 (normals
    // and subnormals alike); multiply by 2^119 = 2^120 * 0.5 (the 2*e2m1 of the codes).
    // Contract: scale byte 0x7F/0xFF (NaN) is not produced by the quantiser and not handled.
    const __m128i b32 = _mm_cvtepu8_epi32(raw);
    const __m128i f = _mm_or_si128(_mm_slli_epi32(_mm_and_si128(b32, _mm_set1_epi32(0x7F)), 20),
                                   _mm_slli_epi32(_mm_and_si128(b32, _mm_set1_epi32(0x80)), 24));
    const __m128 v = _mm_mul_ps(_mm_castsi128_ps(f), _mm_set1_ps(0x1p119f));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  } else {
    const __m128 v = _mm_cvtph_ps(raw);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }
}

// NVFP4 scales of one pair for 4 rows at once (the GEMV's per-pair cost is dominated by
// scale decoding: one 256-bit decode per 2 rows instead of one 128-bit decode per row).
//   sb: 4 scale bytes per row; out[n]: row n's scales in the layout of PairPack::d.
inline void nvfp4_pair_scales4(const uint32_t (&sb)[4], __m256 (&out)[4]) {
  const __m128i raw = _mm_setr_epi32(int(sb[0]), int(sb[1]), int(sb[2]), int(sb[3]));
  const __m256i idx_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const __m256i idx_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  for (int h = 0; h < 2; ++h) {  // rows 2h, 2h+1
    const __m256i b32 = _mm256_cvtepu8_epi32(h ? _mm_unpackhi_epi64(raw, raw) : raw);
    const __m256i f = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(b32, _mm256_set1_epi32(0x7F)), 20),
                                      _mm256_slli_epi32(_mm256_and_si256(b32, _mm256_set1_epi32(0x80)), 24));
    const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(f), _mm256_set1_ps(0x1p119f));  // see pair_scale
    out[2 * h] = _mm256_permutevar8x32_ps(v, idx_lo);
    out[2 * h + 1] = _mm256_permutevar8x32_ps(v, idx_hi);
  }
}

// One pair step of a RN x RM tile: acc[n][m] += (ws[n] * d_a) * float(int dot + corr)
// (with mins: + (d_a * s / 4) * min per lane, and no corr).
template <bool kNvfp4, bool kMins, int RN, int RM>
inline void tile_step(const __m256i (&c)[RN], const uint32_t (&sb)[RN], const uint32_t (&mb)[RN],
                      const PairPack* const (&a)[RM], __m256 (&acc)[RN][RM]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 ws4[4];
  if constexpr (kNvfp4 && RN == 4) nvfp4_pair_scales4(sb, ws4);
  for (int n = 0; n < RN; ++n) {
    __m256i lo, hi;
    decode_pair<kNvfp4>(c[n], lo, hi);
    __m256 ws;
    if constexpr (kNvfp4 && RN == 4)
      ws = ws4[n];
    else
      ws = pair_scale<kNvfp4>(sb[n]);
    const __m256 mv = kMins ? pair_scale<false>(mb[n]) : _mm256_setzero_ps();
    for (int m = 0; m < RM; ++m) {
      const __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[m]->even));
      const __m256i o = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[m]->odd));
      const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, e), _mm256_maddubs_epi16(hi, o));
      __m256i s32 = _mm256_madd_epi16(s16, ones);
      if (!kMins) s32 = _mm256_add_epi32(s32, _mm256_load_si256(reinterpret_cast<const __m256i*>(a[m]->corr)));
      const __m256 sc = _mm256_mul_ps(ws, _mm256_load_ps(a[m]->d));
      acc[n][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), sc, acc[n][m]);
      if (kMins)
        acc[n][m] = _mm256_fmadd_ps(_mm256_load_ps(reinterpret_cast<const float*>(a[m]->corr)), mv, acc[n][m]);
    }
  }
}

// y[m, n] for RN weight rows x RM packed activation rows, over all P pairs.
//   nb: 32-blocks per row (odd nb: the last pair reads only 16 code bytes / half its scales).
template <bool kNvfp4, bool kMins, int RN, int RM>
void q4_tile(const QRow (&w)[RN], const PairPack* const (&a0)[RM], int P, int nb, float out_scale,
             float* const (&y)[RM] /*y row pointers, already offset to column n*/) {
  __m256 acc[RN][RM];
  for (int n = 0; n < RN; ++n)
    for (int m = 0; m < RM; ++m) acc[n][m] = _mm256_setzero_ps();
  const int Pfull = nb / 2;
  const PairPack* a[RM];
  for (int m = 0; m < RM; ++m) a[m] = a0[m];
  for (int p = 0; p < Pfull; ++p) {
    __m256i c[RN];
    uint32_t sb[RN], mb[RN] = {};
    for (int n = 0; n < RN; ++n) {
      const uint8_t* cp = w[n].codes + 32 * size_t(p);
      if (kMins) std::memcpy(&mb[n], w[n].mins + 4 * size_t(p), 4);
      if (RM == 1) _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes), _MM_HINT_T0);
      c[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp));
      std::memcpy(&sb[n], w[n].scales + 4 * size_t(p), 4);
    }
    tile_step<kNvfp4, kMins, RN, RM>(c, sb, mb, a, acc);
    for (int m = 0; m < RM; ++m) ++a[m];
  }
  if (P > Pfull) {  // last single 32-block: 16 code bytes, 2 scale bytes
    __m256i c[RN];
    uint32_t sb[RN], mb[RN] = {};
    for (int n = 0; n < RN; ++n) {
      const uint8_t* cp = w[n].codes + 32 * size_t(Pfull);
      if (kMins) {
        uint16_t m2;
        std::memcpy(&m2, w[n].mins + 4 * size_t(Pfull), 2);
        mb[n] = m2;
      }
      c[n] = _mm256_inserti128_si256(_mm256_setzero_si256(),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(cp)), 0);
      uint16_t s2;
      std::memcpy(&s2, w[n].scales + 4 * size_t(Pfull), 2);
      sb[n] = s2;
    }
    tile_step<kNvfp4, kMins, RN, RM>(c, sb, mb, a, acc);
  }
  for (int n = 0; n < RN; ++n)
    for (int m = 0; m < RM; ++m) y[m][n] = hsum(acc[n][m]) * out_scale;
}

// Per-thread scratch, grown on demand.
struct Scratch {
  std::vector<PairPack> acts;      // [kMBlock, P]
  std::vector<uint16_t> wscales;   // W4A8 group != 32: per-32-block scales [RN, 2P]
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <bool kNvfp4, bool kMins = false>
void gemm_q4(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, P = (nb + 1) / 2;
  const auto* codes = static_cast<const uint8_t*>(w.data);  // [N, Kp/2]
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  const float out_scale = kNvfp4 ? w.tscale : 1.0f;
  // W4A8 with group != 32 (e.g. row-wise): expand to one f16 per 32-block, per tile row.
  const bool expand = !kNvfp4 && w.group != kQ8Block;
  const size_t row_scale_bytes = kNvfp4 ? size_t(Kp / kNvfp4Block) : size_t(Kp / w.group) * 2;
  Scratch& S = scratch();
  S.acts.resize(size_t(std::min(M, kMBlock)) * P);
  if (expand) S.wscales.assign(size_t(kGemvRows) * 2 * P, 0);

  auto row = [&](int n, int slot) -> QRow {
    QRow r{codes + size_t(n) * (Kp / 2), scales + size_t(n) * row_scale_bytes};
    if (kMins) r.mins = static_cast<const uint8_t*>(w.mins) + size_t(n) * nb * 2;  // f16 [nb] (group 32)
    if (expand) {
      const auto* s = reinterpret_cast<const uint16_t*>(r.scales);  // f16 [Kp/group]
      uint16_t* e = S.wscales.data() + size_t(slot) * 2 * P;        // f16 [2P]
      for (int b = 0; b < nb; ++b) e[b] = s[b * kQ8Block / w.group];
      r.scales = reinterpret_cast<const uint8_t*>(e);
    }
    return r;
  };

  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int mb = std::min(kMBlock, M - m0);
    pack_acts<kNvfp4, kMins>(xq, m0, mb, P, S.acts.data());
    const PairPack* A = S.acts.data();  // [mb, P]
    if (mb == 1) {  // decode GEMV: kGemvRows rows share each activation load
      int n = n0;
      for (; n + kGemvRows <= n1; n += kGemvRows) {
        QRow r[kGemvRows];
        for (int i = 0; i < kGemvRows; ++i) r[i] = row(n + i, i);
        const PairPack* a[1] = {A};
        float* yp[1] = {y + size_t(m0) * ldy + n};
        q4_tile<kNvfp4, kMins, kGemvRows, 1>(r, a, P, nb, out_scale, yp);
      }
      for (; n < n1; ++n) {
        QRow r[1] = {row(n, 0)};
        const PairPack* a[1] = {A};
        float* yp[1] = {y + size_t(m0) * ldy + n};
        q4_tile<kNvfp4, kMins, 1, 1>(r, a, P, nb, out_scale, yp);
      }
      continue;
    }
    // GEMM: weights of kGemmRowsN rows stay in L1 across the m tiles of this block.
    int n = n0;
    for (; n + kGemmRowsN <= n1; n += kGemmRowsN) {
      QRow r[kGemmRowsN];
      for (int i = 0; i < kGemmRowsN; ++i) r[i] = row(n + i, i);
      int m = 0;
      constexpr int RM = kGemmRowsM;
      for (; m + RM <= mb; m += RM) {
        const PairPack* a[RM];
        float* yp[RM];
        for (int i = 0; i < RM; ++i)
          a[i] = A + size_t(m + i) * P, yp[i] = y + size_t(m0 + m + i) * ldy + n;
        q4_tile<kNvfp4, kMins, kGemmRowsN, RM>(r, a, P, nb, out_scale, yp);
      }
      for (; m < mb; ++m) {
        const PairPack* a[1] = {A + size_t(m) * P};
        float* yp[1] = {y + size_t(m0 + m) * ldy + n};
        q4_tile<kNvfp4, kMins, kGemmRowsN, 1>(r, a, P, nb, out_scale, yp);
      }
    }
    for (; n < n1; ++n) {
      QRow r[1] = {row(n, 0)};
      for (int m = 0; m < mb; ++m) {
        const PairPack* a[1] = {A + size_t(m) * P};
        float* yp[1] = {y + size_t(m0 + m) * ldy + n};
        q4_tile<kNvfp4, kMins, 1, 1>(r, a, P, nb, out_scale, yp);
      }
    }
  }
}

void gemm_avx2(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy,
               int n0, int n1) {
  switch (w.dtype) {
    case DType::F32:
    case DType::F16: gemm_dense_avx2(w, x, M, y, ldy, n0, n1); break;
    case DType::W4A8:  // groups that are not a multiple of 32 take the scalar path
      if (w.group == kQ8Block && w.mins)  // GGUF Q4_1: the min's term fused (gemm_fuses_mins)
        gemm_q4<false, true>(w, *xq, M, y, ldy, n0, n1);
      else if (w.group % kQ8Block == 0)
        gemm_q4<false>(w, *xq, M, y, ldy, n0, n1);
      else
        scalar_kernels().gemm(w, x, xq, M, y, ldy, n0, n1);
      break;
    case DType::NVFP4: gemm_q4<true>(w, *xq, M, y, ldy, n0, n1); break;
    case DType::W8A8: gemm_w8a8_avx2(w, *xq, M, y, ldy, n0, n1); break;
  }
}

}  // namespace

const KernelSet& avx2_kernels() {
  static const KernelSet k{"avx2", quantize_act_q8_avx2, gemm_avx2, w4a8_mins_avx2, gemm_w8a8_avx2,
                           gemm_nvfp4_x4_avx2, WeightLayout::Nvfp4X4, /*gemm_fuses_mins=*/true,
                           quantize_act_q16_avx2, gemm_a16_avx2, WeightLayout::Q41X8};
  return k;
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
