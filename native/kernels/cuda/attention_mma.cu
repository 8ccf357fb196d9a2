// attention_mma.cu — paged decode attention on the tensor cores (mma.sync m16n8k16, f16 in,
// f32 accumulate; sm_80+, so Orin and Hopper). Same grid, splits, workspace and combine as
// attention.cu; contracts in kernels_cuda.h (detail::attention_decode_mma). The 4-bit formats:
// NVFP4, and NVFP4R / K8V4 (K int8 as exact f16; the f16 row scales applied to the scores (K)
// and to P (V, times 256, undone in the epilogue)). f16 pages ran slower here than on
// attention.cu's SIMT kernel in every measurement (H200, 32K: 50.7 µs against 47.8, session 6),
// and two chunks per softmax step slower than one (41.8 against 32.9 for NVFP4): both deleted.
//
// Per warp and chunk of 16 tokens (session 7's layout):
//   S^T = K Q^T  one m16n8 tile per k slice (rows: the 16 tokens; columns: the G query heads,
//                padded to 8), k = D in D/16 slices: no padded A rows. Q is rounded to f16; NVFP4
//                K by bit placement (attention_mma_rows.cuh k_word_h2: exact, values x 2^-7, Q
//                x 2^7), int8 K exact.
//   O^T += V^T P^T  D/16 m16n8 tiles (rows: D, columns: the heads, padded to 8), k = 16 tokens;
//                P rounded to f16 (relative 2^-11) and transposed into the B operand by
//                movmatrix (two 8 x 8 tiles); V decoded in token pairs (v_pair_h2); f32 O.
// The D index is permuted consistently inside each product (Q with K, V^T with O^T) so that
// every lane reads contiguous bytes: for S, lane (g, t) = (lane / 4, lane % 4) reads tokens g and
// g + 8, values [t D/4, (t+1) D/4); for V, token rows {2t, 2t+1, 2t+8, 2t+9} at [g D/8, (g+1) D/8).
// The softmax state of lane (g, t) is its O^T columns' heads 2t, 2t+1; the running maxima move
// lazily (kLazyMax: only when a score passes them by 2^8), a warp vote skipping the O rescale
// (and its max reduction) on most chunks. The loop is unrolled by two over two register sets
// (the prefetched rows are never copied), the page slot advanced per chunk (no division).
// Session 8 (measured against session 7's kernel on the H200; NOTES.md): a lane's row offsets
// fixed for the kernel (attention_mma_rows.cuh lane_rows; one 64-bit base a pool and chunk), both
// K block scales of a lane converted at once, Q read once per block through shared memory
// (coalesced; it was 32 scalar loads a lane, ~512 L1 wavefronts a warp ahead of the first KV
// load), and the warps' merge buffer padded (MergeLayout: no bank conflicts).
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

// Lazy running max (log2 units): a head's max moves only when a chunk's scores pass it by more
// than this, so p <= 2^kLazy and most chunks skip the O rescale (a warp-uniform branch). 0 for
// the row-scaled formats (their P is multiplied by the V row scale x 256 before its f16 rounding).
template <KvFormat F>
constexpr float kLazyMax = Fmt<F>::kRowScale ? 0.0f : 8.0f;

// The warps' merge buffer: head h's d at h S_H + (d / (D/8)) S_G + d % (D/8). Lane (g, t)
// stores d = g D/8 + 2i (8 bytes) for heads 2t and 2t + 1; S_G = D/8 + 2 and S_H = 8 (mod 16)
// words give the 16 lanes of one store 16 distinct bank pairs (one wavefront; the unpadded
// [G][D] layout put them on 2: 8 wavefronts a store).
template <int D>
struct MergeLayout {
  static constexpr int SG = D / 8 + 2;
  static constexpr int SH = (8 * SG - 8 + 15) / 16 * 16 + 8;
  __device__ static constexpr int at(int h, int d) { return h * SH + (d / (D / 8)) * SG + d % (D / 8); }
};

