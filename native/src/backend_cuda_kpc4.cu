// The CUDA backend's KPC4 KV path: see backend_cuda_kpc4.h. Staging slot layout (kv_pool.h):
// f32 K [L, 16, nkv, D] then V [L, 16, nkv, D]; pool K pages [n_pages][nkv][10 D bytes], V rows
// NVFP4 [n_pages, 16, nkv, D/2 + D/16] (kernels: native/kernels/cuda/attention_kpc4.cuh).
#include "backend_cuda_kpc4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_kpc4.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace kvdeck::cuda_backend {

namespace {
constexpr int B = 16;

void chk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda kpc4 ") + what + ": " + cudaGetErrorString(e));
}
float* stage_k(const KvPool& pool, float* slot, int layer) {
  return slot + size_t(layer) * B * pool.n_kv() * pool.head_dim();
}
float* stage_v(const KvPool& pool, float* slot, int layer) {
  return slot + (size_t(pool.n_layers()) + layer) * B * pool.n_kv() * pool.head_dim();
}
enum Buf { kRows = 0, kFull = 1, kPages = 2, kTables = 3 };
}  // namespace

Kpc4Path::~Kpc4Path() {
  for (uint8_t* p : dev_) cudaFree(p);
  cudaFree(ws_);
}

void Kpc4Path::note_upload(const void* dst, const void* src, size_t bytes) {
  if (bytes > (size_t(1) << 20)) return;
  auto& v = shadow_[dst];
  v.assign(static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + bytes);
}

const int32_t* Kpc4Path::host_of(const void* dev, size_t n, const char* what) const {
  const size_t need = n * sizeof(int32_t);
  auto it = shadow_.find(dev);
  if (it == shadow_.end())  // inside a larger upload (the engine's decode step packs its arrays in one)
    for (it = shadow_.begin(); it != shadow_.end(); ++it) {
      const auto* b = static_cast<const uint8_t*>(it->first);
      const auto* d = static_cast<const uint8_t*>(dev);
      if (d >= b && d + need <= b + it->second.size()) return reinterpret_cast<const int32_t*>(it->second.data() + (d - b));
    }
  if (it == shadow_.end() || it->second.size() < need)
    throw std::logic_error(std::string("cuda kpc4: the ") + what + " array (" + std::to_string(n) +
                           " ints) was not uploaded through Backend::upload: its host copy is needed");
  return reinterpret_cast<const int32_t*>(it->second.data());
}

// h to device buffer `which` (grown as needed, ordered on the stream; pageable source: the call
// returns once h may be reused).
template <class T>
T* Kpc4Path::to_device(std::vector<uint8_t*>& buf, size_t& cap, int which, const std::vector<T>& h, cudaStream_t st) {
  const size_t bytes = std::max<size_t>(h.size() * sizeof(T), 16);
  if (bytes > cap) {
    chk(cudaStreamSynchronize(st), "stream");
    cudaFree(buf[which]);
    buf[which] = nullptr;
    chk(cudaMalloc(&buf[which], bytes * 2), "cudaMalloc");
    cap = bytes * 2;
  }
  if (!h.empty()) chk(cudaMemcpyAsync(buf[which], h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, st), "upload");
  return reinterpret_cast<T*>(buf[which]);
}

float* Kpc4Path::f32_ws(size_t floats, cudaStream_t st) {
  if (floats > ws_floats_) {
    chk(cudaStreamSynchronize(st), "stream");
    cudaFree(ws_);
    ws_ = nullptr;
    chk(cudaMalloc(&ws_, floats * sizeof(float)), "cudaMalloc");
    ws_floats_ = floats;
  }
  return ws_;
}

// =====================================================================================
// KV write: rows into the staging slots; a page's K encoded when its 16th row is written
// =====================================================================================
void Kpc4Path::kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld, const int32_t* slots,
                        int M, cudaStream_t st) {
  const int nkv = pool.n_kv(), D = pool.head_dim(), L = pool.n_layers();
  const size_t tok = size_t(nkv) * D;
  const int32_t* hs = host_of(slots, size_t(M), "kv_write slots");
  std::vector<int32_t> touched;
  for (int m = 0; m < M; ++m)
    if (touched.empty() || touched.back() != hs[m] / B) touched.push_back(hs[m] / B);
  if (layer == 0) pool.release_retired(touched.data(), int(touched.size()));
  std::vector<float*> rows(M);
  std::vector<float*> full_src;
  std::vector<int32_t> full_pages;
  for (int m = 0; m < M; ++m) {
    const int page = hs[m] / B, t = hs[m] % B;
    float* slot = pool.staged(page);
    if (!slot) {  // a page written again after its slot went back (a cancelled chunk): from the pool
      slot = pool.stage(page);
      if (t > 0) {
        const std::vector<int32_t> one{page};
        const int32_t* dp = to_device(dev_, dev_cap_[kPages], kPages, one, st);
        for (int l = 0; l < L; ++l)
          chk(cuda::kpc4_pages_to_f32(pool.k(l), pool.v(l), dp, 1, nkv, D, stage_k(pool, slot, l),
                                      stage_v(pool, slot, l), st),
              "restage");
      }
    }
    rows[m] = stage_k(pool, slot, layer) + size_t(t) * tok;
    if (t == B - 1) full_src.push_back(stage_k(pool, slot, layer)), full_pages.push_back(page);
  }
  // one device array: the row pointers, then the full pages' sources, then their indices
  std::vector<uintptr_t> packed(rows.size() + full_src.size() + (full_pages.size() + 1) / 2, 0);
  std::memcpy(packed.data(), rows.data(), rows.size() * sizeof(float*));
  std::memcpy(packed.data() + rows.size(), full_src.data(), full_src.size() * sizeof(float*));
  std::memcpy(packed.data() + rows.size() + full_src.size(), full_pages.data(), full_pages.size() * sizeof(int32_t));
  const uintptr_t* dpk = to_device(dev_, dev_cap_[kRows], kRows, packed, st);
  cuda::Kpc4Write w;
  w.k_pages = static_cast<uint8_t*>(pool.k(layer)), w.v_pages = static_cast<uint8_t*>(pool.v(layer));
  w.n_kv = nkv, w.D = D, w.slots = slots;
  w.stage_rows = reinterpret_cast<float* const*>(dpk);
  w.v_off = size_t(L) * B * tok;
  w.n_full = int(full_pages.size());
  w.full_src = reinterpret_cast<const float* const*>(dpk + rows.size());
  w.full_pages = reinterpret_cast<const int32_t*>(dpk + rows.size() + full_src.size());
  const cudaError_t e = cuda::kpc4_kv_write(w, k, v, ld, M, st);
  if (e == cudaErrorInvalidValue) throw std::invalid_argument("kv_write: kpc4 head_dim " + std::to_string(D) + " (needs a multiple of 16)");
  chk(e, "kv_write");
  if (layer == L - 1)
    for (int32_t p : full_pages) pool.retire(p);
}

