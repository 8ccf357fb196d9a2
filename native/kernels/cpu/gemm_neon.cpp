// gemm_neon.cpp — AArch64 NEON + dot-product kernels (Cortex-A78AE, Jetson Orin): activation
// quantisation and the integer formats (NVFP4, W4A8 and its mins term, W8A8). Compiled with
// -march=armv8.2-a+dotprod -ffp-contract=off on aarch64 only (CMakeLists.txt); reached only
// through neon_kernels(), which dispatch.cpp selects when getauxval(AT_HWCAP) has ASIMDDP.
//
// Bit for bit the scalar reference (gemm_scalar.cpp), by construction:
//   * integer part: per block, the exact int32 sum of weight x activation products from
//     vdotq_s32 (signed x signed, so NVFP4 reads 2*e2m1 from a 16-entry table and needs no
//     offset; W4A8 reads the +8 nibbles and subtracts 8 * s_a as the scalar code does);
//   * float part: one vector lane per weight row (4 rows per step), and in each lane the
//     scalar code's float ops in its order: acc += (d_a * d_w) * float(isum), block by block,
//     then the NVFP4 tensor scale; no FMA contraction (explicit vmulq/vaddq, -ffp-contract=off
//     here and in the scalar file). native/tests/kernel_check.cpp compares the bits.
// Weight layouts are those of formats.h (the file layout; no repacking).
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_neon.h"

