// attention.cu — paged decode attention over f16 and NVFP4 KV pages (flash-decoding split).
// Contracts: kernels_cuda.h.
//
// Grid (n_kv, splits): one block of 4 warps per (KV head g, split of the sequence); each warp
// owns a quarter of the split. A warp reads TPW tokens per step, LPT = D / 8 lanes per token,
// each lane 8 consecutive values of the row (f16: one 16-byte load; NVFP4: 4 code bytes and
// the E4M3 scale of its 16-value block). A chunk is kUnroll steps; the next chunk's K and V
// loads are issued before the current chunk is computed (register double buffer), and the
// warp's page indices sit in one register per lane (fetched by shuffle), so no load waits
// on another. Scores for the G query heads are reduced across the LPT lanes by shuffles;
// each token group keeps its own online softmax (m, l, o), merged across the warp and the
// block at the end. Scores run in the log2 domain (q pre-scaled by scale * log2 e; exp2).
// NVFP4 rows are dequantised in registers (byte-permute lookup to f16) and never written.
// A second kernel merges the splits' partials (attention_combine.cu).
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

constexpr int kUnroll = 4;  // steps per chunk
constexpr int kE = 8;       // values per lane

// One lane's 8 values of a K or V row.
template <KvFormat F>
struct Slice {
  uint32_t w[F == KvFormat::F16 ? 4 : 1];
  uint32_t sc;
  __device__ __forceinline__ void load(const uint8_t* row, int D, int sub) {
    if constexpr (F == KvFormat::F16) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + sub);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      sc = 0;
    } else {
      w[0] = __ldg(reinterpret_cast<const uint32_t*>(row) + sub);  // codes 8sub .. 8sub+7
      sc = __ldg(row + D / 2 + sub / 2);                             // its 16-value block
    }
  }
  // The 8 values as 4 half2 (NVFP4: e2m1 values, unscaled).
  __device__ __forceinline__ void halves(uint32_t (&h)[4]) const {
    if constexpr (F == KvFormat::F16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = w[i];
    } else {
      e2m1x8_to_half2x4(w[0], h);
    }
  }
  __device__ __forceinline__ float scale() const {
    if constexpr (F == KvFormat::F16) return 1.0f;
    else return e4m3_to_float(sc);
  }
};

// q . k over a lane's 8 values for each head. HALF_K: products summed in half2 over the 8
// values (exact e2m1 values, q rounded to f16), then f32; otherwise all f32.
template <KvFormat F, int G, bool HALF_K>
__device__ __forceinline__ void qk(const Slice<F>& k, const float (&qf)[G][kE], const __half2 (&qh)[G][kE / 2],
                                   float (&s)[G]) {
  uint32_t h[4];
  k.halves(h);
  const float sk = k.scale();
  if constexpr (HALF_K) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      __half2 a = __hmul2(qh[g][0], *reinterpret_cast<const __half2*>(&h[0]));
#pragma unroll
      for (int i = 1; i < 4; ++i) a = __hfma2(qh[g][i], *reinterpret_cast<const __half2*>(&h[i]), a);
      const float2 f = __half22float2(a);
      s[g] = (f.x + f.y) * sk;
    }
  } else {
    float kf[kE];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
      kf[2 * i] = v.x, kf[2 * i + 1] = v.y;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float a = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) a = fmaf(qf[g][e], kf[e], a);
      s[g] = a * sk;
    }
  }
}

// =====================================================================================
// Split kernel: one block per (KV head, split)
// =====================================================================================

template <KvFormat F, int D, int G, bool HALF_K>
__global__ void __launch_bounds__(kAttnWarps * 32, F == KvFormat::NVFP4 ? 4 : 3)
attn_split_kernel(const uint8_t* __restrict__ kbase, const uint8_t* __restrict__ vbase,
                  const int32_t* __restrict__ pages, int block, int n_kv,
                  const float* __restrict__ q, const int32_t* __restrict__ ctx_dev, int split,
                  int n_splits, int n_pt, float scale_log2, float* __restrict__ ws) {
  constexpr int LPT = D / kE, TPW = 32 / LPT, CHUNK = kUnroll * TPW;
  constexpr size_t kRow = F == KvFormat::F16 ? size_t(D) * 2 : size_t(D) / 2 + D / 16;
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
  __half2 qh[G][kE / 2];
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int e = 0; e < kE; ++e) qf[h][e] = q[size_t(g * G + h) * D + sub * kE + e] * scale_log2;
#pragma unroll
    for (int e = 0; e < kE / 2; ++e) qh[h][e] = __floats2half2_rn(qf[h][2 * e], qf[h][2 * e + 1]);
  }
  const int ctx = *ctx_dev;
  if (t_begin >= ctx) return;  // not a live split (the combine reads only live ones)
  const int t_end = min(ctx, t_begin + split);
  const int w_end = min(t_end, w_begin + per_warp);

  float o[G][kE] = {}, m[G], l[G];
