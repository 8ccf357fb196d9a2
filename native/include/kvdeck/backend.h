// kvdeck/backend.h — the operations the forward pass needs, per backend.
//
// The forward pass (Engine::forward_chunk in engine.cpp) is written once against this
// interface; the CPU backend (backend_cpu.cpp) and the CUDA backend (backend_cuda.cu)
// implement it. Every pointer an op receives lives in memory this backend allocated. Ops may
// run asynchronously on backends that can (CUDA streams); sync() waits.
// Memory: ops do not allocate device memory for their outputs (the caller's scratch holds
// them), but the CPU backend keeps growable host workspaces of its own (per-thread scratch,
// the f32 widening of f16 / nvfp4 KV for prefill attention) that grow to the largest context
// seen and are then reused. Ops are called by one thread at a time (the Engine's lock).
#pragma once
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvdeck/kernels.h"
#include "kvdeck/kv_pool.h"
#include "kvdeck/sampler.h"

namespace kvdeck {

// Per-call scratch for run-time quantised activations (int8 per 32-block).
struct QuantScratch {
  ActQ8 act;            // views into backend memory sized for [max_rows, max_K]
  bool valid = false;   // act holds the quantisation of the current input
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;

  // ---- memory -------------------------------------------------------------------
  virtual void* alloc(size_t bytes) = 0;   // zero-filled, 64-byte aligned
  virtual void free(void* p) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  virtual void sync() = 0;

  // ---- ops (shapes in comments; row-major) ----------------------------------------
  // x[m, :] = table[ids[m], :]                       ids: i32 [M], x: f32 [M, H]
  // table: F32 / F16 [V, H], or W8A8 (int8 codes [V, Kp], f16 scales [V, Kp/32]: row r's
  // value j is f32(scales[r, j/32]) * codes[r, j]); a tied W8A8 table is also the lm_head.
  virtual void embed(const WeightView& table, const int32_t* ids, int M, float* x) = 0;
  // y[m, :] = x[m, :] / rms(x[m, :]) * w             x, y: f32 [M, n], w: f32 [n]
  virtual void rmsnorm(const float* x, const float* w, int M, int n, float eps, float* y) = 0;
  // Quantise x f32 [M, K] for the integer GEMM paths (NVFP4, W4A8) into q.
  virtual void quantize_input(const float* x, int M, int K, QuantScratch& q) = 0;
  // y[M, N] (row stride ldy) = x[M, K] · W^T; xq must hold x quantised when W is integer.
  virtual void matmul(const WeightView& w, const float* x, const QuantScratch& xq, int M,
                      float* y, int ldy) = 0;
  // Weights that read the same input, in one call (q/k/v; gate/up): for each i,
  // y_i[M, N_i] (row stride ldy_i) = x[M, K] · W_i^T. Default: one matmul per weight; the
  // CPU backend splits every weight's rows over one team of threads (one parallel region).
  struct MatmulOut {
    const WeightView* w;
    float* y;
    int ldy;
  };
  virtual void matmul_many(const MatmulOut* outs, int n, const float* x, const QuantScratch& xq, int M) {
    for (int i = 0; i < n; ++i) matmul(*outs[i].w, x, xq, M, outs[i].y, outs[i].ldy);
  }
  // x[m, j] += b[j]                                  x: f32 [M, n] (row stride ld)
  virtual void add_bias(float* x, const float* b, int M, int n, int ld) = 0;
  // Rotate-half RoPE in place over heads of D at positions pos[m].
  //   x: f32 [M, n_heads, D] (row stride ld); pos: i32 [M]; inv_freq: f32 [D/2] — all three
  //   in backend memory (a device never reads a host pointer).
  virtual void rope(float* x, int M, int n_heads, int D, int ld, const int32_t* pos,
                    const float* inv_freq) = 0;
  // Write k, v rows (f32 [M, nkv*D], row stride ld) into the layer's pool slots.
  virtual void kv_write(const KvPool& pool, int layer, const float* k, const float* v, int ld,
                        const int32_t* slots, int M) = 0;
  // Causal attention of M queries at consecutive positions pos[0]..pos[0]+M-1 over
  // ctx = pos[0]+M cached tokens. Positions are read from backend memory (pos: i32 [M], the
  // array rope read), so a captured decode step (CUDA graph) replays with new positions.
  //   q: f32 [M, nh*D] (row stride ldq), pages: i32 [ceil(ctx/block)], out: f32 [M, nh*D]
  virtual void attention(const KvPool& pool, int layer, const float* q, int ldq, int M, const int32_t* pos,
                         const int32_t* pages, int nh, int nkv, int D, float* out) = 0;
  // attention() of a chunk whose own M tokens (positions pos[0]..pos[0]+M-1, the rows
  // kv_write just stored) are read from k_new / v_new (f32 [M, nkv*D], row stride ldkv) and
  // the ctx - M earlier tokens from the pool: with a quantised pool (nvfp4) the chunk then
  // attends to its own K/V unrounded (issue 14). The default reads every token from the pool
  // (as attention() does), so a backend without its own version keeps today's results.
  virtual void attention_fresh(const KvPool& pool, int layer, const float* q, int ldq, int M,
                               const int32_t* pos, const int32_t* pages, int nh, int nkv, int D,
                               const float* k_new, const float* v_new, int ldkv, float* out) {
    (void)k_new, (void)v_new, (void)ldkv;
    attention(pool, layer, q, ldq, M, pos, pages, nh, nkv, D, out);
  }
  // y[m, j] = silu(a[m, j]) * b[m, j]               a, b, y: f32 [M, n]
  virtual void silu_mul(const float* a, const float* b, int M, int n, float* y) = 0;
  // x += y                                           f32 [n]
  virtual void add(float* x, const float* y, size_t n) = 0;

