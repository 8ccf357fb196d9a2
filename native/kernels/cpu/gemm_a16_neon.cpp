// gemm_a16_neon.cpp — 16-bit activations (ActQ8::q16) on AArch64 NEON + dot product: the
// W4A8 (GGUF Q4_0 / Q4_1, group a multiple of 32) and W8A8 (Q8_0) products of gemm_a16.cpp.
// Compiled with -march=armv8.2-a+dotprod -ffp-contract=off on aarch64 only; reached only
// through neon_kernels() (dispatch.cpp: ASIMDDP). The quantiser is the scalar one.
//
// Bit for bit the scalar reference (native/tests/kernel_check_neon.cpp compares the bits):
//   * integer part: each int16 activation q = 256 * hi + lo (hi = q >> 8 signed, lo = q & 255),
//     one vld4 of the block's 64 bytes gives even / odd elements' lo and hi bytes;
//     W4A8: sum(nib * q) = 256 * sdot(nib, hi) + udot(nib, lo) (nibbles 0..15 are valid s8 and
//     u8); W8A8 (signed weights, so no udot): lo - 128 as s8, sum(w * q) = 256 * sdot(w, hi) +
//     sdot(w, lo - 128) + 128 * sdot(w, 1). Exact int32 (|t| < 2^31, gemm_a16.cpp's bounds);
//   * float part: one lane per weight row (4 rows a step), the scalar code's ops in its order.
// Other layouts (Q41X8, repacked for AVX2) and groups go to the scalar reference.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_neon.h"