#pragma unroll
  for (int h = 0; h < G; ++h) m[h] = -INFINITY, l[h] = 0.0f;

  // chunk loads: CHUNK (8 or 16) tokens from t0, a multiple of 16: never across a page
  auto load = [&](int t0, Slice<F> (&ks)[kUnroll], Slice<F> (&vs)[kUnroll]) {
    const int pg = __shfl_sync(0xffffffffu, my_page, min(t0 / block - p_first, 31));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = min(t0 + u * TPW + tg, w_end - 1);  // past the end: reload the last row
      const size_t off = ((size_t(pg) * block + t % block) * n_kv + g) * kRow;
      ks[u].load(kbase + off, D, sub);
      vs[u].load(vbase + off, D, sub);
    }
  };

  // the next chunk's loads are issued before this chunk is computed (measured: without the
  // second buffer the f16 kernel ran 1.3x slower at 32K)
  constexpr bool kPrefetch = true;
  Slice<F> ks[kUnroll], vs[kUnroll], kn[kUnroll], vn[kUnroll];
  if (w_begin < w_end) load(w_begin, ks, vs);
  for (int t0 = w_begin; t0 < w_end; t0 += CHUNK) {
    if (kPrefetch && t0 + CHUNK < w_end) load(t0 + CHUNK, kn, vn);  // prefetch the next chunk
    float s[kUnroll][G];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) qk<F, G, HALF_K>(ks[u], qf, qh, s[u]);
#pragma unroll
    for (int off = 1; off < LPT; off <<= 1)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int h = 0; h < G; ++h) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], off);
    float p[kUnroll][G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float cm = m[h];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (t0 + u * TPW + tg >= w_end) s[u][h] = -INFINITY;
        cm = fmaxf(cm, s[u][h]);
      }
      const float ref = cm == -INFINITY ? 0.0f : cm;
      const float alpha = exp2f(m[h] - ref);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += (p[u][h] = exp2f(s[u][h] - ref));
      l[h] = l[h] * alpha + sum;
      m[h] = cm;
#pragma unroll
      for (int e = 0; e < kE; ++e) o[h][e] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint32_t hv[4];
      vs[u].halves(hv);
      float vf[kE];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&hv[i]));
        vf[2 * i] = v.x, vf[2 * i + 1] = v.y;
      }
      const float sv = vs[u].scale();
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float w = p[u][h] * sv;
#pragma unroll
        for (int e = 0; e < kE; ++e) o[h][e] = fmaf(w, vf[e], o[h][e]);
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) ks[u] = kn[u], vs[u] = vn[u];
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

template <KvFormat F, int D, bool HALF_K>
cudaError_t launch_split(const PagedKv& kv, int G, dim3 grid, const float* q, const int32_t* ctx,
                         int split, int n_splits, int n_pt, float sl2, float* ws, cudaStream_t st) {
  const auto* k = static_cast<const uint8_t*>(kv.k);
  const auto* v = static_cast<const uint8_t*>(kv.v);
  const dim3 threads(kAttnWarps * 32);
#define KVDECK_ATTN_CASE(GG)                                                               \
  case GG:                                                                                 \
    return launch_kernel(attn_split_kernel<F, D, GG, HALF_K>, grid, threads, st, /*pdl=*/true, k, v, kv.pages, \
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

template <bool HALF_K>
cudaError_t decode_impl(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                        int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream,
                        const float* fresh_k = nullptr, const float* fresh_v = nullptr,
                        const int32_t* rope_pos = nullptr, const float* rope_inv = nullptr) {
  if (!attn_shape_ok(kv, n_heads, max_ctx)) return cudaErrorInvalidValue;
  const int G = n_heads / kv.n_kv;
  const int split = attn_split_tokens(max_ctx), n_splits = attn_splits(max_ctx);
  const int n_pt = (max_ctx + kv.block - 1) / kv.block;
  const dim3 grid(kv.n_kv, n_splits);
  const float sl2 = scale * 1.4426950408889634f;  // log2(e)
  cudaError_t err;
  if (kv.format == KvFormat::F16)
    err = kv.D == 128 ? launch_split<KvFormat::F16, 128, false>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream)
                      : launch_split<KvFormat::F16, 64, false>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream);
  else if (kv.format == KvFormat::NVFP4)
    err = kv.D == 128 ? launch_split<KvFormat::NVFP4, 128, HALF_K>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream)
                      : launch_split<KvFormat::NVFP4, 64, HALF_K>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream);
  else
    return cudaErrorInvalidValue;
  if (err != cudaSuccess) return err;
  const AttnFresh f{fresh_k ? q : nullptr, fresh_k, fresh_v, sl2, G, rope_pos, rope_inv};
  return launch_attn_combine(workspace, ctx_dev, split, n_splits, kv.D, n_heads, out, stream, f);
}

}  // namespace

cudaError_t attention_decode(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                             int max_ctx, float scale, float* workspace, float* out,
                             cudaStream_t stream, const float* fresh_k, const float* fresh_v,
                             const int32_t* rope_pos, const float* rope_inv) {
  if ((fresh_k == nullptr) != (fresh_v == nullptr)) return cudaErrorInvalidValue;
  // measured on the H200 (gpu_bench): NVFP4 pages run fastest on the tensor cores, f16 pages
  // (memory-bound) on the f32 SIMT kernel; NVFP4R / K8V4 have only the tensor-core kernel
  if (kv.format == KvFormat::NVFP4 || kv.format == KvFormat::NVFP4R || kv.format == KvFormat::K8V4)
    return detail::attention_decode_mma(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream, fresh_k,
                                        fresh_v, rope_pos, rope_inv);
  return decode_impl<false>(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream, fresh_k, fresh_v,
                            rope_pos, rope_inv);
}

namespace detail {
cudaError_t attention_decode_simt(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                  int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream) {
  return decode_impl<false>(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream);
}
}  // namespace detail

namespace detail {
cudaError_t attention_decode_half_qk(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                     int max_ctx, float scale, float* workspace, float* out,
                                     cudaStream_t stream) {
  return decode_impl<true>(kv, q, n_heads, ctx_dev, max_ctx, scale, workspace, out, stream);
}
}  // namespace detail

}  // namespace kvdeck::cuda
