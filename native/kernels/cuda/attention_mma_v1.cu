// attention_mma_v1.cu — the session-6 NVFP4 decode split kernel, kept for one A/B against
// attention_mma.cu's (session 7, gpukv7): detail::attention_decode_mma_v1, NVFP4 pages only,
// same contract as detail::attention_decode_mma. To be deleted once measured.
#include <cstdint>

#include "attention_impl.cuh"
#include "attention_mma_rows.cuh"
#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// The mma: common.cuh mma16816; the rows, their loads and f16 conversion: attention_mma_rows.cuh.

// =====================================================================================
// Split kernel on the tensor cores
// =====================================================================================

constexpr int PAIR = 1;  // chunks of 16 tokens per softmax step (2 measured slower: deleted)

template <KvFormat F, int D, int G>
__global__ void __launch_bounds__(kAttnWarps * 32, F == KvFormat::NVFP4 ? 4 : 3)  // 16 / 12 warps per SM
attn_mma_v1_kernel(const uint8_t* __restrict__ kbase, const uint8_t* __restrict__ vbase,
                const int32_t* __restrict__ pages, int block, int n_kv, const float* __restrict__ q,
                const int32_t* __restrict__ ctx_dev, int split, int n_splits, int n_pt, float scale_log2,
                float* __restrict__ ws) {
  using R = KvRegs<F, D>;
  constexpr int KS = D / 16;  // k slices of S; also m tiles of O^T
  static_assert(F != KvFormat::F16 && F != KvFormat::F32, "the 4-bit formats");
  constexpr bool kRS = Fmt<F>::kRowScale;
  constexpr float kPv = kRS ? 256.0f : 1.0f;  // P x V row scale x 256 keeps small products normal in f16
  const int g_kv = blockIdx.x, sp = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, gid = lane >> 2, tig = lane & 3;
  const int per_warp = split / kAttnWarps;
  const int t_begin = sp * split, w_begin = t_begin + warp * per_warp;
  // issued before ctx is known: page indices (the table covers max_ctx) and Q
  const int p_first = w_begin / block;
  const int my_page = p_first + lane < n_pt ? __ldg(pages + p_first + lane) : 0;
  pdl_wait();  // launched with PDL: q and ctx are the previous kernel's outputs

  // Q as the A operand (rows = heads; lane row gid), rounded to f16
  uint32_t qhi[KS][2];
#pragma unroll
  for (int j = 0; j < KS; ++j)
#pragma unroll
    for (int hlf = 0; hlf < 2; ++hlf) {
      float a = 0.f, b = 0.f;
      if (gid < G) {
        const float* qr = q + size_t(g_kv * G + gid) * D + tig * (D / 4) + 4 * j + 2 * hlf;
        a = qr[0] * scale_log2, b = qr[1] * scale_log2;
      }
      qhi[j][hlf] = h2bits(__floats2half2_rn(a, b));
    }
  const int ctx = *ctx_dev;
  if (t_begin >= ctx) return;
  const int t_end = min(ctx, t_begin + split);
  const int w_end = min(t_end, w_begin + per_warp);

  float oc[KS][4] = {};             // O^T tiles: (d rows, head columns 2t, 2t+1)
  float m = -INFINITY, l = 0.0f;    // softmax state of head gid (l: this lane's tokens)
  constexpr int STEP = 16 * PAIR;
  R cur[PAIR], nxt[PAIR];
  auto load = [&](int t0, R& r) {
    if (t0 >= w_end) t0 -= 16;  // a pair's second chunk past the end: re-read the first (masked)
    const int pg = __shfl_sync(0xffffffffu, my_page, min(t0 / block - p_first, 31));
    load_chunk<F, D>(r, kbase, vbase, size_t(pg) * block + t0 % block, n_kv, g_kv, w_end - t0, gid, tig);
  };
  auto load_step = [&](int t0, R (&r)[PAIR]) {
#pragma unroll
    for (int c = 0; c < PAIR; ++c) load(t0 + 16 * c, r[c]);
  };
  if (w_begin < w_end) load_step(w_begin, cur);
  for (int t0 = w_begin; t0 < w_end; t0 += STEP) {
    if (t0 + STEP < w_end) load_step(t0 + STEP, nxt);
    // ---- S = Q K^T for tokens t0 + 16 c + [0, 8) and + [8, 16) ------------------------------
    // two accumulator chains per tile (even / odd slices) halve the dependent MMA latency
    float s[PAIR][2][4];
#pragma unroll
    for (int c = 0; c < PAIR; ++c) {
      float s2[2][4] = {};
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[c][tile][e] = 0.f;
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int wi = 0; wi < R::KW; ++wi) {  // one word: f16 1 half2 (half a slice); NVFP4 4 half2
          if constexpr (Fmt<F>::kK8) {  // one word: 4 int8 = one slice
            uint32_t kh[2];
            i8x4_to_half2x2(cur[c].k[tile][wi], kh);
            float (&acc)[4] = wi % 2 ? s2[tile] : s[c][tile];
            mma16816(acc, qhi[wi][0], 0u, qhi[wi][1], 0u, kh[0], kh[1]);
            continue;
          }
          uint32_t kh[4];
          to_half2<F>(&cur[c].k[tile][wi], 1, (cur[c].ks[tile] >> (8 * (wi / 2))) & 0xFFu, kh);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int j = 2 * wi + jj;
            float (&acc)[4] = jj ? s2[tile] : s[c][tile];
            mma16816(acc, qhi[j][0], 0u, qhi[j][1], 0u, kh[2 * jj], kh[2 * jj + 1]);
          }
        }
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[c][tile][e] += s2[tile][e];
      if constexpr (kRS) {  // K row scales of the columns' tokens 2t, 2t+1 (tile 0) and 2t+8, 2t+9
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          const float2 r = __half22float2(bits2h(cur[c].rk[tile]));
          s[c][tile][0] *= r.x, s[c][tile][1] *= r.y;
        }
      }
    }
    // ---- online softmax of head gid over the step's 16 PAIR tokens (4 PAIR per lane) ------------
    float cm = m;
