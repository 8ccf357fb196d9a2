#include "kvdeck/kv_pool.h"

#include <cstdlib>

#include "kvdeck/backend.h"

namespace kvdeck {

const char* kv_dtype_name(KvDType t) {
  switch (t) {
    case KvDType::F32: return "f32";
    case KvDType::F16: return "f16";
    case KvDType::NVFP4: return "nvfp4";
    case KvDType::NVFP4R: return "nvfp4r";
    case KvDType::K8V4: return "k8v4";
    case KvDType::KPC4: return "kpc4";
  }
  return "?";
}

size_t kv_row_bytes(KvDType t, int D, bool v) {
  switch (t) {
    case KvDType::F32: return size_t(D) * 4;
    case KvDType::F16: return size_t(D) * 2;
    case KvDType::NVFP4: return size_t(D) / 2 + size_t(D) / 16;
    case KvDType::NVFP4R: return size_t(D) / 2 + size_t(D) / 16 + 2;
    case KvDType::K8V4: return v ? kv_row_bytes(KvDType::NVFP4R, D) : size_t(D) + 2;
    case KvDType::KPC4: return v ? kv_row_bytes(KvDType::NVFP4, D) : size_t(D) * 5 / 8;  // (8 + 2) D per 16 tokens
  }
  return 0;
}

KvPool::KvPool(Backend& backend, int n_layers, int n_kv, int head_dim, int block, int n_pages,
               KvDType dtype)
    : backend_(backend), n_layers_(n_layers), n_kv_(n_kv), head_dim_(head_dim), block_(block),
      n_pages_(n_pages), dtype_(dtype) {
  if (n_pages <= 0 || block <= 0) throw std::invalid_argument("kv pool: n_pages and block must be > 0");
  if ((dtype == KvDType::NVFP4 || dtype == KvDType::NVFP4R || dtype == KvDType::K8V4 || dtype == KvDType::KPC4) &&
      head_dim % 16 != 0)
    throw std::invalid_argument(std::string("kv pool: ") + kv_dtype_name(dtype) +
                                " KV needs head_dim divisible by 16, got " + std::to_string(head_dim));
  if (dtype == KvDType::KPC4 && block != 16)
    throw std::invalid_argument("kv pool: kpc4 KV needs pages of 16 tokens (its K minimum and step are per "
                                "16 tokens of a channel), got kv_block " + std::to_string(block));
  const char* kpc4_cuda = std::getenv("KVDECK_CUDA_KPC4");  // opt-in until measured on a GPU
  if (dtype == KvDType::KPC4 && backend.name() != "cpu" &&
      !(backend.name() == "cuda" && kpc4_cuda && std::string(kpc4_cuda) == "1"))
    throw std::invalid_argument("kv pool: kpc4 KV runs on the cpu backend only: the " + backend.name() +
                                " backend's kpc4 kernels are not measured yet (KVDECK_CUDA_KPC4=1 opts in on "
                                "cuda; or use nvfp4, nvfp4r or k8v4 there)");
  const size_t rows = static_cast<size_t>(n_pages) * block * n_kv;
  for (int l = 0; l < n_layers; ++l) {
    k_.push_back(backend_.alloc(rows * kv_row_bytes(dtype, head_dim)));
    v_.push_back(backend_.alloc(rows * kv_row_bytes(dtype, head_dim, true)));
  }
  refs_.assign(n_pages, 0);
  if (dtype == KvDType::KPC4) slot_of_.assign(n_pages, -1), retired_.assign(n_pages, 0);
  free_.reserve(n_pages);
  for (int p = n_pages - 1; p >= 0; --p) free_.push_back(p);  // page 0 handed out first
}

KvPool::~KvPool() {
  for (void* p : k_) backend_.free(p);
  for (void* p : v_) backend_.free(p);
  for (float* p : slots_) backend_.free(p);
}

size_t KvPool::bytes_per_token() const {
  return size_t(n_layers_) * n_kv_ * (row_bytes() + v_row_bytes());
}
size_t KvPool::page_bytes() const { return bytes_per_token() * block_; }

int KvPool::alloc_page() {
  if (free_.empty())
    throw KvPoolFull("kv pool full: all " + std::to_string(n_pages_) + " pages of " +
                     std::to_string(block_) + " tokens are in use");
  const int p = free_.back();
  free_.pop_back();
  refs_[p] = 1;
  return p;
}

void KvPool::ref(int page) { ++refs_[page]; }

void KvPool::unref(int page) {
  if (refs_[page] <= 0) throw std::logic_error("kv pool: unref of free page " + std::to_string(page));
  if (--refs_[page] == 0) {
    if (!slot_of_.empty()) unstage(page);
    free_.push_back(page);
  }
}

// ---- KPC4 staging ----------------------------------------------------------------------
size_t KvPool::staging_slot_bytes() const {
  return slot_of_.empty() ? 0 : 2 * sizeof(float) * size_t(n_layers_) * block_ * n_kv_ * head_dim_;
}

float* KvPool::staged(int page) const {
  if (slot_of_.empty()) return nullptr;
  const int s = slot_of_[page];
  return s < 0 ? nullptr : slots_[s];
}

float* KvPool::stage(int page) const {
  if (slot_of_.empty()) throw std::logic_error(std::string("kv pool: no staging for ") + kv_dtype_name(dtype_) + " KV");
  if (slot_of_[page] < 0) {
    if (free_slots_.empty()) {
      free_slots_.push_back(int(slots_.size()));
      slots_.push_back(static_cast<float*>(backend_.alloc(staging_slot_bytes())));
    }
    slot_of_[page] = free_slots_.back();
    free_slots_.pop_back();
    ++staged_count_;
  }
  return slots_[slot_of_[page]];
}

void KvPool::retire(int page) const {
  if (slot_of_.empty() || slot_of_[page] < 0 || retired_[page]) return;
  retired_[page] = 1;
  retired_list_.push_back(page);
}

void KvPool::release_retired(const int32_t* keep, int n) const {
  if (retired_list_.empty()) return;
  for (int page : retired_list_) {
    if (!retired_[page]) continue;  // freed (unstaged) since
    bool touched = false;
    for (int i = 0; i < n && !touched; ++i) touched = keep[i] == page;
    if (touched) {
      retired_[page] = 0;  // written again (after a cancelled chunk): open once more
    } else {
      unstage(page);
    }
  }
  retired_list_.clear();
}

void KvPool::unstage(int page) const {
  retired_[page] = 0;
  if (slot_of_[page] < 0) return;
  free_slots_.push_back(slot_of_[page]);
  slot_of_[page] = -1;
  --staged_count_;
}

}  // namespace kvdeck
