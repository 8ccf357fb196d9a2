// gemm_w4a8_avx512.cpp — W4A8 (group a multiple of 32; with or without the GGUF Q4_1 mins)
// in the file layout on AVX-512 BW + VNNI (compiled with -mavx512*; reached only through the
// AVX-512 KernelSet, dispatch.cpp).
//
// Eight 32-blocks (256 values of K) per step. A row's two 64-byte code loads A (blocks 0-3,
// 16 bytes each: dword i = elements 8i..8i+7, low nibbles even, high odd) and B (blocks 4-7)
// become, by one vpermt2d each,
//   V0: lane 2b+i = dword i of block b,   V1: lane 2b+i = dword 2+i of block b   (i = 0, 1),
// so the two int32 lanes 2b, 2b+1 hold block b alone: four vpdpbusd (nibble q+8 as u8 x s8,
// exact) onto the offset correction (-4 * s in each of the two lanes: their sum is the block's
// -8 * s), then one convert, one scale product and one FMA per 256 values (the file-layout kernel of gemm_avx512.cpp paid them per 128). With mins
// (w = scale * nibble + min): no correction; each lane carries d_a * s / 2 for the min's FMA,
// so the min term is fused (KernelSet::gemm_fuses_mins). A last partial step (nb % 8 blocks)
// reads its codes and scales with masked loads. Decode (M = 1): 4 weight rows x 1 activation
// row; prefill: 1 weight row x kRowsM activation rows over activation blocks kept in L1.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
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
constexpr int kGemvRows = 4;           // weight rows per GEMV step (4 streams share the activation loads)
constexpr int kRowsM = 8;              // GEMM tile: 1 weight row x 8 activation rows (remainder: 4, then 1)
constexpr int kL1ActBytes = 32 << 10;  // packed activation rows per block: this many bytes (L1d 48 KiB)
constexpr int kPrefetchBytes = 4096;   // GEMV software prefetch distance (rows are contiguous)
constexpr int kOct = 8;                // 32-blocks per step

// Blocks 8o..8o+7 of one activation row, matching V0 / V1: lane L = 2b + i of block b.
struct alignas(64) OctActs {
  int8_t e0[64];     // lane L, bytes 4L+k: q[32b + 8i + 2k]       (V0, even elements)
  int8_t o0[64];     //                     q[32b + 8i + 2k + 1]   (V0, odd)
  int8_t e1[64];     //                     q[32b + 16 + 8i + 2k]  (V1)
  int8_t o1[64];     //                     q[32b + 16 + 8i + 2k + 1]
  int32_t corr[16];  // lane L: -4 * s_b (no mins); with mins the f32 bits of d_a * s_b / 2
  float d[16];       // lane L: d_a of block b
};

// Rows [m0, m0 + mb) of xq -> out [mb, O] (O = ceil(nb / 8); blocks past nb zero).
template <bool kMins>
void pack_octs(const ActQ8& xq, int O, int m0, int mb, OctActs* out) {
  const int Kp = xq.Kp, nb = Kp / kQ8Block;
  // 16 block bytes -> [even elements (8 bytes) | odd (8 bytes)]
  const __m128i spread = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int8_t* q = xq.q + size_t(m) * Kp;  // [Kp]
    OctActs* row = out + size_t(mi) * O;
    if (nb % kOct) std::memset(&row[O - 1], 0, sizeof(OctActs));
    for (int bb = 0; bb < nb; ++bb) {
      OctActs& pk = row[bb / kOct];
      const int b = bb % kOct;
      const int8_t* qb = q + size_t(bb) * kQ8Block;  // [32]
      const __m128i lo = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)), spread);
      const __m128i hi = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16)), spread);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(pk.e0 + 8 * b), lo);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(pk.o0 + 8 * b), _mm_unpackhi_epi64(lo, lo));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(pk.e1 + 8 * b), hi);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(pk.o1 + 8 * b), _mm_unpackhi_epi64(hi, hi));
      const float d = xq.d[size_t(m) * nb + bb];
      const int32_t s = xq.s[size_t(m) * nb + bb];
      int32_t c = -kW4a8Offset / 2 * s;
      if (kMins) {
        const float ds = d * float(s) * 0.5f;
        std::memcpy(&c, &ds, 4);
      }
      pk.corr[2 * b] = pk.corr[2 * b + 1] = c;
      pk.d[2 * b] = pk.d[2 * b + 1] = d;
    }
  }
}

