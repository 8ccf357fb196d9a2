// gemm_mma_impl.cuh — device helpers of the prefill GEMM (gemm_mma.cu): cp.async, ldmatrix,
// the launch arguments and tile shapes, the mma.sync wrappers (int8 ones add the magic constant as their accumulator input), the
// signed-byte lookups of 4-bit codes and the f16 tile conversions (q8, E2M1 by bit placement). Included by gemm_mma.cu
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
  static constexpr int SC = FMT == 0 ? 4 : 2;  // 32-bit words per column and 32-block
  static constexpr int A_BYTES = BM * A_LD, B_BYTES = BN * B_LD;
  static constexpr int S_FLOATS = 2 * BN * SC, D_FLOATS = BM * 2;  // per buffer (2 buffers)
  static constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 2 * 4 * (S_FLOATS + D_FLOATS);
  static_assert(WM * WN == 8 && MT >= 1 && MT * 16 * WM == BM, "tile shape");
  static_assert(BM + BN <= THREADS, "one scale row or column per thread");
};

// NVFP4 with both tiles made f16 in shared memory once per block (kernel format 3, gemm_mma.cu):
// STG raw stages (q8 rows of 64 bytes, code rows of 32 bytes, unpadded: read as 16-byte chunks)
// and two f16 buffers of BM / BN rows of H_LD halves (144 bytes: conflict-free ldmatrix).
// Warps: 8, each MT x NT m16n8 tiles (32 columns).
template <int BM, int BN, int STG>
struct CfgH {
  static constexpr int NT = 4, WN = BN / (8 * NT), WM = 8 / WN, MT = BM / (16 * WM);
  static constexpr int A_RAW = BM * BK, B_RAW = BN * BK / 2;  // bytes per raw stage
  static constexpr int H_LD = BK + 8;                         // halves per f16 row
  static constexpr int AH = BM * H_LD, BH = BN * H_LD;        // halves per f16 buffer
  static constexpr int SMEM = STG * (A_RAW + B_RAW) + 2 * 2 * (AH + BH) + 2 * 4 * BM * 2;
  static_assert(WM * WN == 8 && WN * 8 * NT == BN && MT >= 1 && MT * 16 * WM == BM && STG >= 3, "tile shape");
};

// The weight (of up to MAXW in one launch) that blockIdx.y's tile belongs to.
struct Weight {
  const uint8_t* codes;
  const void* scales;
  float tscale;
  float* y;
  int N, ldy, t0;
};
__device__ __forceinline__ Weight weight_of(const Args& a) {
  int wi = 0;
#pragma unroll
  for (int i = 1; i < MAXW; ++i)
    if (i < a.n && int(blockIdx.y) >= a.tile0[i]) wi = i;
  Weight w{a.codes[0], a.scales[0], a.tscale[0], a.y[0], a.N[0], a.ldy[0], a.tile0[0]};
#pragma unroll
  for (int i = 1; i < MAXW; ++i)
    if (wi == i) w = Weight{a.codes[i], a.scales[i], a.tscale[i], a.y[i], a.N[i], a.ldy[i], a.tile0[i]};
  return w;
}

// The accumulators of a warp's MT x NT m16n8 tiles times ts into y (rows mrow + .., columns
// ncol + ..), column pairs as float2 where the row stride and pointer allow.
template <int MT, int NT>
__device__ __forceinline__ void store_tile(const float (&acc)[MT][NT][4], float ts, float* y, int ldy, int M, int N,
                                           int mrow, int ncol, int g, int t) {
  const bool pair = ((ldy | int(reinterpret_cast<uintptr_t>(y) >> 2)) & 1) == 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    for (int nt = 0; nt < NT; ++nt)
      for (int h = 0; h < 2; ++h) {
        const int m = mrow + mt * 16 + g + 8 * h, n = ncol + nt * 8 + 2 * t;
        if (m >= M || n >= N) continue;
        float* o = y + size_t(m) * ldy + n;
        const float v0 = acc[mt][nt][2 * h] * ts, v1 = acc[mt][nt][2 * h + 1] * ts;
        if (pair && n + 1 < N) {
          *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
        } else {
          o[0] = v0;
          if (n + 1 < N) o[1] = v1;
        }
      }
}

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

// ---- format 3's tile conversions: each 8-value group of k stored as k 0, 2, 4, 6, 1, 3, 5, 7 ----
// (the pairs e2m1_hi_bytes gives without a shuffle; the q8 rows are stored in the same order,
// so every product of the dot product is kept; only the tensor core's summation order differs)
// 8 int8 (words x: k 0-3, y: k 4-7) as 4 exact half2: [q ^ 0x80, 0x64] is the f16 1024 + q + 128.
__device__ __forceinline__ uint4 i8x8_to_h8(uint32_t x, uint32_t y) {
  const __half2 off = __half2half2(__ushort_as_half(0xE480u));  // -1152
  x ^= 0x80808080u, y ^= 0x80808080u;
  const uint32_t w[4] = {prmt(x, 0x64646464u, 0x4240u), prmt(y, 0x64646464u, 0x4240u),
                         prmt(x, 0x64646464u, 0x4341u), prmt(y, 0x64646464u, 0x4341u)};
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    memcpy(&h, &w[i], 4);
    h = __hadd2(h, off);
    memcpy(&r[i], &h, 4);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}
// An E2M1 code's bits placed in an f16 (sign to bit 15, the two exponent bits to the f16
// exponent's low two, the mantissa bit to the f16 mantissa's top) is the code's value x 2^-14
// for all 16 codes (E2M1's 0.5 is f16's subnormal 2^-15), as attention_mma_rows.cuh does it.
// 8 codes (element i in bits 4i .. 4i+3) times the half2 scale sc = (s, s) x 2^7: 4 half2 of
// value x s x 2^-7, exact (<= 6 significant bits, multiples of 2^-17, at most 21), in the order above.
__device__ __forceinline__ uint4 e2m1x8_to_h8(uint32_t w, uint32_t sc) {
  const uint32_t o = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);         // high bytes, odd codes
  const uint32_t e = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);  // even codes
  const uint32_t v[4] = {prmt(e, 0u, 0x1404u), prmt(e, 0u, 0x3424u), prmt(o, 0u, 0x1404u), prmt(o, 0u, 0x3424u)};
  return make_uint4(hmul2_u32(v[0], sc), hmul2_u32(v[1], sc), hmul2_u32(v[2], sc), hmul2_u32(v[3], sc));
}
// An E4M3 byte (bits 0-7 of b) as the half2 (s, s) x 2^7 (448 x 2^7 fits f16): placed as / 256, times 2^15.
__device__ __forceinline__ uint32_t e4m3_h2_x128(uint32_t b) {
  const uint32_t w = prmt(b, 0u, 0x4040u);  // [b, 0, b, 0]
  return hmul2_u32(((w & 0x007F007Fu) << 7) | ((w & 0x00800080u) << 8), 0x78007800u);  // 0x7800: 32768
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

namespace kvdeck::cuda::detail {
// NVFP4 on the f16 mma (kernel format 3; gemm_mma_nvfp4.cu), tile configuration cfg 0-4 as
// gemm_mma.cu's pick_cfg chooses it; tiles = blockIdx.y's extent. Called by gemm_q8_mma_config.
cudaError_t gemm_nvfp4_h_launch(int cfg, const gemm::Args& a, int tiles, cudaStream_t stream);
}  // namespace kvdeck::cuda::detail