namespace kvdeck::cpu {
namespace {

using namespace neon;

constexpr int kRows = 4;     // weight rows per step: the 4 lanes of every float epilogue
constexpr int kTileM = 4;    // activation rows per GEMM tile (each decoded weight block serves 4)
constexpr int kMBlock = 64;  // activation rows per pass over the weights (they stay in L2)

// ============================================================================
// Activation quantisation (the scalar quantiser's float ops: max|x|, 127/amax, rint, clamp)
// ============================================================================

void quantize_act_q8_neon(const float* x /*[M,K]*/, int M, int K, ActQ8& out) {
  const int Kp = out.Kp, nb = Kp / kQ8Block;
  float tmp[kQ8Block];  // zero-padded copy of a partial block
  for (int m = 0; m < M; ++m) {
    const float* xr = x + size_t(m) * K;  // [K]
    int8_t* q = out.q + size_t(m) * Kp;   // [Kp]
    for (int b = 0; b < nb; ++b) {
      const int k0 = b * kQ8Block;
      const float* src = xr + k0;  // [32]
      if (k0 + kQ8Block > K) {
        std::memset(tmp, 0, sizeof tmp);
        if (K > k0) std::memcpy(tmp, xr + k0, sizeof(float) * (K - k0));
        src = tmp;
      }
      float32x4_t v[8];
      float32x4_t amax = vdupq_n_f32(0.0f);
      for (int i = 0; i < 8; ++i) {
        v[i] = vld1q_f32(src + 4 * i);
        amax = vmaxnmq_f32(amax, vabsq_f32(v[i]));  // maxNum: NaN ignored, as std::max(amax, NaN)
      }
      const float am = vmaxnmvq_f32(amax);
      const float id = am > 0.0f ? 127.0f / am : 0.0f;
      const float32x4_t lim = vdupq_n_f32(127.0f), nlim = vdupq_n_f32(-127.0f);
      int32x4_t qi[8];
      for (int i = 0; i < 8; ++i)  // rint (ties to even), then fmax(-127, fmin(127, .)) as minNum/maxNum
        qi[i] = vcvtq_s32_f32(vmaxnmq_f32(nlim, vminnmq_f32(lim, vrndnq_f32(vmulq_n_f32(v[i], id)))));
      if (src == tmp) {  // lanes past K are 0, as in the scalar code (0 * id is NaN where id overflows)
        int32_t t[kQ8Block];
        for (int i = 0; i < 8; ++i) vst1q_s32(t + 4 * i, qi[i]);
        for (int k = K > k0 ? K - k0 : 0; k < kQ8Block; ++k) t[k] = 0;
        for (int i = 0; i < 8; ++i) qi[i] = vld1q_s32(t + 4 * i);
      }
      for (int h = 0; h < 2; ++h) {
        const int16x8_t a = vcombine_s16(vmovn_s32(qi[4 * h]), vmovn_s32(qi[4 * h + 1]));
        const int16x8_t c = vcombine_s16(vmovn_s32(qi[4 * h + 2]), vmovn_s32(qi[4 * h + 3]));
        vst1q_s8(q + k0 + 16 * h, vcombine_s8(vmovn_s16(a), vmovn_s16(c)));
      }
      int32x4_t s = qi[0];
      for (int i = 1; i < 8; ++i) s = vaddq_s32(s, qi[i]);
      out.d[size_t(m) * nb + b] = am / 127.0f;
      out.s[size_t(m) * nb + b] = vaddvq_s32(s);
    }
  }
}

// ============================================================================
// Integer formats: 4 weight rows x RM activation rows per tile
// ============================================================================

enum class Q { Nvfp4, W4a8, W8a8 };

// 4 weight rows (rows past the range repeat the last one; their lanes are not stored).
struct Rows4 {
  const uint8_t* codes[kRows];    // NVFP4 / W4A8: u8 [Kp/2]; W8A8: i8 [Kp]
  const uint8_t* scales[kRows];   // NVFP4: e4m3 [Kp/16]; W4A8: f16 [Kp/group]; W8A8: f16 [Kp/32]
};

// y[m0 + m, n + lane] for lane < nvalid, m < RM, over all nb 32-blocks of K.
//   gdiv: W4A8 group / 32 (the scale index of 32-block b is b / gdiv)
template <Q F, int RM>
void qtile(const Rows4& w, int nb, int gdiv, const ActQ8& xq, int m0, float out_scale, float* y, int ldy,
           int n, int nvalid) {
  const int Kp = xq.Kp;
  const int8x16_t lut = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};  // kE2m1x2
  const uint8x16_t nib = vdupq_n_u8(0x0F);
  const int32x4_t zero = vdupq_n_s32(0);
  const uint16_t* s16[kRows];
  for (int r = 0; r < kRows; ++r) s16[r] = reinterpret_cast<const uint16_t*>(w.scales[r]);
  float32x4_t acc[RM];
  const int8_t* qa[RM];
  const float* da[RM];
  const int32_t* sa[RM];
  for (int m = 0; m < RM; ++m) {
    acc[m] = vdupq_n_f32(0.0f);
    qa[m] = xq.q + size_t(m0 + m) * Kp;
    da[m] = xq.d + size_t(m0 + m) * nb;
    sa[m] = xq.s + size_t(m0 + m) * nb;
  }
  // One 32-block b with its weight scales (lanes = rows; NVFP4: s0, s1 of 16-blocks 2b, 2b+1).
  auto step = [&](int b, float32x4_t s0, float32x4_t s1) __attribute__((always_inline)) {
    // ---- the block's weights as int8 (4-bit: lo = even elements, hi = odd) ----
    int8x16_t w0[kRows], w1[kRows];
    for (int r = 0; r < kRows; ++r) {
      if constexpr (F == Q::W8a8) {
        const int8_t* c = reinterpret_cast<const int8_t*>(w.codes[r]) + 32 * size_t(b);
        w0[r] = vld1q_s8(c), w1[r] = vld1q_s8(c + 16);
      } else {
        const uint8x16_t c = vld1q_u8(w.codes[r] + 16 * size_t(b));
        const uint8x16_t lo = vandq_u8(c, nib), hi = vshrq_n_u8(c, 4);
        if constexpr (F == Q::Nvfp4)
          w0[r] = vqtbl1q_s8(lut, lo), w1[r] = vqtbl1q_s8(lut, hi);
        else
          w0[r] = vreinterpretq_s8_u8(lo), w1[r] = vreinterpretq_s8_u8(hi);
      }
    }
    // ---- per activation row: exact int32 block sums, then the scalar epilogue per lane ----
    for (int m = 0; m < RM; ++m) {
      int8x16_t a0, a1;
      if constexpr (F == Q::W8a8) {
        a0 = vld1q_s8(qa[m] + 32 * size_t(b)), a1 = vld1q_s8(qa[m] + 32 * size_t(b) + 16);
      } else {
        const int8x16x2_t a = vld2q_s8(qa[m] + 32 * size_t(b));  // even / odd elements
        a0 = a.val[0], a1 = a.val[1];
      }
      int32x4_t d[kRows];  // lane j: elements 8j..8j+7 of the block
      for (int r = 0; r < kRows; ++r) d[r] = vdotq_s32(vdotq_s32(zero, w0[r], a0), w1[r], a1);
      const float32x4_t dav = vdupq_n_f32(da[m][b]);
      if constexpr (F == Q::Nvfp4) {
        const int32x4_t p01 = vpaddq_s32(d[0], d[1]), p23 = vpaddq_s32(d[2], d[3]);
        const int32x4_t b0 = vuzp1q_s32(p01, p23), b1 = vuzp2q_s32(p01, p23);  // 16-block sums
        acc[m] = vaddq_f32(acc[m], vmulq_f32(vmulq_f32(dav, s0), vcvtq_f32_s32(b0)));
        acc[m] = vaddq_f32(acc[m], vmulq_f32(vmulq_f32(dav, s1), vcvtq_f32_s32(b1)));
      } else {
        int32x4_t isum = hsum4(d[0], d[1], d[2], d[3]);
        if constexpr (F == Q::W4a8) isum = vsubq_s32(isum, vdupq_n_s32(kW4a8Offset * sa[m][b]));
        acc[m] = vaddq_f32(acc[m], vmulq_f32(vmulq_f32(dav, s0), vcvtq_f32_s32(isum)));
      }
    }
  };
  if constexpr (F == Q::Nvfp4) {
    int b = 0;
    // GEMV: two 32-blocks per step, each row's 4 scale bytes decoded at once (67 instead of 77
    // instructions per block and 4 rows). The GEMM tile (RM = 4) is short of registers for it.
    for (; RM == 1 && b + 2 <= nb; b += 2) {
      uint32_t sb[kRows];
      for (int r = 0; r < kRows; ++r) std::memcpy(&sb[r], w.scales[r] + 2 * size_t(b), 4);
      float32x4_t s[4];
      e4m3x16_half(vld1q_u32(sb), s);  // = e4m3 * 0.5 of the scalar code
      step(b, s[0], s[1]);
      step(b + 1, s[2], s[3]);
    }
    for (; b < nb; ++b) {  // one block: its 2 scale bytes per row
      uint16_t sb[kRows];
      for (int r = 0; r < kRows; ++r) std::memcpy(&sb[r], w.scales[r] + 2 * size_t(b), 2);
      const uint32x4_t u = vreinterpretq_u32_u16(vmovl_u8(vreinterpret_u8_u16(vld1_u16(sb))));
      step(b, e4m3_half(vandq_u32(u, vdupq_n_u32(0xFF))), e4m3_half(vshrq_n_u32(u, 16)));
    }
  } else {
    for (int b = 0; b < nb; ++b) {
      const float32x4_t s0 = gather_f16(s16, size_t(F == Q::W4a8 ? b / gdiv : b));
      step(b, s0, s0);
    }
  }
  for (int m = 0; m < RM; ++m) {
    float out[kRows];
    vst1q_f32(out, F == Q::Nvfp4 ? vmulq_n_f32(acc[m], out_scale) : acc[m]);
    for (int r = 0; r < nvalid; ++r) y[size_t(m0 + m) * ldy + n + r] = out[r];
  }
}

template <Q F>
void gemm_q(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const size_t code_bytes = F == Q::W8a8 ? size_t(Kp) : size_t(Kp) / 2;
  const size_t scale_bytes = F == Q::Nvfp4 ? size_t(Kp / kNvfp4Block)
                                           : 2 * size_t(F == Q::W4a8 ? Kp / w.group : nb);
  const int gdiv = F == Q::W4a8 ? w.group / kQ8Block : 1;
  const float out_scale = F == Q::Nvfp4 ? w.tscale : 1.0f;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int m1 = M - m0 < kMBlock ? M : m0 + kMBlock;
    for (int n = n0; n < n1; n += kRows) {
      const int nvalid = n1 - n < kRows ? n1 - n : kRows;
      Rows4 r;
      for (int i = 0; i < kRows; ++i) {
        const size_t row = size_t(i < nvalid ? n + i : n1 - 1);
        r.codes[i] = codes + row * code_bytes, r.scales[i] = scales + row * scale_bytes;
      }
      int m = m0;
      for (; m + kTileM <= m1; m += kTileM) qtile<F, kTileM>(r, nb, gdiv, xq, m, out_scale, y, ldy, n, nvalid);
      for (; m < m1; ++m) qtile<F, 1>(r, nb, gdiv, xq, m, out_scale, y, ldy, n, nvalid);
    }
  }
}

}  // namespace

