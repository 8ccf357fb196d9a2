// Prefill GEMM on the tensor cores: int8 mma.sync (sm_80+) over the q8 activations of
// quantize_act_q8 and the integer weight codes, the CPU's block arithmetic kept exactly; NVFP4
// on the f16 mma with both tiles made f16 in shared memory (gemm_nvfp4_h_kernel, below).
//
// Why int8 for W4A8 / W8A8 and not dequantise-to-f16: every integer format's CPU reference (gemm_scalar.cpp)
// is an exact int32 sum per block times f32 scales. The codes are integers (NVFP4: 2*e2m1 in
// int8, W4A8: nibble - 8, W8A8: the int8 code) and so are the activations, so
//   mma.sync.m16n8k16 (NVFP4, one per 16-block) / m16n8k32 (W4A8, W8A8) .s32.s8.s8.s32
// gives the block sums bit for bit; the block scales are then applied in f32 on the
// accumulator fragments. The result equals the GEMV path (and the CPU) up to f32 summation
// order (~1e-7 relative), so the whole-model bound of tests/cuda is unchanged.
//
// Where the time goes, and what this version does about it (NOTES.md, session 5):
// - The f32 work per block, not the mma, bounds the kernel: int -> float conversion (I2F) runs
//   at a quarter of the FMA rate. Here the mma's accumulator input is the magic constant
//   2^23 + 2^22, so the int32 result D reads as the float 12582912 + isum exactly (|isum| <
//   2^22), and one FFMA, fma(sw, D, -sw * 12582912), gives round(sw * isum), the same value as
//   float(isum) * sw: no I2F, no separate multiply. Then acc = fma(d_a, t, acc).
// - Weight decode in registers, few integer ops: e2m1 / W4A8 nibbles to signed int8 by three
//   byte-permute lookups (prmt's sign-replicate mode zeroes the other half's codes) and one
//   IADD3 (lookup16_s8 below). W8A8 codes are used as loaded.
// - Scales leave the inner loop: each stage's weight scales (e4m3 / f16 -> f32, with
//   -sw * magic beside them) and activation scales are converted once per block into shared
//   memory, loaded through registers one stage ahead (no extra barrier).
// - Tiles BM x BN (128 x 128, 64 x 128, 128 x 64, 32 x 128) by 64 k, 8 warps each 32 columns x
//   BM / (16 * warp rows) rows, 4-stage cp.async (16-byte copies into padded rows:
//   conflict-free ldmatrix for the activations and 16-bit weight loads), 2 blocks per SM.
//   blockIdx.x runs over M so the blocks that share a weight tile run together (one DRAM read).
// - Several weights sharing K and format (q/k/v, gate/up) in one launch (gemm_q8_mma_many).
// - NVFP4 on the f16 mma (kernel format 3, the default since session 6; KVDECK_CUDA_GEMM_NVFP4=i8
//   selects format 0, NVFP4 on the int8 mma, read at every launch). e2m1 (2 significant bits) times
//   its e4m3 block scale (4) is exact in f16, and so are the q8 activations ([q ^ 0x80, 0x64] -
//   1152), so m16n8k16.f32.f16.f16 sums each 32-block with the scales already in the weights:
//   one FFMA (d_a) per output and 32-block instead of four, as many mma as the int8 path. The
//   tensor core's f32 sums are not IEEE round-to-nearest, so the result is the CPU's to a few f32
//   ulps (bench_gemm_mma: 4.9e-7 .. 1.1e-6 relative to the GEMV chunks on the 8B shapes) rather
//   than to summation order. Session 6 converted in every warp's registers (1,474 µs an 8B layer
//   vs 1,753 on the int8 mma); session 8's kernel converts once per block into shared memory:
//   1,148 vs 1,445 µs, the 32-layer 8B prefill 12,940 vs 10,451 tok/s (interleaved, NOTES.md).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "gemm_mma_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;
using namespace gemm;

