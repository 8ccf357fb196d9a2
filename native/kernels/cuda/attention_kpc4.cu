// attention_kpc4.cu — decode attention over KPC4 pages on the tensor cores (mma.sync m16n8k16,
// f16 in, f32 accumulate; sm_80+), the scores on the K codes. Contract: attention_kpc4.cuh.
// The grid, splits, warps and the V side are attention_mma.cu's (V rows are NVFP4 there too);
// what differs is K. Per (page, KV head) k_tc = lo_c + step_c code_tc, so
//   q . k_t = sum_c (q_c step_c) code_tc + sum_c q_c lo_c,
// and per warp and page (= one 16-token chunk):
//   qa = f16(16 q sl2) x f16(step / 256)          one HMUL2 per channel pair: the step folded into q
//   S  = qa (1024 + code)^T                        the codes as exact f16 by bit placement:
//                                                  (w >> s) & 0x000F000F | 0x64006400, one LOP3 + one
//                                                  shift per two values (NVFP4 K: ~6 ops per two)
//   C  = qa 1024^T                                 the offset, from the same rounded qa (an MMA with a
//                                                  constant B: exact against S's)
//   L  = f16(16 q sl2) (lo / 256)^T                the min term: one constant per head and page
//   score (log2 domain) = 16 (S - C + L)
// The channel order inside each product is permuted so that a lane's word of 8 codes gives its
// 4 f16 pairs (c, c + 4) with one shift each; Q, step and lo follow the same order.
// The query's own page (not yet rounded: KvPool staging) is read in f32 by the combine.
#include <cstdint>

#include "attention_impl.cuh"
#include "attention_kpc4.cuh"
#include "attention_mma_rows.cuh"
#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kB = 16;  // tokens per page = per chunk

// A lane's raw bytes of one page: its K code segment of tokens gid and gid + 8 (D/4 codes
// each), 8 lo and 8 step bytes (the channels of the f16 pairs it converts for the whole warp:
// step_pairs below), its V rows {2t, 2t+1, 2t+8, 2t+9} (D/8 values).
template <int D>
struct Kpc4Regs {
  static constexpr int KW = D / 32, VW = D / 64;
  uint32_t k[2][KW];
  uint32_t lo[2], st[2];
  uint32_t v[4][VW], vs[4];
};

// The warp's D/2 step (and lo) f16 pairs, P = tig' D/8 + r, r = 2 j + hlf for slice j = 2 wi + jj:
// channels tig' D/4 + 8 wi + x and + 4, x = 2 jj + hlf (the order of the Q / code pairs). Lane l
// converts pairs PP l + i (PP = D/64); they share one 8-byte group of channels, at lane_cb.
template <int D>
struct StepPairs {
  static constexpr int PP = D / 64;
  int cb = 0;                // first channel of the lane's 8-channel group
  uint32_t sel[PP] = {};     // prmt selectors of its pairs (bytes x of the group's two words)
  __device__ __forceinline__ explicit StepPairs(int lane) {
#pragma unroll
    for (int i = 0; i < PP; ++i) {
      const int P = PP * lane + i, r = P % (D / 8), x = 2 * ((r / 2) % 2) + r % 2;
      if (i == 0) cb = P / (D / 8) * (D / 4) + 8 * (r / 4);
      sel[i] = uint32_t(x | (x << 4) | ((4 + x) << 8) | ((4 + x) << 12));
    }
  }
};