#pragma unroll
    for (int c = 0; c < PAIR; ++c)
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (t0 + 16 * c + 8 * tile + 2 * tig + e >= w_end) s[c][tile][e] = -INFINITY;
          cm = fmaxf(cm, s[c][tile][e]);
        }
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
    const float ref = cm == -INFINITY ? 0.0f : cm;
    const float alpha = exp2f(m - ref);
    float p[PAIR][2][2];
    float psum = 0.0f;
#pragma unroll
    for (int c = 0; c < PAIR; ++c)
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int e = 0; e < 2; ++e) psum += (p[c][tile][e] = gid < G ? exp2f(s[c][tile][e] - ref) : 0.0f);
    l = l * alpha + psum;
    m = cm;
    // ---- O^T = O^T * alpha + V^T P^T -------------------------------------------------------
    const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * tig), a1 = __shfl_sync(0xffffffffu, alpha, 8 * tig + 4);
#pragma unroll
    for (int i = 0; i < KS; ++i) oc[i][0] *= a0, oc[i][2] *= a0, oc[i][1] *= a1, oc[i][3] *= a1;
#pragma unroll
    for (int c = 0; c < PAIR; ++c) {
      float2 rv0 = make_float2(kPv, kPv), rv1 = rv0;  // V row scales (x 256) of tokens 2t, 2t+1 / 2t+8, 2t+9
      if constexpr (kRS) {
        rv0 = __half22float2(bits2h(cur[c].rv[0])), rv1 = __half22float2(bits2h(cur[c].rv[1]));
        rv0.x *= kPv, rv0.y *= kPv, rv1.x *= kPv, rv1.y *= kPv;
      }
      const uint32_t pb0 = h2bits(kRS ? __floats2half2_rn(p[c][0][0] * rv0.x, p[c][0][1] * rv0.y)
                                      : __floats2half2_rn(p[c][0][0], p[c][0][1]));  // tokens 2t, 2t+1 of head gid
      const uint32_t pb1 = h2bits(kRS ? __floats2half2_rn(p[c][1][0] * rv1.x, p[c][1][1] * rv1.y)
                                      : __floats2half2_rn(p[c][1][0], p[c][1][1]));  // tokens 2t+8, 2t+9
#pragma unroll
      for (int wi = 0; wi < R::VW; ++wi) {  // rows 2t, 2t+1, 2t+8, 2t+9: one word each
        constexpr int NH = 4;
        uint32_t vh[4][NH];
#pragma unroll
        for (int r = 0; r < 4; ++r) to_half2<F>(&cur[c].v[r][wi], 1, cur[c].vs[r], vh[r]);
#pragma unroll
        for (int jj = 0; jj < NH; ++jj) {
          const int i = NH * wi + jj;  // m tile: rows d = g D/8 + 2i (a0, a2) and + 2i + 1 (a1, a3)
          mma16816(oc[i], prmt(vh[0][jj], vh[1][jj], 0x5410u), prmt(vh[0][jj], vh[1][jj], 0x7632u),
                   prmt(vh[2][jj], vh[3][jj], 0x5410u), prmt(vh[2][jj], vh[3][jj], 0x7632u), pb0, pb1);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < PAIR; ++c) cur[c] = nxt[c];
  }
  pdl_launch_dependents();  // the combine kernel may start (it waits for this grid to finish)
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // ---- merge the warps in shared memory, write the split's partial ----------------------
  __shared__ float so[kAttnWarps][G][D];
  __shared__ float sm[kAttnWarps][G], sl[kAttnWarps][G];
#pragma unroll
  for (int i = 0; i < KS; ++i) {
    const int d = gid * (D / 8) + 2 * i;
    if (2 * tig < G) so[warp][2 * tig][d] = oc[i][0], so[warp][2 * tig][d + 1] = oc[i][2];
    if (2 * tig + 1 < G) so[warp][2 * tig + 1][d] = oc[i][1], so[warp][2 * tig + 1][d + 1] = oc[i][3];
  }
  if (tig == 0 && gid < G) sm[warp][gid] = m, sl[warp][gid] = l;
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
    float* dst = ws + (size_t(g_kv * G + h) * n_splits + sp) * (D + 2);
    dst[d] = acc * (1.0f / kPv);
    if (d == 0) dst[D] = mx, dst[D + 1] = lsum;
  }
}