// S = 1: grid (n_kv, n_splits), the split's partial to ws, the combine kernel merges. S =
// kAttnFusedSplits (attention_impl.cuh, n_splits <= S): grid (n_kv), block warp w runs warp w % 4
// of split w / 4 as above, then the block combines (attn_fused_tail) into tail.out.
template <KvFormat F, int D, int G, int S>
__global__ void __launch_bounds__(kAttnWarps * 32 * S, S > 1 ? 1 : F == KvFormat::NVFP4 ? 4 : 3)  // 16 / 12 warps per SM
attn_mma_kernel(const uint8_t* __restrict__ kbase, const uint8_t* __restrict__ vbase,
                const int32_t* __restrict__ pages, int block, int n_kv, const float* __restrict__ q,
                const int32_t* __restrict__ ctx_dev, int split, int n_splits, int n_pt, float scale_log2,
                float* __restrict__ ws, AttnTail tail) {
  using R = KvRegs<F, D>;
  constexpr int KS = D / 16;  // k slices of S; also m tiles of O^T
  static_assert(F != KvFormat::F16 && F != KvFormat::F32, "the 4-bit formats");
  constexpr bool kRS = Fmt<F>::kRowScale;
  constexpr float kPv = kRS ? 256.0f : 1.0f;  // P x V row scale x 256 keeps small products normal in f16
  const int g_kv = blockIdx.x, sp = S == 1 ? blockIdx.y : threadIdx.x / (kAttnWarps * 32);
  const int lane = threadIdx.x & 31, warp = (threadIdx.x / 32) % kAttnWarps, wb = threadIdx.x / 32;
  const int gid = lane >> 2, tig = lane & 3;
  const int per_warp = split / kAttnWarps;  // a multiple of 16: chunks never straddle a page
  const int t_begin = sp * split, w_begin = t_begin + warp * per_warp;
  // issued before ctx is known: page indices (the table covers max_ctx) and Q
  const int p_first = w_begin / block;
  const int my_page = p_first + lane < n_pt ? __ldg(pages + p_first + lane) : 0;
  pdl_wait();  // launched with PDL: q and ctx are the previous kernel's outputs

  // Q as the B operand of S^T = K Q^T (columns = heads; lane column gid), rounded to f16
  // D index pairs as K's: int8 words (d, d+1), (d+2, d+3); NVFP4 words of 8 codes (c, c+4)
  // (k_word_h2), the NVFP4 values carrying 2^-7 (times 2^7 here)
  constexpr float kQs = Fmt<F>::kK8 ? 1.0f : kNvfp4Shift;
  uint32_t qhi[KS][2];
  // the block's G x D values of q (its KV head's heads) loaded once, coalesced, into shared
  // memory; the lane's D/4 values (head g, [t D/4, (t+1) D/4)) read back as D/16 float4, the
  // units of a head's row XOR-swizzled so that a warp's reads take 2 wavefronts (16 lanes x 16 B)
  constexpr int U = D / 16;  // float4 units of a lane's segment
  __shared__ __align__(16) float sq[G * D];
  auto swz = [](int h, int u) {  // u's position in head h's row (inside its own segment)
    return U == 8 ? u ^ ((u / 8 + 4 * (h & 1)) & 7) : u ^ (((u / 4 >> 1) + 2 * (h & 1)) & 3);
  };
  const float* qg = q + size_t(g_kv) * G * D;
  const bool q16 = (reinterpret_cast<uintptr_t>(qg) & 15u) == 0;  // block-uniform
  for (int i = threadIdx.x; i < G * D / 4; i += kAttnWarps * 32 * S) {
    const int h = i / (D / 4), u = i % (D / 4);
    const float4 v = q16 ? __ldg(reinterpret_cast<const float4*>(qg) + i)
                         : make_float4(qg[4 * i], qg[4 * i + 1], qg[4 * i + 2], qg[4 * i + 3]);
    *reinterpret_cast<float4*>(&sq[h * D + 4 * swz(h, u)]) = v;
  }
  __syncthreads();
  float qv[D / 4];
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const float4 v = gid < G ? *reinterpret_cast<const float4*>(&sq[gid * D + 4 * swz(gid, tig * U + k)])
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    qv[4 * k] = v.x, qv[4 * k + 1] = v.y, qv[4 * k + 2] = v.z, qv[4 * k + 3] = v.w;
  }
