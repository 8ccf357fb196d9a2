// kvdeck/kv_pool.h — the paged KV pool: physical storage and page reference counts.
//
// Three layers, as in SGLang's mem_cache: a request maps its token positions to pages
// (its page table, owned by the Sequence); this pool hands out page indices and counts
// their references (the one owner of page ref counts); the storage is per layer
// K and V [n_pages, block, n_kv, row] in backend memory, where a row is one head's D values:
//   F32: f32 [D]; F16: f16 [D];
//   NVFP4: u8 codes [D/2] (two E2M1 per byte, element 2i low) then u8 E4M3 scales [D/16]
//          (one per 16 values along head_dim, tensor scale 1): 0.28125x the bytes of f16;
//   NVFP4R: the NVFP4 row then an f16 second-level scale per row [2 bytes]: 0.297x f16;
//   K8V4: K rows i8 [D] then an f16 scale [2 bytes]; V rows NVFP4R: 0.406x f16.
// NVFP4R / K8V4 pages are read through an f32 workspace on the CPU backend (kv_needs_workspace),
// not by its attention kernels; the CUDA backend decodes them in its paged-attention kernel
// (native/kernels/cuda/attention_paged.cu). A page returns to the free list
// when its reference count drops to zero. The prefix cache (radix tree) holds its
// own references through the same ref/unref calls. Not thread-safe on its own: the Engine's
// lock serialises every call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvdeck {

class Backend;

enum class KvDType : int32_t { F32 = 0, F16 = 1, NVFP4 = 2, NVFP4R = 3, K8V4 = 4 };
const char* kv_dtype_name(KvDType t);
// Bytes of one head's D values: a K row (v = false) or a V row (they differ for K8V4 only).
size_t kv_row_bytes(KvDType t, int head_dim, bool v = false);
// Formats the attention kernels do not read from pages: dequantised into f32 first.
inline bool kv_needs_workspace(KvDType t) { return t == KvDType::NVFP4R || t == KvDType::K8V4; }

// Thrown when a request cannot get the pages it needs.
struct KvPoolFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class KvPool {
 public:
  KvPool(Backend& backend, int n_layers, int n_kv, int head_dim, int block, int n_pages,
         KvDType dtype);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // ---- geometry -------------------------------------------------------------------
  int block() const { return block_; }
  int n_pages() const { return n_pages_; }
  int n_kv() const { return n_kv_; }
  int head_dim() const { return head_dim_; }
  KvDType dtype() const { return dtype_; }
  size_t page_bytes() const;        // one page, all layers, K and V
  size_t bytes_per_token() const;   // all layers, K and V
  size_t row_bytes() const { return kv_row_bytes(dtype_, head_dim_); }  // a K row
  size_t v_row_bytes() const { return kv_row_bytes(dtype_, head_dim_, true); }
  size_t token_bytes() const { return row_bytes() * n_kv_; }  // one layer, K
  // K / V storage of one layer: [n_pages, block, n_kv, row_bytes() / v_row_bytes()].
  void* k(int layer) const { return k_[layer]; }
  void* v(int layer) const { return v_[layer]; }

  // ---- page references (mutating) ---------------------------------------------------
  int alloc_page();                 // ref count 1; throws KvPoolFull when none is free
  void ref(int page);
  void unref(int page);             // frees the page at zero
  int refcount(int page) const { return refs_[page]; }
  int free_pages() const { return static_cast<int>(free_.size()); }
  int used_pages() const { return n_pages_ - free_pages(); }

 private:
  Backend& backend_;
  int n_layers_, n_kv_, head_dim_, block_, n_pages_;
  KvDType dtype_;
  std::vector<void*> k_, v_;        // [L] backend pointers
  std::vector<int32_t> refs_;       // [n_pages]
  std::vector<int32_t> free_;       // stack of free page ids
};

}  // namespace kvdeck
