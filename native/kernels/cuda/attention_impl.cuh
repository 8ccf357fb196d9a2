// attention_impl.cuh — pieces shared by the decode-attention kernels (attention.cu, attention_mma.cu).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda::detail {

constexpr int kAttnWarps = 4;  // warps per (KV head, split) block; each owns a quarter split

// The shapes attention_decode supports (kernels_cuda.h).
inline bool attn_shape_ok(const PagedKv& kv, int n_heads, int max_ctx) {
  if (kv.n_kv < 1 || n_heads % kv.n_kv != 0 || (kv.D != 64 && kv.D != 128) || kv.block < 16 ||
      kv.block % 16 != 0 || max_ctx < 1 || attn_splits(max_ctx) > kMaxAttnSplits)
    return false;
  const int G = n_heads / kv.n_kv;
  return G >= 1 && G <= 8;
}

// The decode step's own token, unrounded, for the combine (attention_decode's fresh_k / fresh_v):
// q [n_heads, D] f32 (unscaled), k / v [n_kv, D] f32, sl2 = scale * log2(e), G = n_heads / n_kv;
// rope_pos / rope_inv (or null): k is not yet rotated, rotate it (rotate-half at rope_pos[0]).
struct AttnFresh {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float sl2 = 0.0f;
  int G = 1;
  const int32_t* rope_pos = nullptr;
  const float* rope_inv = nullptr;
};

// The fresh token's score for query head h (AttnFresh): sl2 * q[h] . rope(k[h / G]) in f32, the
// warp's lanes over d (every lane gets the sum). attn_combine_kernel's and the fused tail's code.
__device__ __forceinline__ float attn_fresh_score(const AttnFresh& f, int h, int D, int lane) {
  float dot = 0.0f;
  const float* kr = f.k + size_t(h / f.G) * D;
  const int half = D / 2;
  for (int i = lane; i < D; i += 32) {
    float kv = kr[i];
    if (f.rope_inv) {  // as the rope kernels: f32 angle pos * inv_freq, rotate-half
      const int j = i < half ? i : i - half;
      float sn, cs;
      sincosf(float(f.rope_pos[0]) * f.rope_inv[j], &sn, &cs);
      kv = i < half ? kr[j] * cs - kr[j + half] * sn : kr[j + half] * cs + kr[j] * sn;
    }
    dot = fmaf(f.q[size_t(h) * D + i], kv, dot);
  }
  return warp_sum(dot) * f.sl2;
}

// Fused decode attention on the tensor cores (attention_mma.cu: NVFP4 pages, G <= 4, max_ctx <=
// kAttnFusedSplits x 64 tokens): one block of kAttnFusedSplits x kAttnWarps warps per KV head runs
// every split of it (warps w of split w / 4, each as the split kernel's block would) and then the
// combine, so no combine kernel runs. out / f / q8 as launch_attn_combine's; trigger: the block
// triggers its dependents after its main loop (combine_trigger's rule). Measured on the H200
// (session 10, NOTES.md): Llama-3-8B-shaped decode @16 1,906.2 -> 1,834.8 µs/token with the
// trigger. The same fusion of attention.cu's SIMT kernel (f16 KV, SmolLM2) measured no gain
// (552.3 vs 550.9 µs/token) and was removed, as was the step's rope + KV write in the fused
// kernel's prologue (slower in both models: SmolLM2 624.0 vs 588.1, 8B 1,904.4 vs 1,885.7).
constexpr int kAttnFusedSplits = 4;
struct AttnTail {
  float* out = nullptr;
  AttnFresh f;
  ActQ8Out q8;
  bool trigger = false;
};

// Whether the q8-writing combine (fused: the fused kernel) triggers the o GEMV early, for an o
// input of K = n_heads * D values (attention_combine.cu: the measured rule and its switch).
bool combine_trigger(int K, bool fused);
// Whether the fused kernel may run (KVDECK_CUDA_ATTN_FUSED=0: never; attention_combine.cu).
bool attn_fused_on();

// The fused tail: the combine of attn_combine_kernel over the block's own partials ws (written
// by this block before a __syncthreads: [n_heads, n_splits, D + 2]) for the G heads of KV head
// g, with the same operations in the same order, so out and its q8 are bit-identical to the
// split kernel + combine kernel pair's. cst: shared memory, G x (kAttnFusedSplits + 2) floats.
// Every thread of the block calls it (one __syncthreads inside).
template <int G, int D>
__device__ __forceinline__ void attn_fused_tail(const float* ws, int n_splits, int live, int g, const AttnTail& t,
                                                float* cst) {
  constexpr int S = kAttnFusedSplits, CS = S + 2, n_warps = kAttnWarps * S;  // the fused block's warps
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  if (warp < G) {  // head g G + warp: split weights, the fresh token's, the denominator
    const int h = g * G + warp;
    const float* base = ws + size_t(h) * n_splits * (D + 2);
    const float st2 = t.f.k ? attn_fresh_score(t.f, h, D, lane) : 0.0f;
    const float ms = lane < live ? base[size_t(lane) * (D + 2) + D] : -INFINITY;
    const float ls = lane < live ? base[size_t(lane) * (D + 2) + D + 1] : 0.0f;
    float mx = warp_max(ms);
    if (t.f.k) mx = fmaxf(mx, st2);
    const float cf = t.f.k ? exp2f(st2 - mx) : 0.0f;
    const float c = lane < live ? exp2f(ms - mx) : 0.0f;
    const float lsum = warp_sum(c * ls);
    if (lane < S) cst[warp * CS + lane] = c;
    if (lane == 0) cst[warp * CS + S] = cf + lsum, cst[warp * CS + S + 1] = cf;
  }
  __syncthreads();
  for (int grp = warp; grp < G * D / 32; grp += n_warps) {  // 32 outputs of one head a warp
    const int hl = grp / (D / 32), d = (grp % (D / 32)) * 32 + lane, h = g * G + hl;
    const float* base = ws + size_t(h) * n_splits * (D + 2);
    // the combine: t = cf v (or 0), then + wgt_s o_s (each its own rounding) in split order
    float o = t.f.k ? __fmul_rn(cst[hl * CS + S + 1], t.f.v[size_t(g) * D + d]) : 0.0f;
#pragma unroll
    for (int s = 0; s < S; ++s)
      if (s < live) o = __fadd_rn(o, __fmaf_rn(cst[hl * CS + s], base[size_t(s) * (D + 2) + d], 0.0f));
    o = __fdiv_rn(o, cst[hl * CS + S]);
    t.out[size_t(h) * D + d] = o;
    if (t.q8.q) quant_block(o, true, h * D + d, t.q8.q, t.q8.d, t.q8.s, (h * D + d - lane) / 32);
  }
}

// Merge the splits' partials ws [n_heads, n_splits, D + 2] (the live ones: ceil(ctx_dev / split))
// and, with fresh.k, the fresh token into out [n_heads, D]; with q8.q also out's q8 (kernels_cuda.h
// attention_decode).
cudaError_t launch_attn_combine(const float* ws, const int32_t* ctx_dev, int split, int n_splits, int D,
                                int n_heads, float* out, cudaStream_t stream, const AttnFresh& fresh = {},
                                const ActQ8Out& q8 = {});

}  // namespace kvdeck::cuda::detail
