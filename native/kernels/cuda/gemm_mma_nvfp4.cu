// Prefill GEMM, NVFP4 on the f16 mma (kernel format 3, the default for NVFP4 weights): both
// tiles made f16 in shared memory once per block. The int8 kernels, the tile choice and the entry
// points are in gemm_mma.cu (which launches this one through detail::gemm_nvfp4_h_launch); the
// shared tile shapes, fragments and stores in gemm_mma_impl.cuh.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common.cuh"
#include "gemm_mma_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;
using namespace gemm;

namespace {

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

}  // namespace

namespace detail {
cudaError_t gemm_nvfp4_h_launch(int cfg, const gemm::Args& a, int tiles, cudaStream_t stream) {
  switch (cfg) {  // two blocks a SM: 110 KB (3 raw stages), 89, 98, 71 KB; one a SM: 122 KB
    case 0: return launch_h<128, 128, 3, 2>(a, tiles, stream);
    case 1: return launch_h<64, 128, 4, 2>(a, tiles, stream);
    case 2: return launch_h<128, 64, 4, 2>(a, tiles, stream);
    case 3: return launch_h<32, 128, 4, 2>(a, tiles, stream);
    default: return launch_h<128, 128, 4, 1>(a, tiles, stream);
  }
}
}  // namespace detail

}  // namespace kvdeck::cuda
