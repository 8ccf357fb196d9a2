// The CUDA backend's shared state: device setup, the flush of deferred ops, the attention
// workspace, decode-step graph capture / replay, and the error helpers (backend_cuda_state.h).
#include "backend_cuda_state.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "kernels/cuda/kernels_cuda.h"

namespace kvdeck::cuda_backend {

bool env_on(const char* name, bool dflt) {
  const char* s = std::getenv(name);
  return s && *s ? std::string(s) != "0" : dflt;
}

// =====================================================================================
// Device, stream, staging
// =====================================================================================
CudaState::CudaState() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    throw std::runtime_error(std::string("no CUDA device: ") +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices"));
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  sms_ = p.multiProcessorCount;
  check(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&ctx_, sizeof(int32_t)), "cudaMalloc");
  void* h = nullptr;
  if (cudaMallocHost(&h, kStage) == cudaSuccess) stage_ = static_cast<uint8_t*>(h);
  if (const char* t = std::getenv("KVDECK_CUDA_STEP_TIMING"); t && *t) {
    timing_ = new StepTiming;
    timing_->path = t;
    for (cudaEvent_t& e : timing_->ev) check(cudaEventCreate(&e), "cudaEventCreate");
  }
}

CudaState::~CudaState() {
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st_, &g);
    if (g) cudaGraphDestroy(g);
  }
  for (auto& kv : graphs_) cudaGraphExecDestroy(kv.second);
  cudaStreamSynchronize(st_);
  if (timing_) {
    timing_synced();
    timing_write();
    for (cudaEvent_t e : timing_->ev) cudaEventDestroy(e);
    delete timing_;
  }
  if (ws_) cudaFree(ws_);
  cudaFree(ctx_);
  if (stage_) cudaFreeHost(stage_);
  cudaStreamDestroy(st_);
}

// =====================================================================================
// Deferred ops and the workspace
// =====================================================================================
void CudaState::flush() {
  if (p_attn_.out) {  // deferred before any other pending op (their setters flush first, rope aside)
    const Attn a = p_attn_;
    p_attn_ = {};
    launch_attention(a, {});
  }
  if (p_add_.n) {
    const Add a = p_add_;
    p_add_ = {};
    check(cuda::add_inplace(a.x, a.y, a.n, st_), "add");
  }
  if (p_norm_.M) {
    const Norm n = p_norm_;
    p_norm_ = {};
    check(cuda::add_rmsnorm_q8(n.x, n.y, n.w, n.M, n.n, n.eps, n.h, 0, nullptr, nullptr, nullptr, st_), "rmsnorm");
  }
  if (p_silu_.M) {
    const Silu u = p_silu_;
    p_silu_ = {};
    check(cuda::silu_mul(u.a, u.b, u.M, u.n, u.n, u.y, st_), "silu_mul");
  }
  if (!p_rope_.empty()) {
    const std::vector<Rope> r = p_rope_;
    p_rope_.clear();
    for (const Rope& o : r) check(cuda::rope(o.x, o.M, o.nh, o.D, o.ld, o.pos, o.inv, st_), "rope");
  }
}

void CudaState::launch_attention(const Attn& a, const cuda::ActQ8Out& q8) {
  check(cuda::attention_decode(a.kv, a.q, a.nh, a.ctx, a.max_ctx, a.scale, a.ws, a.out, st_, a.fk, a.fv, a.rope_pos,
                               a.rope_inv, q8),
        "attention_decode");
}

float* CudaState::workspace(size_t floats) {
  if (floats > ws_floats_) {
    no_capture("attention workspace");
    check(cudaStreamSynchronize(st_), "stream");
    if (ws_) check(cudaFree(ws_), "cudaFree");
    ws_ = nullptr;
    check(cudaMalloc(&ws_, floats * sizeof(float)), "cudaMalloc");
    ws_floats_ = floats;
  }
  return ws_;
}

// =====================================================================================
// Decode steps as CUDA graphs
// =====================================================================================
// KVDECK_CUDA_GRAPH_INFO=1: one line per captured step on stderr: its kernel nodes (the
// launches per token) and how many of its edges are programmatic (PDL kept by the capture).
void CudaState::print_graph(uint64_t key, cudaGraph_t g) {
  size_t nn = 0, ne = 0;
  if (cudaGraphGetNodes(g, nullptr, &nn) != cudaSuccess || cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne) != cudaSuccess)
    return;
  std::vector<cudaGraphNode_t> nodes(nn), from(ne), to(ne);
  std::vector<cudaGraphEdgeData> data(ne);
  if (cudaGraphGetNodes(g, nodes.data(), &nn) != cudaSuccess ||
      cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &ne) != cudaSuccess)
    return;
  size_t kernels = 0, prog = 0;
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType t;
    if (cudaGraphNodeGetType(n, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) ++kernels;
  }
  for (const cudaGraphEdgeData& d : data) prog += d.type == cudaGraphDependencyTypeProgrammatic;
  std::fprintf(stderr, "kvdeck cuda graph %llu: %zu nodes, %zu kernels, %zu edges (%zu programmatic)\n",
               static_cast<unsigned long long>(key), nn, kernels, ne, prog);
}

