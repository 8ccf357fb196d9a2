// gemm_avx512.cpp — the AVX-512 (F/BW/VL/DQ) + VNNI KernelSet (compiled with -mavx512*; only
// reached when cpuid reports avx512f+bw+vl+dq+vnni and avx2/fma/f16c, see dispatch.cpp), and
// its reader of NVFP4 in the file layout (the engine repacks NVFP4 at load: the Nvfp4X4
// reader is gemm_repack_avx512.cpp; W4A8, W8A8 and F32 / F16 are gemm_{w4a8,w8a8,dense}_avx512.cpp):
//   * codes -> u = 2*e2m1 + 12 via vpshufb on a 16-entry table,
//   * vpdpbusd (u8 x s8 -> int32, 4 products per lane) accumulates onto the per-lane offset
//     correction loaded from the packed activations, so the offset costs nothing,
//   * a 64-byte load of codes is [block b | b+1 | b+2 | b+3] x 16 bytes; low nibbles are the
//     even elements, high nibbles the odd ones; QuadPack lays the activations out to match.
// Quantisation of activations reuses the AVX2 quantiser (not a hot path).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kernels_impl.h"

// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own "undefined" vectors
// (cast / reduce intrinsics); a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kGemvRows = 4;   // weight rows per GEMV step (activation reuse, 4 streams)
constexpr int kGemmRowsN = 4;  // GEMM register tile: 4 weight rows x 4 activation rows
constexpr int kGemmRowsM = 4;  //   = 16 accumulators (of 32 zmm)
constexpr int kMBlock = 64;    // activation rows packed at once (stays in L2)
constexpr int kPrefetchBytes = 4096;  // GEMV software prefetch distance (rows are contiguous: ~memory latency x bandwidth ahead)

// ============================================================================
// Quantised formats: packed activations and the register-tiled VNNI kernel
// ============================================================================

// One activation row, four 32-blocks b = 4t .. 4t+3 (128 values of K).
struct alignas(64) QuadPack {
  int8_t even[64];   // 16 bytes per block: q[b][0,2,..,30]
  int8_t odd[64];    // q[b][1,3,..,31]
  int32_t corr[16];  // per-lane offset correction (lane sums per block = -offset * s)
  float d[16];       // d_a[b] x4 per block
};

// Lane j (0..3) of a block's 128 bits covers elements 8j..8j+7 (see gemm_avx2.cpp): lanes 0, 1
// are 16-block 0 and lanes 2, 3 16-block 1, each carrying -12 * its 16-block sum / 2.
void pack_acts(const ActQ8& xq, int m0, int mb, int T, QuadPack* out /*[mb, T]*/) {
  const int Kp = xq.Kp, nb = Kp / kQ8Block;
  for (int mi = 0; mi < mb; ++mi) {
    const int m = m0 + mi;
    const int8_t* q = xq.q + size_t(m) * Kp;  // [Kp]
    for (int t = 0; t < T; ++t) {
      QuadPack& pk = out[size_t(mi) * T + t];
      for (int h = 0; h < 4; ++h) {
        const int b = 4 * t + h;
        if (b >= nb) {  // partial last quad: zero the missing blocks
          std::memset(pk.even + 16 * h, 0, 16);
          std::memset(pk.odd + 16 * h, 0, 16);
          for (int j = 0; j < 4; ++j) pk.corr[4 * h + j] = 0, pk.d[4 * h + j] = 0.0f;
          continue;
        }
        const int8_t* qb = q + b * kQ8Block;  // [32]
        for (int i = 0; i < 16; ++i) pk.even[16 * h + i] = qb[2 * i], pk.odd[16 * h + i] = qb[2 * i + 1];
        int s0 = 0, s1 = 0;
        for (int i = 0; i < 16; ++i) s0 += qb[i], s1 += qb[16 + i];
        pk.corr[4 * h + 0] = pk.corr[4 * h + 1] = -kNvfp4Offset / 2 * s0;
        pk.corr[4 * h + 2] = pk.corr[4 * h + 3] = -kNvfp4Offset / 2 * s1;
        const float d = xq.d[size_t(m) * nb + b];
        for (int j = 0; j < 4; ++j) pk.d[4 * h + j] = d;
      }
    }
  }
}

struct QRow {
  const uint8_t* codes;   // [Kp/2]: 64 bytes per quad of 32-blocks
  const uint8_t* scales;  // 8 bytes per quad: 8 x e4m3
};

