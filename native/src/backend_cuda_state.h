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

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "kvdeck/backend.h"
#include "kvdeck/kernels.h"

namespace kvdeck::cuda_backend {

bool env_on(const char* name, bool dflt);
int env_int(const char* name, int dflt);

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

  // ---- L2 prefetch of the next batch-1 GEMVs' weights (KVDECK_CUDA_L2PF=<MB>) ----
  // A decode step's GEMVs run in the same order every step: the backend records their weights
  // (pf_note), and the latency-bound kernels before a GEMV (add + norm + q8, rope + KV, silu +
  // q8: sites 'n', 'r', 's') get extra blocks asking L2 for the next <MB> of weight bytes in
  // the last step's order (pf_for), while DRAM would otherwise idle (norms, attention). At most
  // KVDECK_CUDA_L2PF_CAP MB (default half the L2) ahead of the GEMV about to run; a cursor
  // keeps the sites from asking twice. A hint only: results are unchanged. Off by default
  // until measured (NOTES.md session 8); KVDECK_CUDA_L2PF_SITES (default "nrs"),
  // KVDECK_CUDA_L2PF_MODE (1 bulk, 2 per line), KVDECK_CUDA_L2PF_EARLY=1 (before the PDL wait).
  struct PfUnit {
    const void* codes;
    size_t cb;
    const void* scales;
    size_t sb;
  };
  void pf_note(const WeightView& w);             // a batch-1 GEMV of w is being launched
  const cuda::L2Prefetch* pf_for(char site);     // null: nothing to ask at this site
  void pf_step(bool begin);                      // a recorded (not replayed) step begins / ends
  std::vector<PfUnit> pf_seq_, pf_last_;
  size_t pf_at_ = 0, pf_u_ = 0, pf_o_ = 0;  // GEMVs launched this step; prefetched up to (unit, byte)
  bool pf_step_ = false;
  size_t pf_budget_ = 0, pf_cap_ = 0;
  std::string pf_sites_ = "nrs";
  cuda::L2Prefetch pf_buf_;

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
  // Batch-1 GEMV configuration (kernels_cuda.h GemvM1Cfg) of q/k/v (3 weights a launch), gate/up
  // (2) and single weights: the A/B of session 8 (NOTES.md); 0 = R1 U2 pipelined everywhere.
  int gemv_qkv_ = env_int("KVDECK_CUDA_GEMV_QKV", 0);
  int gemv_gu_ = env_int("KVDECK_CUDA_GEMV_GU", 0);
  int gemv_m1_ = env_int("KVDECK_CUDA_GEMV_M1", 0);
};

}  // namespace kvdeck::cuda_backend
