// attention.cu — paged decode attention over f16 and f32 KV pages on the SIMT cores
// (flash-decoding split). Contracts: kernels_cuda.h. The 4-bit formats have their own kernel
// on the tensor cores (attention_mma.cu).
//
// Grid (n_kv, splits): one block of 4 warps per (KV head g, split of the sequence); each warp
// owns a quarter of the split. A warp reads TPW tokens per step, LPT = D / 8 lanes per token,
// each lane 8 consecutive values of the row (f16: one 16-byte load; f32: two). A chunk is
// kUnroll steps (4, f32: 2); the next chunk's K and V
// loads are issued before the current chunk is computed (register double buffer), and the
// warp's page indices sit in one register per lane (fetched by shuffle), so no load waits
// on another. Scores for the G query heads are reduced across the LPT lanes by shuffles;
// each token group keeps its own online softmax (m, l, o), merged across the warp and the
// block at the end. Scores run in the log2 domain (q pre-scaled by scale * log2 e; exp2), all
// arithmetic in f32. A second kernel merges the splits' partials (attention_combine.cu).
#include <cstdint>

#include "attention_impl.cuh"
#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// =====================================================================================
// Row slices and q . k
// =====================================================================================

constexpr int kE = 8;  // values per lane
// steps per chunk: f32 rows are twice the registers of f16 (a lane's 8 values: 32 bytes)
template <KvFormat F>
constexpr int kUnroll = F == KvFormat::F32 ? 2 : 4;

// One lane's 8 values of a K or V row (f16: one 16-byte load; f32: two).
template <KvFormat F>
struct Slice {
  static constexpr int kW = F == KvFormat::F32 ? 8 : 4;
  uint32_t w[kW];
  __device__ __forceinline__ void load(const uint8_t* row, int sub) {
    const uint4* p = reinterpret_cast<const uint4*>(row) + sub * (kW / 4);
#pragma unroll
    for (int i = 0; i < kW / 4; ++i) {
      const uint4 v = __ldg(p + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
  __device__ __forceinline__ void floats(float (&f)[kE]) const {
    if constexpr (F == KvFormat::F32) {
#pragma unroll
      for (int i = 0; i < kE; ++i) f[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
      }
    }
  }
};

// q . k over a lane's 8 values for each head, in f32.
template <KvFormat F, int G>
__device__ __forceinline__ void qk(const Slice<F>& k, const float (&qf)[G][kE], float (&s)[G]) {
  float kf[kE];
  k.floats(kf);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) a = fmaf(qf[g][e], kf[e], a);
    s[g] = a;
  }
}

// =====================================================================================
// Split kernel: one block per (KV head, split)
// =====================================================================================

template <KvFormat F, int D, int G>
__global__ void __launch_bounds__(kAttnWarps * 32, 3)
attn_split_kernel(const uint8_t* __restrict__ kbase, const uint8_t* __restrict__ vbase,
                  const int32_t* __restrict__ pages, int block, int n_kv,
                  const float* __restrict__ q, const int32_t* __restrict__ ctx_dev, int split,
                  int n_splits, int n_pt, float scale_log2, float* __restrict__ ws) {
  constexpr int U = kUnroll<F>, LPT = D / kE, TPW = 32 / LPT, CHUNK = U * TPW;
  constexpr size_t kRow = size_t(D) * (F == KvFormat::F32 ? 4 : 2);
  const int g = blockIdx.x, sp = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int tg = lane / LPT, sub = lane % LPT;
  const int per_warp = split / kAttnWarps;  // a multiple of 16, at most 512
  const int t_begin = sp * split, w_begin = t_begin + warp * per_warp;
  // issued before ctx is known: the warp's page indices (one per lane, at most 32; the table
  // covers max_ctx) and q
  const int p_first = w_begin / block;
  const int my_page = p_first + lane < n_pt ? __ldg(pages + p_first + lane) : 0;
  pdl_wait();  // launched with PDL: q and ctx are the previous kernel's outputs
  float qf[G][kE];
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int e = 0; e < kE; ++e) qf[h][e] = q[size_t(g * G + h) * D + sub * kE + e] * scale_log2;
  const int ctx = *ctx_dev;
  if (t_begin >= ctx) return;  // not a live split (the combine reads only live ones)
  const int t_end = min(ctx, t_begin + split);
  const int w_end = min(t_end, w_begin + per_warp);

