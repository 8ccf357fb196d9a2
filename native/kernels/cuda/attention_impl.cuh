// attention_impl.cuh — pieces shared by the decode-attention kernels (attention.cu, attention_mma.cu).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

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

// Merge the splits' partials ws [n_heads, n_splits, D + 2] (the live ones: ceil(ctx_dev / split))
// and, with fresh.k, the fresh token into out [n_heads, D]; with q8.q also out's q8 (kernels_cuda.h
// attention_decode).
cudaError_t launch_attn_combine(const float* ws, const int32_t* ctx_dev, int split, int n_splits, int D,
                                int n_heads, float* out, cudaStream_t stream, const AttnFresh& fresh = {},
                                const ActQ8Out& q8 = {});

}  // namespace kvdeck::cuda::detail
