// fused.cu — the CUDA backend's fused decode-step kernels (one launch instead of two to four:
// a decode step of a small model is bound by kernel count, not bytes). Contracts: kernels_cuda.h.
// Each is launched with programmatic dependent launch (sm_90+): it waits for the previous
// kernel (griddepcontrol.wait) before its first access to the activations (the norm's weight
// row is read before: weights never change) and lets the next one launch.
// Rows of n % 4 == 0 at 16-byte aligned addresses (every decode step of the engine) take the
// float4 kernels (one L2 round trip each way); the one-value-a-lane kernels serve the rest.
#include <cstdint>
#include <cstdlib>

#include "common.cuh"
#include "fused_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// ---- add + rmsnorm + q8 -----------------------------------------------------------------
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

// The single-pass form of add_rmsnorm_q8_kernel (rows with n % 4 == 0, 16-byte aligned, Kp or
// n <= 4 P T): thread t holds elements 4 (p T + t) .. + 3 of pass p as float4, every load of a
// row issued before the first use and w loaded before the PDL wait (weights never change), one
// barrier for the sum, then h and its q8 from registers (quant_block4: 8 lanes a 32-block).
// The old kernel made 2 + 2 n / T dependent L2 round trips (n / T serial passes each way); this
// one makes one. Same formulas as add_rmsnorm_q8_kernel: only the sum of squares' order differs.
template <int P>
__global__ void __launch_bounds__(1024)
add_rmsnorm_q8_regs_kernel(float* x, const float* __restrict__ y, const float* __restrict__ w, int n, float eps,
                           float* h, int Kp, int8_t* __restrict__ q, float* __restrict__ d,
                           int32_t* __restrict__ s) {
  const int T = blockDim.x;  // a multiple of 32: every pass is whole 32-blocks per 8 lanes
  float4 xv[P], wv[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = 4 * (p * T + threadIdx.x);
    wv[p] = i < n ? *reinterpret_cast<const float4*>(w + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  pdl_wait();
  pdl_launch_dependents();
  float* xr = x + size_t(blockIdx.x) * n;
  const float* yr = y ? y + size_t(blockIdx.x) * n : nullptr;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = 4 * (p * T + threadIdx.x);
    xv[p] = i < n ? *reinterpret_cast<const float4*>(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (yr) {
    float4 yv[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int i = 4 * (p * T + threadIdx.x);
      yv[p] = i < n ? *reinterpret_cast<const float4*>(yr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int i = 4 * (p * T + threadIdx.x);
      xv[p].x += yv[p].x, xv[p].y += yv[p].y, xv[p].z += yv[p].z, xv[p].w += yv[p].w;
      if (i < n) *reinterpret_cast<float4*>(xr + i) = xv[p];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    ss = fmaf(xv[p].x, xv[p].x, ss);
    ss = fmaf(xv[p].y, xv[p].y, ss);
    ss = fmaf(xv[p].z, xv[p].z, ss);
    ss = fmaf(xv[p].w, xv[p].w, ss);
  }
  __shared__ float part[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int i = 0; i < T / 32; ++i) tot += part[i];
  const float inv = rsqrtf(tot / float(n) + eps);
  float* hr = h + size_t(blockIdx.x) * n;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = 4 * (p * T + threadIdx.x);
    float v[4] = {xv[p].x * inv * wv[p].x, xv[p].y * inv * wv[p].y, xv[p].z * inv * wv[p].z,
                  xv[p].w * inv * wv[p].w};
    if (i < n) *reinterpret_cast<float4*>(hr + i) = make_float4(v[0], v[1], v[2], v[3]);
    if (q && 4 * p * T < Kp)  // uniform
      quant_block4(v, i, Kp, q + size_t(blockIdx.x) * Kp, d + size_t(blockIdx.x) * (Kp / 32),
                   s + size_t(blockIdx.x) * (Kp / 32));
  }
}

// ---- silu(a) * b + q8 -------------------------------------------------------------------
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

// silu_mul_q8_kernel four values a lane (n % 4 == 0, 16-byte aligned): item j is values 4 j ..
// + 3 of the [M, Kp] output, 8 lanes a 32-block (quant_block4), float4 loads and stores: a
// quarter of the threads and shuffles for the same bytes, the same formula per value.
__global__ void __launch_bounds__(128)
silu_mul_q8_vec_kernel(const float* __restrict__ a, const float* __restrict__ b, int M, int n, int Kp,
                       float* __restrict__ y, int8_t* __restrict__ q, float* __restrict__ d,
                       int32_t* __restrict__ s) {
  pdl_wait();
  pdl_launch_dependents();
  const int per = Kp / 4;
  const size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool row_ok = j < size_t(M) * per;  // 8-lane groups are wholly in or out (per % 8 == 0)
  const int m = row_ok ? int(j / per) : 0, k = row_ok ? int(j % per) * 4 : Kp;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (k < n) {
    const float4 g = *reinterpret_cast<const float4*>(a + size_t(m) * n + k);
    const float4 u = *reinterpret_cast<const float4*>(b + size_t(m) * n + k);
    v[0] = g.x / (1.0f + expf(-g.x)) * u.x;
    v[1] = g.y / (1.0f + expf(-g.y)) * u.y;
    v[2] = g.z / (1.0f + expf(-g.z)) * u.z;
    v[3] = g.w / (1.0f + expf(-g.w)) * u.w;
    *reinterpret_cast<float4*>(y + size_t(m) * n + k) = make_float4(v[0], v[1], v[2], v[3]);
  }
  quant_block4(v, k, Kp, q + size_t(m) * Kp, d + size_t(m) * (Kp / 32), s + size_t(m) * (Kp / 32));
}

// ---- RoPE + KV write -----------------------------------------------------------------------
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

// RoPE + KV write of M > 8 rows (prefill). rope_kv_write_kernel's items each compute their own
// sine and cosine: at 512 tokens of the Llama-3-8B shape 1.5 M sincosf (q pairs of 32 heads, K
// values of 8) for 32 K distinct angles, 50 µs a layer under CUPTI (session 7 profile). Here an
// item owns one angle: (row, pair i) rotating it in kRowsQHeads q heads, and (row, K or V,
// column d) writing that column for every KV head (the NVFP4 encode by 16 aligned lanes, as
// kv_nvfp4_value). The same values byte for byte: roped_sc / nvfp4_store_value, same formulas.
constexpr int kRowsQHeads = 8;
__host__ __device__ inline unsigned rope_rows_q_pad(const RopeKvArgs& a) {
  return (unsigned(a.M) * unsigned((a.nh + kRowsQHeads - 1) / kRowsQHeads) * unsigned(a.D / 2) + 31) / 32 * 32;
}
__global__ void __launch_bounds__(128) rope_kv_rows_kernel(const RopeKvArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int D = a.D, half = D / 2, hg = (a.nh + kRowsQHeads - 1) / kRowsQHeads;
  const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned nq = unsigned(a.M) * unsigned(hg) * unsigned(half), nq_pad = rope_rows_q_pad(a);
  if (idx == 0 && a.ctx) a.ctx[0] = a.pos[0] + 1;
  if (idx < nq_pad) {  // whole warps
    if (idx >= nq) return;
    const int i = int(idx % unsigned(half)), rg = int(idx / unsigned(half)), r = rg / hg, h0 = rg % hg * kRowsQHeads;
    float sn, cs;
    sincosf(float(a.pos[r]) * a.inv_freq[i], &sn, &cs);
    float* xr = a.q + size_t(r) * a.ldq + i;
#pragma unroll
    for (int e = 0; e < kRowsQHeads; ++e) {
      if (h0 + e >= a.nh) break;
      float* xh = xr + size_t(h0 + e) * D;
      const float x0 = __ldcg(xh), x1 = __ldcg(xh + half);
      xh[0] = x0 * cs - x1 * sn;
      xh[half] = x1 * cs + x0 * sn;
    }
    return;
  }
  const unsigned j = idx - nq_pad;
  const bool live = j < unsigned(a.M) * 2u * unsigned(D);
  const int d = int(j % unsigned(D)), t = int(j / unsigned(D) % 2u), m = live ? int(j / unsigned(D) / 2u) : 0;
  float sn = 0.0f, cs = 1.0f;
  if (live && t == 0) sincosf(float(a.pos[m]) * a.inv_freq[d < half ? d : d - half], &sn, &cs);
  const int row_bytes = a.fmt == 0 ? 4 * D : a.fmt == 1 ? 2 * D : D / 2 + D / 16;
  const float* x = (t ? a.v : a.k) + size_t(m) * a.ldk;
  uint8_t* rows = live ? (t ? a.vb : a.kb) + size_t(a.slots[m]) * a.nkv * row_bytes : nullptr;
  for (int g = 0; g < a.nkv; ++g) {  // warp-uniform: the NVFP4 encode shuffles
    float v = 0.0f;
    if (live) v = t ? __ldcg(x + size_t(g) * D + d) : roped_sc(x + size_t(g) * D, d, half, sn, cs);
    uint8_t* row = live ? rows + size_t(g) * row_bytes : nullptr;
    if (a.fmt == 2) {
      nvfp4_store_value(v, row, d, D);
    } else if (row) {
      if (a.fmt == 0)
        reinterpret_cast<float*>(row)[d] = v;
      else
        reinterpret_cast<__half*>(row)[d] = __float2half_rn(v);
    }
  }
}

// KVDECK_CUDA_PREFILL_ROWS=0: M > 8 rows on rope_kv_write_kernel too (read at every launch: the
// A/B of session 7; gemv.cu's quantize_act_q8 reads it too).
bool rope_rows_off() {
  const char* e = std::getenv("KVDECK_CUDA_PREFILL_ROWS");
  return e && e[0] == '0';
}

bool aligned16(const void* a, const void* b, const void* c, const void* d) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c) |
           reinterpret_cast<uintptr_t>(d)) & 15u) == 0;
}

