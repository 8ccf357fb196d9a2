// gemv_dense.cu — the GEMVs the CUDA backend needs beside NVFP4 / W4A8 (gemv.cu): f32 and
// f16 weights against f32 activations, W8A8 (the 8-bit head) against int8 activations, and
// the W4A8 minimum correction (GGUF Q4_1 imports). Batch M in [1, 8]. Contracts: kernels_cuda.h.
//
// Mapping: one warp per weight row; lanes walk K in 16-byte chunks (8 f16 / 4+4 f32 / 16
// int8) with a stride of 32 chunks, so a warp reads 512 contiguous bytes of the row per step
// and every weight byte is read once; warp shuffles reduce. Correct on any K; the vector path
// needs K % 8 == 0 (the scalar tail loop covers the rest).
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kWarps = 4;  // rows per block

template <int M, bool F16W>
__global__ void __launch_bounds__(kWarps * 32)
gemv_float_kernel(const void* __restrict__ wv, int N, int K, const float* __restrict__ x,
                  float* __restrict__ y, int ldy) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (n >= N) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  const int K8 = K % 8 == 0 ? K : 0;  // vector path only on 16-byte aligned rows
  for (int k = lane * 8; k < K8; k += 256) {
    float w[8];
    if (F16W) {
      const uint4 r = *reinterpret_cast<const uint4*>(static_cast<const __half*>(wv) + size_t(n) * K + k);
      const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        w[2 * i] = f.x, w[2 * i + 1] = f.y;
      }
    } else {
      const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(wv) + size_t(n) * K + k);
      const float4 a = p[0], b = p[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4* xp = reinterpret_cast<const float4*>(x + size_t(m) * K + k);
      const float4 a = xp[0], b = xp[1];
      acc[m] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
  }
  for (int k = K8 + lane; k < K; k += 32) {  // K % 8 != 0: scalar
    const float w = F16W ? __half2float(static_cast<const __half*>(wv)[size_t(n) * K + k])
                         : static_cast<const float*>(wv)[size_t(n) * K + k];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = fmaf(w, x[size_t(m) * K + k], acc[m]);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) y[size_t(m) * ldy + n] = v;
  }
}

// W8A8: chunk c = 16 codes of block c / 2; lanes 2j and 2j+1 hold the two halves of a block,
// so the block's exact int32 sum is one shuffle away (the CPU's per-block isum).
template <int M>
__global__ void __launch_bounds__(kWarps * 32)
gemv_w8a8_kernel(const int8_t* __restrict__ codes, const __half* __restrict__ scales, int N, int Kp,
                 const int8_t* __restrict__ xq, const float* __restrict__ xd, float* __restrict__ y, int ldy) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x & 31;
  pdl_launch_dependents();  // launched with PDL: the next kernel may start and wait for this one
  const int nb = Kp / 32, chunks = Kp / 16;
  const bool row = n < N;
  // the weights never change: the first two steps' chunks are loaded before the PDL wait (a
  // row of up to 1024 codes: all of it; the head of SmolLM2, 576, used to start after the wait)
  int4 w2[2];
  float dw2[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int c = 32 * t + lane;
    const bool live = row && c < chunks;
    const int4* p = reinterpret_cast<const int4*>(codes + size_t(n) * Kp + size_t(c) * 16);
    w2[t] = live ? __ldg(p) : make_int4(0, 0, 0, 0);
    dw2[t] = live ? __half2float(scales[size_t(n) * nb + c / 2]) : 0.0f;
  }
  pdl_wait();
  if (!row) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int c0 = 0; c0 < chunks; c0 += 32) {
    const int c = c0 + lane;
    const bool live = c < chunks;  // chunks is even: a pair is live or dead together
    int4 w = make_int4(0, 0, 0, 0);
    float dw = 0.0f;
    if (c0 < 64) {
      w = c0 ? w2[1] : w2[0], dw = c0 ? dw2[1] : dw2[0];
    } else if (live) {
      w = *reinterpret_cast<const int4*>(codes + size_t(n) * Kp + size_t(c) * 16);
      dw = __half2float(scales[size_t(n) * nb + c / 2]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      int s = 0;
      if (live) {
        const int4 a = *reinterpret_cast<const int4*>(xq + size_t(m) * Kp + size_t(c) * 16);
        s = __dp4a(w.x, a.x, s), s = __dp4a(w.y, a.y, s), s = __dp4a(w.z, a.z, s), s = __dp4a(w.w, a.w, s);
      }
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      if (live && (lane & 1) == 0) acc[m] += xd[size_t(m) * nb + c / 2] * dw * float(s);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) y[size_t(m) * ldy + n] = v;
  }
}

