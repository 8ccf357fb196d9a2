// The CPU backend: host memory, OpenMP threads, and the kernels of native/kernels/cpu.
//
// Threading: each op splits its output into disjoint tasks (GEMM by weight rows so each
// task streams its own slice of the weights; attention by query × KV head or by KV head ×
// segment) that the thread pool hands to whichever thread is running (thread_pool.h: the
// pool degrades with load instead of stalling at barriers). Kernels are single-threaded;
// per-thread scratch is indexed by the pool's thread number.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend_cpu_pce.h"
#include "kvdeck/backend.h"
#include "kvdeck/ops_cpu.h"
#include "kvdeck/thread_pool.h"

namespace kvdeck {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0 ? threads : ThreadPool::available_cores()), pool_(threads_), scratch_(threads_) {}

  std::string name() const override { return "cpu"; }
  int threads() const override { return threads_; }

  // ---- memory ---------------------------------------------------------------------
  void* alloc(size_t bytes) override {
    const size_t n = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n ? n : 64);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, n);
    return p;
  }
  void free(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void sync() override {}

  // ---- ops ------------------------------------------------------------------------
  void embed(const WeightView& table, const int32_t* ids, int M, float* x) override {
    const int H = table.K;
    for (int m = 0; m < M; ++m) {
      const size_t off = static_cast<size_t>(ids[m]) * H;
      if (table.dtype == DType::W8A8)  // int8 rows, f16 scale per 32 (GGUF Q8_0 blocks)
        cpu::w8a8_row_to_f32(static_cast<const int8_t*>(table.data) + static_cast<size_t>(ids[m]) * table.Kp,
                             static_cast<const uint16_t*>(table.scales) + static_cast<size_t>(ids[m]) * (table.Kp / kQ8Block),
                             x + static_cast<size_t>(m) * H, H);
      else if (table.dtype == DType::F32)
        std::memcpy(x + static_cast<size_t>(m) * H, static_cast<const float*>(table.data) + off, sizeof(float) * H);
      else
        cpu::f16_to_f32_row(static_cast<const uint16_t*>(table.data) + off, x + static_cast<size_t>(m) * H, H);
    }
  }

  void rmsnorm(const float* x, const float* w, int M, int n, float eps, float* y) override {
    auto rows = [&](int m0, int m1) {
      for (int m = m0; m < m1; ++m)
        cpu::rmsnorm_row(x + static_cast<size_t>(m) * n, w, n, eps, y + static_cast<size_t>(m) * n);
    };
    if (M <= 8) return rows(0, M);
    const int R = 8, tasks = (M + R - 1) / R;  // 8 rows a task
    pool_.run(tasks, [&](int t, int) { rows(t * R, std::min(M, t * R + R)); });
  }

  // NVFP4 weights are repacked in place (the same buffers and bytes) into the layout of the
  // active kernel set (kernels.h: preferred_layout; File for scalar / NEON, which then read
  // the file layout as it is). Kernels read the view's layout tag, so switching the kernel
  // ISA afterwards stays correct. KVDECK_NVFP4_REPACK=0 keeps the file layout (for A/B runs).
  void prepare_weight(WeightView& w) override {
    if (act_bits_ == 16 && repack_q41_ && w.layout == WeightLayout::File &&
        preferred_layout_a16(w) == WeightLayout::Q41X8) {  // GGUF Q4_1 on a16: codes in place
      repack_q4_1_x8(static_cast<const uint8_t*>(w.data), w.N, w.Kp, static_cast<uint8_t*>(const_cast<void*>(w.data)));
      w.layout = WeightLayout::Q41X8;
      return;
    }
    if (!repack_nvfp4_ || w.dtype != DType::NVFP4 || w.layout != WeightLayout::File) return;
    if (preferred_layout(w) != WeightLayout::Nvfp4X4) return;
    // The engine's upload of this tensor is host memory this backend allocated (alloc()).
    repack_nvfp4_x4(static_cast<const uint8_t*>(w.data), static_cast<const uint8_t*>(w.scales), w.N, w.Kp,
                    static_cast<uint8_t*>(const_cast<void*>(w.data)),
                    static_cast<uint8_t*>(const_cast<void*>(w.scales)));
    w.layout = WeightLayout::Nvfp4X4;
  }

  void set_activation_bits(int bits) override { act_bits_ = bits; }

  void quantize_input(const float* x, int M, int K, QuantScratch& q) override {
    q.act.M = M;
    q.act.Kp = round_up(K, kQ8Block);
    quantize_act_q8(x, M, K, q.act);
    q.valid = true;
  }

  void matmul(const WeightView& w, const float* x, const QuantScratch& xq, int M, float* y,
              int ldy) override {
    const bool integer = is_integer(w.dtype);
    if (integer && !xq.valid) throw std::logic_error("matmul: integer weights need quantised input");
    const ActQ8* a = integer ? &xq.act : nullptr;
    const int rows = task_rows(w, M), tasks = (w.N + rows - 1) / rows;
    pool_.run(tasks, [&](int t, int) { gemm(w, x, a, M, y, ldy, t * rows, std::min(w.N, t * rows + rows)); });
  }

  void matmul_many(const MatmulOut* outs, int n, const float* x, const QuantScratch& xq, int M) override {
    for (int i = 0; i < n; ++i) {
      const DType dt = outs[i].w->dtype;
      if (is_integer(dt) && !xq.valid)
        throw std::logic_error("matmul: integer weights need quantised input");
    }
    // One task list over the row chunks of every weight: one hand-off for all of them.
    int first[8], rows[8], total = 0;
    if (n > 8) throw std::invalid_argument("matmul_many: at most 8 weights");
    for (int i = 0; i < n; ++i) {
      rows[i] = task_rows(*outs[i].w, M);
      first[i] = total;
      total += (outs[i].w->N + rows[i] - 1) / rows[i];
    }
    pool_.run(total, [&](int t, int) {
      int i = n - 1;
      while (first[i] > t) --i;
      const WeightView& w = *outs[i].w;
      const int n0 = (t - first[i]) * rows[i], n1 = std::min(w.N, n0 + rows[i]);
      gemm(w, x, is_integer(w.dtype) ? &xq.act : nullptr, M, outs[i].y, outs[i].ldy, n0, n1);
    });
  }

  void add_bias(float* x, const float* b, int M, int n, int ld) override {
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < n; ++j) x[static_cast<size_t>(m) * ld + j] += b[j];
  }

  void rope(float* x, int M, int n_heads, int D, int ld, const int32_t* pos,
            const float* inv_freq) override {
    const int half = D / 2;
    auto rows = [&](int m0, int m1, int thread) {
      std::vector<float>& cs = scratch(thread, 2 * size_t(half));  // cos [half] | sin [half]
      float* sn = cs.data() + half;
      for (int m = m0; m < m1; ++m) {
        for (int i = 0; i < half; ++i) {
          const float a = static_cast<float>(pos[m]) * inv_freq[i];  // as HF: f32 pos·inv_freq
          cs[i] = std::cos(a);
          sn[i] = std::sin(a);
        }
        cpu::rope_row(x + static_cast<size_t>(m) * ld, n_heads, D, cs.data(), sn);
      }
    };
    if (M <= 8) return rows(0, M, 0);
    const int R = 8, tasks = (M + R - 1) / R;
    pool_.run(tasks, [&](int t, int thread) { rows(t * R, std::min(M, t * R + R), thread); });
  }

  void kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld,
                const int32_t* slots, int M) override {
    if (pool.dtype() == KvDType::KPC4) return cpu_pce::kv_write(pool, layer, k, v, ld, slots, M, pce_);
    const int nkv = pool.n_kv(), D = pool.head_dim();
    const size_t row = pool.row_bytes(), vrow = pool.v_row_bytes();
    uint8_t* kb = static_cast<uint8_t*>(pool.k(layer));
    uint8_t* vb = static_cast<uint8_t*>(pool.v(layer));
    for (int m = 0; m < M; ++m) {
      for (int g = 0; g < nkv; ++g) {
        const size_t dst = (static_cast<size_t>(slots[m]) * nkv + g) * row;  // bytes
        const float* km = k + static_cast<size_t>(m) * ld + size_t(g) * D;
        const float* vm = v + static_cast<size_t>(m) * ld + size_t(g) * D;
        switch (pool.dtype()) {
          case KvDType::NVFP4R:
          case KvDType::K8V4:  // K and V rows may differ in size
            cpu::kv_encode_row(pool.dtype(), false, km, D, kb + dst);
            cpu::kv_encode_row(pool.dtype(), true, vm, D, vb + (static_cast<size_t>(slots[m]) * nkv + g) * vrow);
            break;
          case KvDType::F32:
            std::memcpy(kb + dst, km, sizeof(float) * D);
            std::memcpy(vb + dst, vm, sizeof(float) * D);
            break;
          case KvDType::F16:
            cpu::f32_to_f16_row(km, reinterpret_cast<uint16_t*>(kb + dst), D);
            cpu::f32_to_f16_row(vm, reinterpret_cast<uint16_t*>(vb + dst), D);
            break;
          case KvDType::NVFP4:
            cpu::kv_nvfp4_encode_row(km, D, kb + dst);
            cpu::kv_nvfp4_encode_row(vm, D, vb + dst);
            break;
          case KvDType::KPC4: break;  // cpu_pce::kv_write above
        }
      }
    }
  }

  void attention(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                 const int32_t* pages, int nh, int nkv, int D, float* out) override {
    attend(pool, layer, q, ldq, M, pos, pages, nh, nkv, D, nullptr, nullptr, 0, out);
  }
  void attention_fresh(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                       const int32_t* pages, int nh, int nkv, int D, const float* k_new, const float* v_new,
                       int ldkv, float* out) override {
    attend(pool, layer, q, ldq, M, pos, pages, nh, nkv, D, k_new, v_new, ldkv, out);
  }

  void silu_mul(const float* a, const float* b, int M, int n, float* y) override {
    const size_t total = static_cast<size_t>(M) * n;
    const size_t c = 16384;  // floats a task
    const int tasks = int((total + c - 1) / c);
    pool_.run(tasks, [&](int t, int) {
      const size_t i0 = size_t(t) * c, i1 = std::min(total, i0 + c);
      cpu::silu_mul_row(a + i0, b + i0, static_cast<int>(i1 - i0), y + i0);
    });
  }

  void add(float* x, const float* y, size_t n) override {
#pragma omp simd  // -fopenmp-simd: vectorisation only, no OpenMP runtime
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }

 private:
  // attention / attention_fresh: k_new, v_new (f32 [M, nkv*D], row stride ldkv) or null.
  void attend(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
              const int32_t* pages, int nh, int nkv, int D, const float* k_new, const float* v_new, int ldkv,
              float* out) {
    if (pool.dtype() == KvDType::KPC4)  // its own-page rule instead of fresh rows (backend_cpu_pce.h)
      return cpu_pce::attention(pool_, pce_, pool, layer, q, ldq, M, pos, pages, nh, nkv, D, out);
    const int p0 = pos[0];  // host memory: the CPU backend's memory
    const int G = nh / nkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int ctx = p0 + M;
    cpu::KvView kv{pool.k(layer), pool.v(layer), pool.dtype(), pool.block(), nkv, D, pages};
    if (k_new && pool.dtype() != KvDType::F32) {  // an f32 pool holds the new rows exactly already
      kv.fresh_k = k_new, kv.fresh_v = v_new, kv.fresh0 = p0, kv.fresh_ld = size_t(ldkv);
    }
    if (pool.dtype() != KvDType::F32 && (M > 1 || kv_needs_workspace(pool.dtype()))) {
      // Prefill over nvfp4 / f16 pages: widen the context once into a f32 workspace (reused
      // by every layer) so the M queries do not each widen every row again (exact for f16:
      // the same values as the in-kernel widening of decode). nvfp4r / k8v4 pages take this
      // path for decode too: the attention kernels read f32, f16 and nvfp4 pages only.
      const int n_pages = (ctx + pool.block() - 1) / pool.block();
      const size_t page_floats = size_t(pool.block()) * nkv * D;
      workspace_.resize(2 * n_pages * page_floats);  // K then V, [n_pages, block, nkv, D]
      ws_pages_.resize(n_pages);
      pool_.run(n_pages, [&](int pi, int) {
        ws_pages_[pi] = pi;
        const size_t row = pool.row_bytes(), vrow = pool.v_row_bytes();
        const uint8_t* kp = static_cast<const uint8_t*>(pool.k(layer)) + size_t(pages[pi]) * pool.block() * nkv * row;
        const uint8_t* vp = static_cast<const uint8_t*>(pool.v(layer)) + size_t(pages[pi]) * pool.block() * nkv * vrow;
        float* kw = workspace_.data() + pi * page_floats;              // [block, nkv, D]
        float* vw = workspace_.data() + (n_pages + pi) * page_floats;  // [block, nkv, D]
        if (pool.dtype() == KvDType::F16) {
          cpu::f16_to_f32_row(reinterpret_cast<const uint16_t*>(kp), kw, int(page_floats));
          cpu::f16_to_f32_row(reinterpret_cast<const uint16_t*>(vp), vw, int(page_floats));
        } else {
          for (int r = 0; r < pool.block() * nkv; ++r) {
            cpu::kv_decode_row(pool.dtype(), false, kp + r * row, D, kw + size_t(r) * D);
            cpu::kv_decode_row(pool.dtype(), true, vp + r * vrow, D, vw + size_t(r) * D);
          }
        }
      });
      if (kv.fresh_k) {  // the chunk's own tokens: their f32 rows over the widened ones
        const size_t tok = size_t(nkv) * D;
        for (int t = p0; t < ctx; ++t) {
          const size_t at = size_t(t / pool.block()) * page_floats + size_t(t % pool.block()) * tok;
          std::memcpy(workspace_.data() + at, k_new + size_t(t - p0) * ldkv, sizeof(float) * tok);
          std::memcpy(workspace_.data() + n_pages * page_floats + at, v_new + size_t(t - p0) * ldkv,
                      sizeof(float) * tok);
        }
      }
      // Decode over these pages scores with int8 q (attention_scores_int8): it does not repeat the
      // f32 arithmetic anyway, so the prefill need not follow its page steps (KvView::decode_order).
      const bool int8_decode = cpu::attention_scores_int8(kv);
      kv = cpu::KvView{workspace_.data(), workspace_.data() + n_pages * page_floats, KvDType::F32,
                       pool.block(), nkv, D, ws_pages_.data()};
      kv.decode_order = !int8_decode;
    }
    const int seg = cpu::attn_segment(pool.block()), S = (ctx + seg - 1) / seg;
    if (M == 1) {
      // Decode: one task per segment walks its pages once for every KV
      // head (contiguous reads; the next page prefetched), or per (segment, KV head) when
      // there are too few segments to keep the threads busy. The partials are combined in
      // segment order, as attention_query does.
      part_.resize(size_t(nkv) * S * G * (D + 2));
      float* po = part_.data();                  // [nkv, S, G, D]
      float* pm = po + size_t(nkv) * S * G * D;  // [nkv, S, G]
      float* pl = pm + size_t(nkv) * S * G;      // [nkv, S, G]
      const int hs = S >= 2 * threads_ ? 1 : nkv;  // head splits per segment
      pool_.run(S * hs, [&](int task, int thread) {
        float* tile = scratch(thread, 2 * size_t(pool.block()) * D).data();  // [2, block, D]
        const int s = task / hs, g0 = hs == 1 ? 0 : task % hs, g1 = hs == 1 ? nkv : g0 + 1;
        const int t0 = s * seg, t1 = std::min(ctx, t0 + seg);
        const size_t at = size_t(g0) * S + s;  // partial (g0, s)
        cpu::attention_segment_heads(kv, g0, g1, q + size_t(g0) * G * D, size_t(G) * D, G, t0, t1, scale,
                                     po + at * G * D, size_t(S) * G * D, pm + at * G, pl + at * G, size_t(S) * G,
                                     tile);
      });
      for (int g = 0; g < nkv; ++g)
        cpu::attention_combine(po + size_t(g) * S * G * D, pm + size_t(g) * S * G, pl + size_t(g) * S * G, S,
                               G, D, out + size_t(g) * G * D);
      return;
    }
    // One task per (tile of queries, KV head): the tile's queries share each page they read
    // (attention_queries). Later tiles see more context; tasks are claimed dynamically, so the
    // load balances itself. Tiles of up to attn_tile_ queries, smaller where that would leave
    // fewer than 4 tasks per thread (a short chunk), never below kAttnSubTile.
    const int few = std::max(1, (M * nkv + 4 * threads_ - 1) / (4 * threads_));
    const int QT = std::min(attn_tile_, std::max(std::min(cpu::kAttnSubTile, attn_tile_),
                                                 round_up(few, cpu::kAttnSubTile)));
    const int tiles = (M + QT - 1) / QT;
    const size_t work_floats = cpu::attention_queries_work_floats(QT, G, ctx, pool.block(), D);
    pool_.run(tiles * nkv, [&](int task, int thread) {
      const int tile = tiles - 1 - task / nkv, g = task % nkv;  // longest contexts first
      const int m0 = tile * QT, m1 = std::min(M, m0 + QT);
      cpu::attention_queries(kv, g, q, size_t(ldq), G, m0, m1, p0, scale, out, size_t(nh) * D,
                             scratch(thread, work_floats).data());
    });
  }

  // Rows of W per task: a multiple of 16 (the kernels' unrolled path), tasks_per_thread_
  // tasks per thread (KVDECK_TASKS_PER_THREAD, default 1), and at least ~32 KB of weights per
  // task. Measured 2026-12-01 (decode tok/s, nvfp4, 2 threads on 2 cores): idle 259 / 238 /
  // 231 / 195 for 1 / 2 / 4 / 8 tasks per thread (OpenMP before: 232-247), with 2 busy
  // processes 96 / 97 / 92 (OpenMP 54). One task per thread still degrades gracefully: a task
  // a descheduled worker has not claimed is run by the caller.
  int task_rows(const WeightView& w, int M) const {
    const size_t row_bytes = w.dtype == DType::F32 ? 4 * size_t(w.K) : w.dtype == DType::F16 ? 2 * size_t(w.K) : size_t(w.Kp) * 9 / 16;
    const int per = tasks_per_thread_ * threads_;
    const int by_threads = round_up((w.N + per - 1) / per, 16);
    const int by_bytes = round_up(int(32768 / std::max<size_t>(1, row_bytes * std::max(1, M))) + 1, 16);
    const int at_most = round_up((w.N + threads_ - 1) / threads_, 16);  // keep >= threads_ tasks
    return std::max(16, std::min(at_most, std::max(by_threads, by_bytes)));
  }
  // Per-thread scratch of at least n floats (each pool thread touches only its own).
  std::vector<float>& scratch(int thread, size_t n) {
    std::vector<float>& v = scratch_[thread];
    if (v.size() < n) v.resize(n);
    return v;
  }

  int threads_;
  // Queries per prefill attention tile at most (KVDECK_ATTN_TILE, 1..256; 1 = a query at a
  // time, the pre-tiling behaviour, kept for A/B measurements).
  int attn_tile_ = [] {
    const char* s = std::getenv("KVDECK_ATTN_TILE");
    const int v = s && *s ? std::atoi(s) : cpu::kAttnQueryTile;
    return std::clamp(v, 1, 256);
  }();
  int act_bits_ = 8;
  // KVDECK_Q41_REPACK=0 keeps GGUF Q4_1 in the file layout on a16 (for A/B runs).
  bool repack_q41_ = [] {
    const char* s = std::getenv("KVDECK_Q41_REPACK");
    return !(s && std::strcmp(s, "0") == 0);
  }();
  bool repack_nvfp4_ = [] {
    const char* s = std::getenv("KVDECK_NVFP4_REPACK");
    return !(s && std::strcmp(s, "0") == 0);
  }();
  int tasks_per_thread_ = [] {
    const char* s = std::getenv("KVDECK_TASKS_PER_THREAD");
    return std::clamp(s && *s ? std::atoi(s) : 1, 1, 64);
  }();
  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;  // [threads] per-thread work buffers
  std::vector<float> workspace_;   // nvfp4 prefill: dequantised K,V of one layer's context
  std::vector<int32_t> ws_pages_;  // identity page table into workspace_
  std::vector<float> part_;        // decode: per (KV head, segment) partials, see attention()
  cpu_pce::State pce_{threads_};   // kpc4 KV buffers
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace kvdeck
