// attention_combine.cu — the split combine of the decode-attention kernels (attention.cu's SIMT
// and attention_mma.cu's tensor-core split kernels write the same partials), with the optional
// fresh token of Backend::attention_fresh and the optional q8 of its output (the o projection's
// input). Contract: attention_impl.cuh (launch_attn_combine).
#include <cstdint>
#include <cstdlib>

#include "attention_impl.cuh"
#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// =====================================================================================
// Combine kernel: merge the splits
// =====================================================================================

// out[h, d] = sum_s 2^(m_s - M) o_s[d] / sum_s 2^(m_s - M) l_s over the live splits.
// Grid (n_heads, D / 32): each block recomputes its head's split weights into shared memory
// (one load per thread) while its 8 warps load interleaved splits' partials for 32 outputs
// (lane = d; the first 64 splits in registers, so one round trip), then weights them, and a
// shared-memory sum finishes. Launched with PDL: it starts
// while the split kernel drains and waits for it before reading the workspace.
// Fresh (f.k != null, Backend::attention_fresh): the splits covered the ctx_dev pooled tokens
// and one more token, the decode step's own, joins as a term of its own: score
// sl2 * q[h] . f.k[g] in f32 from its unrounded row, value row f.v[g] (g = h / G).
// q8.q (D % 32 == 0): warp 0, which holds the block's 32 outputs one per lane, quantises them
// as quantize_act_q8_kernel does (a warp max and an integer warp sum: no work repeated, no
// barrier). trigger: the block triggers its dependents after its wait (the o GEMV launches and
// loads its first weights while the combine runs, as it did behind the q8 kernel this
// replaces); see combine_trigger for when.
constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads)
attn_combine_kernel(const float* __restrict__ ws, const int32_t* __restrict__ ctx_dev, int split,
                    int n_splits, int D, float* __restrict__ out, AttnFresh f, ActQ8Out q8, bool trigger) {
  __shared__ float wgt[kMaxAttnSplits];
  __shared__ float red[kCombineThreads / 32][32];  // per warp
  __shared__ float stat[3];
  pdl_wait();
  if (trigger) pdl_launch_dependents();
  const int h = blockIdx.x, d0 = blockIdx.y * 32, tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
  const int live = (*ctx_dev + split - 1) / split;
  const float* base = ws + size_t(h) * n_splits * (D + 2);
  const int fg = f.k ? h / f.G : 0;
  if (f.k && warp == 0) {
    const float sc = attn_fresh_score(f, h, D, lane);
    if (lane == 0) stat[2] = sc;
  }
  // warp w's first kPre splits (w, w + 8, ...) at d = d0 + lane, loaded with the maxima
  constexpr int kWarpsC = kCombineThreads / 32, kPre = 8;
  const int d = d0 + lane;
  float ov[kPre];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int sidx = warp + kWarpsC * k;
    ov[k] = sidx < live && d < D ? base[size_t(sidx) * (D + 2) + d] : 0.0f;
  }
  // split maxima and weights (live <= kMaxAttnSplits = kCombineThreads)
  const float ms = tid < live ? base[size_t(tid) * (D + 2) + D] : -INFINITY;
  const float ls = tid < live ? base[size_t(tid) * (D + 2) + D + 1] : 0.0f;
  float mx = warp_max(ms);
  if (lane == 0) red[warp][0] = mx;
  __syncthreads();
  if (tid == 0) {
    float v = red[0][0];
    for (int w = 1; w < kCombineThreads / 32; ++w) v = fmaxf(v, red[w][0]);
    stat[0] = f.k ? fmaxf(v, stat[2]) : v;
  }
  __syncthreads();
  mx = stat[0];
  const float cf = f.k ? exp2f(stat[2] - mx) : 0.0f;  // the fresh token's weight (l = 1)
  const float c = tid < live ? exp2f(ms - mx) : 0.0f;
  if (tid < kMaxAttnSplits) wgt[tid] = c;
  const float lsum = warp_sum(c * ls);
  __syncthreads();
  if (lane == 0) red[warp][0] = lsum;
  __syncthreads();
  if (tid == 0) {
    float v = cf;
    for (int w = 0; w < kCombineThreads / 32; ++w) v += red[w][0];
    stat[1] = v;
  }
  __syncthreads();
  // warp w: splits w, w + 8, ...; lane: output d0 + lane
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int sidx = warp + kWarpsC * k;
    if (sidx < live) acc += wgt[sidx] * ov[k];
  }
  if (d < D)
    for (int sidx = warp + kWarpsC * kPre; sidx < live; sidx += kWarpsC)
      acc += wgt[sidx] * base[size_t(sidx) * (D + 2) + d];
  red[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && d < D) {
    float t = f.k ? cf * f.v[size_t(fg) * D + d] : 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineThreads / 32; ++w) t += red[w][lane];
    t /= stat[1];
    out[size_t(h) * D + d] = t;
    if (q8.q) quant_block(t, true, h * D + d, q8.q, q8.d, q8.s, (h * D + d0) / 32);  // D % 32 == 0: all lanes
  }
}

}  // namespace