  float o[G][kE] = {}, m[G], l[G];
#pragma unroll
  for (int h = 0; h < G; ++h) m[h] = -INFINITY, l[h] = 0.0f;

  // chunk loads: CHUNK (4, 8 or 16: a divisor of 16) tokens from t0: never across a page
  auto load = [&](int t0, Slice<F> (&ks)[U], Slice<F> (&vs)[U]) {
    const int pg = __shfl_sync(0xffffffffu, my_page, min(t0 / block - p_first, 31));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = min(t0 + u * TPW + tg, w_end - 1);  // past the end: reload the last row
      const size_t off = ((size_t(pg) * block + t % block) * n_kv + g) * kRow;
      ks[u].load(kbase + off, sub);
      vs[u].load(vbase + off, sub);
    }
  };

  // the next chunk's loads are issued before this chunk is computed (measured: without the
  // second buffer the f16 kernel ran 1.3x slower at 32K)
  constexpr bool kPrefetch = true;
  Slice<F> ks[U], vs[U], kn[U], vn[U];
  if (w_begin < w_end) load(w_begin, ks, vs);
  for (int t0 = w_begin; t0 < w_end; t0 += CHUNK) {
    if (kPrefetch && t0 + CHUNK < w_end) load(t0 + CHUNK, kn, vn);  // prefetch the next chunk
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) qk<F, G>(ks[u], qf, s[u]);
#pragma unroll
    for (int off = 1; off < LPT; off <<= 1)
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int h = 0; h < G; ++h) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], off);
    float p[U][G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float cm = m[h];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (t0 + u * TPW + tg >= w_end) s[u][h] = -INFINITY;
        cm = fmaxf(cm, s[u][h]);
      }
      const float ref = cm == -INFINITY ? 0.0f : cm;
      const float alpha = exp2f(m[h] - ref);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) sum += (p[u][h] = exp2f(s[u][h] - ref));
      l[h] = l[h] * alpha + sum;
      m[h] = cm;
#pragma unroll
      for (int e = 0; e < kE; ++e) o[h][e] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[kE];
      vs[u].floats(vf);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float w = p[u][h];
#pragma unroll
        for (int e = 0; e < kE; ++e) o[h][e] = fmaf(w, vf[e], o[h][e]);
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int u = 0; u < U; ++u) ks[u] = kn[u], vs[u] = vn[u];
    }
    if (!kPrefetch && t0 + CHUNK < w_end) load(t0 + CHUNK, ks, vs);
  }

  pdl_launch_dependents();  // the combine kernel may start (it waits for this grid to finish)
  // merge the TPW token groups of the warp (lanes sub, sub + LPT, ...)
#pragma unroll
  for (int off = LPT; off < 32; off <<= 1)
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
      const float mx = fmaxf(m[h], mo), ref = mx == -INFINITY ? 0.0f : mx;
      const float wa = exp2f(m[h] - ref), wb = exp2f(mo - ref);
      l[h] = l[h] * wa + lo * wb;
      m[h] = mx;
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        const float oo = __shfl_xor_sync(0xffffffffu, o[h][e], off);
        o[h][e] = o[h][e] * wa + oo * wb;
      }
    }

  // merge the warps in shared memory, write the split's partial (o relative to its max)
  __shared__ float so[kAttnWarps][G][D];
  __shared__ float sm[kAttnWarps][G], sl[kAttnWarps][G];
  if (tg == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int e = 0; e < kE; ++e) so[warp][h][sub * kE + e] = o[h][e];
      if (sub == 0) sm[warp][h] = m[h], sl[warp][h] = l[h];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += kAttnWarps * 32) {
    const int h = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, sm[w][h]);
    const float ref = mx == -INFINITY ? 0.0f : mx;
    float acc = 0.0f, lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float c = exp2f(sm[w][h] - ref);
      acc += c * so[w][h][d];
      lsum += c * sl[w][h];
    }
    float* dst = ws + (size_t(g * G + h) * n_splits + sp) * (D + 2);
    dst[d] = acc;
    if (d == 0) dst[D] = mx, dst[D + 1] = lsum;
  }
}

// =====================================================================================
// Launchers
// =====================================================================================