namespace {

// ================================ the kernel ================================
// FMT 0 NVFP4 (int8 mma), 1 W4A8, 2 W8A8. For weight i: y_i[m, n] (row stride ldy_i), m < M, n < N_i.
template <int FMT, int BM, int BN, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) gemm_q8_kernel(const Args args) {
  using C = Cfg<FMT, BM, BN>;
  constexpr int MT = C::MT, B_LD = C::B_LD, B_ROW = C::B_ROW, SC = C::SC;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sA = smem;
  uint8_t* sB = smem + STAGES * C::A_BYTES;
  float* sS = reinterpret_cast<float*>(sB + STAGES * C::B_BYTES);  // [2][2 kb][BN][SC]
  float* sD = sS + 2 * C::S_FLOATS;                                  // [2][BM][2 kb]

  // ---- which weight, which tile ----
  const Weight w = weight_of(args);
  const uint8_t* codes = w.codes;
  const void* scales = w.scales;
  const int N = w.N, t0 = w.t0;
  const int8_t* __restrict__ xq = args.xq;
  const float* __restrict__ xd = args.xd;
  const int M = args.M, Kp = args.Kp, group = args.group;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp / C::WN, wn = warp % C::WN;
  const int m0 = blockIdx.x * BM, n0 = (int(blockIdx.y) - t0) * BN;
  const int nb = Kp / 32, nst = (nb + 1) / 2;
  const int wrow = FMT == 2 ? Kp : Kp / 2;

  // ---- cp.async of one stage's activation and weight rows ----
  auto load = [&](int s, int buf) {
    const int k0 = s * BK;
#pragma unroll
    for (int i = 0; i < (BM * 4 + THREADS - 1) / THREADS; ++i) {
      const int idx = tid + i * THREADS, r = idx >> 2, c = idx & 3;
      if (BM * 4 % THREADS == 0 || idx < BM * 4) {
        const int kk = min(k0 + c * 16, Kp - 16);  // a tail stage's second block: loaded, not used
        cp16(sA + buf * C::A_BYTES + r * A_LD + c * 16, xq + size_t(min(m0 + r, M - 1)) * Kp + kk);
      }
    }
    constexpr int CH = B_ROW / 16;
#pragma unroll
    for (int i = 0; i < (BN * CH + THREADS - 1) / THREADS; ++i) {
      const int idx = tid + i * THREADS, r = idx / CH, c = idx % CH;
      if (BN * CH % THREADS == 0 || idx < BN * CH) {
        const int kk = min(k0 * B_ROW / BK + c * 16, wrow - 16);
        cp16(sB + buf * C::B_BYTES + r * B_LD + c * 16, codes + size_t(min(n0 + r, N - 1)) * wrow + kk);
      }
    }
  };
  // ---- scales: one stage's raw values into registers, then f32 into shared memory ----
  // Threads [0, BN): the column n0 + tid's weight scales; [BN, BN + BM): row m0 + tid - BN's d_a.
  uint32_t raw0 = 0, raw1 = 0;
  auto fetch = [&](int s) {
    if (tid < BN) {
      const int n = min(n0 + tid, N - 1);
      if (FMT == 0) {  // 4 e4m3 (16-blocks 4s .. 4s+3) as two 16-bit loads
        const int ns = Kp / 16;
        const uint8_t* r = static_cast<const uint8_t*>(scales) + size_t(n) * ns;
        raw0 = __ldg(reinterpret_cast<const uint16_t*>(r + min(4 * s, ns - 2)));
        raw1 = __ldg(reinterpret_cast<const uint16_t*>(r + min(4 * s + 2, ns - 2)));
      } else {
        const int ng = FMT == 1 ? Kp / group : nb;  // FMT 1 / 2
        const uint16_t* r = static_cast<const uint16_t*>(scales) + size_t(n) * ng;
        raw0 = __ldg(r + min(FMT == 1 ? 64 * s / group : 2 * s, ng - 1));
        raw1 = __ldg(r + min(FMT == 1 ? (64 * s + 32) / group : 2 * s + 1, ng - 1));
      }
    } else if (tid < BN + BM) {
      const float* r = xd + size_t(min(m0 + tid - BN, M - 1)) * nb;
      raw0 = __float_as_uint(__ldg(r + min(2 * s, nb - 1)));
      raw1 = __float_as_uint(__ldg(r + min(2 * s + 1, nb - 1)));
    }
  };
  auto convert = [&](int buf) {
    float* S = sS + buf * C::S_FLOATS;
    if (tid < BN) {
      if (FMT == 0) {
        float sw[4];
        sw[0] = e4m3_to_float(raw0 & 0xFFu) * 0.5f, sw[1] = e4m3_to_float(raw0 >> 8) * 0.5f;
        sw[2] = e4m3_to_float(raw1 & 0xFFu) * 0.5f, sw[3] = e4m3_to_float(raw1 >> 8) * 0.5f;
#pragma unroll
        for (int kb = 0; kb < 2; ++kb)
          *reinterpret_cast<float4*>(S + (kb * BN + tid) * SC) =
              make_float4(sw[2 * kb], sw[2 * kb + 1], -kMagicF * sw[2 * kb], -kMagicF * sw[2 * kb + 1]);
      } else {
        const float s0 = __half2float(__ushort_as_half(uint16_t(raw0)));
        const float s1 = __half2float(__ushort_as_half(uint16_t(raw1)));
        *reinterpret_cast<float2*>(S + tid * SC) = make_float2(s0, -kMagicF * s0);
        *reinterpret_cast<float2*>(S + (BN + tid) * SC) = make_float2(s1, -kMagicF * s1);
      }
    } else if (tid < BN + BM) {
      *reinterpret_cast<float2*>(sD + buf * C::D_FLOATS + (tid - BN) * 2) =
          make_float2(__uint_as_float(raw0), __uint_as_float(raw1));
    }
  };

  float acc[MT][4][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    for (int nt = 0; nt < 4; ++nt)
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  fetch(0);
  convert(0);
  if (nst > 1) fetch(1);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nst) load(s, s);
    cp_commit();
  }
  const int rbase = wm * MT * 16, cbase = wn * 32;
  for (int it = 0; it < nst; ++it) {
    cp_wait<STAGES - 2>();
    __syncthreads();
    if (it + STAGES - 1 < nst) load(it + STAGES - 1, (it + STAGES - 1) % STAGES);
    cp_commit();
    if (it + 1 < nst) convert((it + 1) & 1);
    if (it + 2 < nst) fetch(it + 2);
    const uint8_t* A = sA + (it % STAGES) * C::A_BYTES;
    const uint8_t* B = sB + (it % STAGES) * C::B_BYTES;
    const float* S = sS + (it & 1) * C::S_FLOATS;
    const float* D = sD + (it & 1) * C::D_FLOATS;
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
      if (it * 2 + kb >= nb) break;  // the tail stage's second block
      uint32_t a[MT][4];
      float da[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        ldsm_x4(a[mt], A + (rbase + mt * 16 + (lane & 15)) * A_LD + kb * 32 + (lane >> 4) * 16);
        da[mt][0] = D[(rbase + mt * 16 + g) * 2 + kb];
        da[mt][1] = D[(rbase + mt * 16 + g + 8) * 2 + kb];
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = cbase + nt * 8;
        const uint8_t* p = B + (col + g) * B_LD;
        uint32_t b0, b1;  // k 4t..4t+3 and 16+4t..16+4t+3 of this 32-block, column col + g
        if (FMT == 2) {
          b0 = *reinterpret_cast<const uint32_t*>(p + kb * 32 + 4 * t);
          b1 = *reinterpret_cast<const uint32_t*>(p + kb * 32 + 16 + 4 * t);
        } else {
          const uint32_t x0 = *reinterpret_cast<const uint16_t*>(p + kb * 16 + 2 * t);
          const uint32_t x1 = *reinterpret_cast<const uint16_t*>(p + kb * 16 + 8 + 2 * t);
          b0 = FMT == 0 ? e2m1_s8(x0) : w4_s8(x0);
          b1 = FMT == 0 ? e2m1_s8(x1) : w4_s8(x1);
        }
        // the scales of this thread's output columns col + 2t and col + 2t + 1
        const float* sp = S + (kb * BN + col + 2 * t) * SC;
        if (FMT == 0) {
          const float4 h0 = *reinterpret_cast<const float4*>(sp);       // sw 16-block 0, 1, -sw*magic 0, 1
          const float4 h1 = *reinterpret_cast<const float4*>(sp + SC);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t d0[4], d1[4];
            mma_k16(d0, a[mt][0], a[mt][1], b0);
            mma_k16(d1, a[mt][2], a[mt][3], b1);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float4& h = (e & 1) ? h1 : h0;
              const float x0 = fmaf(h.x, __uint_as_float(d0[e]), h.z);  // round(sw0 * isum0)
              const float x1 = fmaf(h.y, __uint_as_float(d1[e]), h.w);
              acc[mt][nt][e] = fmaf(da[mt][e >> 1], x0 + x1, acc[mt][nt][e]);
            }
          }
        } else {
          const float4 h = *reinterpret_cast<const float4*>(sp);  // sw, -sw*magic of both columns
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t d[4];
            mma_k32(d, a[mt], b0, b1);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float x = (e & 1) ? fmaf(h.z, __uint_as_float(d[e]), h.w) : fmaf(h.x, __uint_as_float(d[e]), h.y);
              acc[mt][nt][e] = fmaf(da[mt][e >> 1], x, acc[mt][nt][e]);
            }
          }
        }
      }
    }
  }
  cp_wait<0>();
  store_tile<MT, 4>(acc, FMT == 0 ? w.tscale : 1.0f, w.y, w.ldy, M, N, m0 + rbase, n0 + cbase, g, t);
}

