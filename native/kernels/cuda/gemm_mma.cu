// Prefill GEMM on the tensor cores: int8 mma.sync (sm_80+) over the q8 activations of
// quantize_act_q8 and the integer weight codes, the CPU's block arithmetic kept exactly; NVFP4
// on the f16 mma with both tiles made f16 in shared memory (gemm_nvfp4_h_kernel, gemm_mma_nvfp4.cu).
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
    default: return gemm_nvfp4_h_launch(cfg, a, tile, stream);  // gemm_mma_nvfp4.cu
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