  // out[0] = the first index of the maximum of x[0..n) (greedy decoding without a download
  // of the logits); x and out in backend memory. Default: through host memory.
  virtual void argmax(const float* x, int n, int32_t* out) {
    std::vector<float> h(size_t(n > 0 ? n : 0));
    download(h.data(), x, sizeof(float) * h.size());
    int32_t best = 0;
    for (int i = 1; i < n; ++i)
      if (h[i] > h[best]) best = i;
    upload(out, &best, sizeof(best));
  }
  // out[0] = the id the CPU Sampler chooses from x[0..n) (sampler.h: argmax when
  // p.temperature <= 0, else sample_with_uniform with the draw u), with every token whose bit
  // is clear in mask set to -inf first (mask: u32 [ceil(n / 32)], token i is bit i % 32 of
  // word i / 32; null: every token allowed). x, mask and out in backend memory: a decode step
  // then moves one id instead of [n] logits. Default: through host memory, the CPU code itself.
  virtual void sample(const float* x, int n, const SamplingParams& p, double u, const uint32_t* mask,
                      int32_t* out) {
    std::vector<float> h(size_t(n > 0 ? n : 0));
    download(h.data(), x, sizeof(float) * h.size());
    if (mask) {
      std::vector<uint32_t> bits((h.size() + 31) / 32);
      download(bits.data(), mask, sizeof(uint32_t) * bits.size());
      for (int i = 0; i < n; ++i)
        if (!((bits[i / 32] >> (i % 32)) & 1u)) h[i] = -INFINITY;
    }
    std::vector<std::pair<float, int>> scratch;
    const int32_t id = p.temperature <= 0.0f ? kvdeck::argmax(h.data(), n)
                                             : sample_with_uniform(h.data(), n, p, u, scratch);
    upload(out, &id, sizeof(id));
  }

  // ---- decode steps (CUDA graphs) -------------------------------------------------------
  // The engine brackets the ops of a decode step (M = 1: the same ops, shapes and buffers
  // every step; positions, slots and pages read from backend memory) with step_begin(key) /
  // step_end(key, ok), key naming the kind of step (bits 0-7) and, in bits 8 and up, a bound on
  // the step's context length (a power of two >= 256, >= pos + 1: a recording may size its
  // attention for it, one recording per bucket). A backend that records steps may replay
  // a recording in step_begin and return true: the engine then skips the ops (it uploads the
  // step's inputs before and downloads after). step_end(key, false) follows a step that threw.
  // Default: no recording.
  virtual bool step_begin(uint64_t key) {
    (void)key;
    return false;
  }
  virtual void step_end(uint64_t key, bool ok) { (void)key, (void)ok; }

  // ---- load time --------------------------------------------------------------------
  // Called once per linear weight after all weights are uploaded, before the first forward:
  // a backend may repack w into a layout of its own (allocating backend memory it owns and
  // frees, or in place in the view's buffers) and rewrite the view. The CPU backend repacks
  // NVFP4 in place into WeightLayout::Nvfp4X4 when its active kernel set prefers it (kernels.h).
  virtual void prepare_weight(WeightView& w) { (void)w; }
  // The engine's activation bits (8 or 16), told before the first prepare_weight: the CPU
  // backend repacks GGUF Q4_1 weights into WeightLayout::Q41X8 when they will run on 16-bit
  // activations (kernels.h preferred_layout_a16).
  virtual void set_activation_bits(int bits) { (void)bits; }
};

std::unique_ptr<Backend> make_cpu_backend(int threads);
// The backend named `name` ("cpu"; "cuda" where built), or std::invalid_argument naming the
// backends this build has (backend_registry.cpp). "cuda" on a machine without a usable GPU
// throws std::runtime_error("no CUDA device: <the driver's reason>").
std::unique_ptr<Backend> make_backend(const std::string& name, int threads);
// Backends this build has ("cpu", and "cuda" when built with KVDECK_CUDA).
std::vector<std::string> built_backends();
// Those that can run here: a CUDA build on a machine with no GPU (or no driver) lists "cpu".
std::vector<std::string> usable_backends();
#ifdef KVDECK_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int threads);  // backend_cuda.cu
std::string cuda_device_status();                          // "" when a device is usable
#endif

}  // namespace kvdeck
