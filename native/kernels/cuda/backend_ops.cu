// backend_ops.cu — the CUDA backend's small ops: embedding rows, residual add, bias, KV-pool
// writes in the CPU pool's byte layout (the same codec bit for bit; nvfp4r / k8v4 rows and the
// paged attention of M queries are in attention_paged.cu), argmax, and the decode context
// length read from the positions array. Contracts: kernels_cuda.h.
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// =====================================================================================
// Elementwise
// =====================================================================================

__global__ void embed_kernel(const void* __restrict__ table, bool f16, const int32_t* __restrict__ ids, int H,
                             float* __restrict__ x) {
  const int m = blockIdx.y;
  const size_t row = size_t(ids[m]) * H;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
    x[size_t(m) * H + i] = f16 ? __half2float(static_cast<const __half*>(table)[row + i])
                               : static_cast<const float*>(table)[row + i];
}

// An 8-bit table (W8A8 / GGUF Q8_0 rows): int8 codes [V, Kp], f16 scales [V, Kp/32];
// value j of row r = f32(scale[r, j/32]) * code[r, j] (one product: the CPU's exact result).
__global__ void embed_w8a8_kernel(const int8_t* __restrict__ codes, const __half* __restrict__ scales,
                                  const int32_t* __restrict__ ids, int H, int Kp, float* __restrict__ x) {
  const int m = blockIdx.y;
  const size_t r = size_t(ids[m]);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
    x[size_t(m) * H + i] = __half2float(scales[r * (Kp / 32) + i / 32]) * float(codes[r * Kp + i]);
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void add_bias_kernel(float* __restrict__ x, const float* __restrict__ b, int M, int n, int ld) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(M) * n) return;
  x[(i / n) * ld + i % n] += b[i % n];
}

__global__ void ctx_from_pos_kernel(const int32_t* __restrict__ pos, int32_t* __restrict__ ctx) {
  ctx[0] = pos[0] + 1;
}

// =====================================================================================
// KV writes: the CPU codec (formats.cpp f32_to_e4m3 / f32_to_e2m1, kv_codec_cpu.cpp) in
// integer operations, so the bytes match the CPU pool's.
// =====================================================================================

// f32_to_e4m3_dev: common.cuh

__device__ __forceinline__ float e4m3_to_f32_dev(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  if ((b & 0x7Fu) == 0x7Fu) return __uint_as_float(sign | 0x7FC00000u);
  if (e != 0) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
  return __uint_as_float(sign | __float_as_uint(float(m) * __uint_as_float(0x3B000000u)));
}

__device__ __forceinline__ uint8_t f32_to_e2m1_dev(float f) {
  const uint8_t sign = uint8_t((__float_as_uint(f) >> 28) & 0x8u);
  const float a = fabsf(f);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return uint8_t(sign | code);
}

// One thread per (token, KV head, 16-value block) for NVFP4; per value otherwise.
__global__ void kv_write_kernel(KvFormat fmt, bool f32, uint8_t* __restrict__ kb, uint8_t* __restrict__ vb,
                                const float* __restrict__ k, const float* __restrict__ v, int ld,
                                const int32_t* __restrict__ slots, int M, int nkv, int D, int row_bytes) {
  const int per = f32 || fmt == KvFormat::F16 ? D : D / 16;  // work items per (token, head)
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(M) * nkv * per) return;
  const int j = int(i % per), g = int(i / per % nkv), m = int(i / per / nkv);
  const size_t dst = (size_t(slots[m]) * nkv + g) * row_bytes;
  const float* kr = k + size_t(m) * ld + size_t(g) * D;
  const float* vr = v + size_t(m) * ld + size_t(g) * D;
  if (f32) {
    reinterpret_cast<float*>(kb + dst)[j] = kr[j];
    reinterpret_cast<float*>(vb + dst)[j] = vr[j];
    return;
  }
  if (fmt == KvFormat::F16) {
    reinterpret_cast<__half*>(kb + dst)[j] = __float2half_rn(kr[j]);
    reinterpret_cast<__half*>(vb + dst)[j] = __float2half_rn(vr[j]);
    return;
  }
  for (int t = 0; t < 2; ++t) {
    const float* xb = (t ? vr : kr) + j * 16;
    uint8_t* row = (t ? vb : kb) + dst;
    float amax = 0.0f;
    for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(xb[e]));
    const uint8_t s = f32_to_e4m3_dev(__fdiv_rn(amax, 6.0f));
    const float sd = e4m3_to_f32_dev(s);
    row[D / 2 + j] = s;
    for (int e = 0; e < 16; e += 2) {
      const uint8_t lo = sd > 0.f ? f32_to_e2m1_dev(__fdiv_rn(xb[e], sd)) : 0;
      const uint8_t hi = sd > 0.f ? f32_to_e2m1_dev(__fdiv_rn(xb[e + 1], sd)) : 0;
      row[(j * 16 + e) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

// =====================================================================================
// Argmax (first index of the maximum, as numpy.argmax; NaN never wins)
// =====================================================================================

constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* __restrict__ x, int n, int32_t* __restrict__ out) {
  pdl_wait();  // launched with PDL: x is the previous kernel's output
  float best = -INFINITY;
  int bi = n;  // none yet
  auto take = [&](float v, int i) {  // a thread sees its indices in increasing order
    if (v > best || (bi == n && v == best)) best = v, bi = i;
  };
  // float4 loads, 8 in flight per thread before the first compare (one block of the logits'
  // 49K-128K values was latency-bound one value at a time: 12.8 µs on the 8B's vocabulary)
  const int n4 = (reinterpret_cast<uintptr_t>(x) & 15u) ? 0 : n / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int v0 = threadIdx.x; v0 < n4; v0 += 8 * kArgmaxThreads) {
    float4 r[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int v = v0 + u * kArgmaxThreads;
      r[u] = v < n4 ? __ldcg(x4 + v) : make_float4(NAN, NAN, NAN, NAN);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = 4 * (v0 + u * kArgmaxThreads);
      take(r[u].x, i), take(r[u].y, i + 1), take(r[u].z, i + 2), take(r[u].w, i + 3);
    }
  }
  for (int i = 4 * n4 + threadIdx.x; i < n; i += kArgmaxThreads) take(x[i], i);
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) best = ov, bi = oi;
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x / 32] = best, si[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w)
      if (sv[w] > best || (sv[w] == best && si[w] < bi)) best = sv[w], bi = si[w];
    out[0] = bi < n ? bi : 0;
  }
}

}  // namespace

