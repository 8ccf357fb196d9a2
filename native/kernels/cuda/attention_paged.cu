// attention_paged.cu — causal attention of M queries over paged KV of every pool format
// (f32, f16, nvfp4, nvfp4r, k8v4), optionally with the chunk's own tokens read unrounded from
// their f32 rows ("fresh", issue 14), and the nvfp4r / k8v4 KV writes in the CPU pool's bytes.
// The prefill path, the f32-KV decode path and the nvfp4r / k8v4 decode path (attention_decode
// covers f16 / nvfp4 decode). Contracts: kernels_cuda.h.
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// =====================================================================================
// Row codecs (kv_pool.h layouts; kv_codec_cpu.cpp is the oracle)
// =====================================================================================

__device__ __forceinline__ float e4m3_dev(uint8_t b) {  // formats.cpp e4m3_to_f32, NaN -> 0
  if ((b & 0x7Fu) == 0x7Fu) return 0.0f;
  return e4m3_to_float(b);
}

__device__ __forceinline__ uint8_t f32_to_e2m1_rne(float f) {  // formats.cpp f32_to_e2m1
  const uint8_t sign = uint8_t((__float_as_uint(f) >> 28) & 0x8u);
  const float a = fabsf(f);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return uint8_t(sign | code);
}

__device__ __forceinline__ float e2m1_val(uint32_t code) {
  const uint32_t a = code & 7u;  // {0, .5, 1, 1.5, 2, 3, 4, 6} without a (local-memory) table
  const float mag = a < 2 ? 0.5f * float(a) : ((a & 1u) ? 1.5f : 1.0f) * float(1u << ((a >> 1) - 1));
  return (code & 8u) ? -mag : mag;
}