// =====================================================================================
// Launchers
// =====================================================================================

template <KvFormat F, int D>
cudaError_t launch_mma_v1(const PagedKv& kv, int G, dim3 grid, const float* q, const int32_t* ctx, int split,
                       int n_splits, int n_pt, float sl2, float* ws, cudaStream_t st) {
  const auto* k = static_cast<const uint8_t*>(kv.k);
  const auto* v = static_cast<const uint8_t*>(kv.v);
#define KVDECK_MMA_CASE(GG)                                                                          \
  case GG:                                                                                           \
    return launch_kernel(attn_mma_v1_kernel<F, D, GG>, grid, dim3(kAttnWarps * 32), st, /*pdl=*/true, k, v, kv.pages, \
                         kv.block, kv.n_kv, q, ctx, split, n_splits, n_pt, sl2, ws);
  switch (G) {
    KVDECK_MMA_CASE(1)
    KVDECK_MMA_CASE(2)
    KVDECK_MMA_CASE(3)
    KVDECK_MMA_CASE(4)
    KVDECK_MMA_CASE(5)
    KVDECK_MMA_CASE(6)
    KVDECK_MMA_CASE(7)
    KVDECK_MMA_CASE(8)
    default: return cudaErrorInvalidValue;
  }
#undef KVDECK_MMA_CASE
  return cudaGetLastError();
}

}  // namespace

namespace detail {

cudaError_t attention_decode_mma_v1(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                 int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream,
                                 const float* fresh_k, const float* fresh_v, const int32_t* rope_pos,
                                 const float* rope_inv) {
  if (!attn_shape_ok(kv, n_heads, max_ctx)) return cudaErrorInvalidValue;
  const int G = n_heads / kv.n_kv;
  const int split = attn_split_tokens(max_ctx), n_splits = attn_splits(max_ctx);
  const int n_pt = (max_ctx + kv.block - 1) / kv.block;
  const dim3 grid(kv.n_kv, n_splits);
  const float sl2 = scale * 1.4426950408889634f;
  if (kv.format != KvFormat::NVFP4) return cudaErrorInvalidValue;
  const cudaError_t err =
      kv.D == 128 ? launch_mma_v1<KvFormat::NVFP4, 128>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream)
                  : launch_mma_v1<KvFormat::NVFP4, 64>(kv, G, grid, q, ctx_dev, split, n_splits, n_pt, sl2, workspace, stream);
  if (err != cudaSuccess) return err;
  const AttnFresh f{fresh_k ? q : nullptr, fresh_k, fresh_v, sl2, G, rope_pos, rope_inv};
  return launch_attn_combine(workspace, ctx_dev, split, n_splits, kv.D, n_heads, out, stream, f);
}

}  // namespace detail

}  // namespace kvdeck::cuda