// KVDECK_CUDA_NORM_SERIAL=1: the one-value-a-lane kernels (an A/B switch for the benchmarks).
bool serial_norm() {
  static const bool on = [] {
    const char* e = std::getenv("KVDECK_CUDA_NORM_SERIAL");
    return e && e[0] == '1';
  }();
  return on;
}

}  // namespace

cudaError_t add_rmsnorm_q8(float* x, const float* y, const float* w, int M, int n, float eps, float* h, int Kp,
                           int8_t* q, float* d, int32_t* s, cudaStream_t stream) {
  if (M < 1 || n < 1 || (q && (Kp % 32 != 0 || Kp < n || Kp - n >= 32))) return cudaErrorInvalidValue;
  const int span = q ? Kp : n;  // elements the block covers (the q8 padding included)
  if (n % 4 == 0 && aligned16(x, y, w, h) && span <= 4 * 4 * 1024 && !serial_norm()) {
    const int P = span <= 4 * 1024 ? 1 : span <= 2 * 4 * 1024 ? 2 : 4;
    const int threads = ((span / 4 + P - 1) / P + 31) / 32 * 32;  // 4 P threads >= span, <= 1024
    auto* k = P == 1 ? add_rmsnorm_q8_regs_kernel<1> : P == 2 ? add_rmsnorm_q8_regs_kernel<2> : add_rmsnorm_q8_regs_kernel<4>;
    return launch_kernel(k, dim3(M), dim3(threads), stream, true, x, y, w, n, eps, h, Kp, q, d, s);
  }
  if (n >= 2048)
    return launch_kernel(add_rmsnorm_q8_kernel<1024>, dim3(M), dim3(1024), stream, true, x, y, w, n, eps, h, Kp, q,
                         d, s);
  return launch_kernel(add_rmsnorm_q8_kernel<kNormThreads>, dim3(M), dim3(kNormThreads), stream, true, x, y, w, n,
                       eps, h, Kp, q, d, s);
}

