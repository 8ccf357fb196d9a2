// fused.cu — the CUDA backend's fused decode-step kernels (one launch instead of two to four:
// a decode step of a small model is bound by kernel count, not bytes). Contracts: kernels_cuda.h.
// Each is launched with programmatic dependent launch (sm_90+): it waits for the previous
// kernel (griddepcontrol.wait) before its first global access and lets the next one launch.
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kNormThreads = 256;  // rows under 2048: as elementwise.cu's rmsnorm (the same sums)

// Quantise 32 values (one per lane) exactly as quantize_act_q8_kernel does.
__device__ __forceinline__ void quant_block(float v, bool live, int k, int8_t* q, float* d, int32_t* s, int blk) {
  const float amax = warp_max(fabsf(v));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int qi = live ? int(fmaxf(-127.0f, fminf(127.0f, rintf(v * id)))) : 0;
  q[k] = int8_t(qi);
  const int sum = warp_sum_int(qi);
  if ((threadIdx.x & 31) == 0) {
    d[blk] = amax / 127.0f;
    s[blk] = sum;
  }
}

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

// ---- RoPE of q and k and the KV write, one launch --------------------------------------
__device__ __forceinline__ float from_e4m3(uint8_t b) {  // formats.cpp e4m3_to_f32 (finite codes)
  const uint32_t sign = uint32_t(b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
  if (e != 0) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
  return __uint_as_float(sign | __float_as_uint(float(m) * __uint_as_float(0x3B000000u)));
}
__device__ __forceinline__ uint8_t to_e2m1(float f) {  // formats.cpp f32_to_e2m1
  const uint8_t sign = uint8_t((__float_as_uint(f) >> 28) & 0x8u);
  const float a = fabsf(f);
  return uint8_t(sign | ((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f)));
}

// Rotated value d of a head x (rotate-half, as elementwise.cu's rope_kernel).
__device__ __forceinline__ float roped(const float* x, int d, int half, float p, const float* inv_freq) {
  const int i = d < half ? d : d - half;
  float sn, cs;
  sincosf(p * inv_freq[i], &sn, &cs);
  const float a = x[i], b = x[i + half];
  return d < half ? a * cs - b * sn : b * cs + a * sn;
}

// Items: [0, M*nh*half) rotate q pairs in place; then (m, g, unit) items write K (roped) and
// V rows of token m into its slot: a unit is one value (f32 / f16) or one 16-value block
// (NVFP4, the CPU's kv_nvfp4_encode_row). ctx (optional): ctx[0] = pos[0] + 1.
__global__ void rope_kv_write_kernel(float* __restrict__ q, int ldq, int nh, const float* __restrict__ k,
                                     const float* __restrict__ v, int ldk, int nkv, int D, int M,
                                     const int32_t* __restrict__ pos, const float* __restrict__ inv_freq, int fmt,
                                     uint8_t* __restrict__ kb, uint8_t* __restrict__ vb,
                                     const int32_t* __restrict__ slots, int32_t* __restrict__ ctx) {
  pdl_wait();
  pdl_launch_dependents();
  const int half = D / 2;
  const size_t nq = size_t(M) * nh * half;
  const int per = fmt == 2 ? D / 16 : D;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx == 0 && ctx) ctx[0] = pos[0] + 1;
  if (idx < nq) {
    const int i = int(idx % half);
    const size_t rh = idx / half;
    const int r = int(rh / nh), h = int(rh % nh);
    float sn, cs;
    sincosf(float(pos[r]) * inv_freq[i], &sn, &cs);
    float* xh = q + size_t(r) * ldq + size_t(h) * D;
    const float a = xh[i], b = xh[i + half];
    xh[i] = a * cs - b * sn;
    xh[i + half] = b * cs + a * sn;
    return;
  }
  const size_t j = idx - nq;
  if (j >= size_t(M) * nkv * per) return;
  const int u = int(j % per), g = int(j / per % nkv), m = int(j / per / nkv);
  const int row_bytes = fmt == 0 ? 4 * D : fmt == 1 ? 2 * D : D / 2 + D / 16;
  const size_t dst = (size_t(slots[m]) * nkv + g) * row_bytes;
  const float* kr = k + size_t(m) * ldk + size_t(g) * D;
  const float* vr = v + size_t(m) * ldk + size_t(g) * D;
  const float p = float(pos[m]);
  if (fmt == 0) {
    reinterpret_cast<float*>(kb + dst)[u] = roped(kr, u, half, p, inv_freq);
    reinterpret_cast<float*>(vb + dst)[u] = vr[u];
    return;
  }
  if (fmt == 1) {
    reinterpret_cast<__half*>(kb + dst)[u] = __float2half_rn(roped(kr, u, half, p, inv_freq));
    reinterpret_cast<__half*>(vb + dst)[u] = __float2half_rn(vr[u]);
    return;
  }
  for (int t = 0; t < 2; ++t) {
    float xb[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) xb[e] = t ? vr[u * 16 + e] : roped(kr, u * 16 + e, half, p, inv_freq);
    uint8_t* row = (t ? vb : kb) + dst;
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(xb[e]));
    const uint8_t sc = f32_to_e4m3_dev(__fdiv_rn(amax, 6.0f));
    const float sd = from_e4m3(sc);
    row[D / 2 + u] = sc;
#pragma unroll
    for (int e = 0; e < 16; e += 2) {
      const uint8_t lo = sd > 0.f ? to_e2m1(__fdiv_rn(xb[e], sd)) : 0;
      const uint8_t hi = sd > 0.f ? to_e2m1(__fdiv_rn(xb[e + 1], sd)) : 0;
      row[(u * 16 + e) / 2] = uint8_t(lo | (hi << 4));
    }
  }
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
  const int per = format == 2 ? D / 16 : D;
  const size_t total = size_t(M) * (q ? n_heads : 0) * (D / 2) + size_t(M) * n_kv * per;
  return launch_kernel(rope_kv_write_kernel, dim3(unsigned((total + 127) / 128)), dim3(128), stream, true, q, ldq,
                       q ? n_heads : 0, k, v, ldk, n_kv, D, M, pos, inv_freq, format,
                       static_cast<uint8_t*>(k_pages), static_cast<uint8_t*>(v_pages), slots, ctx);
}

}  // namespace kvdeck::cuda