template <KvFormat F, int D>
cudaError_t launch_split(const PagedKv& kv, int G, dim3 grid, const float* q, const int32_t* ctx,
                         int split, int n_splits, int n_pt, float sl2, float* ws, cudaStream_t st) {
  const auto* k = static_cast<const uint8_t*>(kv.k);
  const auto* v = static_cast<const uint8_t*>(kv.v);
  const dim3 threads(kAttnWarps * 32);
#define KVDECK_ATTN_CASE(GG)                                                               \
  case GG:                                                                                 \
    return launch_kernel(attn_split_kernel<F, D, GG>, grid, threads, st, /*pdl=*/true, k, v, kv.pages, \
                         kv.block, kv.n_kv, q, ctx, split, n_splits, n_pt, sl2, ws);
  switch (G) {
    KVDECK_ATTN_CASE(1)
    KVDECK_ATTN_CASE(2)
    KVDECK_ATTN_CASE(3)
    KVDECK_ATTN_CASE(4)
    KVDECK_ATTN_CASE(5)
    KVDECK_ATTN_CASE(6)
    KVDECK_ATTN_CASE(7)
    KVDECK_ATTN_CASE(8)
    default: return cudaErrorInvalidValue;
  }
#undef KVDECK_ATTN_CASE
  return cudaGetLastError();
}

cudaError_t decode_impl(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                        int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream,
                        const float* fresh_k = nullptr, const float* fresh_v = nullptr,
                        const int32_t* rope_pos = nullptr, const float* rope_inv = nullptr,
                        const ActQ8Out& q8 = {}) {
  if (!attn_shape_ok(kv, n_heads, max_ctx)) return cudaErrorInvalidValue;
  const int G = n_heads / kv.n_kv;
  const int split = attn_split_tokens(max_ctx), n_splits = attn_splits(max_ctx);
  const int n_pt = (max_ctx + kv.block - 1) / kv.block;
  const dim3 grid(kv.n_kv, n_splits);
  const float sl2 = scale * 1.4426950408889634f;  // log2(e)
  cudaError_t err;
  if (kv.format == KvFormat::F16)
    err = kv.D == 128 ? launch_split<KvFormat::F16, 128>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream)
                      : launch_split<KvFormat::F16, 64>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream);
  else if (kv.format == KvFormat::F32)
    err = kv.D == 128 ? launch_split<KvFormat::F32, 128>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream)
                      : launch_split<KvFormat::F32, 64>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream);
  else
    return cudaErrorInvalidValue;
  if (err != cudaSuccess) return err;
  const AttnFresh f{fresh_k ? q : nullptr, fresh_k, fresh_v, sl2, G, rope_pos, rope_inv};
  return launch_attn_combine(workspace, ctx_dev, split, n_splits, kv.D, n_heads, out, stream, f, q8);
}

}  // namespace

cudaError_t attention_decode(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                             int max_ctx, float scale, float* workspace, float* out,
                             cudaStream_t stream, const float* fresh_k, const float* fresh_v,
                             const int32_t* rope_pos, const float* rope_inv, const ActQ8Out& q8) {
  if ((fresh_k == nullptr) != (fresh_v == nullptr)) return cudaErrorInvalidValue;
  if ((q8.q == nullptr) != (q8.d == nullptr) || (q8.q == nullptr) != (q8.s == nullptr)) return cudaErrorInvalidValue;
  // measured on the H200 (gpu_bench): the 4-bit formats run fastest on the tensor cores
  // (attention_mma.cu; NVFP4 on this SIMT kernel took 57.6 µs at 32K against 33.0), f16 and
  // f32 pages (memory-bound) on the f32 SIMT kernel here
  if (kv.format == KvFormat::NVFP4 || kv.format == KvFormat::NVFP4R || kv.format == KvFormat::K8V4)
    return detail::attention_decode_mma(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream, fresh_k,
                                        fresh_v, rope_pos, rope_inv, q8);
  return decode_impl(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream, fresh_k, fresh_v, rope_pos,
                     rope_inv, q8);
}

namespace detail {
cudaError_t attention_decode_simt(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                  int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream) {
  return decode_impl(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream);
}
}  // namespace detail

}  // namespace kvdeck::cuda