cudaError_t silu_mul_q8(const float* a, const float* b, int M, int n, int Kp, float* y, int8_t* q, float* d,
                        int32_t* s, cudaStream_t stream) {
  if (M < 1 || n < 1 || Kp % 32 != 0 || Kp < n || Kp - n >= 32) return cudaErrorInvalidValue;
  if (n % 4 == 0 && aligned16(a, b, y, nullptr) && !serial_norm()) {
    const size_t items = size_t(M) * (Kp / 4);
    return launch_kernel(silu_mul_q8_vec_kernel, dim3(unsigned((items + 127) / 128)), dim3(128), stream, true, a, b,
                         M, n, Kp, y, q, d, s);
  }
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
  const size_t rows = size_t(rope_rows_q_pad(a)) + size_t(M) * 2 * D;
  if (M > 8 && size_t(M) * (n_heads + kRowsQHeads) * D < (size_t(1) << 31) && !rope_rows_off())
    return launch_kernel(rope_kv_rows_kernel, dim3(unsigned((rows + 127) / 128)), dim3(128), stream, true, a);
  const size_t total = format == 2 ? rope_q_pad(a) + size_t(M) * n_kv * 2 * D : rope_kv_items(a);
  return launch_kernel(rope_kv_write_kernel, dim3(unsigned((total + 127) / 128)), dim3(128), stream, true, a);
}

}  // namespace kvdeck::cuda
