// gemv.cu — decode-time linear layers on the GPU: activation quantisation and GEMV for
// NVFP4 (integer and f16 variants) and W4A8, batch 1..8. Contracts: kernels_cuda.h.
//
// Mapping: a block of kThreads threads owns R weight rows; each thread walks the 32-element
// chunks of K (16 code bytes, one 16-byte load per row) with a stride of kThreads, so a warp
// reads 512 contiguous code bytes of each row per step and every weight byte is read once.
// The chunk's activations (M rows x 32 int8 / f16) are loaded once and reused for the R
// rows. Partial sums are reduced across the warp by shuffles and across warps in shared
// memory. Memory-bound by design: the weight bytes are the cost.
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// =====================================================================================
// Activation quantisation (one warp per 32-block)
// =====================================================================================

__global__ void quantize_act_q8_kernel(const float* __restrict__ x, int M, int K, int Kp,
                                       int8_t* __restrict__ q, float* __restrict__ d,
                                       int32_t* __restrict__ s) {
  const int nb = Kp / 32;
  const int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // global 32-block index
  if (blk >= M * nb) return;
  const int lane = threadIdx.x & 31, m = blk / nb, k = (blk % nb) * 32 + lane;
  const float v = k < K ? x[size_t(m) * K + k] : 0.0f;
  const float amax = warp_max(fabsf(v));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int qi = k < K ? int(fmaxf(-127.0f, fminf(127.0f, rintf(v * id)))) : 0;
  q[size_t(m) * Kp + k] = int8_t(qi);
  const int sum = warp_sum_int(qi);
  if (lane == 0) {
    d[blk] = amax / 127.0f;
    s[blk] = sum;
  }
}

__global__ void convert_act_f16_kernel(const float* __restrict__ x, int M, int K, int Kp,
                                       __half* __restrict__ h) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(M) * Kp) return;
  const int m = int(i / Kp), k = int(i % Kp);
  h[i] = __float2half_rn(k < K ? x[size_t(m) * K + k] : 0.0f);
}

// =====================================================================================
// Shared reduction: acc[r][m] of every thread -> y[m, n0 + r]
// =====================================================================================

template <int M, int R>
__device__ __forceinline__ void reduce_store(float (&acc)[R][M], float scale, int n0, int N,
                                             float* __restrict__ y, int ldy) {
  __shared__ float part[kWarps][R * M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == 0) part[warp][r * M + m] = v;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < R * M; i += kThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += part[w][i];
    const int r = i / M, m = i % M;
    if (n0 + r < N) y[size_t(m) * ldy + n0 + r] = v * scale;
  }
}

// =====================================================================================
// NVFP4 x int8 (__dp4a)
// =====================================================================================

template <int M, int R>
__global__ void __launch_bounds__(kThreads)
gemv_nvfp4_dp4a_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                       float tscale, int N, int Kp, const int8_t* __restrict__ xq,
                       const float* __restrict__ xd, float* __restrict__ y, int ldy) {
  const int n0 = blockIdx.x * R, nc = Kp / 32;
  float acc[R][M] = {};
  for (int c = threadIdx.x; c < nc; c += kThreads) {
    uint4 w[R];
    uint32_t sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = min(n0 + r, N - 1);  // rows past N recompute row N-1 (not stored)
      w[r] = __ldg(reinterpret_cast<const uint4*>(codes + size_t(n) * (Kp / 2)) + c);
      sc[r] = __ldg(reinterpret_cast<const uint16_t*>(scales + size_t(n) * (Kp / 16)) + c);
    }
    int4 a[M][2];
    float da[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int4* xa = reinterpret_cast<const int4*>(xq + size_t(m) * Kp) + 2 * c;
      a[m][0] = __ldg(xa);
      a[m][1] = __ldg(xa + 1);
      da[m] = __ldg(xd + size_t(m) * nc + c);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t wi[8];
      e2m1x8_to_i8x2(w[r].x, wi[0], wi[1]);
      e2m1x8_to_i8x2(w[r].y, wi[2], wi[3]);
      e2m1x8_to_i8x2(w[r].z, wi[4], wi[5]);
      e2m1x8_to_i8x2(w[r].w, wi[6], wi[7]);
      const float2 sw = e4m3x2_to_float2_div256(sc[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        int s0 = __dp4a(int(wi[0]), a[m][0].x, 0);
        s0 = __dp4a(int(wi[1]), a[m][0].y, s0);
        s0 = __dp4a(int(wi[2]), a[m][0].z, s0);
        s0 = __dp4a(int(wi[3]), a[m][0].w, s0);
        int s1 = __dp4a(int(wi[4]), a[m][1].x, 0);
        s1 = __dp4a(int(wi[5]), a[m][1].y, s1);
        s1 = __dp4a(int(wi[6]), a[m][1].z, s1);
        s1 = __dp4a(int(wi[7]), a[m][1].w, s1);
        acc[r][m] = fmaf(da[m], fmaf(sw.x, float(s0), sw.y * float(s1)), acc[r][m]);
      }
    }
  }
  // 2*e2m1 codes (x0.5) and scales / 256 (x256): x128 with the tensor scale.
  reduce_store<M, R>(acc, tscale * 128.0f, n0, N, y, ldy);
}

