// sampling.cu — the next token chosen on the device (Backend::sample): greedy, temperature,
// top-k and top-p under an allowed-token mask, as the CPU's sample_with_uniform (sampler.cpp)
// chooses it, so a decode step moves one id instead of the vocabulary's logits.
// Contracts: kernels_cuda.h (sample_token). The steps:
//   1. keys: each logit as an order-preserving u32 (-0 as +0, masked tokens as -inf), ids 0..V-1;
//   2. CUB's stable radix sort, descending: the CPU's order (logit descending, lower id first);
//   3. one block: weights exp(double((l - max) * (1 / T))) (the CPU's float then double
//      arithmetic), the top_k / nucleus cut by block-wide prefix sums in double, and the id
//      where the running sum first reaches u * z (a binary search over the stored sums).
// Exact against the CPU: the mask, the sort (so greedy and the candidate order) and every
// float operation. Not bit-exact: the double sums (a fixed tree here, left to right there)
// and CUDA's exp(double) against glibc's (both within 1 ulp), so a draw or a top_p cut that
// lands within ~1e-13 relative of a boundary can pick the neighbouring token.
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kPickThreads = 1024;
constexpr int kPer = 4;  // consecutive sorted elements per thread in a scan chunk

__device__ __forceinline__ bool allowed(const uint32_t* mask, int i) {
  return !mask || ((mask[i >> 5] >> (i & 31)) & 1u);
}

__device__ __forceinline__ uint32_t key_of(float f) {
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0;  // -0 == +0 for the CPU's comparison
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float float_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// ---- greedy: the first index of the maximum of the allowed logits (0 if none) ----
__global__ void __launch_bounds__(kPickThreads)
argmax_masked_kernel(const float* __restrict__ x, int n, const uint32_t* __restrict__ mask, int32_t* __restrict__ out) {
  float best = -INFINITY;
  int bi = n;  // none yet
  for (int i = threadIdx.x; i < n; i += kPickThreads) {
    const float v = allowed(mask, i) ? x[i] : -INFINITY;
    if (v > best || (bi == n && v == best)) best = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) best = ov, bi = oi;
  }
  __shared__ float sv[kPickThreads / 32];
  __shared__ int si[kPickThreads / 32];
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x / 32] = best, si[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kPickThreads / 32; ++w)
      if (sv[w] > best || (sv[w] == best && si[w] < bi)) best = sv[w], bi = si[w];
    out[0] = bi < n ? bi : 0;
  }
}

__global__ void sample_keys_kernel(const float* __restrict__ x, int n, const uint32_t* __restrict__ mask,
                                   uint32_t* __restrict__ keys, int32_t* __restrict__ ids) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  keys[i] = key_of(allowed(mask, i) ? x[i] : -INFINITY);
  ids[i] = i;
}

// ---- block-wide reductions in double, in a fixed order (deterministic) ----
__device__ double block_sum(double v, double* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < kPickThreads / 32; ++w) t += sh[w];
  return t;
}

// Exclusive prefix of v over the block's threads in thread order; *total gets the block's sum.
__device__ double block_exclusive_scan(double v, double* sh, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  double x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  if (warp == 0) {
    double s = sh[lane];  // kPickThreads / 32 == 32 warps
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    sh[lane] = s;
  }
  __syncthreads();
  *total = sh[31];
  return (warp ? sh[warp - 1] : 0.0) + x - v;
}

__device__ int block_min(int v, int* sh) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  int t = sh[0];
  for (int w = 1; w < kPickThreads / 32; ++w) t = min(t, sh[w]);
  return t;
}

