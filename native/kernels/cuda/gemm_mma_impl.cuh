// gemm_mma_impl.cuh — device helpers of the prefill GEMM (gemm_mma.cu): cp.async, ldmatrix,
// the launch arguments and tile shapes, the mma.sync wrappers (int8 ones add the magic constant as their accumulator input), the
// signed-byte lookups of 4-bit codes and the int8 -> f16 conversion. Included by gemm_mma.cu
// only; bench/gemm/check_fragments_host.cpp checks copies of the lookups and conversions (keep in step).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "common.cuh"

namespace kvdeck::cuda::gemm {

using detail::prmt;

constexpr uint32_t kMagic = 0x4B400000u;  // the float 12582912 = 2^23 + 2^22
constexpr float kMagicF = 12582912.0f;

// ---- launch arguments and tile shapes ----
constexpr int BK = 64, STAGES = 4, THREADS = 256, MAXW = 4;
constexpr int A_LD = BK + 16;                // bytes per activation row in shared memory (80)

struct Args {
  const int8_t* xq;
  const float* xd;
  int M, Kp, group, n;
  int tile0[MAXW + 1];  // weight i covers blockIdx.y in [tile0[i], tile0[i + 1])
  const uint8_t* codes[MAXW];
  const void* scales[MAXW];
  float tscale[MAXW];
  int N[MAXW];
  float* y[MAXW];
  int ldy[MAXW];
};

template <int FMT, int BM, int BN>
struct Cfg {
  static constexpr int WN = BN / 32, WM = 8 / WN, MT = BM / (16 * WM);
  static constexpr int B_ROW = FMT == 2 ? BK : BK / 2;  // weight bytes per row and stage
  static constexpr int B_LD = B_ROW + 16;               // 80 (w8) or 48 (4-bit)
  static constexpr int SC = FMT == 0 ? 4 : FMT == 3 ? 1 : 2;  // 32-bit words per column and 32-block
  static constexpr int A_BYTES = BM * A_LD, B_BYTES = BN * B_LD;
  static constexpr int S_FLOATS = 2 * BN * SC, D_FLOATS = BM * 2;  // per buffer (2 buffers)
  static constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 2 * 4 * (S_FLOATS + D_FLOATS);
  static_assert(WM * WN == 8 && MT >= 1 && MT * 16 * WM == BM, "tile shape");
  static_assert(BM + BN <= THREADS, "one scale row or column per thread");
};

// ---- device helpers ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// D = A * B + magic (every accumulator input the magic constant)
__device__ __forceinline__ void mma_k32(uint32_t d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMagic));
}
// f16 x f16 -> f32, D = A * B + C
__device__ __forceinline__ void mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
// 4 int8 -> two half2 (bytes 0,1 and 2,3), exact: [q ^ 0x80, 0x64] is the f16 1024 + q + 128.
__device__ __forceinline__ void i8x4_to_half2x2(uint32_t a, uint32_t& lo, uint32_t& hi) {
  const uint32_t x = a ^ 0x80808080u;
  const __half2 off = __half2half2(__ushort_as_half(0xE480u));  // -1152
  uint32_t l = prmt(x, 0x64646464u, 0x5140u), h = prmt(x, 0x64646464u, 0x7362u);
  __half2 hl, hh;
  memcpy(&hl, &l, 4), memcpy(&hh, &h, 4);
  hl = __hadd2(hl, off), hh = __hadd2(hh, off);
  memcpy(&lo, &hl, 4), memcpy(&hi, &hh, 4);
}
__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
  __half2 x, y;
  memcpy(&x, &a, 4), memcpy(&y, &b, 4);
  x = __hmul2(x, y);
  uint32_t r;
  memcpy(&r, &x, 4);
  return r;
}
__device__ __forceinline__ void mma_k16(uint32_t d[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a0), "r"(a1), "r"(b), "r"(kMagic));
}

// 4 four-bit codes (element j in bits 4j..4j+3 of x, bits 16.. zero) -> 4 signed bytes by a
// 16-entry table: pos* holds the magnitudes of the codes with bit 3 clear, neg* those with
// bit 3 set (entries < 0x80), nz* is 1 where a bit-3-set entry is nonzero (its byte is
// negative). prmt in its default mode replicates the selected byte's sign (0 here) for a
// selector nibble with bit 3 set, so each lookup yields only its own half's codes; the bytes
// pos - neg are then right except for the borrow each negative byte takes from the next,
// which + (nz << 8) returns (the nz lookup reads the selectors shifted up one byte). 6 ops.
__device__ __forceinline__ uint32_t lookup16_s8(uint32_t x, uint32_t pos0, uint32_t pos1, uint32_t neg0,
                                                uint32_t neg1, uint32_t nz0, uint32_t nz1) {
  const uint32_t xn = x ^ 0x8888u;  // the bit-3-set codes select, the others are zeroed
  const uint32_t p = prmt(pos0, pos1, x);
  const uint32_t n = prmt(neg0, neg1, xn);
  const uint32_t c = prmt(nz0, nz1, (xn << 4) | 0x8u);  // byte j + 1 from code j; byte 0: 0
  return p - n + c;  // one IADD3
}
// NVFP4: 2*e2m1, magnitudes {0,1,2,3,4,6,8,12}, bit 3 the sign.
__device__ __forceinline__ uint32_t e2m1_s8(uint32_t x) {
  return lookup16_s8(x, 0x03020100u, 0x0C080604u, 0x03020100u, 0x0C080604u, 0x01010100u, 0x01010101u);
}
// W4A8: nibble - 8 (offset binary): bit 3 clear -> -(8 - idx), set -> +idx.
__device__ __forceinline__ uint32_t w4_s8(uint32_t x) {
  // roles swapped: here the bit-3-clear codes are the negative ones
  const uint32_t xn = x ^ 0x8888u;
  const uint32_t p = prmt(0x03020100u, 0x07060504u, xn);      // bit 3 set: idx
  const uint32_t n = prmt(0x05060708u, 0x01020304u, x);       // bit 3 clear: 8 - idx (never 0)
  const uint32_t c = prmt(0x01010101u, 0x01010101u, (x << 4) | 0x8u);
  return p - n + c;
}

}  // namespace kvdeck::cuda::gemm
