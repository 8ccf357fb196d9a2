// vec_neon.h — small AArch64 NEON helpers shared by the *_neon.cpp kernels (include only from
// files compiled with -march=armv8.2-a+dotprod; CMakeLists.txt). Those files are built with
// -ffp-contract=off: every FMA below is an explicit vfmaq_f32, every other product and sum is
// rounded on its own, as in the scalar reference (also built without contraction on aarch64).
// Rule for *_neon.cpp: no out-of-line inline or template code (std containers, ...): such code
// is emitted as weak symbols built for ARMv8.2 that the linker may pick for portable callers on
// a CPU without it. `make cross-check` fails on weak symbols in these objects.
#pragma once
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace kvdeck::cpu::neon {

// [sum a0, sum a1, sum a2, sum a3]: one int32 total per input vector (exact).
inline int32x4_t hsum4(int32x4_t a0, int32x4_t a1, int32x4_t a2, int32x4_t a3) {
  return vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));
}

// Four f16 values (one per row pointer, at element i) widened to f32 lanes (exact).
inline float32x4_t gather_f16(const uint16_t* const (&r)[4], size_t i) {
  uint16x4_t h = vdup_n_u16(0);
  h = vld1_lane_u16(r[0] + i, h, 0);
  h = vld1_lane_u16(r[1] + i, h, 1);
  h = vld1_lane_u16(r[2] + i, h, 2);
  h = vld1_lane_u16(r[3] + i, h, 3);
  return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

// E4M3 bytes (low 8 bits of each u32 lane) times 0.5, exactly: (e, m) moved to bit 20 reads
// as value * 2^-120 for normals and subnormals alike; * 2^119 restores value / 2 (no rounding:
// a power of two, results normal). Contract: NaN bytes (0x7F / 0xFF) are not produced by the
// quantiser and decode to 480 / 2 (the same convention as gemm_avx2.cpp's pair_scale).
inline float32x4_t e4m3_half(uint32x4_t b) {
  const uint32x4_t f = vorrq_u32(vshlq_n_u32(vandq_u32(b, vdupq_n_u32(0x7F)), 20),
                                 vshlq_n_u32(vandq_u32(b, vdupq_n_u32(0x80)), 24));
  return vmulq_f32(vreinterpretq_f32_u32(f), vdupq_n_f32(0x1p119f));
}

// 16 E4M3 bytes times 0.5, exactly, lanes = rows: lane r of u holds row r's 4 bytes (k = 0..3,
// byte k of the u32). out[k] = row r's byte k in lane r. Via f16: (e, m) at bit 7 reads as
// value * 2^-8 (normals and subnormals: E4M3 fits in binary16), * 2^7 = value / 2, no rounding.
// NaN bytes decode to 480 / 2 as in e4m3_half.
inline void e4m3x16_half(uint32x4_t u, float32x4_t (&out)[4]) {
  const uint8x16_t tr = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  const uint8x16_t t = vqtbl1q_u8(vreinterpretq_u8_u32(u), tr);  // byte 4k + r
  const uint8x16_t mag = vandq_u8(t, vdupq_n_u8(0x7F)), sgn = vandq_u8(t, vdupq_n_u8(0x80));
  const uint16x8_t h0 = vorrq_u16(vshll_n_u8(vget_low_u8(mag), 7), vshll_n_u8(vget_low_u8(sgn), 8));
  const uint16x8_t h1 = vorrq_u16(vshll_high_n_u8(mag, 7), vshll_high_n_u8(sgn, 8));
  const float32x4_t k = vdupq_n_f32(0x1p7f);
  out[0] = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h0))), k);
  out[1] = vmulq_f32(vcvt_high_f32_f16(vreinterpretq_f16_u16(h0)), k);
  out[2] = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h1))), k);
  out[3] = vmulq_f32(vcvt_high_f32_f16(vreinterpretq_f16_u16(h1)), k);
}

// e^x for 4 lanes: the Cephes expf of vec_avx2.h's exp256 (same constants and steps), ~1 ulp
// on [-87, 88]; inputs below -87 (and -inf) give exactly 0, as flush_exp does.
inline float32x4_t exp4(float32x4_t x) {
  const uint32x4_t live = vcgeq_f32(x, vdupq_n_f32(-87.0f));
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500E-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507E-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073E-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894E-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459E-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201E-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t v = vmulq_f32(p, vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), live));
}

}  // namespace kvdeck::cpu::neon
#endif  // __aarch64__