template <int D>
__device__ __forceinline__ void kpc4_load(Kpc4Regs<D>& r, const uint8_t* kb, const uint8_t* vb, int page, int n_kv,
                                          int g_kv, int gid, int tig, int cb) {
  using R = Kpc4Regs<D>;
  constexpr int AK = D == 128 ? 16 : 8;  // page blocks are 10 D bytes: 16-aligned for D 64 / 128
  constexpr int AV = Fmt<KvFormat::NVFP4>::template align<D>();
  constexpr size_t VR = Fmt<KvFormat::NVFP4>::template vrow<D>();
  const uint8_t* kp = kb + (size_t(page) * n_kv + g_kv) * kpc4_head_bytes(D);
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) load_words<AK>(kp + (gid + 8 * tile) * (D / 2) + tig * (D / 8), r.k[tile], R::KW);
  load_words<8>(kp + 8 * D + cb, r.lo, 2);
  load_words<8>(kp + 9 * D + cb, r.st, 2);
  const int rows[4] = {2 * tig, 2 * tig + 1, 2 * tig + 8, 2 * tig + 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* p = vb + ((size_t(page) * kB + rows[i]) * n_kv + g_kv) * VR;
    load_words<AV>(p + gid * (D / 16), r.v[i], R::VW);
    r.vs[i] = __ldg(p + D / 2 + gid * (D / 8) / 16);
  }
}

// Byte x of word a and byte x of b (sel: StepPairs) as an f16 pair of their E4M3 values / 256
// (exact, subnormals included).
template <bool kSigned>
__device__ __forceinline__ uint32_t e4m3_pair_div256(uint32_t a, uint32_t b, uint32_t sel) {
  const uint32_t t = prmt(a, b, sel);
  const uint32_t h = (t & 0x007F007Fu) << 7;
  return kSigned ? h | ((t & 0x00800080u) << 8) : h;
}