// =====================================================================================
// Launchers
// =====================================================================================

cudaError_t embed_rows(const void* table, bool f16, const int32_t* ids, int M, int H, float* x, cudaStream_t stream) {
  if (M < 1 || M > 65535 || H < 1) return cudaErrorInvalidValue;
  const int bx = (H + 255) / 256 < 8 ? (H + 255) / 256 : 8;
  embed_kernel<<<dim3(bx, M), 256, 0, stream>>>(table, f16, ids, H, x);
  return cudaGetLastError();
}

cudaError_t embed_rows_w8a8(const void* codes, const void* scales, const int32_t* ids, int M, int H, int Kp,
                            float* x, cudaStream_t stream) {
  if (M < 1 || M > 65535 || H < 1 || Kp < H || Kp % 32) return cudaErrorInvalidValue;
  const int bx = (H + 255) / 256 < 8 ? (H + 255) / 256 : 8;
  embed_w8a8_kernel<<<dim3(bx, M), 256, 0, stream>>>(static_cast<const int8_t*>(codes),
                                                     static_cast<const __half*>(scales), ids, H, Kp, x);
  return cudaGetLastError();
}

cudaError_t add_inplace(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t blocks = (n + 255) / 256;
  add_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t add_bias(float* x, const float* b, int M, int n, int ld, cudaStream_t stream) {
  if (M < 1 || n < 1 || ld < n) return cudaErrorInvalidValue;
  const size_t total = size_t(M) * n;
  add_bias_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(x, b, M, n, ld);
  return cudaGetLastError();
}

cudaError_t ctx_from_pos(const int32_t* pos, int32_t* ctx, cudaStream_t stream) {
  ctx_from_pos_kernel<<<1, 1, 0, stream>>>(pos, ctx);
  return cudaGetLastError();
}

cudaError_t kv_write(int format, void* k_pages, void* v_pages, int n_kv, int D, const float* k, const float* v,
                     int ld, const int32_t* slots, int M, cudaStream_t stream) {
  if (M < 1 || n_kv < 1 || D < 16 || D % 16 != 0 || ld < n_kv * D || format < 0 || format > 2)
    return cudaErrorInvalidValue;
  const bool f32 = format == 0;
  const KvFormat fmt = format == 2 ? KvFormat::NVFP4 : KvFormat::F16;
  const int row_bytes = f32 ? 4 * D : format == 1 ? 2 * D : D / 2 + D / 16;
  const int per = format == 2 ? D / 16 : D;
  const size_t total = size_t(M) * n_kv * per;
  kv_write_kernel<<<unsigned((total + 127) / 128), 128, 0, stream>>>(
      fmt, f32, static_cast<uint8_t*>(k_pages), static_cast<uint8_t*>(v_pages), k, v, ld, slots, M, n_kv, D, row_bytes);
  return cudaGetLastError();
}

cudaError_t argmax(const float* x, int n, int32_t* out, cudaStream_t stream) {
  if (n < 1) return cudaErrorInvalidValue;
  return detail::launch_kernel(argmax_kernel, dim3(1), dim3(kArgmaxThreads), stream, /*pdl=*/true, x, n, out);
}

}  // namespace kvdeck::cuda