namespace {

// Rows [m0, m0 + RM) x 4 weight rows of the mins term (lanes = weight rows).
template <int RM>
void mins_tile(const uint16_t* const (&mr)[kRows], const uint16_t* const (&sr)[kRows], const ActQ8& xq, int nb,
               int m0, float* y, int ldy, int n, int nvalid) {
  float32x4_t acc[RM];
  for (int m = 0; m < RM; ++m) acc[m] = vdupq_n_f32(0.0f);
  for (int b = 0; b < nb; ++b) {
    const float32x4_t off = vaddq_f32(gather_f16(mr, size_t(b)), vmulq_f32(vdupq_n_f32(8.0f), gather_f16(sr, size_t(b))));
    for (int m = 0; m < RM; ++m) {
      const size_t i = size_t(m0 + m) * nb + b;
      acc[m] = vaddq_f32(acc[m], vmulq_f32(vdupq_n_f32(xq.d[i] * float(xq.s[i])), off));
    }
  }
  for (int m = 0; m < RM; ++m) {
    float out[kRows];
    vst1q_f32(out, acc[m]);
    for (int r = 0; r < nvalid; ++r) y[size_t(m0 + m) * ldy + n + r] += out[r];
  }
}

}  // namespace

// W4A8 + mins: y += sum_b (d_a * float(s_a)) * (min + 8 * scale), block by block per lane.
void w4a8_mins_neon(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int nb = w.Kp / kQ8Block;
  const auto* mins = static_cast<const uint16_t*>(w.mins);      // f16 [N, nb]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  for (int n = n0; n < n1; n += kRows) {
    const int nvalid = n1 - n < kRows ? n1 - n : kRows;
    const uint16_t *mr[kRows], *sr[kRows];
    for (int i = 0; i < kRows; ++i) {
      const size_t row = size_t(i < nvalid ? n + i : n1 - 1);
      mr[i] = mins + row * nb, sr[i] = scales + row * nb;
    }
    int m = 0;
    for (; m + kTileM <= M; m += kTileM) mins_tile<kTileM>(mr, sr, xq, nb, m, y, ldy, n, nvalid);
    for (; m < M; ++m) mins_tile<1>(mr, sr, xq, nb, m, y, ldy, n, nvalid);
  }
}