#pragma unroll
  for (int j = 0; j < KS; ++j)
#pragma unroll
    for (int hlf = 0; hlf < 2; ++hlf) {
      const int r = Fmt<F>::kK8 ? 4 * j + 2 * hlf : 8 * (j / 2) + 2 * (j % 2) + hlf, o2 = Fmt<F>::kK8 ? 1 : 4;
      qhi[j][hlf] = h2bits(__floats2half2_rn(qv[r] * (scale_log2 * kQs), qv[r + o2] * (scale_log2 * kQs)));
    }
  const int ctx = *ctx_dev;
  if (S == 1 && t_begin >= ctx) return;  // (fused: its warps run no chunk and write no partial)
  const int t_end = min(ctx, t_begin + split);
  const int w_end = min(t_end, w_begin + per_warp);

  float oc[KS][4] = {};             // O^T tiles: (d rows, head columns 2t, 2t+1)
  // softmax state of heads 2t (m0, l0) and 2t + 1 (m1, l1); l: this lane's tokens
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  constexpr float kL = kLazyMax<F>;
  // the next chunk to load: slot ni of the warp's page window (<= 32 pages), row offset no in it
  int ni = 0, no = w_begin - p_first * block;
  const LaneRows lr = lane_rows<F, D>(n_kv, g_kv, gid, tig);
  auto issue = [&](int t0, R& r) {
    const int pg = __shfl_sync(0xffffffffu, my_page, ni);
    load_chunk<F, D, kRS>(r, kbase, vbase, uint32_t(pg * block + no), lr, w_end - t0, gid, tig);
    const bool wrap = no + 16 == block;
    ni += wrap, no = wrap ? 0 : no + 16;
  };
  // one chunk of 16 tokens at t0 (its rows in c)
  auto chunk = [&](const R& c, int t0) {
    // ---- S^T = K Q^T: rows the tokens t0 + g, t0 + g + 8; columns the heads 2t, 2t+1 ----------
    // two accumulator chains (even / odd slices) halve the dependent MMA latency
    float s[4] = {}, s2[4] = {};
#pragma unroll
    for (int wi = 0; wi < R::KW; ++wi) {  // one word: NVFP4 4 half2 (two slices); int8 one slice
      if constexpr (Fmt<F>::kK8) {
        uint32_t k0[2], k1[2];
        i8x4_to_half2x2(c.k[0][wi], k0);
        i8x4_to_half2x2(c.k[1][wi], k1);
        mma16816(*(wi % 2 ? &s2 : &s), k0[0], k1[0], k0[1], k1[1], qhi[wi][0], qhi[wi][1]);
      } else {
        uint32_t k0[4], k1[4];  // words 2b, 2b + 1: block b
        // the lane's block scales (blocks 2t, 2t + 1 at D 128; one at D 64) as f16 pairs, once a tile
        const __half2 s0 = e4m3_u16_h2_x128(c.ks[0]), s1 = e4m3_u16_h2_x128(c.ks[1]);
        k_word_h2(c.k[0][wi], wi / 2 ? __high2half2(s0) : __low2half2(s0), k0);
        k_word_h2(c.k[1][wi], wi / 2 ? __high2half2(s1) : __low2half2(s1), k1);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
          mma16816(*(jj ? &s2 : &s), k0[2 * jj], k1[2 * jj], k0[2 * jj + 1], k1[2 * jj + 1], qhi[2 * wi + jj][0],
                   qhi[2 * wi + jj][1]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] += s2[e];
    if constexpr (kRS) {  // K row scales of the lane's rows g, g + 8
      const float r0 = __low2float(bits2h(c.rk[0])), r1 = __low2float(bits2h(c.rk[1]));
      s[0] *= r0, s[1] *= r0, s[2] *= r1, s[3] *= r1;
    }
    // ---- online softmax; the running maxima move lazily (kLazyMax) ---------------------------
    if (t0 + 16 > w_end) {  // the warp's last chunk, partial (warp-uniform)
      if (t0 + gid >= w_end) s[0] = s[1] = -INFINITY;
      if (t0 + gid + 8 >= w_end) s[2] = s[3] = -INFINITY;
    }
    float c0 = fmaxf(s[0], s[2]), c1 = fmaxf(s[1], s[3]);
    if (__any_sync(0xffffffffu, c0 > m0 + kL || c1 > m1 + kL)) {  // some head's max moves: rescale
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {  // the heads' maxima over the chunk's 16 tokens
        c0 = fmaxf(c0, __shfl_xor_sync(0xffffffffu, c0, o));
        c1 = fmaxf(c1, __shfl_xor_sync(0xffffffffu, c1, o));
      }
      const float n0 = c0 > m0 + kL ? c0 : m0, n1 = c1 > m1 + kL ? c1 : m1;  // finite: a chunk has a valid token
      const float a0 = ex2_approx(m0 - n0), a1 = ex2_approx(m1 - n1);
      l0 *= a0, l1 *= a1, m0 = n0, m1 = n1;
#pragma unroll
      for (int i = 0; i < KS; ++i) oc[i][0] *= a0, oc[i][2] *= a0, oc[i][1] *= a1, oc[i][3] *= a1;
    }
    const bool h0 = 2 * tig < G, h1 = 2 * tig + 1 < G;  // real heads (the others are padding)
    const float p00 = h0 ? ex2_approx(s[0] - m0) : 0.0f, p01 = h1 ? ex2_approx(s[1] - m1) : 0.0f;
    const float p10 = h0 ? ex2_approx(s[2] - m0) : 0.0f, p11 = h1 ? ex2_approx(s[3] - m1) : 0.0f;
    l0 += p00 + p10, l1 += p01 + p11;
    // P^T as the B operand (k: tokens 2t, 2t+1 / 2t+8, 2t+9; n: head g): the f16 tiles transposed
    uint32_t pb0 = movmatrix_trans(h2bits(__floats2half2_rn(p00, p01)));
    uint32_t pb1 = movmatrix_trans(h2bits(__floats2half2_rn(p10, p11)));
    if constexpr (kRS) {  // V row scales (x 256) of tokens 2t, 2t+1 / 2t+8, 2t+9
      const __half2 k256 = __float2half2_rn(kPv);
      pb0 = h2bits(__hmul2(bits2h(pb0), __hmul2(bits2h(c.rv[0]), k256)));
      pb1 = h2bits(__hmul2(bits2h(pb1), __hmul2(bits2h(c.rv[1]), k256)));
    }
    // ---- O^T += V^T P^T ----------------------------------------------------------------------
    // rows 2t, 2t+1 / 2t+8, 2t+9 (one block of each: the lane's D / 8 values), decoded in token pairs
    const __half2 sv01 = e4m3x2_h2_x128(c.vs[0] | c.vs[1] << 16), sv89 = e4m3x2_h2_x128(c.vs[2] | c.vs[3] << 16);
#pragma unroll
    for (int wi = 0; wi < R::VW; ++wi) {
      uint32_t h01[8], h89[8];
      v_pair_h2(c.v[0][wi], c.v[1][wi], sv01, h01);
      v_pair_h2(c.v[2][wi], c.v[3][wi], sv89, h89);
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)  // m tile i: rows d = g D/8 + 2i (a0, a2) and + 2i + 1 (a1, a3)
        mma16816(oc[4 * wi + ii], h01[2 * ii], h01[2 * ii + 1], h89[2 * ii], h89[2 * ii + 1], pb0, pb1);
    }
  };
  // two register sets in turn (loop unrolled by two): the next chunk's loads are in flight
  // while this one computes, with no copies between the sets
  R ra, rb;
  if (w_begin < w_end) issue(w_begin, ra);
  for (int t0 = w_begin; t0 < w_end; t0 += 32) {
    if (t0 + 16 < w_end) issue(t0 + 16, rb);
    chunk(ra, t0);
    if (t0 + 16 >= w_end) break;
    if (t0 + 32 < w_end) issue(t0 + 32, ra);
    chunk(rb, t0 + 16);
  }
  if (S == 1 || tail.trigger) pdl_launch_dependents();  // the combine (the o GEMV) may start: it waits for this grid
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }

  // ---- merge the warps in shared memory, write the split's partial ----------------------
  // the warps' weights 2^(m_w - max) once per head, then each thread sums pairs of outputs
  using ML = MergeLayout<D>;
  __shared__ __align__(16) float so[kAttnWarps * S][G * ML::SH];
  __shared__ float sm[kAttnWarps * S][G], sl[kAttnWarps * S][G], wt[kAttnWarps * S][G];