__device__ __forceinline__ float row_scale(const uint8_t* p) {  // an f16 stored at any even offset
  return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// FMT: 0 f32, 1 f16, 2 nvfp4, 3 nvfp4r, 4 k8v4 (the values of kvdeck::KvDType); V: a V row.
template <int FMT, bool V>
__device__ __forceinline__ float kv_elem(const uint8_t* row, int d, int D) {
  if (FMT == 0) return reinterpret_cast<const float*>(row)[d];
  if (FMT == 1) return __half2float(reinterpret_cast<const __half*>(row)[d]);
  if (FMT == 4 && !V) return float(reinterpret_cast<const int8_t*>(row)[d]) * row_scale(row + D);
  const uint8_t c = row[d >> 1];
  float s = e4m3_dev(row[D / 2 + (d >> 4)]);
  if (FMT != 2) s *= row_scale(row + D / 2 + D / 16);  // exact: e4m3 x f16 fits f32
  return e2m1_val((d & 1) ? (c >> 4) : (c & 15u)) * s;
}

__host__ __device__ constexpr int row_bytes_of(int fmt, int D, bool v) {
  return fmt == 0 ? 4 * D : fmt == 1 ? 2 * D : fmt == 2 ? D / 2 + D / 16 : fmt == 3 || v ? D / 2 + D / 16 + 2 : D + 2;
}

// =====================================================================================
// KV writes of nvfp4r / k8v4 rows: one warp per (token, KV head, K or V row)
// =====================================================================================

__global__ void kv_write_q_kernel(int fmt, uint8_t* __restrict__ kb, uint8_t* __restrict__ vb,
                                  const float* __restrict__ k, const float* __restrict__ v, int ld,
                                  const int32_t* __restrict__ slots, int M, int nkv, int D) {
  const int item = int((size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x & 31;
  if (item >= M * nkv * 2) return;
  const bool is_v = item & 1;
  const int g = item / 2 % nkv, m = item / 2 / nkv;
  const int rb = row_bytes_of(fmt, D, is_v);
  uint8_t* row = (is_v ? vb : kb) + (size_t(slots[m]) * nkv + g) * rb;
  const float* x = (is_v ? v : k) + size_t(m) * ld + size_t(g) * D;
  float amax = 0.0f;
  for (int i = lane; i < D; i += 32) amax = fmaxf(amax, fabsf(x[i]));
  amax = warp_max(amax);
  const bool int8 = fmt == 4 && !is_v;
  // the row scale: f16(amax / top), at least the smallest subnormal for a nonzero row
  uint16_t gh = 0;
  if (amax > 0.0f) {
    gh = __half_as_ushort(__float2half_rn(__fdiv_rn(amax, int8 ? 127.0f : 6.0f * 448.0f)));
    if (!gh) gh = 1;
  }
  const float gs = __half2float(__ushort_as_half(gh));
  if (int8) {
    for (int i = lane; i < D; i += 32) {
      const float r = gs > 0.0f ? rintf(__fdiv_rn(x[i], gs)) : 0.0f;
      reinterpret_cast<int8_t*>(row)[i] = int8_t(fmaxf(-127.0f, fminf(127.0f, r)));
    }
    if (lane == 0) row[D] = uint8_t(gh & 0xFFu), row[D + 1] = uint8_t(gh >> 8);
    return;
  }
  // nvfp4r: s_b = e4m3(amax_b / (6 g)), code = e2m1(x / (e4m3(s_b) g)); a lane per 16-block
  for (int b = lane; b < D / 16; b += 32) {
    const float* xb = x + b * 16;
    float bmax = 0.0f;
    for (int i = 0; i < 16; ++i) bmax = fmaxf(bmax, fabsf(xb[i]));
    const uint8_t s = gs > 0.0f ? f32_to_e4m3_dev(__fdiv_rn(bmax, __fmul_rn(6.0f, gs))) : 0;
    const float sd = __fmul_rn(e4m3_dev(s), gs);
    row[D / 2 + b] = s;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = sd > 0.f ? f32_to_e2m1_rne(__fdiv_rn(xb[i], sd)) : 0;
      const uint8_t hi = sd > 0.f ? f32_to_e2m1_rne(__fdiv_rn(xb[i + 1], sd)) : 0;
      row[(b * 16 + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
  if (lane == 0) row[D / 2 + D / 16] = uint8_t(gh & 0xFFu), row[D / 2 + D / 16 + 1] = uint8_t(gh >> 8);
}

// =====================================================================================
// Paged attention of M queries (causal over the cache; query m sees pos[m] + 1 tokens)
// =====================================================================================
// One warp per (query, head[, split]): lane j scores token t0 + j of each 32-token tile
// against q (shared memory), an online softmax over tiles, then the tile's V rows accumulated
// with lanes over head_dim (d = lane + 32 e). f32 throughout. Fresh (fk != null): tokens
// t >= pos[0] (the chunk's own) are read from fk / fv rows t - pos[0] (stride fld) instead of
// the pages. Split (ws != null, small M): blockIdx.y owns tokens [y * split_len, (y + 1) *
// split_len) and writes its partial (acc[D], m, l) to ws[(item * gridDim.y + y) * (D + 2)];
// attn_paged_combine_kernel merges.

constexpr int kAttnWarpsPerBlock = 4;
constexpr int kAttnMaxD = 256;

template <int FMT, int E>
__global__ void __launch_bounds__(kAttnWarpsPerBlock * 32)
attention_paged_kernel(const uint8_t* __restrict__ kb, const uint8_t* __restrict__ vb, const int32_t* __restrict__ pages,
                       int block, int nkv, const float* __restrict__ q, int ldq, int M, int nh,
                       const int32_t* __restrict__ pos, float scale, float* __restrict__ out, int split_len,
                       float* __restrict__ ws, const float* __restrict__ fk, const float* __restrict__ fv, int fld) {
  constexpr int D = E * 32;
  constexpr int RK = row_bytes_of(FMT, D, false), RV = row_bytes_of(FMT, D, true);
  __shared__ float qs[kAttnWarpsPerBlock][D];
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int item = blockIdx.x * kAttnWarpsPerBlock + w;
  if (item >= M * nh) return;
  const int m = item / nh, h = item % nh, g = h / (nh / nkv);
  for (int d = lane; d < D; d += 32) qs[w][d] = q[size_t(m) * ldq + size_t(h) * D + d];
  __syncwarp();
  const int f0 = fk ? pos[0] : 0x7FFFFFFF;  // first token read from the fresh rows
  const int t_begin = ws ? int(blockIdx.y) * split_len : 0;
  const int ctx = ws ? min(pos[m] + 1, t_begin + split_len) : pos[m] + 1;
  float run_m = -INFINITY, run_l = 0.0f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;
  for (int t0 = t_begin; t0 < ctx; t0 += 32) {
    const int t = t0 + lane;
    float s = -INFINITY;
    if (t < ctx) {
      float dot = 0.0f;
      if (t >= f0) {
        const float* kr = fk + size_t(t - f0) * fld + size_t(g) * D;
        for (int d = 0; d < D; ++d) dot = fmaf(qs[w][d], kr[d], dot);
      } else {
        const size_t slot = size_t(pages[t / block]) * block + t % block;
        const uint8_t* kr = kb + (slot * nkv + g) * RK;
        for (int d = 0; d < D; ++d) dot = fmaf(qs[w][d], kv_elem<FMT, false>(kr, d, D), dot);
      }
      s = dot * scale;
    }
    const float tm = warp_max(s), nm = fmaxf(run_m, tm);
    const float corr = __expf(run_m - nm);  // run_m = -inf at first: 0
    const float p = t < ctx ? __expf(s - nm) : 0.0f;
    run_l = run_l * corr + warp_sum(p);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
    run_m = nm;
    const int n = min(32, ctx - t0);
    for (int j = 0; j < n; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const int tj = t0 + j;
      if (tj >= f0) {
        const float* vr = fv + size_t(tj - f0) * fld + size_t(g) * D;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(pj, vr[lane + 32 * e], acc[e]);
      } else {
        const size_t slot = size_t(pages[tj / block]) * block + tj % block;
        const uint8_t* vr = vb + (slot * nkv + g) * RV;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(pj, kv_elem<FMT, true>(vr, lane + 32 * e, D), acc[e]);
      }
    }
  }
  if (ws) {  // an empty split leaves m = -inf, l = 0
    float* p = ws + (size_t(item) * gridDim.y + blockIdx.y) * (D + 2);
#pragma unroll
    for (int e = 0; e < E; ++e) p[lane + 32 * e] = acc[e];
    if (lane == 0) p[D] = run_m, p[D + 1] = run_l;
    return;
  }
  const float inv = 1.0f / run_l;
#pragma unroll
  for (int e = 0; e < E; ++e) out[size_t(m) * nh * D + size_t(h) * D + lane + 32 * e] = acc[e] * inv;
}

// One block per (query, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void attn_paged_combine_kernel(const float* __restrict__ ws, int splits, int D, float* __restrict__ out) {
  const float* p = ws + size_t(blockIdx.x) * splits * (D + 2);
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, p[s * (D + 2) + D]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = p[s * (D + 2) + D];
      if (ms == -INFINITY) continue;
      const float c = __expf(ms - mx);
      num = fmaf(p[s * (D + 2) + d], c, num);
      den = fmaf(p[s * (D + 2) + D + 1], c, den);
    }
    out[size_t(blockIdx.x) * D + d] = num / den;
  }
}

struct PagedArgs {
  const uint8_t *k, *v;
  const int32_t* pages;
  int block, nkv;
  const float* q;
  int ldq, M, nh;
  const int32_t* pos;
  float scale;
  float* out;
  int split_len;
  float* ws;
  const float *fk, *fv;
  int fld;
};

template <int FMT>
cudaError_t launch_paged(int E, dim3 grid, const PagedArgs& a, cudaStream_t st) {
  const dim3 threads(kAttnWarpsPerBlock * 32);
#define KVDECK_PAGED_CASE(EE)                                                                                   \
  case EE:                                                                                                      \
    attention_paged_kernel<FMT, EE><<<grid, threads, 0, st>>>(a.k, a.v, a.pages, a.block, a.nkv, a.q, a.ldq, a.M, \
                                                              a.nh, a.pos, a.scale, a.out, a.split_len, a.ws,    \
                                                              a.fk, a.fv, a.fld);                                \
    break;
  switch (E) {
    KVDECK_PAGED_CASE(1)
    KVDECK_PAGED_CASE(2)
    KVDECK_PAGED_CASE(3)
    KVDECK_PAGED_CASE(4)
    KVDECK_PAGED_CASE(8)
    default: return cudaErrorInvalidValue;
  }
#undef KVDECK_PAGED_CASE
  return cudaGetLastError();
}

}  // namespace

// =====================================================================================
// Launchers
// =====================================================================================

cudaError_t kv_write_q(int format, void* k_pages, void* v_pages, int n_kv, int D, const float* k, const float* v,
                       int ld, const int32_t* slots, int M, cudaStream_t stream) {
  if (M < 1 || n_kv < 1 || D < 16 || D % 16 != 0 || ld < n_kv * D || (format != 3 && format != 4))
    return cudaErrorInvalidValue;
  const size_t threads = size_t(M) * n_kv * 2 * 32;
  kv_write_q_kernel<<<unsigned((threads + 127) / 128), 128, 0, stream>>>(
      format, static_cast<uint8_t*>(k_pages), static_cast<uint8_t*>(v_pages), k, v, ld, slots, M, n_kv, D);
  return cudaGetLastError();
}

cudaError_t attention_paged(int format, const void* k_pages, const void* v_pages, const int32_t* pages, int block,
                            int n_kv, int D, const float* q, int ldq, int M, int n_heads, const int32_t* pos,
                            float scale, float* out, cudaStream_t stream, int max_ctx, float* ws,
                            const float* fresh_k, const float* fresh_v, int fresh_ld) {
  if (M < 1 || n_kv < 1 || n_heads % n_kv != 0 || D % 32 != 0 || D > kAttnMaxD || block < 1 || format < 0 ||
      format > 4 || ldq < n_heads * D || (format >= 2 && D % 16 != 0) ||
      (fresh_k && (!fresh_v || fresh_ld < n_kv * D)))
    return cudaErrorInvalidValue;
  const int splits = ws ? paged_attn_splits(max_ctx) : 1, split_len = ws ? paged_attn_split_len(max_ctx) : 0;
  const dim3 grid(unsigned((size_t(M) * n_heads + kAttnWarpsPerBlock - 1) / kAttnWarpsPerBlock), splits);
  const PagedArgs a{static_cast<const uint8_t*>(k_pages), static_cast<const uint8_t*>(v_pages), pages, block, n_kv,
                    q, ldq, M, n_heads, pos, scale, out, split_len, ws, fresh_k, fresh_v, fresh_ld};
  const int E = D / 32;
  cudaError_t e;
  switch (format) {
    case 0: e = launch_paged<0>(E, grid, a, stream); break;
    case 1: e = launch_paged<1>(E, grid, a, stream); break;
    case 2: e = launch_paged<2>(E, grid, a, stream); break;
    case 3: e = launch_paged<3>(E, grid, a, stream); break;
    default: e = launch_paged<4>(E, grid, a, stream); break;
  }
  if (e != cudaSuccess || !ws) return e;
  attn_paged_combine_kernel<<<M * n_heads, D < 128 ? D : 128, 0, stream>>>(ws, splits, D, out);
  return cudaGetLastError();
}

}  // namespace kvdeck::cuda