// One weight row's step: the four u8 vectors (V0 even / odd, V1 even / odd), the lane scales
// and (with mins) the lane minimums.
struct WStep {
  __m512i u[4];
  __m512 ws, mn;
};

// codes: 128 bytes (n < 8 blocks: 16n, masked); scales / mins: 8 f16 (n masked), one per block.
template <bool kMins>
inline WStep load_step(const uint8_t* codes, const uint16_t* scales, const uint16_t* mins, int n) {
  const __m512i idx0 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
  const __m512i idx1 = _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  const __m256i dup = _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512i a, b;
  __m128i sh, mh = _mm_setzero_si128();
  if (n == kOct) {
    a = _mm512_loadu_si512(codes);
    b = _mm512_loadu_si512(codes + 64);
    sh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
    if (kMins) mh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mins));
  } else {  // the last partial step: 16n code bytes, n scales
    const uint64_t bytes = uint64_t(16) * n;  // 16..112
    a = _mm512_maskz_loadu_epi8(bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1, codes);
    b = bytes > 64 ? _mm512_maskz_loadu_epi8((__mmask64(1) << (bytes - 64)) - 1, codes + 64) : _mm512_setzero_si512();
    const __mmask8 k = __mmask8((1u << n) - 1);
    sh = _mm_maskz_loadu_epi16(k, scales);
    if (kMins) mh = _mm_maskz_loadu_epi16(k, mins);
  }
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i v0 = _mm512_permutex2var_epi32(a, idx0, b), v1 = _mm512_permutex2var_epi32(a, idx1, b);
  WStep w;
  w.u[0] = _mm512_and_si512(v0, nib);
  w.u[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), nib);
  w.u[2] = _mm512_and_si512(v1, nib);
  w.u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), nib);
  w.ws = _mm512_cvtph_ps(_mm256_permutexvar_epi16(dup, _mm256_castsi128_si256(sh)));
  w.mn = kMins ? _mm512_cvtph_ps(_mm256_permutexvar_epi16(dup, _mm256_castsi128_si256(mh))) : _mm512_setzero_ps();
  return w;
}

// acc += (int32 dot + correction) * (ws * d_a) [+ (d_a * s / 2) * min] for one activation row.
template <bool kMins>
inline void step(const WStep& w, const OctActs* a, __m512& acc) {
  auto ld = [](const int8_t* p) { return _mm512_load_si512(p); };
  __m512i s = kMins ? _mm512_setzero_si512() : _mm512_load_si512(a->corr);
  s = _mm512_dpbusd_epi32(s, w.u[0], ld(a->e0));
  s = _mm512_dpbusd_epi32(s, w.u[1], ld(a->o0));
  s = _mm512_dpbusd_epi32(s, w.u[2], ld(a->e1));
  s = _mm512_dpbusd_epi32(s, w.u[3], ld(a->o1));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w.ws, _mm512_load_ps(a->d)), acc);
  if (kMins) acc = _mm512_fmadd_ps(_mm512_load_ps(reinterpret_cast<const float*>(a->corr)), w.mn, acc);
}

// Weight rows as the tiles read them: row r of the tile at codes + r * cstride (Kp/2 bytes),
// one f16 scale (and min) per 32-block at scales + r * sstride (mins + r * nb). Passed as
// base pointers and strides: an array of per-row structs built per strip went through the
// stack as two 8-byte stores and a 16-byte load (a store-forwarding stall per row, measured:
// the GEMV 1.4x slower).
struct WRows {
  const uint8_t* codes;
  const uint16_t* scales;
  const uint16_t* mins;
  size_t cstride, sstride;  // bytes, f16 values
  int nb;
};

