// common.cuh — device helpers shared by kvdeck's CUDA kernels (byte permutes, format decode).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace kvdeck::cuda::detail {

// prmt.b32 in its generic mode. Selector nibbles must have bit 3 clear (bit 3 would select
// sign replication); only the low 16 bits of s are read.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifdef KVDECK_CUDA_EMU  // bench/emu/emu.h: the kernels' source run on a CPU
  return emu::prmt(a, b, s);
#else
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#endif
}

// D += A B, one m16n8k16 tile: f16 A (row-major, 4 registers) and B (column-major, 2), f32 D.
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#ifdef KVDECK_CUDA_EMU
  emu::mma16816(c, a0, a1, a2, a3, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// 2^x by ex2.approx.ftz.f32 (relative error ~2^-22; results below 2^-126 flush to 0, -inf gives 0):
// exp2f without its denormal-range scaling around the MUFU.
__device__ __forceinline__ float ex2_approx(float x) {
#ifdef KVDECK_CUDA_EMU
  return std::exp2(x);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#endif
}

// movmatrix.sync.aligned.m8n8.trans.b16 (sm_75+): lane l holds (row l / 4, cols 2 (l % 4), +1)
// of an 8 x 8 matrix of 16-bit values and receives the same elements of its transpose.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
#ifdef KVDECK_CUDA_EMU
  return emu::movmatrix_trans(x);
#else
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
#endif
}

// 8 four-bit codes q (element i in bits [4i, 4i+4)) through a signed 16-entry byte table
// given as its positive half (pos0: entries 0-3, pos1: 4-7) and negative half (neg0, neg1:
// entries 8-15, i.e. the codes with bit 3 set). lo gets elements 0-3, hi elements 4-7, one
// byte each, in element order. 11 integer ops for 8 codes.
__device__ __forceinline__ void lut16x8(uint32_t q, uint32_t pos0, uint32_t pos1, uint32_t neg0,
                                        uint32_t neg1, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = q & 0x77777777u;                           // low 3 bits: table index
  const uint32_t s = ((q >> 1) & 0x44444444u) | 0x32103210u;    // byte n, or n+4 if bit 3
  lo = prmt(prmt(pos0, pos1, m), prmt(neg0, neg1, m), s);
  hi = prmt(prmt(pos0, pos1, m >> 16), prmt(neg0, neg1, m >> 16), s >> 16);
}

// E2M1 -> 2*e2m1 as int8: {0,1,2,3,4,6,8,12} and negatives (the CPU's kE2m1x2).
constexpr uint32_t kE2m1x2Pos0 = 0x03020100u, kE2m1x2Pos1 = 0x0C080604u;
constexpr uint32_t kE2m1x2Neg0 = 0xFDFEFF00u, kE2m1x2Neg1 = 0xF4F8FAFCu;
// E2M1 -> the high byte of its f16 (the low byte is 0 for every E2M1 value).
constexpr uint32_t kE2m1HiPos0 = 0x3E3C3800u, kE2m1HiPos1 = 0x46444240u;
constexpr uint32_t kE2m1HiNeg0 = 0xBEBCB880u, kE2m1HiNeg1 = 0xC6C4C2C0u;

__device__ __forceinline__ void e2m1x8_to_i8x2(uint32_t q, uint32_t& lo, uint32_t& hi) {
  lut16x8(q, kE2m1x2Pos0, kE2m1x2Pos1, kE2m1x2Neg0, kE2m1x2Neg1, lo, hi);
}

// 8 E2M1 codes -> 4 half2 (elements 0..7 in order, exact).
__device__ __forceinline__ void e2m1x8_to_half2x4(uint32_t q, uint32_t h[4]) {
  uint32_t a, b;
  lut16x8(q, kE2m1HiPos0, kE2m1HiPos1, kE2m1HiNeg0, kE2m1HiNeg1, a, b);
  h[0] = prmt(a, 0u, 0x1404u);  // [0, a0, 0, a1]: f16 of elements 0, 1
  h[1] = prmt(a, 0u, 0x3424u);
  h[2] = prmt(b, 0u, 0x1404u);
  h[3] = prmt(b, 0u, 0x3424u);
}

// Two E4M3 bytes (b0 in bits 0-7, b1 in bits 8-15) -> float2 of their values / 256: the
// E4M3 bits placed in an f16 (sign to bit 15, exponent and mantissa shifted by 7) decode to
// value * 2^-8 for normal and subnormal codes alike. 0x7F decodes as 480 / 256 (finite).
__device__ __forceinline__ float2 e4m3x2_to_float2_div256(uint32_t b01) {
  const uint32_t w = prmt(b01, 0u, 0x4140u);                 // [b0, 0, b1, 0]
  const uint32_t h = ((w & 0x007F007Fu) << 7) | ((w & 0x00800080u) << 8);
  __half2 hv;
  memcpy(&hv, &h, 4);
  return __half22float2(hv);
}

__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint16_t h = uint16_t(((b & 0x7Fu) << 7) | ((b & 0x80u) << 8));
  return __half2float(__ushort_as_half(h)) * 256.0f;
}

// f32 -> E4M3 (float8_e4m3fn) with round-to-nearest-even, saturating at 448: formats.cpp
// f32_to_e4m3 in integer operations, so KV block scales match the CPU pool's bytes.
__device__ __forceinline__ uint32_t rne_shift(uint32_t v, uint32_t sh) {
  return (v + ((1u << (sh - 1)) - 1u) + ((v >> sh) & 1u)) >> sh;
}

__device__ __forceinline__ uint8_t f32_to_e4m3_dev(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint8_t(sign | 0x7Fu);
  if (a >= 0x43E00000u) return uint8_t(sign | 0x7Eu);
  if (a >= 0x3C800000u) return uint8_t(sign | (rne_shift(a, 20) - ((127u - 7u) << 3)));
  const uint32_t e = a >> 23;
  const uint32_t sh = min(141u - min(e, 120u), 25u);
  const uint32_t mant = e ? ((a & 0x7FFFFFu) | 0x800000u) : 0u;
  return uint8_t(sign | rne_shift(mant, sh));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Quantise 32 values (one per lane) exactly as quantize_act_q8_kernel does (fused.cu's norm and
// silu kernels, the attention combine).
__device__ __forceinline__ void quant_block(float v, bool live, int k, int8_t* q, float* d, int32_t* s, int blk) {
  const float amax = warp_max(fabsf(v));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int qi = live ? int(fmaxf(-127.0f, fminf(127.0f, rintf(v * id)))) : 0;
  q[k] = int8_t(qi);
  const int sum = warp_sum_int(qi);
  if ((threadIdx.x & 31) == 0) {
    d[blk] = amax / 127.0f;
    s[blk] = sum;
  }
}

// Programmatic dependent launch (sm_90+; no-ops below, and when not launched with PDL):
// pdl_launch_dependents lets the next kernel in the stream start; pdl_wait blocks until the
// previous kernel has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launch `kernel` with or without the programmatic-stream-serialization attribute (PDL is
// only requested on devices of compute capability 9.0 or newer).
bool pdl_supported();
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t st, bool pdl,
                          Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = 0, cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  const bool use = pdl && pdl_supported();
  cfg.attrs = use ? at : nullptr;
  cfg.numAttrs = use ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

}  // namespace kvdeck::cuda::detail
