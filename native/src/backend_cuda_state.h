// The CUDA backend's state (backend_cuda.cu holds the Backend overrides; this is what they
// share): the stream, the pinned upload staging, the deferred ops that fuse with their
// consumer and their flush, the attention workspace, the decode-step CUDA graphs, and the
// error helpers. Implemented in backend_cuda_state.cu.
//
// Deferred ops: a small model's decode step is bound by kernel count, so rmsnorm, add, silu_mul
// and rope are held one op and fused with the op that consumes them (add + rmsnorm +
// quantize_input: one kernel; silu_mul + quantize_input; rope q + rope k + kv_write), and so is
// a decode attention (its combine kernel writes the q8 of a quantize_input of its output);
// every other entry point calls flush() first, which launches what is pending on its own.
// Graphs: the engine brackets a decode step with step_begin / step_end; the first step of a
// kind runs eagerly (workspaces are allocated), the second is captured, later ones replay.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "kvdeck/backend.h"
#include "kvdeck/kernels.h"

namespace kvdeck::cuda_backend {

bool env_on(const char* name, bool dflt);

class CudaState {
 protected:
  CudaState();  // throws std::runtime_error("no CUDA device: ...") without a usable device
  ~CudaState();
  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;

  // ---- deferred ops ----
  struct Add {
    float* x = nullptr;
    const float* y = nullptr;
    size_t n = 0;
  };
  struct Norm {
    float* x = nullptr;
    const float* y = nullptr;  // a folded add, or null
    const float* w = nullptr;
    int M = 0, n = 0;
    float eps = 0;
    float* h = nullptr;
  };
  struct Silu {
    const float *a = nullptr, *b = nullptr;
    int M = 0, n = 0;
    float* y = nullptr;
  };
  struct Rope {
    float* x = nullptr;
    int M = 0, nh = 0, D = 0, ld = 0;
    const int32_t* pos = nullptr;
    const float* inv = nullptr;
  };
  struct Attn {  // a decode attention (cuda::attention_decode's arguments)
    cuda::PagedKv kv{};
    const float* q = nullptr;
    int nh = 0;
    const int32_t* ctx = nullptr;
    int max_ctx = 0;
    float scale = 0;
    float* ws = nullptr;
    float* out = nullptr;
    const float *fk = nullptr, *fv = nullptr;
    const int32_t* rope_pos = nullptr;
    const float* rope_inv = nullptr;
  };
  void flush();  // launches every pending op on its own, in order
  void launch_attention(const Attn& a, const cuda::ActQ8Out& q8);

  // The attention workspace, grown (outside a capture: the first step of a kind runs eagerly).
  float* workspace(size_t floats);

  // ---- decode-step graphs (Backend::step_begin / step_end) ----
  bool graph_begin(uint64_t key);
  void graph_end(uint64_t key, bool ok);
  void print_graph(uint64_t key, cudaGraph_t g);

  // ---- the host's share of a replayed step (KVDECK_CUDA_STEP_TIMING=<file>, measurement only) ----
  // Each replay is bracketed by events (GPU time of the graph launched onto an idle stream) and
  // host clocks: outside = the previous step's sync return -> this graph_begin (Python, binding,
  // engine host work, uploads), launch = cudaGraphLaunch's host call, wait = its return -> the
  // sync's return (GPU work, the token's download, the wake-up). With KVDECK_CUDA_STEP_B2B set
  // (read at each replay, so a script can toggle it) a replay launches the graph a second time
  // right behind the first and times that one: the step's GPU time with no host gap before it
  // (a replay is idempotent: same inputs, same KV slot, same outputs). Per-step means are
  // written to the file when the backend is destroyed (bench/decode_ab.py --host reads it).
  struct StepTiming {
    std::string path;
    cudaEvent_t ev[3] = {};
    int pending = 0;  // events recorded by the last replay: 2 (one graph), 3 (two)
    bool in_step = false, after_step = false;
    std::chrono::steady_clock::time_point t_launched, t_synced;
    double n = 0, gpu_us = 0, launch_us = 0, wait_us = 0;
    std::vector<float> out_us;  // one a step: its median is written (a script's pauses between steps are outliers)
    double n_b2b = 0, gpu_b2b_us = 0;
  };
  void timing_replay(cudaGraphExec_t ex);  // graph_begin's replay under KVDECK_CUDA_STEP_TIMING
  void timing_synced();                     // sync()'s return
  void timing_write();