inline void decode_quad(__m512i c, __m512i& lo, __m512i& hi) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(c, nib));
  hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(c, 4), nib));
}

// Per-lane weight scale of one quad from its 8 scale bytes (layout of QuadPack::d): E4M3 by
// bit placement, times 2^119 (= 2^120 * 0.5); see gemm_avx2.cpp.
inline __m512 quad_scale(uint64_t bits) {
  const __m128i raw = _mm_cvtsi64_si128(int64_t(bits));
  const __m256i b32 = _mm256_cvtepu8_epi32(raw);
  const __m256i f = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(b32, _mm256_set1_epi32(0x7F)), 20),
                                    _mm256_slli_epi32(_mm256_and_si256(b32, _mm256_set1_epi32(0x80)), 24));
  const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(f), _mm256_set1_ps(0x1p119f));
  const __m512i idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  return _mm512_permutexvar_ps(idx, _mm512_zextps256_ps512(v));
}

template <int RN, int RM>
inline void tile_step(const __m512i (&c)[RN], const uint64_t (&sb)[RN], const QuadPack* const* a,
                      __m512 (&acc)[RN][RM]) {
  for (int n = 0; n < RN; ++n) {
    __m512i lo, hi;
    decode_quad(c[n], lo, hi);
    const __m512 ws = quad_scale(sb[n]);
    for (int m = 0; m < RM; ++m) {
      __m512i s32 = _mm512_load_si512(a[m]->corr);
      s32 = _mm512_dpbusd_epi32(s32, lo, _mm512_load_si512(a[m]->even));
      s32 = _mm512_dpbusd_epi32(s32, hi, _mm512_load_si512(a[m]->odd));
      const __m512 sc = _mm512_mul_ps(ws, _mm512_load_ps(a[m]->d));
      acc[n][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32), sc, acc[n][m]);
    }
  }
}

// y[m][n] for RN weight rows x RM packed activation rows over all T quads.
template <int RN, int RM>
void q4_tile(const QRow* w /*[RN]*/, const QuadPack* const* a0 /*[RM]*/, int T, int nb,
             float out_scale, float* const* y /*[RM], offset to column n*/) {
  __m512 acc[RN][RM];
  for (int n = 0; n < RN; ++n)
    for (int m = 0; m < RM; ++m) acc[n][m] = _mm512_setzero_ps();
  const int Tfull = nb / 4;
  const QuadPack* a[RM];
  for (int m = 0; m < RM; ++m) a[m] = a0[m];
  for (int t = 0; t < Tfull; ++t) {
    __m512i c[RN];
    uint64_t sb[RN];
    for (int n = 0; n < RN; ++n) {
      const uint8_t* cp = w[n].codes + 64 * size_t(t);
      if (RM == 1) _mm_prefetch(reinterpret_cast<const char*>(cp + kPrefetchBytes), _MM_HINT_T0);
      c[n] = _mm512_loadu_si512(cp);
      std::memcpy(&sb[n], w[n].scales + 8 * size_t(t), 8);
    }
    tile_step<RN, RM>(c, sb, a, acc);
    for (int m = 0; m < RM; ++m) ++a[m];
  }
  if (T > Tfull) {  // 1..3 remaining 32-blocks: masked code load, 2 scale bytes per block
    const int rem = nb - 4 * Tfull;
    const __mmask64 cmask = (__mmask64(1) << (16 * rem)) - 1;
    __m512i c[RN];
    uint64_t sb[RN];
    for (int n = 0; n < RN; ++n) {
      c[n] = _mm512_maskz_loadu_epi8(cmask, w[n].codes + 64 * size_t(Tfull));
      sb[n] = 0;
      std::memcpy(&sb[n], w[n].scales + 8 * size_t(Tfull), 2 * rem);
    }
    tile_step<RN, RM>(c, sb, a, acc);
  }
  for (int n = 0; n < RN; ++n)
    for (int m = 0; m < RM; ++m) y[m][n] = _mm512_reduce_add_ps(acc[n][m]) * out_scale;
}

std::vector<QuadPack>& scratch() {
  thread_local std::vector<QuadPack> s;  // [kMBlock, T]
  return s;
}