// =====================================================================================
// Split kernel (one block per (KV head, split), 4 warps, each a quarter of the split)
// =====================================================================================
template <int D, int G>
__global__ void __launch_bounds__(kAttnWarps * 32, 3)
kpc4_mma_kernel(const uint8_t* __restrict__ kbase, const uint8_t* __restrict__ vbase,
                const int32_t* __restrict__ pages, int n_kv, const float* __restrict__ q,
                const int32_t* __restrict__ ctx_dev, int split, int n_splits, int n_pt, float sl2,
                float* __restrict__ ws) {
  using R = Kpc4Regs<D>;
  constexpr int KS = D / 16;
  const int g_kv = blockIdx.x, sp = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, gid = lane >> 2, tig = lane & 3;
  const int per_warp = split / kAttnWarps;
  const int t_begin = sp * split, w_begin = t_begin + warp * per_warp;
  const int p_first = w_begin / kB;
  const int my_page = p_first + lane < n_pt ? __ldg(pages + p_first + lane) : 0;
  const StepPairs<D> spairs(lane);
  __shared__ __align__(16) uint32_t s_st[kAttnWarps][D / 2], s_lo[kAttnWarps][D / 2];  // the page's pairs
  pdl_wait();  // q and ctx are the previous kernels' outputs

  // Q of head gid, channels tig D/4 + 8 wi + {2jj, 2jj+4} (a0) and {2jj+1, 2jj+5} (a2) of slice
  // j = 2 wi + jj, times 16 sl2 in f16
  uint32_t qh[KS][2];
#pragma unroll
  for (int j = 0; j < KS; ++j)
#pragma unroll
    for (int hlf = 0; hlf < 2; ++hlf) {
      float a = 0.f, b = 0.f;
      if (gid < G) {
        const float* qr = q + size_t(g_kv * G + gid) * D + tig * (D / 4) + 8 * (j / 2) + 2 * (j % 2) + hlf;
        a = qr[0] * (16.0f * sl2), b = qr[4] * (16.0f * sl2);
      }
      qh[j][hlf] = h2bits(__floats2half2_rn(a, b));
    }
  const int ctx = (*ctx_dev - 1) / kB * kB;  // the pooled tokens: every page before the own one
  if (t_begin >= ctx) return;
  const int t_end = min(ctx, t_begin + split);
  const int w_end = min(t_end, w_begin + per_warp);
  // 1024 as an f16 pair in a register (ctx >= 0: the OR adds nothing): the code conversion
  // (w >> s) & 0x000F000F | k1024 is then one LOP3 (one immediate), not an AND and an OR
  const uint32_t k1024 = 0x64006400u | uint32_t(ctx >> 31);

  float oc[KS][4] = {};
  float m = -INFINITY, l = 0.0f;
  R cur, nxt;
  auto load = [&](int t0, R& r) {
    const int pg = __shfl_sync(0xffffffffu, my_page, min(t0 / kB - p_first, 31));
    kpc4_load<D>(r, kbase, vbase, pg, n_kv, g_kv, gid, tig, spairs.cb);
  };
  if (w_begin < w_end) load(w_begin, cur);
  for (int t0 = w_begin; t0 < w_end; t0 += kB) {
    if (t0 + kB < w_end) load(t0 + kB, nxt);
    // ---- the page's step / lo as f16 pairs, converted once per warp (PP pairs a lane) -------
    __syncwarp();  // the previous page's pairs are read
#pragma unroll
    for (int i = 0; i < StepPairs<D>::PP; ++i) {
      s_st[warp][StepPairs<D>::PP * lane + i] = e4m3_pair_div256<false>(cur.st[0], cur.st[1], spairs.sel[i]);
      s_lo[warp][StepPairs<D>::PP * lane + i] = e4m3_pair_div256<true>(cur.lo[0], cur.lo[1], spairs.sel[i]);
    }
    __syncwarp();
    // ---- scores on the codes ---------------------------------------------------------------
    float s[2][4] = {}, s2[2][4] = {}, cc[4] = {}, cl[4] = {};
#pragma unroll
    for (int wi = 0; wi < R::KW; ++wi)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * wi + jj;
        const int P = tig * (D / 8) + 2 * j;  // this slice's pairs: P (a0 / b0), P + 1 (a2 / b1)
        const uint2 st2 = *reinterpret_cast<const uint2*>(&s_st[warp][P]);
        const uint2 lo2 = *reinterpret_cast<const uint2*>(&s_lo[warp][P]);
        const uint32_t sa = st2.x, sb = st2.y, la = lo2.x, lb = lo2.y;
        const uint32_t qa0 = h2bits(__hmul2(bits2h(qh[j][0]), bits2h(sa)));
        const uint32_t qa1 = h2bits(__hmul2(bits2h(qh[j][1]), bits2h(sb)));
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          const uint32_t w = cur.k[tile][wi];
          const uint32_t b0 = ((w >> (8 * jj)) & 0x000F000Fu) | k1024;      // codes (2jj, 2jj + 4)
          const uint32_t b1 = ((w >> (8 * jj + 4)) & 0x000F000Fu) | k1024;  // (2jj + 1, 2jj + 5)
          mma16816(jj ? s2[tile] : s[tile], qa0, 0u, qa1, 0u, b0, b1);
        }
        mma16816(cc, qa0, 0u, qa1, 0u, 0x64006400u, 0x64006400u);
        mma16816(cl, qh[j][0], 0u, qh[j][1], 0u, la, lb);
      }
    const float bias = cl[0] - cc[0];  // head gid's (every column holds it)
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int e = 0; e < 2; ++e) s[tile][e] = 16.0f * (s[tile][e] + s2[tile][e] + bias);
    // ---- online softmax of head gid over the page's 16 tokens (4 per lane) -----------------
    float cm = m;
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (t0 + 8 * tile + 2 * tig + e >= w_end) s[tile][e] = -INFINITY;
        cm = fmaxf(cm, s[tile][e]);
      }
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
    const float ref = cm == -INFINITY ? 0.0f : cm;
    const float alpha = exp2f(m - ref);
    float p[2][2];
    float psum = 0.0f;
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int e = 0; e < 2; ++e) psum += (p[tile][e] = gid < G ? exp2f(s[tile][e] - ref) : 0.0f);
    l = l * alpha + psum;
    m = cm;
    // ---- O^T = O^T alpha + V^T P^T (attention_mma.cu's NVFP4 V) ------------------------------
    const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * tig), a1 = __shfl_sync(0xffffffffu, alpha, 8 * tig + 4);