// =====================================================================================
// NVFP4 x f16 (half2 FMA per 16-block)
// =====================================================================================

template <int M, int R>
__global__ void __launch_bounds__(kThreads)
gemv_nvfp4_f16_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                      float tscale, int N, int Kp, const __half* __restrict__ xh,
                      float* __restrict__ y, int ldy) {
  const int n0 = blockIdx.x * R, nc = Kp / 32;
  float acc[R][M] = {};
  for (int c = threadIdx.x; c < nc; c += kThreads) {
    uint4 w[R];
    uint32_t sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = min(n0 + r, N - 1);
      w[r] = __ldg(reinterpret_cast<const uint4*>(codes + size_t(n) * (Kp / 2)) + c);
      sc[r] = __ldg(reinterpret_cast<const uint16_t*>(scales + size_t(n) * (Kp / 16)) + c);
    }
    uint4 a[M][4];  // 32 halves per row
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4* xa = reinterpret_cast<const uint4*>(xh + size_t(m) * Kp) + 4 * c;
#pragma unroll
      for (int j = 0; j < 4; ++j) a[m][j] = __ldg(xa + j);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t h[16];
      e2m1x8_to_half2x4(w[r].x, h + 0);
      e2m1x8_to_half2x4(w[r].y, h + 4);
      e2m1x8_to_half2x4(w[r].z, h + 8);
      e2m1x8_to_half2x4(w[r].w, h + 12);
      const float2 sw = e4m3x2_to_float2_div256(sc[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint32_t* av = reinterpret_cast<const uint32_t*>(&a[m][0]);
        __half2 b0 = __float2half2_rn(0.0f), b1 = b0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          b0 = __hfma2(*reinterpret_cast<const __half2*>(&h[j]),
                       *reinterpret_cast<const __half2*>(&av[j]), b0);
          b1 = __hfma2(*reinterpret_cast<const __half2*>(&h[8 + j]),
                       *reinterpret_cast<const __half2*>(&av[8 + j]), b1);
        }
        const float2 f0 = __half22float2(b0), f1 = __half22float2(b1);
        acc[r][m] = fmaf(sw.x, f0.x + f0.y, fmaf(sw.y, f1.x + f1.y, acc[r][m]));
      }
    }
  }
  reduce_store<M, R>(acc, tscale * 256.0f, n0, N, y, ldy);
}

// =====================================================================================
// W4A8 x int8 (__dp4a)
// =====================================================================================

template <int M, int R>
__global__ void __launch_bounds__(kThreads)
gemv_w4a8_kernel(const uint8_t* __restrict__ codes, const __half* __restrict__ scales, int group,
                 int N, int Kp, const int8_t* __restrict__ xq, const float* __restrict__ xd,
                 const int32_t* __restrict__ xs, float* __restrict__ y, int ldy) {
  const int n0 = blockIdx.x * R, nc = Kp / 32, ng = Kp / group, cpg = group / 32;
  float acc[R][M] = {};
  for (int c = threadIdx.x; c < nc; c += kThreads) {
    uint4 w[R];
    float sw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = min(n0 + r, N - 1);
      w[r] = __ldg(reinterpret_cast<const uint4*>(codes + size_t(n) * (Kp / 2)) + c);
      sw[r] = __half2float(__ldg(scales + size_t(n) * ng + c / cpg));
    }
    int4 a[M][2];
    float da[M];
    int sa[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int4* xa = reinterpret_cast<const int4*>(xq + size_t(m) * Kp) + 2 * c;
      a[m][0] = __ldg(xa);
      a[m][1] = __ldg(xa + 1);
      da[m] = __ldg(xd + size_t(m) * nc + c);
      sa[m] = __ldg(xs + size_t(m) * nc + c);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t wq[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
      uint32_t wi[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = wq[j] & 0x0F0F0F0Fu, hi = (wq[j] >> 4) & 0x0F0F0F0Fu;
        wi[2 * j] = prmt(lo, hi, 0x5140u);      // elements 8j .. 8j+3
        wi[2 * j + 1] = prmt(lo, hi, 0x7362u);  // elements 8j+4 .. 8j+7
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        int s = -8 * sa[m];
        s = __dp4a(int(wi[0]), a[m][0].x, s);
        s = __dp4a(int(wi[1]), a[m][0].y, s);
        s = __dp4a(int(wi[2]), a[m][0].z, s);
        s = __dp4a(int(wi[3]), a[m][0].w, s);
        s = __dp4a(int(wi[4]), a[m][1].x, s);
        s = __dp4a(int(wi[5]), a[m][1].y, s);
        s = __dp4a(int(wi[6]), a[m][1].z, s);
        s = __dp4a(int(wi[7]), a[m][1].w, s);
        acc[r][m] = fmaf(da[m] * sw[r], float(s), acc[r][m]);
      }
    }
  }
  reduce_store<M, R>(acc, 1.0f, n0, N, y, ldy);
}