namespace kvdeck::cpu {
namespace {

using namespace neon;

constexpr int kRows = 4;  // weight rows per step: the 4 lanes of the float epilogue

enum class F16 { Q4, Q4Mins, W8 };

// y[m, n + r] for r < nvalid (4 rows; rows past the range repeat the last one).
template <F16 F>
void rows4(const ActQ8& xq, int m, const uint8_t* const (&codes)[kRows], const uint16_t* const (&sc)[kRows],
           const uint16_t* const (&mn)[kRows], int gdiv, float* y, int nvalid) {
  const int Kp = xq.Kp, nb = Kp / kQ8Block;
  const auto* qa = reinterpret_cast<const uint8_t*>(xq.q16 + size_t(m) * Kp);  // int16 [Kp] as bytes
  const float* da = xq.d + size_t(m) * nb;
  const int32_t* sa = xq.s + size_t(m) * nb;
  const uint8x16_t nib = vdupq_n_u8(0x0F), flip = vdupq_n_u8(0x80);
  const int8x16_t one = vdupq_n_s8(1);
  const int32x4_t zero = vdupq_n_s32(0);
  const uint32x4_t uzero = vdupq_n_u32(0);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int b = 0; b < nb; ++b) {
    int32x4_t d[kRows];  // per row: lanes of the block's exact sum
    if constexpr (F == F16::W8) {
      const uint8x16x2_t p0 = vld2q_u8(qa + 64 * size_t(b)), p1 = vld2q_u8(qa + 64 * size_t(b) + 32);
      const int8x16_t h0 = vreinterpretq_s8_u8(p0.val[1]), h1 = vreinterpretq_s8_u8(p1.val[1]);
      const int8x16_t l0 = vreinterpretq_s8_u8(veorq_u8(p0.val[0], flip));  // lo - 128
      const int8x16_t l1 = vreinterpretq_s8_u8(veorq_u8(p1.val[0], flip));
      for (int r = 0; r < kRows; ++r) {
        const int8_t* c = reinterpret_cast<const int8_t*>(codes[r]) + 32 * size_t(b);
        const int8x16_t w0 = vld1q_s8(c), w1 = vld1q_s8(c + 16);
        const int32x4_t hi = vdotq_s32(vdotq_s32(zero, w0, h0), w1, h1);
        const int32x4_t lo = vdotq_s32(vdotq_s32(zero, w0, l0), w1, l1);
        const int32x4_t ws = vdotq_s32(vdotq_s32(zero, w0, one), w1, one);
        d[r] = vaddq_s32(vshlq_n_s32(hi, 8), vaddq_s32(lo, vshlq_n_s32(ws, 7)));
      }
    } else {
      const uint8x16x4_t p = vld4q_u8(qa + 64 * size_t(b));  // even lo, even hi, odd lo, odd hi
      const int8x16_t eh = vreinterpretq_s8_u8(p.val[1]), oh = vreinterpretq_s8_u8(p.val[3]);
      for (int r = 0; r < kRows; ++r) {
        const uint8x16_t c = vld1q_u8(codes[r] + 16 * size_t(b));
        const uint8x16_t lo = vandq_u8(c, nib), hi = vshrq_n_u8(c, 4);  // even / odd elements
        const int32x4_t h = vdotq_s32(vdotq_s32(zero, vreinterpretq_s8_u8(lo), eh), vreinterpretq_s8_u8(hi), oh);
        const uint32x4_t l = vdotq_u32(vdotq_u32(uzero, lo, p.val[0]), hi, p.val[2]);
        d[r] = vaddq_s32(vshlq_n_s32(h, 8), vreinterpretq_s32_u32(l));
      }
    }
    const int32x4_t t = hsum4(d[0], d[1], d[2], d[3]);  // lane r: row r's block sum
    const float32x4_t dav = vdupq_n_f32(da[b]);
    const float32x4_t dw = gather_f16(sc, size_t(F == F16::W8 ? b : b / gdiv));
    if constexpr (F == F16::Q4Mins) {  // da * (dw * t + min * s)
      const float32x4_t inner = vaddq_f32(vmulq_f32(dw, vcvtq_f32_s32(t)),
                                          vmulq_f32(gather_f16(mn, size_t(b)), vdupq_n_f32(float(sa[b]))));
      acc = vaddq_f32(acc, vmulq_f32(dav, inner));
    } else if constexpr (F == F16::Q4) {  // da * dw * (t - 8 s)
      acc = vaddq_f32(acc, vmulq_f32(vmulq_f32(dav, dw), vcvtq_f32_s32(vsubq_s32(t, vdupq_n_s32(kW4a8Offset * sa[b])))));
    } else {  // da * dw * t
      acc = vaddq_f32(acc, vmulq_f32(vmulq_f32(dav, dw), vcvtq_f32_s32(t)));
    }
  }
  float out[kRows];
  vst1q_f32(out, acc);
  for (int r = 0; r < nvalid; ++r) y[r] = out[r];
}

template <F16 F>
void gemm_f(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const size_t code_bytes = F == F16::W8 ? size_t(Kp) : size_t(Kp) / 2;
  const int ng = F == F16::W8 ? nb : Kp / w.group, gdiv = F == F16::W8 ? 1 : w.group / kQ8Block;
  const auto* codes = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const uint16_t*>(w.scales);
  const auto* mins = static_cast<const uint16_t*>(w.mins);
  for (int n = n0; n < n1; n += kRows) {
    const int nvalid = n1 - n < kRows ? n1 - n : kRows;
    const uint8_t* c[kRows];
    const uint16_t *s[kRows], *mr[kRows];
    for (int i = 0; i < kRows; ++i) {
      const size_t row = size_t(i < nvalid ? n + i : n1 - 1);
      c[i] = codes + row * code_bytes, s[i] = scales + row * ng, mr[i] = mins ? mins + row * nb : nullptr;
    }
    for (int m = 0; m < M; ++m) rows4<F>(xq, m, c, s, mr, gdiv, y + size_t(m) * ldy + n, nvalid);
  }
}

}  // namespace

void gemm_a16_neon(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  check_a16_weight(w);
  if (w.layout != WeightLayout::File)
    gemm_a16_scalar(w, xq, M, y, ldy, n0, n1);
  else if (w.dtype == DType::W8A8)
    gemm_f<F16::W8>(w, xq, M, y, ldy, n0, n1);
  else if (w.mins)
    gemm_f<F16::Q4Mins>(w, xq, M, y, ldy, n0, n1);
  else
    gemm_f<F16::Q4>(w, xq, M, y, ldy, n0, n1);
}

}  // namespace kvdeck::cpu
#endif  // __aarch64__