void gemm_nvfp4_file(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, T = (nb + 3) / 4;
  const auto* codes = static_cast<const uint8_t*>(w.data);  // [N, Kp/2]
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  std::vector<QuadPack>& S = scratch();
  S.resize(size_t(std::min(M, kMBlock)) * T);
  auto row = [&](int n) { return QRow{codes + size_t(n) * (Kp / 2), scales + size_t(n) * (Kp / kNvfp4Block)}; };
  // One RN-row strip against activation rows [0, mb) of the packed block.
  auto strip = [&](auto rn_tag, auto rm_tag, int n, const QuadPack* A, int m0, int mb) {
    constexpr int RN = decltype(rn_tag)::value, RM = decltype(rm_tag)::value;
    QRow r[RN];
    for (int i = 0; i < RN; ++i) r[i] = row(n + i);
    int m = 0;
    for (; m + RM <= mb; m += RM) {
      const QuadPack* a[RM];
      float* yp[RM];
      for (int i = 0; i < RM; ++i) a[i] = A + size_t(m + i) * T, yp[i] = y + size_t(m0 + m + i) * ldy + n;
      q4_tile<RN, RM>(r, a, T, nb, w.tscale, yp);
    }
    for (; m < mb; ++m) {
      const QuadPack* a[1] = {A + size_t(m) * T};
      float* yp[1] = {y + size_t(m0 + m) * ldy + n};
      q4_tile<RN, 1>(r, a, T, nb, w.tscale, yp);
    }
  };
  using I1 = std::integral_constant<int, 1>;
  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int mb = std::min(kMBlock, M - m0);
    pack_acts(xq, m0, mb, T, S.data());
    const QuadPack* A = S.data();  // [mb, T]
    int n = n0;
    if (mb == 1) {
      for (; n + kGemvRows <= n1; n += kGemvRows)
        strip(std::integral_constant<int, kGemvRows>{}, I1{}, n, A, m0, mb);
    } else {
      for (; n + kGemmRowsN <= n1; n += kGemmRowsN)
        strip(std::integral_constant<int, kGemmRowsN>{}, std::integral_constant<int, kGemmRowsM>{}, n, A, m0, mb);
    }
    for (; n < n1; ++n) strip(I1{}, I1{}, n, A, m0, mb);
  }
}

void gemm_avx512(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy,
                 int n0, int n1) {
  switch (w.dtype) {
    case DType::F32:  // prefill: the AVX2 tile (the 512-bit one measured 0.92-0.99x at M = 512)
      (M == 1 ? gemm_dense_avx512 : gemm_dense_avx2)(w, x, M, y, ldy, n0, n1);
      break;
    case DType::F16: gemm_dense_avx512(w, x, M, y, ldy, n0, n1); break;
    case DType::W4A8:
      if (w.group % kQ8Block == 0 && (!w.mins || w.group == kQ8Block)) {
        gemm_w4a8_avx512(w, *xq, M, y, ldy, n0, n1);  // the mins term fused (gemm_fuses_mins)
      } else {  // other groups: the scalar path (and its separate mins pass)
        scalar_kernels().gemm(w, x, xq, M, y, ldy, n0, n1);
        if (w.mins) w4a8_mins_scalar(w, *xq, M, y, ldy, n0, n1);
      }
      break;
    case DType::NVFP4: gemm_nvfp4_file(w, *xq, M, y, ldy, n0, n1); break;
    case DType::W8A8: gemm_w8a8_avx512(w, *xq, M, y, ldy, n0, n1); break;
  }
}

}  // namespace

const KernelSet& avx512_kernels() {
  // Measured per op against the AVX2 set on a Sapphire Rapids guest (docs/ENGINE.md, CPU
  // kernels): NVFP4 is repacked at load (Nvfp4X4, gemm_repack_avx512.cpp), W4A8 runs
  // gemm_w4a8_avx512.cpp (mins fused), W8A8 gemm_w8a8_avx512.cpp, F16 and the F32 GEMV
  // gemm_dense_avx512.cpp, the F32 GEMM and 16-bit activations (a16) the AVX2 kernels.
  static const KernelSet k{"avx512vnni", quantize_act_q8_avx2, gemm_avx512, w4a8_mins_avx2, gemm_w8a8_avx512,
                           gemm_nvfp4_x4_avx512, WeightLayout::Nvfp4X4, /*gemm_fuses_mins=*/true,
                           // 16-bit activations: the AVX2 kernels
                           quantize_act_q16_avx2, gemm_a16_avx2, WeightLayout::Q41X8};
  return k;
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
