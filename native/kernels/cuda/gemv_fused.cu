// gemv_fused.cu — batch-1 GEMV with the activation quantisation fused in (one kernel instead of
// quantize_act_q8 + GEMV). Contracts: kernels_cuda.h (gemv_*_q8fused).
//
// A persistent grid (at most 2 blocks of 16 warps per SM, all resident): each block first loads its warps'
// first weight chunks (before waiting on the producer of x, under PDL), then quantises x into
// shared memory with the CPU's quantize_act_q8 arithmetic (bit-identical), then every warp
// streams its rows (row = block * 16 + warp, stride grid * 16) as one sequence of steps across
// row boundaries, the next step's weights always in flight. Measured slower than the two-kernel
// path on the H200 (NOTES.md): the per-block quantisation loop is serial before any row starts.
#include <cstdint>

#include "common.cuh"
#include "gemv_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;
using namespace detail::gemv;

namespace {

constexpr int kFusedWarps = 16;
constexpr int kFusedU = 2;  // chunks per lane per step

template <Fmt F>
__global__ void __launch_bounds__(kFusedWarps * 32, 2)
gemv_fused_kernel(const GemvArgs a, const float* __restrict__ x, int K) {
  __shared__ __align__(16) int8_t sq[kFusedMaxKp];
  __shared__ float sd[kFusedMaxKp / 32];
  __shared__ int32_t ss[kFusedMaxKp / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nc = a.Kp / 32;
  const int stride = gridDim.x * kFusedWarps, row0 = blockIdx.x * kFusedWarps + warp;
  const int steps_per_row = (nc + 32 * kFusedU - 1) / (32 * kFusedU);
  const int rows = row0 < a.N ? (a.N - 1 - row0) / stride + 1 : 0;
  const int steps = rows * steps_per_row;
  pdl_launch_dependents();
  // step s: row row0 + (s / steps_per_row) * stride, chunks lane + 32 (U (s % spr) + u)
  auto load = [&](int st, Chunk<F> (&w)[kFusedU]) {
    const int n = row0 + (st / steps_per_row) * stride, c0 = lane + 32 * kFusedU * (st % steps_per_row);
#pragma unroll
    for (int u = 0; u < kFusedU; ++u) w[u] = load_chunk<F>(a, n, min(c0 + 32 * u, nc - 1));
  };
  Chunk<F> wk[kFusedU], wn[kFusedU];
  if (steps > 0) load(0, wk);
  pdl_wait();  // x is the previous kernel's output
  // quantise x into shared memory: warp w takes 32-blocks w, w + 16, ...
  for (int b = warp; b < nc; b += kFusedWarps) {
    const int k = b * 32 + lane;
    const float v = k < K ? x[k] : 0.0f;
    const float amax = warp_max(fabsf(v));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int qi = k < K ? int(fmaxf(-127.0f, fminf(127.0f, rintf(v * id)))) : 0;
    sq[k] = int8_t(qi);
    const int sum = warp_sum_int(qi);
    if (lane == 0) sd[b] = amax / 127.0f, ss[b] = sum;
  }
  __syncthreads();
  float acc = 0.0f;
  for (int st = 0; st < steps; ++st) {
    if (st + 1 < steps) load(st + 1, wn);
    const int c0 = lane + 32 * kFusedU * (st % steps_per_row);
#pragma unroll
    for (int u = 0; u < kFusedU; ++u) {
      const int c = c0 + 32 * u;
      if (c >= nc) break;
      Act<F> xa;
      xa.v[0] = *reinterpret_cast<const uint4*>(sq + 32 * c);
      xa.v[1] = *reinterpret_cast<const uint4*>(sq + 32 * c + 16);
      xa.d = sd[c];
      xa.s = ss[c];
      acc = dot<F>(decode<F>(wk[u]), xa, acc);
    }
#pragma unroll
    for (int u = 0; u < kFusedU; ++u) wk[u] = wn[u];
    if (st % steps_per_row == steps_per_row - 1) {  // the row is complete
      const float v = warp_sum(acc);
      const int n = row0 + (st / steps_per_row) * stride;
      const float scale = F == Fmt::W4a8 ? 1.0f : a.tscale * 128.0f;
      if (lane == 0) a.y[n] = v * scale;
      acc = 0.0f;
    }
  }
}

int fused_grid(int N) {
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      sms = 16;
  }
  const int blocks = (N + kFusedWarps - 1) / kFusedWarps;
  return blocks < 2 * sms ? blocks : 2 * sms;  // 2 blocks of 16 warps per SM are resident
}

bool fused_ok(int N, int K, int Kp) {
  return N >= 1 && K >= 1 && Kp % 32 == 0 && Kp >= K && Kp - K < 32 && Kp <= kFusedMaxKp;
}

}  // namespace

cudaError_t gemv_nvfp4_q8fused(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int K,
                               int Kp, const float* x, float* y, cudaStream_t stream, bool pdl) {
  if (!fused_ok(N, K, Kp)) return cudaErrorInvalidValue;
  const GemvArgs a{codes, scales, tscale, 16, N, Kp, nullptr, nullptr, nullptr, nullptr, y, N};
  return launch_kernel(gemv_fused_kernel<Fmt::Nvfp4PosNeg>, dim3(fused_grid(N)), dim3(kFusedWarps * 32), stream,
                       pdl, a, x, K);
}

cudaError_t gemv_w4a8_q8fused(const uint8_t* codes, const uint16_t* scales, int group, int N, int K, int Kp,
                              const float* x, float* y, cudaStream_t stream, bool pdl) {
  if (!fused_ok(N, K, Kp) || group < 32 || group % 32 != 0 || Kp % group != 0) return cudaErrorInvalidValue;
  const GemvArgs a{codes, scales, 1.0f, group, N, Kp, nullptr, nullptr, nullptr, nullptr, y, N};
  return launch_kernel(gemv_fused_kernel<Fmt::W4a8>, dim3(fused_grid(N)), dim3(kFusedWarps * 32), stream, pdl,
                       a, x, K);
}

}  // namespace kvdeck::cuda