// keys / ids sorted (descending); w, cw: double [V] scratch.
__global__ void __launch_bounds__(kPickThreads)
sample_pick_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ ids, int V, SampleArgs a,
                   double* __restrict__ w, double* __restrict__ cw, int32_t* __restrict__ out) {
  __shared__ double sh[32];
  __shared__ int shi[32];
  const int tid = threadIdx.x;
  const float mx = float_of(keys[0]);
  if (mx == -INFINITY) {  // no token allowed
    if (tid == 0) out[0] = ids[0];
    return;
  }
  const float inv_t = 1.0f / a.temperature;
  const int k = a.top_k > 0 ? min(a.top_k, V) : V;
  // weights; the mass of the whole vocabulary and of the top k
  double tot = 0.0, km = 0.0;
  for (int j = tid; j < V; j += kPickThreads) {
    const double e = exp(double((float_of(keys[j]) - mx) * inv_t));
    w[j] = e;
    tot += e;
    if (j < k) km += e;
  }
  tot = block_sum(tot, sh);
  km = block_sum(km, sh);
  const double denom = a.top_k > 0 ? km : tot;
  // the nucleus: the first j < k where the running sum of w / denom reaches top_p
  double carry_a = 0.0, carry_z = 0.0;
  int keep = k;
  for (int c0 = 0; c0 < k; c0 += kPickThreads * kPer) {
    const int j0 = c0 + tid * kPer;
    double la = 0.0, lz = 0.0;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (j0 + i < k) la += w[j0 + i] / denom, lz += w[j0 + i];
    double ta, tz;
    double acc = carry_a + block_exclusive_scan(la, sh, &ta);
    double z = carry_z + block_exclusive_scan(lz, sh, &tz);
    int found = 0x7FFFFFFF;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = j0 + i;
      if (j >= k) break;
      acc += w[j] / denom;
      z += w[j];
      cw[j] = z;
      if (acc >= a.top_p && found == 0x7FFFFFFF) found = j;
    }
    found = block_min(found, shi);
    if (found != 0x7FFFFFFF) {
      keep = found + 1;
      break;
    }
    carry_a += ta, carry_z += tz;
  }
  __syncthreads();  // cw (global) complete for the block
  if (tid == 0) {
    const double r = a.u * cw[keep - 1];
    int lo = 0, hi = keep - 1;  // the first j with cw[j] >= r (cw is non-decreasing)
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (cw[mid] >= r) hi = mid;
      else lo = mid + 1;
    }
    out[0] = ids[lo];
  }
}

struct SampleWs {
  uint32_t *keys_in, *keys_out;
  int32_t *ids_in, *ids_out;
  double *w, *cw;
  void* cub;
  size_t cub_bytes;
};

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The layout of the workspace (ws null: only the sizes).
size_t layout(int V, void* ws, SampleWs* out) {
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr),
                                            static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr), V);
  const size_t a4 = align256(size_t(V) * 4), a8 = align256(size_t(V) * 8);
  const size_t total = 4 * a4 + 2 * a8 + align256(cub_bytes);
  if (ws && out) {
    auto* b = static_cast<uint8_t*>(ws);
    out->keys_in = reinterpret_cast<uint32_t*>(b);
    out->keys_out = reinterpret_cast<uint32_t*>(b + a4);
    out->ids_in = reinterpret_cast<int32_t*>(b + 2 * a4);
    out->ids_out = reinterpret_cast<int32_t*>(b + 3 * a4);
    out->w = reinterpret_cast<double*>(b + 4 * a4);
    out->cw = reinterpret_cast<double*>(b + 4 * a4 + a8);
    out->cub = b + 4 * a4 + 2 * a8;
    out->cub_bytes = cub_bytes;
  }
  return total;
}

}  // namespace

size_t sample_workspace_bytes(int V) { return V < 1 ? 0 : layout(V, nullptr, nullptr); }

cudaError_t sample_token(const float* logits, int V, const uint32_t* mask, const SampleArgs& args, void* ws,
                         size_t ws_bytes, int32_t* out, cudaStream_t stream) {
  if (V < 1) return cudaErrorInvalidValue;
  if (args.temperature <= 0.0f) {
    argmax_masked_kernel<<<1, kPickThreads, 0, stream>>>(logits, V, mask, out);
    return cudaGetLastError();
  }
  if (!(args.top_p > 0.0f && args.top_p <= 1.0f) || !(args.u >= 0.0 && args.u < 1.0)) return cudaErrorInvalidValue;
  SampleWs s{};
  if (!ws || ws_bytes < layout(V, ws, &s)) return cudaErrorInvalidValue;
  sample_keys_kernel<<<(V + 255) / 256, 256, 0, stream>>>(logits, V, mask, s.keys_in, s.ids_in);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  size_t cb = s.cub_bytes;
  e = cub::DeviceRadixSort::SortPairsDescending(s.cub, cb, s.keys_in, s.keys_out, s.ids_in, s.ids_out, V, 0, 32,
                                                stream);
  if (e != cudaSuccess) return e;
  sample_pick_kernel<<<1, kPickThreads, 0, stream>>>(s.keys_out, s.ids_out, V, args, s.w, s.cw, out);
  return cudaGetLastError();
}

}  // namespace kvdeck::cuda
