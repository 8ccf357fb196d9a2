// attention.cu — paged decode attention over f16 and NVFP4 KV pages (flash-decoding split).
// Contracts: kernels_cuda.h.
//
// Grid (n_kv, splits): one block of 4 warps per (KV head g, split of the sequence); each warp
// owns a quarter of the split. A warp reads TPW tokens per step, LPT = D / E lanes per token,
// each lane E consecutive values of the row (f16: 8 values, one 16-byte load; NVFP4: 16
// values, 8 code bytes and its one E4M3 scale). Scores for the G query heads of the group
// are reduced across the LPT lanes by shuffles; each token group keeps its own online
// softmax (m, l, o) in registers, merged across the warp and then the block at the end.
// Scores run in the log2 domain (q pre-scaled by scale * log2 e; exp2). NVFP4 rows are
// dequantised in registers (byte-permute lookup to f16, then f32), never written back.
// A second kernel merges the splits' partials, one block per query head.
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kAttnWarps = 4;
constexpr int kUnroll = 4;  // steps per chunk: kUnroll * TPW tokens' K and V loads in flight

// E values of one K or V row slice -> f32, times the slice's scale for NVFP4 (E == 16: a
// lane's slice is exactly one 16-value scale block).
template <KvFormat F, int E>
struct Slice {
  uint32_t w[F == KvFormat::F16 ? 4 : 2];
  uint32_t sc;
  __device__ __forceinline__ void load(const uint8_t* row, int D, int sub) {
    if constexpr (F == KvFormat::F16) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + sub);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      sc = 0;
    } else {
      const uint32_t* c = reinterpret_cast<const uint32_t*>(row + sub * 8);  // 4-byte aligned
      w[0] = __ldg(c);
      w[1] = __ldg(c + 1);
      sc = __ldg(row + D / 2 + sub);
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (auto& x : w) x = 0;
    sc = 0;
  }
  // Unscaled values (NVFP4: e2m1 codes' values; the block scale is applied by the caller).
  __device__ __forceinline__ void values(float (&f)[E]) const {
    uint32_t h[E / 2];
    if constexpr (F == KvFormat::F16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = w[i];
    } else {
      e2m1x8_to_half2x4(w[0], h);
      e2m1x8_to_half2x4(w[1], h + 4);
    }
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
      f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
  }
  __device__ __forceinline__ float scale() const {
    if constexpr (F == KvFormat::F16) return 1.0f;
    else return e4m3_to_float(sc);
  }
};

template <KvFormat F, int D, int G>
__global__ void __launch_bounds__(kAttnWarps * 32)
attn_split_kernel(const uint8_t* __restrict__ kbase, const uint8_t* __restrict__ vbase,
                  const int32_t* __restrict__ pages, int block, int n_kv,
                  const float* __restrict__ q, const int32_t* __restrict__ ctx_dev, int split,
                  int n_splits, float scale_log2, float* __restrict__ ws) {
  constexpr int E = F == KvFormat::F16 ? 8 : 16;
  constexpr int LPT = D / E, TPW = 32 / LPT;
  constexpr size_t kRow = F == KvFormat::F16 ? size_t(D) * 2 : size_t(D) / 2 + D / 16;
  const int g = blockIdx.x, sp = blockIdx.y;
  const int ctx = *ctx_dev;
  const int t_begin = sp * split;
  if (t_begin >= ctx) return;  // not a live split (the combine reads only live ones)
  const int t_end = min(ctx, t_begin + split);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int tg = lane / LPT, sub = lane % LPT;
  const int per_warp = split / kAttnWarps;
  const int w_begin = t_begin + warp * per_warp, w_end = min(t_end, w_begin + per_warp);

  float qf[G][E];
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int e = 0; e < E; ++e) qf[h][e] = q[size_t(g * G + h) * D + sub * E + e] * scale_log2;

  float o[G][E] = {}, m[G], l[G];
#pragma unroll
  for (int h = 0; h < G; ++h) m[h] = -INFINITY, l[h] = 0.0f;

  for (int t0 = w_begin; t0 < w_end; t0 += kUnroll * TPW) {
    Slice<F, E> ks[kUnroll], vs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = t0 + u * TPW + tg;
      if (t < w_end) {
        const size_t off = ((size_t(__ldg(pages + t / block)) * block + t % block) * n_kv + g) * kRow;
        ks[u].load(kbase + off, D, sub);
        vs[u].load(vbase + off, D, sub);
      } else {
        ks[u].zero();
        vs[u].zero();
      }
    }
    // scores s[u][h] (log2 domain), reduced over the LPT lanes of the token
    float s[kUnroll][G];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[E];
      ks[u].values(kf);
      const float sk = ks[u].scale();
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float a = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) a = fmaf(qf[h][e], kf[e], a);
        s[u][h] = a * sk;
      }
    }
