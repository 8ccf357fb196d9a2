// fused.cu — the CUDA backend's fused decode-step kernels (one launch instead of two to four:
// a decode step of a small model is bound by kernel count, not bytes). Contracts: kernels_cuda.h.
// Each is launched with programmatic dependent launch (sm_90+): it waits for the previous
// kernel (griddepcontrol.wait) before its first global access and lets the next one launch.
#include <cstdint>

#include "common.cuh"
#include "fused_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kNormThreads = 256;  // rows under 2048: as elementwise.cu's rmsnorm (the same sums)

// One block per row: x += y (y optional), h = x / rms(x) * w, then q8 of h (q optional).
// Element i of a row is held by thread i % T in pass i / T, so a warp holds whole 32-blocks
// (T a multiple of 32): each quantises its blocks from registers, with no barrier and no
// re-read of h. T = 1024 for wide rows (a decode step's norm is one block: its serial
// passes are its latency).
template <int T>
__global__ void __launch_bounds__(T)
add_rmsnorm_q8_kernel(float* x, const float* __restrict__ y, const float* __restrict__ w, int n,
                      float eps, float* h, int Kp, int8_t* __restrict__ q, float* __restrict__ d,
                      int32_t* __restrict__ s) {
  pdl_wait();
  pdl_launch_dependents();
  float* xr = x + size_t(blockIdx.x) * n;
  float* hr = h + size_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += T) {
    float v = xr[i];
    if (y) {
      v += y[size_t(blockIdx.x) * n + i];
      xr[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  __shared__ float part[T / 32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.0f;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) tot += part[i];
  const float inv = rsqrtf(tot / float(n) + eps);
  const int end = q ? Kp : n;  // Kp: a multiple of 32, so every pass is warp-uniform
  const int nb = Kp / 32;
  for (int i = threadIdx.x; i < end; i += T) {
    const float v = i < n ? xr[i] * inv * w[i] : 0.0f;
    if (i < n) hr[i] = v;
    if (q) quant_block(v, i < n, i, q + size_t(blockIdx.x) * Kp, d + size_t(blockIdx.x) * nb, s + size_t(blockIdx.x) * nb, i / 32);
  }
}

// One warp per 32-block of a row: y = silu(a) * b, then its q8.
__global__ void silu_mul_q8_kernel(const float* __restrict__ a, const float* __restrict__ b, int M, int n, int Kp,
                                   float* __restrict__ y, int8_t* __restrict__ q, float* __restrict__ d,
                                   int32_t* __restrict__ s) {
  pdl_wait();
  pdl_launch_dependents();
  const int nb = Kp / 32;
  const int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (blk >= M * nb) return;
  const int m = blk / nb, k = (blk % nb) * 32 + (threadIdx.x & 31);
  float v = 0.0f;
  if (k < n) {
    const float g = a[size_t(m) * n + k], u = b[size_t(m) * n + k];
    v = g / (1.0f + expf(-g)) * u;
    y[size_t(m) * n + k] = v;
  }
  quant_block(v, k < n, int(size_t(m) * Kp + k), q, d, s, blk);
}

// RoPE of q and k and the KV write, one launch: one work item per thread (fused_impl.cuh). NVFP4
// pools: the q pairs (padded to whole warps), then one thread per K / V value (kv_nvfp4_value)
// instead of one per 16-value block, where a thread's 16 serial sincosf and divisions were the
// kernel's latency: Llama-3-8B shape 12.4 -> 4.3 µs (CUPTI), decode 2,531 -> 2,270 µs/token.
__host__ __device__ inline size_t rope_q_pad(const RopeKvArgs& a) {
  return (size_t(a.M) * a.nh * (a.D / 2) + 31) / 32 * 32;
}
__global__ void rope_kv_write_kernel(const RopeKvArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (a.fmt != 2) return rope_kv_item(a, idx);
  const size_t nq = size_t(a.M) * a.nh * (a.D / 2), nq_pad = rope_q_pad(a);
  if (idx == 0 && a.ctx) a.ctx[0] = a.pos[0] + 1;
  if (idx < nq_pad) {  // whole warps
    if (idx < nq) rope_kv_item(a, idx);
    return;
  }
  const size_t j = idx - nq_pad;
  kv_nvfp4_value(a, j, j < size_t(a.M) * a.nkv * 2 * a.D);
}

}  // namespace

cudaError_t add_rmsnorm_q8(float* x, const float* y, const float* w, int M, int n, float eps, float* h, int Kp,
                           int8_t* q, float* d, int32_t* s, cudaStream_t stream) {
  if (M < 1 || n < 1 || (q && (Kp % 32 != 0 || Kp < n || Kp - n >= 32))) return cudaErrorInvalidValue;
  if (n >= 2048)
    return launch_kernel(add_rmsnorm_q8_kernel<1024>, dim3(M), dim3(1024), stream, true, x, y, w, n, eps, h, Kp, q,
                         d, s);
  return launch_kernel(add_rmsnorm_q8_kernel<kNormThreads>, dim3(M), dim3(kNormThreads), stream, true, x, y, w, n,
                       eps, h, Kp, q, d, s);
}

cudaError_t silu_mul_q8(const float* a, const float* b, int M, int n, int Kp, float* y, int8_t* q, float* d,
                        int32_t* s, cudaStream_t stream) {
  if (M < 1 || n < 1 || Kp % 32 != 0 || Kp < n || Kp - n >= 32) return cudaErrorInvalidValue;
  const int blocks = M * (Kp / 32);
  return launch_kernel(silu_mul_q8_kernel, dim3((blocks + 7) / 8), dim3(256), stream, true, a, b, M, n, Kp, y, q,
                       d, s);
}

cudaError_t rope_kv_write(float* q, int ldq, int n_heads, const float* k, const float* v, int ldk, int n_kv, int D,
                          int M, const int32_t* pos, const float* inv_freq, int format, void* k_pages,
                          void* v_pages, const int32_t* slots, int32_t* ctx, cudaStream_t stream) {
  if (M < 1 || n_kv < 1 || D < 16 || D % 16 != 0 || format < 0 || format > 2 || (q && ldq < n_heads * D) ||
      ldk < n_kv * D)
    return cudaErrorInvalidValue;
  const RopeKvArgs a{q, ldq, q ? n_heads : 0, k, v, ldk, n_kv, D, M, pos, inv_freq, format,
                     static_cast<uint8_t*>(k_pages), static_cast<uint8_t*>(v_pages), slots, ctx};
  const size_t total = format == 2 ? rope_q_pad(a) + size_t(M) * n_kv * 2 * D : rope_kv_items(a);
  return launch_kernel(rope_kv_write_kernel, dim3(unsigned((total + 127) / 128)), dim3(128), stream, true, a);
}

}  // namespace kvdeck::cuda
