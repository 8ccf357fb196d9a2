// The CUDA backend: device memory, one stream, and the kernels of native/kernels/cuda.
//
// Every op enqueues on the backend's stream and returns (download and sync wait). Shapes a
// kernel does not support are refused with std::invalid_argument naming the op, before
// anything is enqueued; CUDA errors raise std::runtime_error with CUDA's message.
// Fusion and graphs: rmsnorm, add, silu_mul, rope and the decode attention are deferred one op
// and fused with the op that consumes them, and decode steps (M = 1) run as a CUDA graph
// (positions, KV slots and the page table are read from device memory, so one graph serves
// every step); the state and its mechanics are in backend_cuda_state.h / .cu.
// A/B switches: KVDECK_CUDA_GRAPH=0 runs every step eagerly; KVDECK_CUDA_PDL=0 launches the GEMVs
// without programmatic dependent launch; KVDECK_CUDA_MMA=0 runs prefill matmuls as batch-8 GEMV
// chunks instead of the tensor-core GEMM; KVDECK_CUDA_GEMM_NVFP4=i8 (NVFP4 on the int8 mma
// instead of the f16 mma) is read by gemm_mma.cu at every launch; KVDECK_CUDA_CTX_BUCKETS=0
// records one decode step per kind instead of one per context bucket of its key with the
// attention grids sized for the bucket (backend_cuda_state.h); KVDECK_CUDA_ATTN_Q8=0 quantises
// the o projection's input in a kernel of its own instead of in the attention combine;
// KVDECK_CUDA_GEMV_GU=0 / 1 runs the batch-1 gate/up GEMV pipelined at two chunks a lane / at
// four chunks unpipelined for every Kp (default: four for Kp >= 2048; backend_cuda_state.h);
// KVDECK_CUDA_PINNED_DL=0 downloads small results straight into the caller's (pageable) memory
// instead of through the pinned staging; KVDECK_CUDA_STEP_TIMING=<file> times each replayed
// decode step's GPU and host parts (measurement only; backend_cuda_state.h StepTiming).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_cuda_kpc4.h"
#include "backend_cuda_state.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kvdeck/backend.h"

namespace kvdeck {
namespace {

class CudaBackend final : public Backend, private cuda_backend::CudaState {
 public:
  std::string name() const override { return "cuda"; }
  int threads() const override { return sms_; }  // the multiprocessors the kernels spread over