// ===================== NVFP4 on the f16 mma, tiles made f16 once per block =====================
// Kernel format 3. Session 6's version converted in every warp: each q8 value once per column
// warp (4 of them at BN 128) and each weight code once per row warp, the conversion on the path
// from the stage barrier to the mma (ncu: ~0.5 issued instructions a cycle per scheduler, PRMT /
// LOP3 the largest share). Here the block converts stage s + 1 (the raw cp.async stage: q8 rows,
// code rows) into an f16 buffer (q8 as is; codes by bit placement times the block scale, value x
// scale x 2^-7, exact; 2^7 returned in the store) while its warps run stage s's mma from the
// other f16 buffer: one barrier a stage, ldmatrix for both operands, no conversion between the
// barrier and the mma, ~0.6x the instructions. Both tiles store each 8-value group of k in the
// same order (gemm_mma_impl.cuh), so the products are session 6's; the tensor core's f32
// summation order differs (a few ulps). Threads: A chunks of 16 q8 (BM * 4), B items of 32 codes
// (BN * 2: a column's half of the stage, one 16-bit scale load), d_a rows (BM). The shared
// memory pipe is now the busiest unit (ncu, gate/up at two blocks a SM: L1 83% of peak).
template <int BM, int BN, int STG, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) gemm_nvfp4_h_kernel(const Args args) {
  using C = CfgH<BM, BN, STG>;
  constexpr int MT = C::MT, NT = C::NT, H_LD = C::H_LD;
  constexpr int ACH = (BM * 4 + THREADS - 1) / THREADS, BCH = (BN * 2 + THREADS - 1) / THREADS;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* rA = smem;                                                   // [STG][BM][64] q8
  uint8_t* rB = rA + STG * C::A_RAW;                                    // [STG][BN][32] codes
  __half* hA = reinterpret_cast<__half*>(rB + STG * C::B_RAW);          // [2][BM][H_LD]
  __half* hB = hA + 2 * C::AH;                                          // [2][BN][H_LD]
  float* sD = reinterpret_cast<float*>(hB + 2 * C::BH);                 // [2][BM][2 kb]

  const Weight w = weight_of(args);
  const int8_t* __restrict__ xq = args.xq;
  const float* __restrict__ xd = args.xd;
  const int M = args.M, Kp = args.Kp, N = w.N;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp / C::WN, wn = warp % C::WN;
  const int m0 = blockIdx.x * BM, n0 = (int(blockIdx.y) - w.t0) * BN;
  const int nb = Kp / 32, nst = (nb + 1) / 2, wrow = Kp / 2, ns = Kp / 16;

  auto load = [&](int s, int buf) {  // cp.async of one raw stage
    const int k0 = s * BK;
#pragma unroll
    for (int i = 0; i < ACH; ++i) {
      const int idx = tid + i * THREADS, r = idx >> 2, c = idx & 3;
      if (BM * 4 % THREADS == 0 || idx < BM * 4)
        cp16(rA + buf * C::A_RAW + r * BK + c * 16, xq + size_t(min(m0 + r, M - 1)) * Kp + min(k0 + c * 16, Kp - 16));
    }
#pragma unroll
    for (int i = 0; i < BCH; ++i) {
      const int idx = tid + i * THREADS, r = idx >> 1, c = idx & 1;
      if (BN * 2 % THREADS == 0 || idx < BN * 2)
        cp16(rB + buf * C::B_RAW + r * (BK / 2) + c * 16,
             w.codes + size_t(min(n0 + r, N - 1)) * wrow + min(k0 / 2 + c * 16, wrow - 16));
    }
  };
  // scales one stage ahead in registers: the B items' two e4m3 bytes, the d_a rows' two floats
  uint32_t rs[BCH];
  float2 rd = make_float2(0.0f, 0.0f);
  auto fetch = [&](int s) {
#pragma unroll
    for (int i = 0; i < BCH; ++i) {
      const int idx = tid + i * THREADS, r = idx >> 1, c = idx & 1;
      const uint8_t* p = static_cast<const uint8_t*>(w.scales) + size_t(min(n0 + r, N - 1)) * ns;
      rs[i] = __ldg(reinterpret_cast<const uint16_t*>(p + min(4 * s + 2 * c, ns - 2)));
    }
    if (tid < BM) {
      const float* r = xd + size_t(min(m0 + tid, M - 1)) * nb;
      rd = make_float2(__ldg(r + min(2 * s, nb - 1)), __ldg(r + min(2 * s + 1, nb - 1)));
    }
  };
  // raw buffer rb -> f16 buffer hb (and the fetched scales -> sD[hb]); the raw words are read
  // first (read_a, read_b), converted and stored after the next k-block's mma (put_a, put_b), so
  // that their shared-memory latency overlaps it (and only one tile's words are live at a time:
  // 128 registers at two blocks a SM)
  uint4 va[ACH], vb[BCH];
  auto read_a = [&](int rb) {
#pragma unroll
    for (int i = 0; i < ACH; ++i) {
      const int idx = tid + i * THREADS;
      if (BM * 4 % THREADS == 0 || idx < BM * 4)
        va[i] = *reinterpret_cast<const uint4*>(rA + rb * C::A_RAW + (idx >> 2) * BK + (idx & 3) * 16);
    }
  };
  auto read_b = [&](int rb) {
#pragma unroll
    for (int i = 0; i < BCH; ++i) {
      const int idx = tid + i * THREADS;
      if (BN * 2 % THREADS == 0 || idx < BN * 2)
        vb[i] = *reinterpret_cast<const uint4*>(rB + rb * C::B_RAW + (idx >> 1) * (BK / 2) + (idx & 1) * 16);
    }
  };
  auto put_a = [&](int hb) {
#pragma unroll
    for (int i = 0; i < ACH; ++i) {
      const int idx = tid + i * THREADS;
      if (BM * 4 % THREADS == 0 || idx < BM * 4) {
        uint4* o = reinterpret_cast<uint4*>(hA + hb * C::AH + (idx >> 2) * H_LD + (idx & 3) * 16);
        o[0] = i8x8_to_h8(va[i].x, va[i].y);
        o[1] = i8x8_to_h8(va[i].z, va[i].w);
      }
    }
    if (tid < BM) *reinterpret_cast<float2*>(sD + hb * BM * 2 + tid * 2) = rd;
  };
  auto put_b = [&](int hb) {
#pragma unroll
    for (int i = 0; i < BCH; ++i) {
      const int idx = tid + i * THREADS;
      if (BN * 2 % THREADS == 0 || idx < BN * 2) {
        uint4* o = reinterpret_cast<uint4*>(hB + hb * C::BH + (idx >> 1) * H_LD + (idx & 1) * 32);
        const uint32_t s0 = e4m3_h2_x128(rs[i] & 0xFFu), s1 = e4m3_h2_x128(rs[i] >> 8);
        o[0] = e2m1x8_to_h8(vb[i].x, s0);
        o[1] = e2m1x8_to_h8(vb[i].y, s0);
        o[2] = e2m1x8_to_h8(vb[i].z, s1);
        o[3] = e2m1x8_to_h8(vb[i].w, s1);
      }
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    for (int nt = 0; nt < NT; ++nt)
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  const int rbase = wm * MT * 16, cbase = wn * NT * 8;
  // one k-block (32 values) of f16 buffer hb: per column tile one ldmatrix (both 16-halves' B
  // fragments), per row tile two; two mma per 32-block, then d_a in f32
  auto mma_kb = [&](int hb, int kb) {
    const __half* A = hA + hb * C::AH + kb * 32;
    const __half* B = hB + hb * C::BH + kb * 32;
    const float* D = sD + hb * BM * 2 + kb;
    uint32_t b[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) ldsm_x4(b[nt], B + (cbase + nt * 8 + (lane & 7)) * H_LD + (lane >> 3) * 8);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t a0[4], a1[4];
      const __half* ar = A + (rbase + mt * 16 + (lane & 15)) * H_LD + (lane >> 4) * 8;
      ldsm_x4(a0, ar);
      ldsm_x4(a1, ar + 16);
      const float d0 = D[(rbase + mt * 16 + g) * 2], d1 = D[(rbase + mt * 16 + g + 8) * 2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float c[4];
        mma_f16(c, a0, b[nt][0], b[nt][1], z);
        mma_f16(c, a1, b[nt][2], b[nt][3], c);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = fmaf(e < 2 ? d0 : d1, c[e], acc[mt][nt][e]);
      }
    }
  };

  fetch(0);
#pragma unroll
  for (int s = 0; s < STG - 1; ++s) {
    if (s < nst) load(s, s);
    cp_commit();
  }
  cp_wait<STG - 2>();  // stage 0
  __syncthreads();
  read_a(0);
  read_b(0);
  put_a(0);
  put_b(0);
  if (nst > 1) fetch(1);
  for (int it = 0; it < nst; ++it) {
    cp_wait<STG - 3>();  // stage it + 1 (this thread's copies), then everyone's; f16 buffer it & 1 complete
    __syncthreads();
    if (it + STG - 1 < nst) load(it + STG - 1, (it + STG - 1) % STG);
    cp_commit();
    // stage it + 1 into f16 buffer (it + 1) & 1 (past the last stage: stale bytes into a buffer never read)
    const int hb = it & 1;
    read_a((it + 1) % STG);
    mma_kb(hb, 0);
    put_a(hb ^ 1);
    read_b((it + 1) % STG);
    if (it * 2 + 1 < nb) mma_kb(hb, 1);  // a tail stage has one 32-block
    put_b(hb ^ 1);
    if (it + 2 < nst) fetch(it + 2);
  }
  cp_wait<0>();
  store_tile<MT, NT>(acc, w.tscale * 128.0f, w.y, w.ldy, M, N, m0 + rbase, n0 + cbase, g, t);
}

// ================================ launch ================================
template <int FMT, int BM, int BN, int MINB = 2>
cudaError_t launch(const Args& a, int tiles, cudaStream_t stream) {
  constexpr int smem = Cfg<FMT, BM, BN>::SMEM;
  static bool ready = false;  // raise the dynamic shared-memory limit once per instantiation
  if (!ready) {
    const cudaError_t e =
        cudaFuncSetAttribute(gemm_q8_kernel<FMT, BM, BN, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    ready = true;
  }
  const dim3 grid((a.M + BM - 1) / BM, tiles);
  gemm_q8_kernel<FMT, BM, BN, MINB><<<grid, THREADS, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int FMT>
cudaError_t launch_cfg(int cfg, const Args& a, int tiles, cudaStream_t stream) {
  switch (cfg) {
    case 0: return launch<FMT, 128, 128>(a, tiles, stream);
    case 1: return launch<FMT, 64, 128>(a, tiles, stream);
    case 2: return launch<FMT, 128, 64>(a, tiles, stream);
    case 3: return launch<FMT, 32, 128>(a, tiles, stream);
    default: return launch<FMT, 128, 128, 1>(a, tiles, stream);  // 4: one block per SM, no register cap
  }
}

template <int BM, int BN, int STG, int MINB>
cudaError_t launch_h(const Args& a, int tiles, cudaStream_t stream) {
  constexpr int smem = CfgH<BM, BN, STG>::SMEM;
  static bool ready = false;
  if (!ready) {
    const cudaError_t e =
        cudaFuncSetAttribute(gemm_nvfp4_h_kernel<BM, BN, STG, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    ready = true;
  }
  const dim3 grid((a.M + BM - 1) / BM, tiles);
  gemm_nvfp4_h_kernel<BM, BN, STG, MINB><<<grid, THREADS, smem, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_cfg_h(int cfg, const Args& a, int tiles, cudaStream_t stream) {
  switch (cfg) {  // two blocks a SM: 110 KB (3 raw stages), 89, 98, 71 KB; one a SM: 122 KB
    case 0: return launch_h<128, 128, 3, 2>(a, tiles, stream);
    case 1: return launch_h<64, 128, 4, 2>(a, tiles, stream);
    case 2: return launch_h<128, 64, 4, 2>(a, tiles, stream);
    case 3: return launch_h<32, 128, 4, 2>(a, tiles, stream);
    default: return launch_h<128, 128, 4, 1>(a, tiles, stream);
  }
}

int sm_count() {
  static int n = 0;
  if (!n) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) n = 1;
  }
  return n;
}

// The tile shape for an M x (sum of N) problem, by the H200 sweep (NOTES.md, session 5): 128 x
// 128 with one block per SM (no register cap) where its blocks fill one wave (o, down at 512
// tokens) or many (gate/up, lm_head); 64 x 128 (two per SM) in between (q/k/v: 1.45 waves) and
// for 33-64 tokens; 32 x 128 for fewer.
// NVFP4 on the f16 mma (format 3) keeps two blocks per SM where there are many waves (gate/up
// 563.7 vs 657.5 µs at 512 tokens; session 8 sweep, which confirmed the other picks too).
int pick_cfg(int fmt, int M, int tiles128) {
  const int sms = sm_count();
  if (M <= 32) return 3;
  if (M <= 64) return 1;
  const int b = (M + 127) / 128 * tiles128;
  if (10 * b >= 9 * sms && b <= sms) return 4;
  if (b >= 4 * sms) return fmt == 3 ? 0 : 4;
  return 1;
}

}  // namespace

namespace detail {
cudaError_t gemm_q8_mma_config(int cfg, int fmt, const GemmQ8Weight* w, int n, int group, int Kp, const int8_t* xq,
                               const float* xd, int M, cudaStream_t stream) {
  if (fmt < 0 || fmt > 3 || n < 1 || n > MAXW || M < 1 || Kp < 32 || Kp % 32 ||
      (fmt == 1 && (group < 32 || group % 32 || Kp % group)) || reinterpret_cast<uintptr_t>(xq) % 16 || Kp % 16)
    return cudaErrorInvalidValue;
  Args a{};
  a.xq = xq, a.xd = xd, a.M = M, a.Kp = Kp, a.group = group, a.n = n;
  for (int i = 0; i < n; ++i) {
    if (w[i].N < 1 || !w[i].codes || !w[i].scales || !w[i].y || w[i].ldy < w[i].N ||
        reinterpret_cast<uintptr_t>(w[i].codes) % 16 || reinterpret_cast<uintptr_t>(w[i].scales) % 2)
      return cudaErrorInvalidValue;
    a.codes[i] = w[i].codes, a.scales[i] = w[i].scales, a.tscale[i] = w[i].tscale, a.N[i] = w[i].N;
    a.y[i] = w[i].y, a.ldy[i] = w[i].ldy;
  }
  if (cfg > 4) return cudaErrorInvalidValue;
  if (cfg < 0) {
    int t128 = 0;
    for (int i = 0; i < n; ++i) t128 += (w[i].N + 127) / 128;
    cfg = pick_cfg(fmt, M, t128);
  }
  const int bn = cfg == 2 ? 64 : 128;  // every other shape is 128 outputs wide
  int tile = 0;
  for (int i = 0; i < n; ++i) a.tile0[i] = tile, tile += (w[i].N + bn - 1) / bn;
  for (int i = n; i <= MAXW; ++i) a.tile0[i] = tile;
  if (tile > 65535) return cudaErrorInvalidValue;
  switch (fmt) {
    case 0: return launch_cfg<0>(cfg, a, tile, stream);
    case 1: return launch_cfg<1>(cfg, a, tile, stream);
    case 2: return launch_cfg<2>(cfg, a, tile, stream);
    default: return launch_cfg_h(cfg, a, tile, stream);
  }
}
}  // namespace detail

cudaError_t gemm_q8_mma_many(int fmt, const GemmQ8Weight* w, int n, int group, int Kp, const int8_t* xq,
                             const float* xd, int M, cudaStream_t stream) {
  // NVFP4 on the f16 mma (kernel format 3) by default; KVDECK_CUDA_GEMM_NVFP4=i8: on the int8
  // mma (format 0; read at every call, so one process can time both: bench gpu)
  if (fmt < 0 || fmt > 2) return cudaErrorInvalidValue;
  const char* nv = std::getenv("KVDECK_CUDA_GEMM_NVFP4");
  const int kf = fmt == 0 && !(nv && std::strcmp(nv, "i8") == 0) ? 3 : fmt;
  return detail::gemm_q8_mma_config(-1, kf, w, n, group, Kp, xq, xd, M, stream);
}

cudaError_t gemm_q8_mma(int fmt, const uint8_t* codes, const void* scales, float tscale, int group, int N, int Kp,
                        const int8_t* xq, const float* xd, int M, float* y, int ldy, cudaStream_t stream) {
  const GemmQ8Weight w{codes, scales, tscale, N, y, ldy};
  return gemm_q8_mma_many(fmt, &w, 1, group, Kp, xq, xd, M, stream);
}

}  // namespace kvdeck::cuda
