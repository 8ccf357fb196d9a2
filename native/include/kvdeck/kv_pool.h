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
//   KPC4: K per (page, KV head): int4 codes [block][D/2] (token-major, channel 2i low), then
//         E4M3 minimums [D] and E4M3 steps [D] per channel (x = lo + code * step, over the
//         page's 16 tokens: 10 B per 16 values, kv_codec_pce.h); V rows NVFP4: 0.297x f16.
//         block must be 16. A page's K codes exist once it is full: until then (the open page)
//         its K and V rows live unrounded in an f32 staging slot (below), and a query reads its
//         own page from there (decode and prefill alike; the earlier pages from the codes).
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

enum class KvDType : int32_t { F32 = 0, F16 = 1, NVFP4 = 2, NVFP4R = 3, K8V4 = 4, KPC4 = 5 };
const char* kv_dtype_name(KvDType t);
// Bytes of one head's D values: a K row (v = false) or a V row (they differ for K8V4 only).
size_t kv_row_bytes(KvDType t, int head_dim, bool v = false);
// Formats the attention kernels do not read from pages: dequantised into f32 first.
inline bool kv_needs_workspace(KvDType t) { return t == KvDType::NVFP4R || t == KvDType::K8V4; }
// KPC4's K is per page, not per row: its pages are read by the CPU backend's own path
// (backend_cpu_pce.cpp); kv_row_bytes gives its K bytes per token (5 D / 8 at block 16).

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
  int n_layers() const { return n_layers_; }
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

  // ---- KPC4 staging: the open pages' unrounded rows -----------------------------------
  // A slot holds one page's rows of every layer, f32 K [L, block, nkv, D] then V the same.
  // Slots are taken on a page's first write and given back when the page is freed or, once
  // the page is full in every layer (retire), when the forward that filled it ends (the Engine
  // calls release_retired; its own queries read it until then), or after a cancelled forward
  // at the first write of a later one that does not touch it again. Memory is
  // taken from the backend on demand and kept for reuse (never more slots than pages).
  // The bookkeeping is mutable: kv_write (backend.h) writes through a const pool; the
  // Engine's lock serialises every call.
  float* staged(int page) const;    // the page's slot, or null when it has none
  float* stage(int page) const;     // staged(page), taking a slot first when it has none
  void retire(int page) const;      // full in every layer: its slot may go at the next forward
  // Give back the slots of retired pages, except those of the pages in keep[0..n).
  void release_retired(const int32_t* keep, int n) const;
  size_t staging_slot_bytes() const;
  int staged_pages() const { return staged_count_; }
  size_t staging_bytes() const { return size_t(staged_count_) * staging_slot_bytes(); }

 private:
  void unstage(int page) const;

  Backend& backend_;
  int n_layers_, n_kv_, head_dim_, block_, n_pages_;
  KvDType dtype_;
  std::vector<void*> k_, v_;        // [L] backend pointers
  std::vector<int32_t> refs_;       // [n_pages]
  std::vector<int32_t> free_;       // stack of free page ids
  // KPC4 staging (empty for the other formats)
  mutable std::vector<int32_t> slot_of_;    // [n_pages] staging slot or -1
  mutable std::vector<uint8_t> retired_;    // [n_pages] full in every layer, slot still held
  mutable std::vector<int32_t> retired_list_;
  mutable std::vector<float*> slots_;       // every slot allocated so far
  mutable std::vector<int32_t> free_slots_;
  mutable int staged_count_ = 0;
};

}  // namespace kvdeck