  // ---- memory ---------------------------------------------------------------------
  void* alloc(size_t bytes) override {
    flush();
    no_capture("alloc");
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 64)), "cudaMalloc");
    check(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 64), st_), "cudaMemset");
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    flush();
    cudaStreamSynchronize(st_);
    cudaFree(p);
  }
  // Returns once src may be reused (ordered on the stream). Small uploads (a step's ids,
  // positions, slots and page table) go through a pinned staging buffer: an asynchronous copy
  // instead of a pageable one that blocks; the staging is reused once the stream has drained
  // (every download and sync drains it).
  void upload(void* dst, const void* src, size_t bytes) override {
    flush();
    ctx_fresh_ = nullptr;  // pos may change
    no_capture("upload");
    if (!bytes) return;
    if (kpc4_) kpc4_->note_upload(dst, src, bytes);  // its host-side bookkeeping (backend_cuda_kpc4.h)
    if (bytes <= kStage / 4 && stage_) {
      if (stage_used_ + bytes > kStage) sync();
      uint8_t* p = stage_ + stage_used_;
      std::memcpy(p, src, bytes);
      stage_used_ += (bytes + 63) / 64 * 64;
      check(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, st_), "upload");
      return;
    }
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st_), "upload");
  }
  // Small downloads (a decode step's token id, a sampled id) through the pinned staging
  // (backend_cuda_state.h pinned_dl_), past the uploads still staged there.
  void download(void* dst, const void* src, size_t bytes) override {
    flush();
    no_capture("download");
    if (bytes && pinned_dl_ && stage_ && bytes <= kSmallDownload) {
      if (stage_used_ + bytes > kStage) sync();
      uint8_t* p = stage_ + stage_used_;
      check(cudaMemcpyAsync(p, src, bytes, cudaMemcpyDeviceToHost, st_), "download");
      sync();
      std::memcpy(dst, p, bytes);
      return;
    }
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st_), "download");
    sync();
  }
  void sync() override {
    flush();
    check(cudaStreamSynchronize(st_), "stream");
    stage_used_ = 0;
    if (timing_) timing_synced();
  }

  // ---- ops ------------------------------------------------------------------------
  void embed(const WeightView& table, const int32_t* ids, int M, float* x) override {
    flush();
    if (table.dtype == DType::W8A8) {
      check(cuda::embed_rows_w8a8(table.data, table.scales, ids, M, table.K, table.Kp, x, st_), "embed");
      return;
    }
    if (table.dtype != DType::F32 && table.dtype != DType::F16) bad("embed: the table must be f32, f16 or w8a8");
    check(cuda::embed_rows(table.data, table.dtype == DType::F16, ids, M, table.K, x, st_), "embed");
  }
  void rmsnorm(const float* x, const float* w, int M, int n, float eps, float* y) override {
    const float* add = nullptr;  // a pending x += add folds into the norm
    if (p_add_.n && p_add_.x == x && p_add_.n == size_t(M) * n) add = p_add_.y, p_add_ = {};
    flush();
    p_norm_ = {const_cast<float*>(x), add, w, M, n, eps, y};
  }
  void quantize_input(const float* x, int M, int K, QuantScratch& q) override {
    q.act.M = M;
    q.act.Kp = round_up(K, kQ8Block);
    const int Kp = q.act.Kp;
    if (p_norm_.M && p_norm_.h == x && p_norm_.M == M && p_norm_.n == K) {
      const Norm n = p_norm_;
      p_norm_ = {};
      flush();
      check(cuda::add_rmsnorm_q8(n.x, n.y, n.w, M, K, n.eps, n.h, Kp, q.act.q, q.act.d, q.act.s, st_), "rmsnorm");
    } else if (p_attn_.out == x && M == 1 && K == p_attn_.nh * p_attn_.kv.D && Kp == K) {
      const Attn a = p_attn_;  // the combine writes the q8 (attention_decode's q8)
      p_attn_ = {};
      flush();
      launch_attention(a, {q.act.q, q.act.d, q.act.s});
    } else if (p_silu_.M && p_silu_.y == x && p_silu_.M == M && p_silu_.n == K) {
      const Silu u = p_silu_;
      p_silu_ = {};
      flush();
      check(cuda::silu_mul_q8(u.a, u.b, M, K, Kp, u.y, q.act.q, q.act.d, q.act.s, st_), "silu_mul");
    } else {
      flush();
      check(cuda::quantize_act_q8(x, M, K, Kp, q.act.q, q.act.d, q.act.s, st_, pdl_), "quantize_input");
    }
    q.valid = true;
  }
  // M > 8 (prefill): NVFP4 / W4A8 / W8A8 on the tensor cores (gemm_mma.cu, the same integer
  // block sums as the GEMV); f32 / f16 weights (and KVDECK_CUDA_MMA=0) run the batch-8 kernels
  // over row chunks of 8, each chunk re-reading the weights.
  void matmul(const WeightView& w, const float* x, const QuantScratch& xq, int M, float* y, int ldy) override {
    flush();
    if (is_integer(w.dtype) && !xq.valid) bad("matmul: integer weights need quantised input");
    const int Kp = w.Kp, nb = Kp / kQ8Block;
    if (M > 8 && mma_ && is_integer(w.dtype)) {
      const int fmt = w.dtype == DType::NVFP4 ? 0 : w.dtype == DType::W4A8 ? 1 : 2;
      cudaError_t e = cuda::gemm_q8_mma(fmt, static_cast<const uint8_t*>(w.data), w.scales, w.tscale, w.group, w.N,
                                        Kp, xq.act.q, xq.act.d, M, y, ldy, st_);
      if (e == cudaSuccess && w.dtype == DType::W4A8 && w.mins)
        e = cuda::w4a8_mins_add(static_cast<const uint16_t*>(w.mins), static_cast<const uint16_t*>(w.scales), w.N,
                                Kp, xq.act.d, xq.act.s, M, y, ldy, st_);
      if (e != cudaErrorInvalidValue) return check(e, "matmul (tensor cores)");
      cudaGetLastError();  // a shape the tile kernel refuses (alignment): the GEMV chunks below
    }
    for (int m0 = 0; m0 < M; m0 += 8) {
      const int R = std::min(8, M - m0);
      float* yr = y + size_t(m0) * ldy;
      const int8_t* q = xq.act.q ? xq.act.q + size_t(m0) * Kp : nullptr;
      const float* d = xq.act.d ? xq.act.d + size_t(m0) * nb : nullptr;
      const int32_t* s = xq.act.s ? xq.act.s + size_t(m0) * nb : nullptr;
      const auto* codes = static_cast<const uint8_t*>(w.data);
      cudaError_t e = cudaSuccess;
      switch (w.dtype) {
        case DType::F32:
        case DType::F16:
          e = cuda::gemv_float(w.dtype == DType::F16, w.data, w.N, w.K, x + size_t(m0) * w.K, R, yr, ldy, st_);
          break;
        case DType::NVFP4:
          e = cuda::gemv_nvfp4_dp4a(codes, static_cast<const uint8_t*>(w.scales), w.tscale, w.N, Kp, q, d, R, yr, ldy,
                                    st_, pdl_);
          break;
        case DType::W4A8:
          e = cuda::gemv_w4a8(codes, static_cast<const uint16_t*>(w.scales), w.group, w.N, Kp, q, d, s, R, yr, ldy,
                              st_, pdl_);
          if (e == cudaSuccess && w.mins)
            e = cuda::w4a8_mins_add(static_cast<const uint16_t*>(w.mins), static_cast<const uint16_t*>(w.scales), w.N,
                                    Kp, d, s, R, yr, ldy, st_);
          break;
        case DType::W8A8:
          e = cuda::gemv_w8a8(reinterpret_cast<const int8_t*>(codes), static_cast<const uint16_t*>(w.scales), w.N, Kp,
                              q, d, R, yr, ldy, st_);
          break;
      }
      if (e == cudaErrorInvalidValue)
        bad("matmul: " + std::string(dtype_name(w.dtype)) + " weight [" + std::to_string(w.N) + ", " +
            std::to_string(w.K) + "] (group " + std::to_string(w.group) + ") is not supported by the CUDA kernels");
      check(e, "matmul");
    }
  }
  // Batch 1, NVFP4 or W4A8 (no minimums) sharing Kp: one launch for all (gemv_many_m1).
  // M > 8, one integer format sharing Kp and group (q/k/v, gate/up): one tensor-core GEMM launch.
  void matmul_many(const MatmulOut* outs, int n, const float* x, const QuantScratch& xq, int M) override {
    flush();
    const WeightView& w0 = *outs[0].w;
    if (M > 8 && mma_ && xq.valid && n <= 4 && is_integer(w0.dtype) && gemm_many(outs, n, xq, M)) return;
    bool one = M == 1 && n >= 2 && n <= 4 && xq.valid && (w0.dtype == DType::NVFP4 || w0.dtype == DType::W4A8);
    for (int i = 0; one && i < n; ++i) {
      const WeightView& w = *outs[i].w;
      one = w.dtype == w0.dtype && w.Kp == w0.Kp && w.group == w0.group && !w.mins;
    }
    if (!one) return Backend::matmul_many(outs, n, x, xq, M);
    cuda::GemvWeight g[4];
    for (int i = 0; i < n; ++i)
      g[i] = {static_cast<const uint8_t*>(outs[i].w->data), outs[i].w->scales, outs[i].w->tscale, outs[i].w->N,
              outs[i].y};
    // gate/up of long rows: four chunks a lane, not pipelined (kernels_cuda.h gemv_many_m1)
    const bool u4 = n == 2 && (gemv_gu_u4_ > 0 || (gemv_gu_u4_ < 0 && w0.Kp >= 2048));
    check(cuda::gemv_many_m1(w0.dtype == DType::NVFP4 ? 0 : 1, g, n, w0.group, w0.Kp, xq.act.q, xq.act.d, xq.act.s,
                             st_, pdl_, u4),
          "matmul (batch 1)");
  }
  void add_bias(float* x, const float* b, int M, int n, int ld) override {
    flush();
    check(cuda::add_bias(x, b, M, n, ld, st_), "add_bias");
  }
  void rope(float* x, int M, int n_heads, int D, int ld, const int32_t* pos, const float* inv_freq) override {
    if (p_add_.n || p_norm_.M || p_silu_.M || p_attn_.out || p_rope_.size() >= 2) flush();
    p_rope_.push_back({x, M, n_heads, D, ld, pos, inv_freq});
  }
  void kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld, const int32_t* slots,
                int M) override {
    if (pool.dtype() == KvDType::KPC4) {
      flush();
      kpc4_used_ = true;
      return kpc4_path("kv_write").kv_write(pool, layer, k, v, ld, slots, M, st_);
    }
    if (kv_needs_workspace(pool.dtype())) {  // nvfp4r / k8v4 rows: attention_paged.cu, not fused
      flush();
      return check(cuda::kv_write_q(int(pool.dtype()), pool.k(layer), pool.v(layer), pool.n_kv(), pool.head_dim(), k,
                                    v, ld, slots, M, st_),
                   "kv_write");
    }
    const int D = pool.head_dim();
    int ki = -1, qi = -1;  // pending ropes of this k and of a q at the same positions
    for (int i = 0; i < int(p_rope_.size()); ++i)
      if (p_rope_[i].x == k && p_rope_[i].M == M && p_rope_[i].ld == ld && p_rope_[i].nh == pool.n_kv() &&
          p_rope_[i].D == D)
        ki = i;
    if (ki >= 0)
      for (int i = 0; i < int(p_rope_.size()); ++i)
        if (i != ki && p_rope_[i].M == M && p_rope_[i].D == D && p_rope_[i].pos == p_rope_[ki].pos &&
            p_rope_[i].inv == p_rope_[ki].inv)
          qi = i;
    if (ki >= 0 && (qi >= 0 || p_rope_.size() == 1)) {
      const Rope kr = p_rope_[ki], qr = qi >= 0 ? p_rope_[qi] : Rope{};
      p_rope_.clear();
      flush();
      check(cuda::rope_kv_write(qr.x, qr.ld, qr.nh, k, v, ld, pool.n_kv(), D, M, kr.pos, kr.inv, int(pool.dtype()),
                                pool.k(layer), pool.v(layer), slots, M == 1 ? ctx_ : nullptr, st_),
            "rope_kv_write");
      ctx_fresh_ = M == 1 ? kr.pos : nullptr;
      unroped_k_ = kr;  // k stays unrotated: an attention_fresh reading it rotates it first
      return;
    }
    flush();
    const cudaError_t e = cuda::kv_write(int(pool.dtype()), pool.k(layer), pool.v(layer), pool.n_kv(),
                                         pool.head_dim(), k, v, ld, slots, M, st_);
    if (e == cudaErrorInvalidValue) bad("kv_write: head_dim " + std::to_string(pool.head_dim()) + " (needs a multiple of 16)");
    check(e, "kv_write");
  }
  void attention(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                 const int32_t* pages, int nh, int nkv, int D, float* out) override {
    attend(pool, layer, q, ldq, M, pos, pages, nh, nkv, D, nullptr, nullptr, 0, out);
  }
  void attention_fresh(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                       const int32_t* pages, int nh, int nkv, int D, const float* k_new, const float* v_new,
                       int ldkv, float* out) override {
    const bool f32 = pool.dtype() == KvDType::F32;  // its pages hold the new rows exactly already
    attend(pool, layer, q, ldq, M, pos, pages, nh, nkv, D, f32 ? nullptr : k_new, f32 ? nullptr : v_new, ldkv, out);
  }
  // fk, fv (or null): the chunk's own K / V rows, unrounded (attention_fresh).
  void attend(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
              const int32_t* pages, int nh, int nkv, int D, const float* fk, const float* fv, int ldkv, float* out) {
    flush();
    Rope kr{};  // fk as rope_kv_write left it (unrotated), or none
    if (fk && fk == unroped_k_.x && unroped_k_.M == M && unroped_k_.ld == ldkv) kr = unroped_k_;
    unroped_k_ = {};
    const int32_t* fresh = ctx_fresh_;  // ctx_ already holds pos[0] + 1 (written with the KV)
    ctx_fresh_ = nullptr;
    const float scale = 1.0f / std::sqrt(float(D));
    const int pool_ctx = std::min(pool.n_pages() * pool.block(), 524288);  // sizes the workspace (never moves)
    const int max_ctx = step_ctx_ ? std::min(pool_ctx, step_ctx_) : pool_ctx;  // sizes the grids
    if (pool.dtype() == KvDType::KPC4)  // its own-page rule instead of fresh rows (backend_cuda_kpc4.h)
      return kpc4_path("attention").attention(pool, layer, q, ldq, M, pos, pages, nh, nkv, D, out,
                                              workspace(cuda::attn_workspace_floats(nh, pool_ctx, D)), max_ctx,
                                              ctx_, st_);
    cuda::PagedKv kv;
    kv.k = pool.k(layer), kv.v = pool.v(layer), kv.pages = pages, kv.block = pool.block(), kv.n_kv = nkv, kv.D = D;
    const KvDType dt = pool.dtype();
    const bool split_ok = (dt == KvDType::F16 || dt == KvDType::NVFP4 || attn_decode_split_) && dt != KvDType::KPC4 &&
                          (D == 64 || D == 128) &&
                          pool.block() % 16 == 0 &&
                          nh % nkv == 0 && nh / nkv <= 8 && ldq == nh * D;
    if (M == 1 && split_ok) {  // decode: split over the sequence (attention.cu / attention_mma.cu)
      kv.format = cuda::KvFormat(int(pool.dtype()));  // f32, f16, nvfp4, nvfp4r, k8v4
      float* ws = workspace(cuda::attn_workspace_floats(nh, pool_ctx, D));
      // fresh: the pages hold pos[0] tokens before the step's own, so pos is that count
      const Attn a{kv, q, nh, fk ? pos : ctx_, max_ctx, scale, ws, out, fk, fv, fk ? kr.pos : nullptr,
                   fk ? kr.inv : nullptr};
      if (!fk && fresh != pos) check(cuda::ctx_from_pos(pos, ctx_, st_), "attention");
      if (attn_q8_) {
        p_attn_ = a;  // an o projection's quantize_input of out takes its q8 from the combine
        return;
      }
      return launch_attention(a, {});
    }
    if (kr.x)  // the chunk's own k, rotated in place as the CPU backend's rope leaves it
      check(cuda::rope(kr.x, M, nkv, D, ldkv, kr.pos, kr.inv, st_), "rope");
    // Prefill (M > 8): the tensor-core kernel (attention_prefill.cu) unless
    // KVDECK_CUDA_ATTN_PREFILL=paged, else (and for kpc4) the f32 SIMT kernel below.
    if (M > 8 && attn_prefill_ && dt != KvDType::KPC4) {
      kv.format = cuda::KvFormat(int(dt));
      const cudaError_t e = cuda::attention_prefill(kv, q, ldq, M, nh, pos, scale, out, st_, fk, fv, ldkv,
                                                    attn_prefill_ == 1);
      if (e != cudaErrorNotSupported) return check(e, "attention_prefill");
    }
    // Small M (f32 / nvfp4r / k8v4 decode, a short prefill tail): split over the sequence as well.
    float* ws = M <= 8 ? workspace(std::max(cuda::paged_attn_ws_floats(M, nh, pool_ctx, D),
                                            cuda::paged_attn_ws_floats(M, nh, max_ctx, D)))
                       : nullptr;
    const cudaError_t e = cuda::attention_paged(int(pool.dtype()), pool.k(layer), pool.v(layer), pages, pool.block(),
                                                nkv, D, q, ldq, M, nh, pos, scale, out, st_, max_ctx, ws, fk, fv, ldkv);
    if (e == cudaErrorInvalidValue) bad("attention: head_dim " + std::to_string(D) + " (needs a multiple of 32, <= 256)");
    check(e, "attention");
  }
  void silu_mul(const float* a, const float* b, int M, int n, float* y) override {
    flush();
    p_silu_ = {a, b, M, n, y};
  }
  void add(float* x, const float* y, size_t n) override {
    flush();
    if (n) p_add_ = {x, y, n};
  }
  void argmax(const float* x, int n, int32_t* out) override {
    flush();
    check(cuda::argmax(x, n, out, st_), "argmax");
  }
  // On the device (sampling.cu): one id leaves, not [n] logits. Its workspace is its own (the
  // attention workspace must not move under a recorded step), grown here, outside any step.
  void sample(const float* x, int n, const SamplingParams& p, double u, const uint32_t* mask, int32_t* out) override {
    flush();
    check_sampling(p);
    const size_t need = p.temperature > 0.0f ? cuda::sample_workspace_bytes(n) : 0;
    if (need > sample_bytes_) {
      no_capture("sample workspace");
      void* w = nullptr;
      check(cudaStreamSynchronize(st_), "stream");
      sample_ws_.reset();
      check(cudaMalloc(&w, need), "cudaMalloc");
      sample_ws_.reset(w);
      sample_bytes_ = need;
    }
    const cudaError_t e = cuda::sample_token(x, n, mask, {p.temperature, p.top_k, p.top_p, u}, sample_ws_.get(),
                                             sample_bytes_, out, st_);
    if (e == cudaErrorInvalidValue) bad("sample: draw u = " + std::to_string(u) + " outside [0, 1) or n = " + std::to_string(n));
    check(e, "sample");
  }

  // The M > 8 grouped GEMM of matmul_many; false: a shape it refuses (the per-weight path).
  bool gemm_many(const MatmulOut* outs, int n, const QuantScratch& xq, int M) {
    const WeightView& w0 = *outs[0].w;
    cuda::GemmQ8Weight g[4];
    for (int i = 0; i < n; ++i) {
      const WeightView& w = *outs[i].w;
      if (w.dtype != w0.dtype || w.Kp != w0.Kp || w.group != w0.group || w.mins) return false;
      g[i] = {static_cast<const uint8_t*>(w.data), w.scales, w.tscale, w.N, outs[i].y, outs[i].ldy};
    }
    const int fmt = w0.dtype == DType::NVFP4 ? 0 : w0.dtype == DType::W4A8 ? 1 : 2;
    const cudaError_t e = cuda::gemm_q8_mma_many(fmt, g, n, w0.group, w0.Kp, xq.act.q, xq.act.d, M, st_);
    if (e == cudaErrorInvalidValue) {
      cudaGetLastError();
      return false;
    }
    check(e, "matmul_many (tensor cores)");
    return true;
  }

  // ---- decode steps as CUDA graphs ----------------------------------------------------
  // kpc4 pools: every step eager (its kv_write keeps host bookkeeping); a step begun before the
  // first kpc4 write (the first ever) is the eager first step of its kind, never a capture.
  bool step_begin(uint64_t key) override { return kpc4_used_ ? false : graph_begin(key); }
  void step_end(uint64_t key, bool ok) override { graph_end(key, ok); }  // no capture: resets the step's bound

 private:
  // KVDECK_CUDA_ATTN_PREFILL: mma (1, default: q as f16 hi + lo), mma16 (2: q in f16), paged (0:
  // the f32 SIMT kernel, the A/B). KVDECK_CUDA_ATTN_DECODE=paged: f32 / nvfp4r / k8v4 decode on
  // the paged kernel (the A/B) instead of the split kernels (SIMT for f32, tensor cores for the
  // others). Measured on the H200: native/kernels/cuda/NOTES.md (session 6).
  static std::string env_str(const char* name) {
    const char* s = std::getenv(name);
    return s ? s : "";
  }
  int attn_prefill_ = env_str("KVDECK_CUDA_ATTN_PREFILL") == "paged"   ? 0
                      : env_str("KVDECK_CUDA_ATTN_PREFILL") == "mma16" ? 2
                                                                      : 1;
  bool attn_decode_split_ = env_str("KVDECK_CUDA_ATTN_DECODE") != "paged";
  Rope unroped_k_;  // the k rope_kv_write wrote to the pool but left unrotated in its buffer
  // kpc4 KV (backend_cuda_kpc4.h): opt-in with KVDECK_CUDA_KPC4=1 until a GPU run measures it.
  std::unique_ptr<cuda_backend::Kpc4Path> kpc4_ =
      env_str("KVDECK_CUDA_KPC4") == "1" ? std::make_unique<cuda_backend::Kpc4Path>() : nullptr;
  bool kpc4_used_ = false;  // a kpc4 pool was written: decode steps run eagerly (no graph)
  cuda_backend::Kpc4Path& kpc4_path(const char* op) {
    if (!kpc4_) bad(std::string(op) + ": kpc4 KV on the CUDA backend is opt-in: set KVDECK_CUDA_KPC4=1");
    return *kpc4_;
  }
  struct CudaFree {
    void operator()(void* p) const { cudaFree(p); }
  };
  std::unique_ptr<void, CudaFree> sample_ws_;  // device: Backend::sample's sort and sums
  size_t sample_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int threads) {
  (void)threads;
  return std::make_unique<CudaBackend>();
}

std::string cuda_device_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device: the driver reports 0 devices";
  return "";
}

}  // namespace kvdeck