// y[m, n] += sum_b d_a(m, b) * s_a(m, b) * (min(n, b) + 8 * scale(n, b)): lanes over blocks.
__global__ void __launch_bounds__(kWarps * 32)
w4a8_mins_kernel(const __half* __restrict__ mins, const __half* __restrict__ scales, int N, int nb, int M,
                 const float* __restrict__ xd, const int32_t* __restrict__ xs, float* __restrict__ y, int ldy) {
  const int n = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (n >= N) return;
  for (int m = 0; m < M; ++m) {
    float acc = 0.0f;
    for (int b = lane; b < nb; b += 32) {
      const float off = __half2float(mins[size_t(n) * nb + b]) + 8.0f * __half2float(scales[size_t(n) * nb + b]);
      acc += xd[size_t(m) * nb + b] * float(xs[size_t(m) * nb + b]) * off;
    }
    acc = warp_sum(acc);
    if (lane == 0) y[size_t(m) * ldy + n] += acc;
  }
}

template <template <int> class L, typename... A>
cudaError_t by_m(int M, A... a) {
  switch (M) {
    case 1: return L<1>::run(a...);
    case 2: return L<2>::run(a...);
    case 3: return L<3>::run(a...);
    case 4: return L<4>::run(a...);
    case 5: return L<5>::run(a...);
    case 6: return L<6>::run(a...);
    case 7: return L<7>::run(a...);
    case 8: return L<8>::run(a...);
    default: return cudaErrorInvalidValue;
  }
}

template <int M>
struct FloatL {
  static cudaError_t run(bool f16, const void* w, int N, int K, const float* x, float* y, int ldy, cudaStream_t st) {
    const dim3 grid((N + kWarps - 1) / kWarps), block(kWarps * 32);
    if (f16)
      gemv_float_kernel<M, true><<<grid, block, 0, st>>>(w, N, K, x, y, ldy);
    else
      gemv_float_kernel<M, false><<<grid, block, 0, st>>>(w, N, K, x, y, ldy);
    return cudaGetLastError();
  }
};

template <int M>
struct W8L {
  static cudaError_t run(const int8_t* c, const __half* s, int N, int Kp, const int8_t* xq, const float* xd,
                         float* y, int ldy, cudaStream_t st) {
    return detail::launch_kernel(gemv_w8a8_kernel<M>, dim3((N + kWarps - 1) / kWarps), dim3(kWarps * 32), st,
                                 /*pdl=*/true, c, s, N, Kp, xq, xd, y, ldy);
  }
};

}  // namespace

cudaError_t gemv_float(bool f16_weights, const void* w, int N, int K, const float* x, int M, float* y, int ldy,
                       cudaStream_t stream) {
  if (N < 1 || K < 1 || M < 1 || M > 8 || ldy < N) return cudaErrorInvalidValue;
  return by_m<FloatL>(M, f16_weights, w, N, K, x, y, ldy, stream);
}

cudaError_t gemv_w8a8(const int8_t* codes, const uint16_t* scales, int N, int Kp, const int8_t* xq,
                      const float* xd, int M, float* y, int ldy, cudaStream_t stream) {
  if (N < 1 || Kp < 32 || Kp % 32 != 0 || M < 1 || M > 8 || ldy < N) return cudaErrorInvalidValue;
  return by_m<W8L>(M, codes, reinterpret_cast<const __half*>(scales), N, Kp, xq, xd, y, ldy, stream);
}

cudaError_t w4a8_mins_add(const uint16_t* mins, const uint16_t* scales, int N, int Kp, const float* xd,
                          const int32_t* xs, int M, float* y, int ldy, cudaStream_t stream) {
  if (N < 1 || Kp < 32 || Kp % 32 != 0 || M < 1 || ldy < N) return cudaErrorInvalidValue;
  w4a8_mins_kernel<<<(N + kWarps - 1) / kWarps, kWarps * 32, 0, stream>>>(
      reinterpret_cast<const __half*>(mins), reinterpret_cast<const __half*>(scales), N, Kp / 32, M, xd, xs, y, ldy);
  return cudaGetLastError();
}

}  // namespace kvdeck::cuda