#pragma unroll
    for (int i = 0; i < KS; ++i) oc[i][0] *= a0, oc[i][2] *= a0, oc[i][1] *= a1, oc[i][3] *= a1;
    const uint32_t pb0 = h2bits(__floats2half2_rn(p[0][0], p[0][1]));  // tokens 2t, 2t+1 of head gid
    const uint32_t pb1 = h2bits(__floats2half2_rn(p[1][0], p[1][1]));  // tokens 2t+8, 2t+9
#pragma unroll
    for (int wi = 0; wi < R::VW; ++wi) {
      uint32_t vh[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r) to_half2<KvFormat::NVFP4>(&cur.v[r][wi], 1, cur.vs[r], vh[r]);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 4 * wi + jj;  // m tile: rows d = g D/8 + 2i (a0, a2) and + 2i + 1 (a1, a3)
        mma16816(oc[i], prmt(vh[0][jj], vh[1][jj], 0x5410u), prmt(vh[0][jj], vh[1][jj], 0x7632u),
                 prmt(vh[2][jj], vh[3][jj], 0x5410u), prmt(vh[2][jj], vh[3][jj], 0x7632u), pb0, pb1);
      }
    }
    cur = nxt;
  }
  pdl_launch_dependents();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // ---- merge the warps in shared memory, write the split's partial -------------------------
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
    dst[d] = acc;
    if (d == 0) dst[D] = mx, dst[D + 1] = lsum;
  }
}

// =====================================================================================
// Combine: the pooled splits' partials and the own page's tokens (f32, from staging)
// =====================================================================================
constexpr int kCombine = 128;  // threads; thread d < D owns output d

__global__ void __launch_bounds__(kCombine)
kpc4_combine_kernel(const float* __restrict__ ws, const int32_t* __restrict__ ctx_dev, int split, int n_splits,
                    int D, int G, int n_kv, const float* __restrict__ q, const float* __restrict__ own_k,
                    const float* __restrict__ own_v, float sl2, float* __restrict__ out) {
  __shared__ float wsp[kMaxAttnSplits], wown[kB], red[kCombine / 32];
  __shared__ float stat[2];
  pdl_wait();
  const int h = blockIdx.x, g = h / G, tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
  const int ctx = *ctx_dev, pooled = (ctx - 1) / kB * kB, n_own = ctx - pooled;
  const int live = (pooled + split - 1) / split;
  const float* base = ws + size_t(h) * n_splits * (D + 2);
  const size_t tok = size_t(n_kv) * D;
  // The own page's scores in f32 from its unrounded rows, with q rounded as the split kernel
  // rounds it (f16(16 q sl2)): q's rounding error times the pages' shared mean (lo) then shifts
  // every score of the head alike, which the softmax cancels (with q in f32 here it would not:
  // 5.6e-3 against 8.7e-4 at ctx 17, bench/emu/kpc4_emu.cpp).
  for (int t = warp; t < n_own; t += kCombine / 32) {
    float dot = 0.0f;
    for (int i = lane; i < D; i += 32)
      dot = fmaf(__half2float(__float2half_rn(q[size_t(h) * D + i] * (16.0f * sl2))),
                 own_k[t * tok + size_t(g) * D + i], dot);
    dot = warp_sum(dot);
    if (lane == 0) wown[t] = dot * (1.0f / 16.0f);
  }
  float mx = -INFINITY;
  for (int s = tid; s < live; s += kCombine) mx = fmaxf(mx, base[size_t(s) * (D + 2) + D]);
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (tid == 0) {
    float M = -INFINITY;
    for (int w = 0; w < kCombine / 32; ++w) M = fmaxf(M, red[w]);
    for (int t = 0; t < n_own; ++t) M = fmaxf(M, wown[t]);
    stat[0] = M;
  }
  __syncthreads();
  const float M = stat[0];
  float den = 0.0f;
  for (int s = tid; s < live; s += kCombine) {
    const float w = exp2f(base[size_t(s) * (D + 2) + D] - M);
    wsp[s] = w;
    den += w * base[size_t(s) * (D + 2) + D + 1];
  }
  __syncthreads();  // every wown read above; now weight them
  if (tid < n_own) wown[tid] = exp2f(wown[tid] - M);
  __syncthreads();
  if (tid < n_own) den += wown[tid];
  den = warp_sum(den);
  if (lane == 0) red[warp] = den;
  __syncthreads();
  if (tid == 0) {
    float d = 0.0f;
    for (int w = 0; w < kCombine / 32; ++w) d += red[w];
    stat[1] = d;
  }
  __syncthreads();
  for (int d = tid; d < D; d += kCombine) {
    float acc = 0.0f;
    for (int s = 0; s < live; ++s) acc = fmaf(wsp[s], base[size_t(s) * (D + 2) + d], acc);
    for (int t = 0; t < n_own; ++t) acc = fmaf(wown[t], own_v[t * tok + size_t(g) * D + d], acc);
    out[size_t(h) * D + d] = acc / stat[1];
  }
}