#pragma unroll
    for (int off = 1; off < LPT; off <<= 1)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int h = 0; h < G; ++h) s[u][h] += __shfl_xor_sync(0xffffffffu, s[u][h], off);
    // online softmax update, once per chunk
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
      for (int e = 0; e < E; ++e) o[h][e] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float vf[E];
      vs[u].values(vf);
      const float sv = vs[u].scale();
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float w = p[u][h] * sv;
#pragma unroll
        for (int e = 0; e < E; ++e) o[h][e] = fmaf(w, vf[e], o[h][e]);
      }
    }
  }

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
      for (int e = 0; e < E; ++e) {
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
      for (int e = 0; e < E; ++e) so[warp][h][sub * E + e] = o[h][e];
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

// out[h, d] = sum_s 2^(m_s - M) o_s[d] / sum_s 2^(m_s - M) l_s over the live splits.
__global__ void attn_combine_kernel(const float* __restrict__ ws, const int32_t* __restrict__ ctx_dev,
                                    int split, int n_splits, int D, float* __restrict__ out) {
  const int h = blockIdx.x, live = (*ctx_dev + split - 1) / split;
  const float* base = ws + size_t(h) * n_splits * (D + 2);
  float mx = -INFINITY;
  for (int s = 0; s < live; ++s) mx = fmaxf(mx, base[size_t(s) * (D + 2) + D]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f, lsum = 0.0f;
    for (int s = 0; s < live; ++s) {
      const float* p = base + size_t(s) * (D + 2);
      const float c = exp2f(p[D] - mx);
      acc += c * p[d];
      lsum += c * p[D + 1];
    }
    out[size_t(h) * D + d] = acc / lsum;
  }
}

template <KvFormat F, int D>
cudaError_t launch_split(const PagedKv& kv, int G, dim3 grid, const float* q, const int32_t* ctx,
                         int split, int n_splits, float sl2, float* ws, cudaStream_t st) {
  const auto* k = static_cast<const uint8_t*>(kv.k);
  const auto* v = static_cast<const uint8_t*>(kv.v);
  const dim3 threads(kAttnWarps * 32);
#define KVDECK_ATTN_CASE(GG)                                                                 \
  case GG:                                                                                   \
    attn_split_kernel<F, D, GG><<<grid, threads, 0, st>>>(k, v, kv.pages, kv.block, kv.n_kv, \
                                                          q, ctx, split, n_splits, sl2, ws); \
    break;
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

}  // namespace

cudaError_t attention_decode(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                             int max_ctx, float scale, float* workspace, float* out,
                             cudaStream_t stream) {
  if (kv.n_kv < 1 || n_heads % kv.n_kv != 0 || (kv.D != 64 && kv.D != 128) || kv.block < 16 ||
      kv.block % 16 != 0 || max_ctx < 1)
    return cudaErrorInvalidValue;
  const int G = n_heads / kv.n_kv;
  if (G < 1 || G > 8) return cudaErrorInvalidValue;
  const int split = attn_split_tokens(max_ctx), n_splits = attn_splits(max_ctx);
  const dim3 grid(kv.n_kv, n_splits);
  const float sl2 = scale * 1.4426950408889634f;  // log2(e)
  cudaError_t err;
  if (kv.format == KvFormat::F16)
    err = kv.D == 128 ? launch_split<KvFormat::F16, 128>(kv, G, grid, q, ctx_dev, split, n_splits, sl2, workspace, stream)
                      : launch_split<KvFormat::F16, 64>(kv, G, grid, q, ctx_dev, split, n_splits, sl2, workspace, stream);
  else if (kv.format == KvFormat::NVFP4)
    err = kv.D == 128 ? launch_split<KvFormat::NVFP4, 128>(kv, G, grid, q, ctx_dev, split, n_splits, sl2, workspace, stream)
                      : launch_split<KvFormat::NVFP4, 64>(kv, G, grid, q, ctx_dev, split, n_splits, sl2, workspace, stream);
  else
    return cudaErrorInvalidValue;
  if (err != cudaSuccess) return err;
  attn_combine_kernel<<<n_heads, kv.D, 0, stream>>>(workspace, ctx_dev, split, n_splits, kv.D, out);
  return cudaGetLastError();
}

}  // namespace kvdeck::cuda