// =====================================================================================
// Attention
// =====================================================================================
void Kpc4Path::attention(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                         const int32_t* pages, int nh, int nkv, int D, float* out, float* ws, int max_ctx,
                         int32_t* ctx, cudaStream_t st) {
  const int32_t* hp = host_of(pos, size_t(M), "attention positions");
  const int p0 = hp[0], cx = p0 + M, P0 = p0 / B, P1 = (cx - 1) / B;
  const int32_t* hpg = host_of(pages, size_t(P1) + 1, "attention page table");
  const float scale = 1.0f / std::sqrt(float(D));
  const size_t tok = size_t(nkv) * D, page_floats = size_t(B) * tok;
  for (int P = P0; P <= P1; ++P)
    if (!pool.staged(hpg[P]))
      throw std::logic_error("cuda kpc4 attention: the queries' page " + std::to_string(hpg[P]) + " is not staged");
  if (M == 1 && ldq == nh * D) {  // decode: the tensor-core split kernel on the codes
    float* own = pool.staged(hpg[P1]);
    chk(cuda::ctx_from_pos(pos, ctx, st), "attention");
    const cudaError_t e = cuda::kpc4_attention_decode(pool.k(layer), pool.v(layer), pages, nkv, D, q, nh, ctx,
                                                      std::max(max_ctx, cx), scale, stage_k(pool, own, layer),
                                                      stage_v(pool, own, layer), ws, out, st);
    if (e != cudaErrorInvalidValue) return chk(e, "attention_decode");
    cudaGetLastError();  // a shape it refuses (D, grouping): the f32 path below
  }
  // prefill: pages [0, P1) decoded once, the queries' pages P0..P1 from staging after them
  const int n_rnd = P1, n_own = P1 - P0 + 1;
  float* wk = f32_ws(2 * size_t(n_rnd + n_own) * page_floats, st);
  float* wv = wk + size_t(n_rnd + n_own) * page_floats;
  chk(cuda::kpc4_pages_to_f32(pool.k(layer), pool.v(layer), pages, n_rnd, nkv, D, wk, wv, st), "attention");
  for (int i = 0; i < n_own; ++i) {
    float* slot = pool.staged(hpg[P0 + i]);
    chk(cudaMemcpyAsync(wk + size_t(n_rnd + i) * page_floats, stage_k(pool, slot, layer), page_floats * sizeof(float),
                        cudaMemcpyDeviceToDevice, st),
        "attention");
    chk(cudaMemcpyAsync(wv + size_t(n_rnd + i) * page_floats, stage_v(pool, slot, layer), page_floats * sizeof(float),
                        cudaMemcpyDeviceToDevice, st),
        "attention");
  }
  std::vector<int32_t> tables(size_t(n_own) * (P1 + 1));
  for (int i = 0; i < n_own; ++i) {
    int32_t* t = tables.data() + size_t(i) * (P1 + 1);
    for (int j = 0; j < P0 + i; ++j) t[j] = j;
    t[P0 + i] = n_rnd + i;
  }
  const int32_t* dt = to_device(dev_, dev_cap_[kTables], kTables, tables, st);
  for (int i = 0; i < n_own; ++i) {
    const int P = P0 + i, m0 = std::max(p0, P * B) - p0, m1 = std::min(cx, P * B + B) - p0;
    const cudaError_t e = cuda::attention_paged(0, wk, wv, dt + size_t(i) * (P1 + 1), B, nkv, D, q + size_t(m0) * ldq,
                                                ldq, m1 - m0, nh, pos + m0, scale, out + size_t(m0) * nh * D, st);
    if (e == cudaErrorInvalidValue)
      throw std::invalid_argument("attention: kpc4 head_dim " + std::to_string(D) + " (needs a multiple of 32, <= 256)");
    chk(e, "attention");
  }
}

}  // namespace kvdeck::cuda_backend
