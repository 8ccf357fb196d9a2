// attention_fused.cuh — the split combine inside the decode split kernels (attention.cu,
// attention_mma.cu): with a `done` counter array (attention_decode's contract), every block
// counts itself after writing its partial and the last live block of a KV head merges the
// partials of its G heads (and the fresh token, AttnFresh) into out, as attention_combine.cu's
// kernel does, so no second kernel runs. The counter is left 0 for the next call.
#pragma once
#include <cstdint>

#include "attention_impl.cuh"
#include "common.cuh"

namespace kvdeck::cuda::detail {

// Called by all kAttnWarps * 32 threads of block (g_kv, sp) after its partial is in ws; live =
// ceil(ctx / split) (0: only the fresh token, called by split 0 alone). Partials: ws [n_heads,
// n_splits, D + 2] (o relative to m, m, l).
template <int G, int D>
__device__ __forceinline__ void attn_fused_combine(const float* ws, int* done, int g_kv, int n_splits, int live,
                                                   const AttnFresh& f, float* out) {
  __shared__ float wgt[G][kMaxAttnSplits];
  __shared__ float hst[G][2];  // per head: 1 / l, the fresh token's weight
  __shared__ int s_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __threadfence();  // this block's partial, visible before its count
  __syncthreads();
  if (tid == 0) s_last = live == 0 || atomicAdd(done + g_kv, 1) == live - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other blocks' partials (each fenced before counting)
  for (int h = warp; h < G; h += kAttnWarps) {
    const int hh = g_kv * G + h;
    const float* base = ws + size_t(hh) * n_splits * (D + 2);
    float mx = -INFINITY, fs = -INFINITY;
    for (int s = lane; s < live; s += 32) mx = fmaxf(mx, base[size_t(s) * (D + 2) + D]);
    mx = warp_max(mx);
    if (f.k) {  // the fresh token's score in f32 from its unrounded row (rotated here if asked)
      float dot = 0.0f;
      const float* kr = f.k + size_t(g_kv) * D;
      for (int i = lane; i < D; i += 32) {
        float kv = kr[i];
        if (f.rope_inv) {
          const int half = D / 2, j = i < half ? i : i - half;
          float sn, cs;
          sincosf(float(f.rope_pos[0]) * f.rope_inv[j], &sn, &cs);
          kv = i < half ? kr[j] * cs - kr[j + half] * sn : kr[j + half] * cs + kr[j] * sn;
        }
        dot = fmaf(f.q[size_t(hh) * D + i], kv, dot);
      }
      fs = warp_sum(dot) * f.sl2;
      mx = fmaxf(mx, fs);
    }
    float lsum = 0.0f;
    for (int s = lane; s < live; s += 32) {
      const float w = exp2f(base[size_t(s) * (D + 2) + D] - mx);
      wgt[h][s] = w;
      lsum += w * base[size_t(s) * (D + 2) + D + 1];
    }
    lsum = warp_sum(lsum);
    const float cf = f.k ? exp2f(fs - mx) : 0.0f;
    if (lane == 0) hst[h][0] = 1.0f / (lsum + cf), hst[h][1] = cf;
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kAttnWarps * 32) {
    const int h = i / D, d = i % D;
    const float* base = ws + size_t(g_kv * G + h) * n_splits * (D + 2) + d;
    float acc = f.k ? hst[h][1] * f.v[size_t(g_kv) * D + d] : 0.0f;
    for (int s = 0; s < live; ++s) acc = fmaf(wgt[h][s], base[size_t(s) * (D + 2)], acc);
    out[size_t(g_kv * G + h) * D + d] = acc * hst[h][0];
  }
  if (tid == 0) done[g_kv] = 0;
}

}  // namespace kvdeck::cuda::detail
