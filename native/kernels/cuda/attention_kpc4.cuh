// attention_kpc4.cuh — the KPC4 KV format's CUDA kernels (host API): the KV write with the open
// page staged in f32 (kv_write_kpc4.cu) and decode attention with the scores on the K codes
// (attention_kpc4.cu). Layouts: kv_pool.h / kvdeck/kv_pce.h. One layer of a pool:
//   K [n_pages][n_kv][10 D bytes]: codes u8 [16][D/2] (token-major, channel 2i low), E4M3
//     lo [D] (rounded down), E4M3 step [D] (rounded up); k' = fma(code, step, lo);
//   V [n_pages][16][n_kv][D/2 + D/16]: NVFP4 rows (tensor scale 1);
//   a staging slot (KvPool::stage): f32 K [L][16][n_kv][D] then V the same; the layer's K of
//   one page is itself an f32 page [16][n_kv][D] (the f32 pool layout).
// Opt-in on the backend (KVDECK_CUDA_KPC4=1) until a GPU run measures it: NOTES.md.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvdeck::cuda {

__host__ __device__ constexpr size_t kpc4_head_bytes(int D) { return size_t(D) * 10; }

// One layer's KV write of M rows (f32 [M, n_kv * D], row stride ld) into kpc4 pages.
struct Kpc4Write {
  uint8_t* k_pages = nullptr;            // device: the layer's K pages
  uint8_t* v_pages = nullptr;            // device: the layer's V rows
  int n_kv = 0, D = 0;
  const int32_t* slots = nullptr;        // device [M]: pool slot (page * 16 + t) of row m
  float* const* stage_rows = nullptr;    // device [M]: row m's staged K row (its layer, token t)
  size_t v_off = 0;                      // floats from a staged K row to its V row (L * 16 * n_kv * D)
  int n_full = 0;                        // pages this write completes (their 16th row is here)
  const float* const* full_src = nullptr;  // device [n_full]: the layer's staged K [16][n_kv][D]
  const int32_t* full_pages = nullptr;     // device [n_full]: their pool pages
};
// Copies the K / V rows into staging, writes V rows as NVFP4 (kv_nvfp4_encode_row, byte for
// byte), then encodes each completed page's K from its staged rows (kpc4_encode_page, byte for
// byte). D % 16 == 0.
cudaError_t kpc4_kv_write(const Kpc4Write& w, const float* k, const float* v, int ld, int M, cudaStream_t stream);

// Pages pages[0..n) (device) decoded to f32 (kpc4_decode_page_ref, kv_nvfp4_decode_row bit for
// bit): page j's rows to wk / wv + j * 16 * n_kv * D in the f32 pool layout [16][n_kv][D].
cudaError_t kpc4_pages_to_f32(const void* k_pages, const void* v_pages, const int32_t* pages, int n, int n_kv, int D,
                              float* wk, float* wv, cudaStream_t stream);

// Decode attention of one query over ctx = ctx_dev[0] tokens (device int; max_ctx bounds it
// and sizes the grid and ws: attn_workspace_floats(n_heads, max_ctx, D) floats): the pages
// before the query's own page (p < (ctx - 1) / 16) from the pool, on the tensor cores with the
// scores on the K codes (q . k_t = sum_c (q_c step_c) code_tc + sum_c q_c lo_c per page), V
// NVFP4 as attention_mma.cu; the own page's ctx - 16 floor((ctx - 1) / 16) tokens from its
// staging (own_k / own_v: the layer's staged K / V [16][n_kv][D] f32) in f32, merged in the
// combine. q f32 [n_heads, D] (roped), out f32 [n_heads, D]. D 64 / 128, n_heads / n_kv in
// [1, 8]; other shapes: cudaErrorInvalidValue.
cudaError_t kpc4_attention_decode(const void* k_pages, const void* v_pages, const int32_t* pages, int n_kv, int D,
                                  const float* q, int n_heads, const int32_t* ctx_dev, int max_ctx, float scale,
                                  const float* own_k, const float* own_v, float* ws, float* out, cudaStream_t stream);

}  // namespace kvdeck::cuda