void gemm_w8a8_neon(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  gemm_q<Q::W8a8>(w, xq, M, y, ldy, n0, n1);
}

namespace {

void gemm_neon(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy, int n0,
               int n1) {
  switch (w.dtype) {
    case DType::F32:
    case DType::F16: gemm_dense_neon(w, x, M, y, ldy, n0, n1); break;
    case DType::W4A8:  // groups that are not a multiple of 32 take the scalar path
      if (w.group % kQ8Block == 0)
        gemm_q<Q::W4a8>(w, *xq, M, y, ldy, n0, n1);
      else
        scalar_kernels().gemm(w, x, xq, M, y, ldy, n0, n1);
      break;
    case DType::NVFP4: gemm_q<Q::Nvfp4>(w, *xq, M, y, ldy, n0, n1); break;
    case DType::W8A8: gemm_q<Q::W8a8>(w, *xq, M, y, ldy, n0, n1); break;
  }
}

}  // namespace

const KernelSet& neon_kernels() {
  static const KernelSet k{"neon", quantize_act_q8_neon, gemm_neon, w4a8_mins_neon, gemm_w8a8_neon,
                           nullptr, WeightLayout::File, /*gemm_fuses_mins=*/false,
                           nullptr, gemm_a16_neon};  // a16: the scalar quantiser, gemm_a16_neon.cpp
  return k;
}

}  // namespace kvdeck::cpu
#endif  // __aarch64__