namespace detail {
// Whether the q8-writing combine (or the fused tail, attention_impl.cuh) triggers the o GEMV
// early, for an o input of K = n_heads * D values. Measured on the H200 (session 7, decode_ab.py, one call, interleaved): SmolLM2 (K 576,
// an o GEMV of 144 blocks) 523.1 µs/token with the trigger against 548.8 without; the 8B (K
// 4,096, 1,024 blocks) 1,954.9 with against 1,927.7 without. So short rows only (K <= 2,048: the
// bound fitted to these two shapes, not measured between them). KVDECK_CUDA_COMBINE_TRIGGER=0 / 1
// forces it off / on (A/B; read at every launch, so a graph records what its capture ran under).
// Without q8 no trigger: the next kernel, quantize_act_q8, starts at the end, as before.
// The fused kernel (attention_impl.cuh) triggers after its main loop for every K: measured on
// the 8B (K 4,096) in session 10 (decode_ab.py, interleaved), 1,834.8 µs/token with it against
// 1,863.5 without (call 1; call 2, with the later-removed rope prologue: 1,885.7 / 1,911.2): its o
// GEMV no longer follows a 256-block combine kernel but a kernel of 8 blocks.
bool combine_trigger(int K, bool fused) {
  const char* e = std::getenv("KVDECK_CUDA_COMBINE_TRIGGER");
  if (e && (e[0] == '0' || e[0] == '1')) return e[0] == '1';
  return fused || K <= 2048;
}

// KVDECK_CUDA_ATTN_FUSED=0: the split kernel + combine pair at every max_ctx (A/B; read at every
// launch, like the trigger's switch).
bool attn_fused_on() {
  const char* e = std::getenv("KVDECK_CUDA_ATTN_FUSED");
  return !(e && e[0] == '0');
}

cudaError_t launch_attn_combine(const float* ws, const int32_t* ctx_dev, int split, int n_splits, int D,
                                int n_heads, float* out, cudaStream_t stream, const AttnFresh& fresh,
                                const ActQ8Out& q8) {
  static_assert(kMaxAttnSplits <= kCombineThreads, "one split per thread");
  if ((q8.q == nullptr) != (q8.d == nullptr) || (q8.q == nullptr) != (q8.s == nullptr) || (q8.q && D % 32 != 0))
    return cudaErrorInvalidValue;
  return launch_kernel(attn_combine_kernel, dim3(n_heads, (D + 31) / 32), dim3(kCombineThreads), stream,
                       /*pdl=*/true, ws, ctx_dev, split, n_splits, D, out, fresh, q8, q8.q != nullptr && combine_trigger(n_heads * D, false));
}
}  // namespace detail

}  // namespace kvdeck::cuda