  // ---- errors: both drop pending ops and end a capture in progress before throwing ----
  void check(cudaError_t e, const char* what);
  [[noreturn]] void bad(const std::string& msg);
  void no_capture(const char* what);
  void abort_capture();

  cudaStream_t st_ = nullptr;
  int sms_ = 0;
  bool pdl_ = env_on("KVDECK_CUDA_PDL", true);
  bool graphs_on_ = env_on("KVDECK_CUDA_GRAPH", true);
  bool mma_ = env_on("KVDECK_CUDA_MMA", true);  // prefill GEMM on the tensor cores
  bool graph_info_ = env_on("KVDECK_CUDA_GRAPH_INFO", false);  // print each captured graph's nodes
  // The decode step's context bound from its key (backend.h step_begin; 0: none, the pool's
  // capacity): the attention grids of a short context are sized for it, one graph per bucket.
  // On by default (8B-shaped decode @16 on the H200: 2,100.8 -> 1,976.0 µs/token; SmolLM2 @64
  // 567.3 -> 574.3, inside its spread; NOTES.md session 6); KVDECK_CUDA_CTX_BUCKETS=0: one graph
  // per kind of step, its grids sized for the pool.
  bool buckets_ = env_on("KVDECK_CUDA_CTX_BUCKETS", true);
  int step_ctx_ = 0;
  bool capturing_ = false;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  std::unordered_set<uint64_t> seen_;
  int32_t* ctx_ = nullptr;   // device: the decode step's context length
  float* ws_ = nullptr;      // device: split-attention partials
  size_t ws_floats_ = 0;
  static constexpr size_t kStage = size_t(1) << 20;  // pinned staging for small uploads
  uint8_t* stage_ = nullptr;
  size_t stage_used_ = 0;
  // Downloads of <= kSmallDownload bytes (the decode step's token id) land in the pinned staging,
  // then one memcpy to dst (a pageable D2H blocks on the driver's own staging);
  // KVDECK_CUDA_PINNED_DL=0: straight into dst (the A/B; NOTES.md session 8, gpuhost8).
  bool pinned_dl_ = env_on("KVDECK_CUDA_PINNED_DL", true);
  static constexpr size_t kSmallDownload = 4096;
  StepTiming* timing_ = nullptr;  // KVDECK_CUDA_STEP_TIMING
  const int32_t* ctx_fresh_ = nullptr;  // the pos array ctx_ was last written from by rope_kv_write
  Add p_add_;
  Norm p_norm_;
  Silu p_silu_;
  std::vector<Rope> p_rope_;
  Attn p_attn_;
  // The o projection's q8 written by the attention combine (one kernel a layer less): on by
  // default; KVDECK_CUDA_ATTN_Q8=0 runs quantize_act_q8 after the combine (the A/B; NOTES.md
  // session 7).
  bool attn_q8_ = env_on("KVDECK_CUDA_ATTN_Q8", true);
  // The batch-1 gate/up GEMV (gemv_many_m1 of two weights) at four chunks a lane, not pipelined,
  // for Kp >= 2048 (-1, the default); KVDECK_CUDA_GEMV_GU=0: the pipelined two chunks of every
  // other GEMV, =1: four for every Kp. Llama-3-8B-shaped decode @16 1,919.7 -> 1,891.9 µs/token
  // (session 8, interleaved); SmolLM2's gate/up (Kp 576) keeps the measured default.
  int gemv_gu_u4_ = [] {
    const char* e = std::getenv("KVDECK_CUDA_GEMV_GU");
    return e && *e ? (e[0] == '0' ? 0 : 1) : -1;
  }();
};

}  // namespace kvdeck::cuda_backend