template <int D>
cudaError_t launch_split(int G, dim3 grid, cudaStream_t st, const uint8_t* k, const uint8_t* v, const int32_t* pages,
                         int n_kv, const float* q, const int32_t* ctx, int split, int n_splits, int n_pt, float sl2,
                         float* ws) {
#define KVDECK_KPC4_CASE(GG)                                                                                   \
  case GG:                                                                                                     \
    return launch_kernel(kpc4_mma_kernel<D, GG>, grid, dim3(kAttnWarps * 32), st, /*pdl=*/true, k, v, pages, n_kv, \
                         q, ctx, split, n_splits, n_pt, sl2, ws);
  switch (G) {
    KVDECK_KPC4_CASE(1)
    KVDECK_KPC4_CASE(2)
    KVDECK_KPC4_CASE(3)
    KVDECK_KPC4_CASE(4)
    KVDECK_KPC4_CASE(5)
    KVDECK_KPC4_CASE(6)
    KVDECK_KPC4_CASE(7)
    KVDECK_KPC4_CASE(8)
    default: return cudaErrorInvalidValue;
  }
#undef KVDECK_KPC4_CASE
}

}  // namespace

cudaError_t kpc4_attention_decode(const void* k_pages, const void* v_pages, const int32_t* pages, int n_kv, int D,
                                  const float* q, int n_heads, const int32_t* ctx_dev, int max_ctx, float scale,
                                  const float* own_k, const float* own_v, float* ws, float* out, cudaStream_t stream) {
  if ((D != 64 && D != 128) || n_kv < 1 || n_heads % n_kv != 0 || n_heads / n_kv > 8 || max_ctx < 1 ||
      attn_splits(max_ctx) > kMaxAttnSplits)
    return cudaErrorInvalidValue;
  const int G = n_heads / n_kv;
  const int split = attn_split_tokens(max_ctx), n_splits = attn_splits(max_ctx), n_pt = (max_ctx + kB - 1) / kB;
  const dim3 grid(n_kv, n_splits);
  const float sl2 = scale * 1.4426950408889634f;
  const auto* k = static_cast<const uint8_t*>(k_pages);
  const auto* v = static_cast<const uint8_t*>(v_pages);
  const cudaError_t e = D == 128 ? launch_split<128>(G, grid, stream, k, v, pages, n_kv, q, ctx_dev, split, n_splits,
                                                     n_pt, sl2, ws)
                                 : launch_split<64>(G, grid, stream, k, v, pages, n_kv, q, ctx_dev, split, n_splits,
                                                    n_pt, sl2, ws);
  if (e != cudaSuccess) return e;
  return launch_kernel(kpc4_combine_kernel, dim3(n_heads), dim3(kCombine), stream, /*pdl=*/true, ws, ctx_dev, split,
                       n_splits, D, G, n_kv, q, own_k, own_v, sl2, out);
}

}  // namespace kvdeck::cuda
