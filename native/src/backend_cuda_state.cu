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
int env_int(const char* name, int dflt) {
  const char* s = std::getenv(name);
  return s && *s ? std::atoi(s) : dflt;
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
  const auto env_mb = [](const char* name, double dflt) {
    const char* v = std::getenv(name);
    return size_t((v && *v ? std::atof(v) : dflt) * 1048576.0);
  };
  pf_budget_ = env_mb("KVDECK_CUDA_L2PF", 0);
  pf_cap_ = env_mb("KVDECK_CUDA_L2PF_CAP", p.l2CacheSize / 2 / 1048576.0);
  if (const char* v = std::getenv("KVDECK_CUDA_L2PF_SITES")) pf_sites_ = v;
  if (const char* v = std::getenv("KVDECK_CUDA_L2PF_MODE")) pf_buf_.mode = std::atoi(v) == 2 ? 2 : 1;
  pf_buf_.early = env_on("KVDECK_CUDA_L2PF_EARLY", false);
}

CudaState::~CudaState() {
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st_, &g);
    if (g) cudaGraphDestroy(g);
  }
  for (auto& kv : graphs_) cudaGraphExecDestroy(kv.second);
  cudaStreamSynchronize(st_);
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
// L2 prefetch of the next GEMVs' weights (backend_cuda_state.h)
// =====================================================================================
void CudaState::pf_note(const WeightView& w) {
  if (!pf_budget_ || !pf_step_) return;
  const size_t N = size_t(w.N), Kp = size_t(w.Kp);
  PfUnit u{w.data, 0, w.scales, 0};
  switch (w.dtype) {
    case DType::NVFP4: u.cb = N * Kp / 2, u.sb = N * Kp / 16; break;
    case DType::W4A8: u.cb = N * Kp / 2, u.sb = N * (Kp / size_t(w.group)) * 2; break;
    case DType::W8A8: u.cb = N * Kp, u.sb = N * (Kp / 32) * 2; break;
    default: return;
  }
  pf_seq_.push_back(u);
  ++pf_at_;
}

void CudaState::pf_step(bool begin) {
  if (!begin && pf_step_ && !pf_seq_.empty()) pf_last_.swap(pf_seq_);
  pf_seq_.clear();
  pf_at_ = pf_u_ = pf_o_ = 0;
  pf_step_ = begin && pf_budget_;
}

const cuda::L2Prefetch* CudaState::pf_for(char site) {
  if (!pf_budget_ || !pf_step_ || pf_sites_.find(site) == std::string::npos || pf_at_ >= pf_last_.size())
    return nullptr;
  size_t u = pf_u_, o = pf_o_;
  if (u < pf_at_) u = pf_at_, o = 0;
  size_t ahead = o;  // bytes already asked for beyond the GEMV about to run
  for (size_t i = pf_at_; i < u; ++i) ahead += pf_last_[i].cb + pf_last_[i].sb;
  size_t want = ahead < pf_cap_ ? std::min(pf_budget_, pf_cap_ - ahead) : 0;
  cuda::L2Prefetch& pf = pf_buf_;
  pf.count = 0;
  const auto add = [&](const void* p, size_t from, size_t to) {  // 16-byte aligned inside [p + from, p + to)
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + from + 15) & ~uintptr_t(15);
    const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + to) & ~uintptr_t(15);
    if (b <= a || pf.count == cuda::L2Prefetch::kMax) return;
    pf.p[pf.count] = reinterpret_cast<const void*>(a);
    pf.n[pf.count] = uint32_t(std::min<uintptr_t>(b - a, 0xFFFFFFF0u));
    ++pf.count;
  };
  while (want && u < pf_last_.size() && pf.count + 2 <= cuda::L2Prefetch::kMax) {
    const PfUnit& w = pf_last_[u];
    const size_t tot = w.cb + w.sb, take = std::min(want, tot - o);
    // the first bytes of the unit in the GEMV's read order: rows from 0, codes and scales alike
    add(w.codes, size_t(double(w.cb) * o / tot), size_t(double(w.cb) * (o + take) / tot));
    add(w.scales, size_t(double(w.sb) * o / tot), size_t(double(w.sb) * (o + take) / tot));
    o += take, want -= take;
    if (o == tot) ++u, o = 0;
  }
  pf_u_ = u, pf_o_ = o;
  pf.blocks = 0;  // the launch sizes its extra blocks (fused.cu)
  return pf.count ? &pf : nullptr;
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
  size_t kernels = 0, prog = 0, blocks = 0;
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType t;
    if (cudaGraphNodeGetType(n, &t) != cudaSuccess || t != cudaGraphNodeTypeKernel) continue;
    ++kernels;
    cudaKernelNodeParams kp{};
    if (cudaGraphKernelNodeGetParams(n, &kp) == cudaSuccess) blocks += size_t(kp.gridDim.x) * kp.gridDim.y * kp.gridDim.z;
  }
  for (const cudaGraphEdgeData& d : data) prog += d.type == cudaGraphDependencyTypeProgrammatic;
  std::fprintf(stderr, "kvdeck cuda graph %llu: %zu nodes, %zu kernels, %zu edges (%zu programmatic), %zu blocks\n",
               static_cast<unsigned long long>(key), nn, kernels, ne, prog, blocks);
}

bool CudaState::graph_begin(uint64_t key) {
  flush();
  if (!buckets_) key &= 0xFF;
  const uint64_t cap = key >> 8;
  step_ctx_ = 0;  // a replayed step runs no op (and no step_end follows it)
  auto it = graphs_on_ ? graphs_.find(key) : graphs_.end();
  if (it != graphs_.end()) {
    check(cudaGraphLaunch(it->second, st_), "cudaGraphLaunch");
    return true;
  }
  step_ctx_ = cap && cap < (1u << 30) ? int(cap) : 0;  // until step_end
  pf_step(true);
  if (!graphs_on_) return false;
  if (seen_.insert(key).second) return false;  // the first step of a kind runs eagerly (allocations)
  check(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  capturing_ = true;
  return false;
}

void CudaState::graph_end(uint64_t key, bool ok) {
  if (ok) flush();
  step_ctx_ = 0;
  pf_step(false);  // the step's GEMV order for the next one
  if (!ok) pf_last_.clear();
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