#pragma unroll
  for (int i = 0; i < KS; ++i) {
    const int d = gid * (D / 8) + 2 * i;
    if (2 * tig < G) *reinterpret_cast<float2*>(&so[wb][ML::at(2 * tig, d)]) = make_float2(oc[i][0], oc[i][2]);
    if (2 * tig + 1 < G) *reinterpret_cast<float2*>(&so[wb][ML::at(2 * tig + 1, d)]) = make_float2(oc[i][1], oc[i][3]);
  }
  if (gid == 0) {
    if (2 * tig < G) sm[wb][2 * tig] = m0, sl[wb][2 * tig] = l0;
    if (2 * tig + 1 < G) sm[wb][2 * tig + 1] = m1, sl[wb][2 * tig + 1] = l1;
  }
  __syncthreads();
  const int live = S == 1 ? 1 : (ctx + split - 1) / split;  // the block's live splits (fused: <= n_splits <= S)
  if (threadIdx.x < live * G) {  // warp 0 of a live split always had tokens (w_begin = t_begin < ctx): mx is finite
    const int h = threadIdx.x % G, ss = S == 1 ? sp : threadIdx.x / G, w0 = (ss - (S == 1 ? sp : 0)) * kAttnWarps;
    float mx = sm[w0][h];
#pragma unroll
    for (int w = 1; w < kAttnWarps; ++w) mx = fmaxf(mx, sm[w0 + w][h]);
    float lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float cw = exp2f(sm[w0 + w][h] - mx);
      wt[w0 + w][h] = cw * (kNvfp4Shift / kPv);  // V values carried 2^-7 (and P the row scale's 256)
      lsum += cw * sl[w0 + w][h];
    }
    float* dst = ws + (size_t(g_kv * G + h) * n_splits + ss) * (D + 2);
    dst[D] = mx, dst[D + 1] = lsum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < live * G * D / 2; i += kAttnWarps * 32 * S) {
    const int h = i / (D / 2) % G, d = 2 * (i % (D / 2));
    const int ss = S == 1 ? sp : i / (G * D / 2), w0 = (ss - (S == 1 ? sp : 0)) * kAttnWarps;
    float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float cw = wt[w0 + w][h];
      const float2 o = *reinterpret_cast<const float2*>(&so[w0 + w][ML::at(h, d)]);  // d, d + 1: one group
      acc.x += cw * o.x, acc.y += cw * o.y;
    }
    *reinterpret_cast<float2*>(ws + (size_t(g_kv * G + h) * n_splits + ss) * (D + 2) + d) = acc;  // 8-byte aligned: D + 2, d even
  }
  if constexpr (S > 1) {
    __shared__ float cst[G * (S + 2)];
    __syncthreads();  // the partials in ws are visible to the block
    attn_fused_tail<G, D>(ws, n_splits, live, g_kv, tail, cst);
  }
}

