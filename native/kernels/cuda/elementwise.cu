// elementwise.cu — RMSNorm, rotate-half RoPE and SwiGLU (silu(gate) * up), f32. Contracts: kernels_cuda.h.
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kNormThreads = 256;

// One block per row: sum of squares in f32 (block reduction), then the scaled write.
__global__ void __launch_bounds__(kNormThreads)
rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, int n, float eps,
               float* __restrict__ y) {
  const float* xr = x + size_t(blockIdx.x) * n;
  float* yr = y + size_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kNormThreads) ss = fmaf(xr[i], xr[i], ss);
  __shared__ float part[kNormThreads / 32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormThreads / 32; ++i) tot += part[i];
  const float inv = rsqrtf(tot / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += kNormThreads) yr[i] = xr[i] * inv * w[i];
}

// One thread per (row, head, i < D/2) pair.
__global__ void rope_kernel(float* __restrict__ x, int rows, int n_heads, int D, int ld,
                            const int32_t* __restrict__ pos, const float* __restrict__ inv_freq) {
  const int half = D / 2;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(rows) * n_heads * half) return;
  const int i = int(idx % half);
  const size_t rh = idx / half;  // row * n_heads + head
  const int r = int(rh / n_heads), h = int(rh % n_heads);
  float s, c;
  sincosf(float(pos[r]) * inv_freq[i], &s, &c);
  float* xh = x + size_t(r) * ld + size_t(h) * D;
  const float a = xh[i], b = xh[i + half];
  xh[i] = a * c - b * s;
  xh[i + half] = b * c + a * s;
}

__global__ void silu_mul_kernel(const float* __restrict__ a, const float* __restrict__ b, int rows,
                                int n, int ld, float* __restrict__ y) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(rows) * n) return;
  const size_t r = idx / n, i = idx % n;
  const float g = a[r * ld + i], u = b[r * ld + i];
  y[idx] = g / (1.0f + expf(-g)) * u;
}

}  // namespace

cudaError_t rmsnorm(const float* x, const float* w, int rows, int n, float eps, float* y,
                    cudaStream_t stream) {
  if (rows < 1 || n < 1) return cudaErrorInvalidValue;
  rmsnorm_kernel<<<rows, kNormThreads, 0, stream>>>(x, w, n, eps, y);
  return cudaGetLastError();
}

cudaError_t rope(float* x, int rows, int n_heads, int D, int ld, const int32_t* pos,
                 const float* inv_freq, cudaStream_t stream) {
  if (rows < 1 || n_heads < 1 || D < 2 || D % 2 != 0 || ld < n_heads * D) return cudaErrorInvalidValue;
  const size_t n = size_t(rows) * n_heads * (D / 2);
  rope_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, rows, n_heads, D, ld, pos, inv_freq);
  return cudaGetLastError();
}

cudaError_t silu_mul(const float* a, const float* b, int rows, int n, int ld_ab, float* y,
                     cudaStream_t stream) {
  if (rows < 1 || n < 1 || ld_ab < n) return cudaErrorInvalidValue;
  const size_t total = size_t(rows) * n;
  silu_mul_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(a, b, rows, n, ld_ab, y);
  return cudaGetLastError();
}

}  // namespace kvdeck::cuda