// y[m][n] for RN weight rows x RM activation rows (a[m]: the row's step 0) over nb blocks.
template <bool kMins, int RN, int RM>
void tile(const WRows& w, const OctActs* const (&a)[RM], float* const (&y)[RM] /*column n*/) {
  __m512 acc[RN][RM];
  for (int r = 0; r < RN; ++r)
    for (int m = 0; m < RM; ++m) acc[r][m] = _mm512_setzero_ps();
  const int nb = w.nb;
  for (int o = 0, b0 = 0; b0 < nb; ++o, b0 += kOct) {
    const int n = std::min(kOct, nb - b0);
    for (int r = 0; r < RN; ++r) {
      const uint8_t* cp = w.codes + r * w.cstride + size_t(b0) * 16;
      if (RM == 1) {
        _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes + 64), _MM_HINT_T0);
      }
      const WStep ws = load_step<kMins>(cp, w.scales + r * w.sstride + b0, kMins ? w.mins + r * size_t(nb) + b0 : nullptr, n);
      for (int m = 0; m < RM; ++m) step<kMins>(ws, a[m] + o, acc[r][m]);
    }
  }
  if constexpr (RN == 4 && RM == 1) {
    float* const yp[4] = {y[0], y[0] + 1, y[0] + 2, y[0] + 3};
    const __m512 acc4[4] = {acc[0][0], acc[1][0], acc[2][0], acc[3][0]};
    store_sum4(acc4, 1.0f, yp);
  } else {
    for (int r = 0; r < RN; ++r) {
      float* yp[RM];
      for (int m = 0; m < RM; ++m) yp[m] = y[m] + r;
      store_sums<RM>(acc[r], 1.0f, yp);
    }
  }
}

struct Scratch {
  std::vector<OctActs> acts;
  std::vector<uint16_t> wscales;  // group != 32: per-32-block f16 scales [kGemvRows, nb]
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <bool kMins>
void gemm_w4a8(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, O = (nb + kOct - 1) / kOct;
  const auto* codes = static_cast<const uint8_t*>(w.data);         // [N, Kp/2]
  const auto* scales = static_cast<const uint16_t*>(w.scales);     // f16 [N, Kp/group]
  const auto* mins = static_cast<const uint16_t*>(w.mins);         // f16 [N, nb] (group 32)
  const bool expand = w.group != kQ8Block;
  const int per_row = O * int(sizeof(OctActs));
  const int mblock = M == 1 ? 1 : std::max(kRowsM, kL1ActBytes / per_row / kRowsM * kRowsM);
  Scratch& S = scratch();
  S.acts.resize(size_t(std::min(M, mblock)) * O);
  if (expand) S.wscales.assign(size_t(kGemvRows) * nb, 0);
  // Rows [n, n + rows) (group != 32: their scales expanded per 32-block into the scratch).
  auto rows_at = [&](int n, int rows) {
    WRows r{codes + size_t(n) * (Kp / 2), scales + size_t(n) * (Kp / w.group), kMins ? mins + size_t(n) * nb : nullptr,
            size_t(Kp / 2), size_t(Kp / w.group), nb};
    if (expand) {
      for (int i = 0; i < rows; ++i)
        for (int b = 0; b < nb; ++b) S.wscales[size_t(i) * nb + b] = r.scales[i * r.sstride + b * kQ8Block / w.group];
      r.scales = S.wscales.data(), r.sstride = size_t(nb);
    }
    return r;
  };
  for (int m0 = 0; m0 < M; m0 += mblock) {
    const int mb = std::min(mblock, M - m0);
    pack_octs<kMins>(xq, O, m0, mb, S.acts.data());
    const OctActs* A = S.acts.data();
    float* yb = y + size_t(m0) * ldy;
    int n = n0;
    if (mb == 1) {
      const OctActs* a[1] = {A};
      for (; n + kGemvRows <= n1; n += kGemvRows) {
        float* const yp[1] = {yb + n};
        tile<kMins, kGemvRows, 1>(rows_at(n, kGemvRows), a, yp);
      }
      for (; n < n1; ++n) {
        float* const yp[1] = {yb + n};
        tile<kMins, 1, 1>(rows_at(n, 1), a, yp);
      }
      continue;
    }
    for (; n < n1; ++n) {
      const WRows r = rows_at(n, 1);
      int m = 0;
      auto tiles = [&](auto rm_tag) {
        constexpr int RM = decltype(rm_tag)::value;
        for (; m + RM <= mb; m += RM) {
          const OctActs* a[RM];
          float* yp[RM];
          for (int i = 0; i < RM; ++i) a[i] = A + size_t(m + i) * O, yp[i] = yb + size_t(m + i) * ldy + n;
          tile<kMins, 1, RM>(r, a, yp);
        }
      };
      tiles(std::integral_constant<int, kRowsM>{});
      tiles(std::integral_constant<int, 4>{});
      tiles(std::integral_constant<int, 1>{});
    }
  }
}

}  // namespace

void gemm_w4a8_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  if (w.mins)
    gemm_w4a8<true>(w, xq, M, y, ldy, n0, n1);
  else
    gemm_w4a8<false>(w, xq, M, y, ldy, n0, n1);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