// =====================================================================================
// Launchers
// =====================================================================================

// The split kernel (+ the combine kernel), or with fused (n_splits <= kAttnFusedSplits, NVFP4,
// G <= 4: the fused block's merge buffer fits the 48 KB of static shared memory) the fused kernel alone.
template <KvFormat F, int D>
cudaError_t launch_mma(const PagedKv& kv, int G, int n_splits, const float* q, const int32_t* ctx, int split,
                       int n_pt, float sl2, float* ws, bool fused, const AttnTail& tail, cudaStream_t st) {
  const auto* k = static_cast<const uint8_t*>(kv.k);
  const auto* v = static_cast<const uint8_t*>(kv.v);
  const dim3 grid(kv.n_kv, n_splits), threads(kAttnWarps * 32);
  const dim3 grid_f(kv.n_kv), threads_f(kAttnWarps * 32 * kAttnFusedSplits);
#define KVDECK_MMA_CASE(GG)                                                                                     \
  case GG:                                                                                                      \
    return launch_kernel(attn_mma_kernel<F, D, GG, 1>, grid, threads, st, /*pdl=*/true, k, v, kv.pages,        \
                         kv.block, kv.n_kv, q, ctx, split, n_splits, n_pt, sl2, ws, AttnTail{});
#define KVDECK_MMA_FUSED_CASE(GG)                                                                               \
  case GG:                                                                                                      \
    return launch_kernel(attn_mma_kernel<F, D, GG, kAttnFusedSplits>, grid_f, threads_f, st, /*pdl=*/true, k, v, \
                         kv.pages, kv.block, kv.n_kv, q, ctx, split, n_splits, n_pt, sl2, ws, tail);
  if constexpr (F == KvFormat::NVFP4)
    if (fused) switch (G) {
        KVDECK_MMA_FUSED_CASE(1)
        KVDECK_MMA_FUSED_CASE(2)
        KVDECK_MMA_FUSED_CASE(3)
        KVDECK_MMA_FUSED_CASE(4)
        default: return cudaErrorInvalidValue;
      }
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
#undef KVDECK_MMA_FUSED_CASE
  return cudaGetLastError();
}

}  // namespace