// =====================================================================================
// Dispatch over M (1..8) with R rows per block
// =====================================================================================

constexpr int rows_for(int M) { return M <= 2 ? 4 : 2; }

bool shape_ok(int N, int Kp, int M, int ldy) {
  return N >= 1 && Kp >= 32 && Kp % 32 == 0 && M >= 1 && M <= 8 && ldy >= N;
}

template <template <int, int> class Launch, typename... A>
cudaError_t dispatch_m(int M, int N, cudaStream_t st, A... args) {
  switch (M) {
    case 1: return Launch<1, rows_for(1)>::run(N, st, args...);
    case 2: return Launch<2, rows_for(2)>::run(N, st, args...);
    case 3: return Launch<3, rows_for(3)>::run(N, st, args...);
    case 4: return Launch<4, rows_for(4)>::run(N, st, args...);
    case 5: return Launch<5, rows_for(5)>::run(N, st, args...);
    case 6: return Launch<6, rows_for(6)>::run(N, st, args...);
    case 7: return Launch<7, rows_for(7)>::run(N, st, args...);
    default: return Launch<8, rows_for(8)>::run(N, st, args...);
  }
}

template <int M, int R>
struct LaunchNvfp4Dp4a {
  template <typename... A>
  static cudaError_t run(int N, cudaStream_t st, A... a) {
    gemv_nvfp4_dp4a_kernel<M, R><<<(N + R - 1) / R, kThreads, 0, st>>>(a...);
    return cudaGetLastError();
  }
};
template <int M, int R>
struct LaunchNvfp4F16 {
  template <typename... A>
  static cudaError_t run(int N, cudaStream_t st, A... a) {
    gemv_nvfp4_f16_kernel<M, R><<<(N + R - 1) / R, kThreads, 0, st>>>(a...);
    return cudaGetLastError();
  }
};
template <int M, int R>
struct LaunchW4a8 {
  template <typename... A>
  static cudaError_t run(int N, cudaStream_t st, A... a) {
    gemv_w4a8_kernel<M, R><<<(N + R - 1) / R, kThreads, 0, st>>>(a...);
    return cudaGetLastError();
  }
};

}  // namespace

// =====================================================================================
// Launchers
// =====================================================================================

cudaError_t quantize_act_q8(const float* x, int M, int K, int Kp, int8_t* q, float* d, int32_t* s,
                            cudaStream_t stream) {
  if (M < 1 || K < 1 || Kp % 32 != 0 || Kp < K || Kp - K >= 32) return cudaErrorInvalidValue;
  const int blocks = M * (Kp / 32), per = 8;  // 8 warps (32-blocks) per CTA
  quantize_act_q8_kernel<<<(blocks + per - 1) / per, per * 32, 0, stream>>>(x, M, K, Kp, q, d, s);
  return cudaGetLastError();
}

cudaError_t convert_act_f16(const float* x, int M, int K, int Kp, uint16_t* h, cudaStream_t stream) {
  if (M < 1 || K < 1 || Kp % 32 != 0 || Kp < K) return cudaErrorInvalidValue;
  const size_t n = size_t(M) * Kp;
  convert_act_f16_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, M, K, Kp,
                                                                       reinterpret_cast<__half*>(h));
  return cudaGetLastError();
}

cudaError_t gemv_nvfp4_dp4a(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int Kp,
                            const int8_t* xq, const float* xd, int M, float* y, int ldy,
                            cudaStream_t stream) {
  if (!shape_ok(N, Kp, M, ldy)) return cudaErrorInvalidValue;
  return dispatch_m<LaunchNvfp4Dp4a>(M, N, stream, codes, scales, tscale, N, Kp, xq, xd, y, ldy);
}

cudaError_t gemv_nvfp4_f16(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int Kp,
                           const uint16_t* xh, int M, float* y, int ldy, cudaStream_t stream) {
  if (!shape_ok(N, Kp, M, ldy)) return cudaErrorInvalidValue;
  return dispatch_m<LaunchNvfp4F16>(M, N, stream, codes, scales, tscale, N, Kp,
                                    reinterpret_cast<const __half*>(xh), y, ldy);
}

cudaError_t gemv_w4a8(const uint8_t* codes, const uint16_t* scales, int group, int N, int Kp,
                      const int8_t* xq, const float* xd, const int32_t* xs, int M, float* y, int ldy,
                      cudaStream_t stream) {
  if (!shape_ok(N, Kp, M, ldy) || group < 32 || group % 32 != 0 || Kp % group != 0)
    return cudaErrorInvalidValue;
  return dispatch_m<LaunchW4a8>(M, N, stream, codes, reinterpret_cast<const __half*>(scales), group,
                                N, Kp, xq, xd, xs, y, ldy);
}

}  // namespace kvdeck::cuda
