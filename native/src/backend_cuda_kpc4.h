// backend_cuda_kpc4.h — the CUDA backend's KPC4 KV path (kv_pool.h, kvdeck/kv_pce.h), opt-in
// with KVDECK_CUDA_KPC4=1 until a GPU run measures it (native/kernels/cuda/NOTES.md). The same
// rules as the CPU backend's (backend_cpu_pce.h): rows go to the open page's f32 staging slot
// (device memory from KvPool::stage), a page's K is encoded once its 16th row is written, and a
// query reads its own page from staging and every earlier page from the pool, in decode and
// prefill alike. Decode: kpc4_attention_decode (scores on the K codes, tensor cores); prefill
// (M > 1): the layer's context decoded to f32 once, then the f32 paged kernel per query page
// with that page's own entry pointing at its staged copy (as the CPU's prefill).
// The staging bookkeeping is the host's (which slot a page holds, which pages a write fills), so
// this path reads the host copies of the step's small uploads (slots, positions, page table:
// note_upload) and its decode steps run eagerly (no CUDA graph: a replayed step would skip it).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvdeck/kv_pool.h"

namespace kvdeck::cuda_backend {

class Kpc4Path {
 public:
  Kpc4Path() = default;
  ~Kpc4Path();
  Kpc4Path(const Kpc4Path&) = delete;
  Kpc4Path& operator=(const Kpc4Path&) = delete;

  // Backend::upload of bytes from src to dst: kept (up to 1 MiB) for the host-side bookkeeping.
  void note_upload(const void* dst, const void* src, size_t bytes);

  // Backend::kv_write for a kpc4 pool (k, v, slots: device; slots uploaded through note_upload).
  void kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld, const int32_t* slots, int M,
                cudaStream_t st);
  // Backend::attention for a kpc4 pool. ws: the backend's decode workspace
  // (attn_workspace_floats(nh, max_ctx, D) floats), ctx: a device int it may overwrite.
  void attention(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                 const int32_t* pages, int nh, int nkv, int D, float* out, float* ws, int max_ctx, int32_t* ctx,
                 cudaStream_t st);

 private:
  const int32_t* host_of(const void* dev, size_t n, const char* what) const;
  template <class T>
  T* to_device(std::vector<uint8_t*>& buf, size_t& cap, int which, const std::vector<T>& h, cudaStream_t st);
  float* f32_ws(size_t floats, cudaStream_t st);

  std::unordered_map<const void*, std::vector<uint8_t>> shadow_;
  std::vector<uint8_t*> dev_ = std::vector<uint8_t*>(4, nullptr);  // per-purpose device arrays
  std::vector<size_t> dev_cap_ = std::vector<size_t>(4, 0);
  float* ws_ = nullptr;  // prefill: the layer's context as f32 pages
  size_t ws_floats_ = 0;
};

}  // namespace kvdeck::cuda_backend