namespace detail {

cudaError_t attention_decode_mma(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                 int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream,
                                 const float* fresh_k, const float* fresh_v, const int32_t* rope_pos,
                                 const float* rope_inv, const ActQ8Out& q8) {
  if (!attn_shape_ok(kv, n_heads, max_ctx)) return cudaErrorInvalidValue;
  if ((q8.q == nullptr) != (q8.d == nullptr) || (q8.q == nullptr) != (q8.s == nullptr) || (q8.q && kv.D % 32 != 0))
    return cudaErrorInvalidValue;
  const int G = n_heads / kv.n_kv;
  const int split = attn_split_tokens(max_ctx), n_splits = attn_splits(max_ctx);
  const int n_pt = (max_ctx + kv.block - 1) / kv.block;
  const float sl2 = scale * 1.4426950408889634f;
  const AttnFresh f{fresh_k ? q : nullptr, fresh_k, fresh_v, sl2, G, rope_pos, rope_inv};
  const bool fused = n_splits <= kAttnFusedSplits && kv.format == KvFormat::NVFP4 && G <= 4 && attn_fused_on();
  const AttnTail tail{out, f, q8, q8.q != nullptr && combine_trigger(n_heads * kv.D, fused)};
  cudaError_t err;
  if (kv.format == KvFormat::NVFP4)
    err = kv.D == 128 ? launch_mma<KvFormat::NVFP4, 128>(kv, G, n_splits, q, ctx_dev, split, n_pt, sl2, workspace, fused, tail, stream)
                      : launch_mma<KvFormat::NVFP4, 64>(kv, G, n_splits, q, ctx_dev, split, n_pt, sl2, workspace, fused, tail, stream);
  else if (kv.format == KvFormat::NVFP4R)
    err = kv.D == 128 ? launch_mma<KvFormat::NVFP4R, 128>(kv, G, n_splits, q, ctx_dev, split, n_pt, sl2, workspace, false, tail, stream)
                      : launch_mma<KvFormat::NVFP4R, 64>(kv, G, n_splits, q, ctx_dev, split, n_pt, sl2, workspace, false, tail, stream);
  else if (kv.format == KvFormat::K8V4)
    err = kv.D == 128 ? launch_mma<KvFormat::K8V4, 128>(kv, G, n_splits, q, ctx_dev, split, n_pt, sl2, workspace, false, tail, stream)
                      : launch_mma<KvFormat::K8V4, 64>(kv, G, n_splits, q, ctx_dev, split, n_pt, sl2, workspace, false, tail, stream);
  else
    return cudaErrorInvalidValue;
  if (err != cudaSuccess || fused) return err;
  return launch_attn_combine(workspace, ctx_dev, split, n_splits, kv.D, n_heads, out, stream, f, q8);
}

}  // namespace detail

}  // namespace kvdeck::cuda