bool CudaState::graph_begin(uint64_t key) {
  flush();
  if (!buckets_) key &= 0xFF;
  const uint64_t cap = key >> 8;
  step_ctx_ = 0;  // a replayed step runs no op (and no step_end follows it)
  auto it = graphs_on_ ? graphs_.find(key) : graphs_.end();
  if (it != graphs_.end()) {
    if (timing_) timing_replay(it->second);
    else check(cudaGraphLaunch(it->second, st_), "cudaGraphLaunch");
    return true;
  }
  step_ctx_ = cap && cap < (1u << 30) ? int(cap) : 0;  // until step_end
  if (!graphs_on_) return false;
  if (seen_.insert(key).second) return false;  // the first step of a kind runs eagerly (allocations)
  check(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  capturing_ = true;
  return false;
}

void CudaState::graph_end(uint64_t key, bool ok) {
  if (ok) flush();
  step_ctx_ = 0;
  if (!buckets_) key &= 0xFF;
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(st_, &g);
  if (!ok) {  // the step threw: drop the recording (its ops never ran)
    if (g) cudaGraphDestroy(g);
    seen_.erase(key);
    return;
  }
  check(e, "cudaStreamEndCapture");
  if (graph_info_) print_graph(key, g);
  cudaGraphExec_t ex = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&ex, g, 0);
  cudaGraphDestroy(g);
  check(ie, "cudaGraphInstantiate");
  graphs_[key] = ex;
  check(cudaGraphLaunch(ex, st_), "cudaGraphLaunch");  // the captured ops have not run yet
}

// =====================================================================================
// The host's share of a replayed step (KVDECK_CUDA_STEP_TIMING; backend_cuda_state.h)
// =====================================================================================
void CudaState::timing_replay(cudaGraphExec_t ex) {
  StepTiming& t = *timing_;
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  if (t.after_step) {  // the previous step's sync return -> here: the host outside the backend
    t.out_us.push_back(float(std::chrono::duration<double, std::micro>(t0 - t.t_synced).count()));
  }
  t.after_step = false;
  const char* b = std::getenv("KVDECK_CUDA_STEP_B2B");
  const bool b2b = b && *b && std::string(b) != "0";
  check(cudaEventRecord(t.ev[0], st_), "cudaEventRecord");
  check(cudaGraphLaunch(ex, st_), "cudaGraphLaunch");
  t.t_launched = clk::now();
  check(cudaEventRecord(t.ev[1], st_), "cudaEventRecord");
  if (b2b) {
    check(cudaGraphLaunch(ex, st_), "cudaGraphLaunch");
    check(cudaEventRecord(t.ev[2], st_), "cudaEventRecord");
  }
  t.launch_us += std::chrono::duration<double, std::micro>(t.t_launched - t0).count();
  t.pending = b2b ? 3 : 2;
  t.in_step = true;
}

void CudaState::timing_synced() {
  StepTiming& t = *timing_;
  if (!t.in_step) return;
  t.in_step = false;
  t.t_synced = std::chrono::steady_clock::now();
  float ms = 0;
  if (t.pending == 3) {  // the second graph: GPU time with no host gap before it
    if (cudaEventElapsedTime(&ms, t.ev[1], t.ev[2]) == cudaSuccess) t.gpu_b2b_us += ms * 1e3, ++t.n_b2b;
    t.pending = 0;
    return;  // its wait holds two graphs: not a step's
  }
  t.pending = 0;
  if (cudaEventElapsedTime(&ms, t.ev[0], t.ev[1]) != cudaSuccess) return;
  t.gpu_us += ms * 1e3;
  t.wait_us += std::chrono::duration<double, std::micro>(t.t_synced - t.t_launched).count();
  ++t.n;
  t.after_step = true;
}

void CudaState::timing_write() {
  StepTiming& t = *timing_;
  std::vector<float>& o = t.out_us;
  if (!o.empty()) std::nth_element(o.begin(), o.begin() + o.size() / 2, o.end());
  const double out = o.empty() ? 0.0 : o[o.size() / 2];
  FILE* f = std::fopen(t.path.c_str(), "w");
  if (!f) return;
  auto per = [](double v, double n) { return n ? v / n : 0.0; };
  std::fprintf(f,
               "replays=%.0f gpu_us=%.2f launch_us=%.2f wait_us=%.2f outside_n=%.0f outside_us=%.2f b2b_n=%.0f "
               "gpu_b2b_us=%.2f\n",
               t.n, per(t.gpu_us, t.n), per(t.launch_us, t.n + t.n_b2b), per(t.wait_us, t.n), double(o.size()), out,
               t.n_b2b, per(t.gpu_b2b_us, t.n_b2b));
  std::fclose(f);
}

// =====================================================================================
// Errors
// =====================================================================================
void CudaState::check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  abort_capture();
  throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void CudaState::bad(const std::string& msg) {
  abort_capture();
  throw std::invalid_argument("cuda backend: " + msg);
}

void CudaState::no_capture(const char* what) {
  if (capturing_) bad(std::string(what) + " inside a captured decode step");
}

void CudaState::abort_capture() {
  p_add_ = {}, p_norm_ = {}, p_silu_ = {}, p_rope_.clear(), p_attn_ = {};
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(st_, &g);
  if (g) cudaGraphDestroy(g);
  seen_.clear();
}

}  // namespace kvdeck::cuda_backend
