// gemv.cu — decode-time linear layers on the GPU: activation quantisation and GEMV for
// NVFP4 (integer and f16 variants) and W4A8, batch 1..8. Contracts: kernels_cuda.h.
//
// Mapping: one warp owns R consecutive weight rows; each lane walks the 32-element chunks of
// K (16 code bytes, one 16-byte load per row) with a stride of 32, U chunks in flight, so a
// warp reads 512 contiguous code bytes of each row per step and every weight byte is read
// once. The chunk's activations (M rows x 32 int8 / f16) are loaded once for the R rows
// (L1-resident). Warp shuffles reduce; no shared memory, no barriers. Memory-bound by
// design: the weight bytes are the cost.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common.cuh"
#include "fused_impl.cuh"
#include "gemv_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;

namespace {

// =====================================================================================
// Activation quantisation (one warp per 32-block)
// =====================================================================================

__global__ void quantize_act_q8_kernel(const float* __restrict__ x, int M, int K, int Kp,
                                       int8_t* __restrict__ q, float* __restrict__ d,
                                       int32_t* __restrict__ s) {
  const int nb = Kp / 32;
  const int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // global 32-block index
  if (blk >= M * nb) return;
  const int lane = threadIdx.x & 31, m = blk / nb, k = (blk % nb) * 32 + lane;
  pdl_launch_dependents();
  pdl_wait();  // x is the previous kernel's output
  const float v = k < K ? x[size_t(m) * K + k] : 0.0f;
  const float amax = warp_max(fabsf(v));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const int qi = k < K ? int(fmaxf(-127.0f, fminf(127.0f, rintf(v * id)))) : 0;
  q[size_t(m) * Kp + k] = int8_t(qi);
  const int sum = warp_sum_int(qi);
  if (lane == 0) {
    d[blk] = amax / 127.0f;
    s[blk] = sum;
  }
}

__global__ void convert_act_f16_kernel(const float* __restrict__ x, int M, int K, int Kp,
                                       __half* __restrict__ h) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(M) * Kp) return;
  const int m = int(i / Kp), k = int(i % Kp);
  pdl_launch_dependents();
  pdl_wait();
  h[i] = __float2half_rn(k < K ? x[size_t(m) * K + k] : 0.0f);
}

}  // namespace

using namespace detail::gemv;

namespace {

// =====================================================================================
// GEMV kernel (building blocks: gemv_impl.cuh)
// =====================================================================================

// The body of one warp: rows n0 .. n0 + R - 1 of a (gemv_kernel; gemv_many_kernel per weight).
template <Fmt F, int M, int R, int U, bool PF>
__device__ __forceinline__ void gemv_warp(const GemvArgs& a, int n0) {
  const int lane = threadIdx.x & 31;
  if (n0 >= a.N) return;
  const int nc = a.Kp / 32;
  if (!a.late) pdl_launch_dependents();
  auto load_all = [&](int c0, Chunk<F> (&w)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)  // past the end: reload the last chunk (unused)
        w[u][r] = load_chunk<F>(a, min(n0 + r, a.N - 1), min(c0 + 32 * u, nc - 1));
  };
  float acc[R][M] = {};
  Chunk<F> wk[U][R], wn[U][R];
  if (lane < nc) load_all(lane, wk);
  pdl_wait();  // weights never change: only activations (and y) wait for the producer
  for (int c0 = lane; c0 < nc; c0 += 32 * U) {
    const bool more = c0 + 32 * U < nc;
    if (PF && more) load_all(c0 + 32 * U, wn);  // software pipeline: next step's weights
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + 32 * u >= nc) break;
      Act<F> x[M];
#pragma unroll
      for (int m = 0; m < M; ++m) x[m] = load_act<F>(a, m, c0 + 32 * u);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const Decoded<F> d = decode<F>(wk[u][r]);
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = dot<F>(d, x[m], acc[r][m]);
      }
    }
    if (PF) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) wk[u][r] = wn[u][r];
    } else if (more) {
      load_all(c0 + 32 * U, wk);
    }
  }
  if (a.late) pdl_launch_dependents();
  // nvfp4: 2*e2m1 codes (x0.5) and scales / 256 (x256) -> x128; f16 path: x256
  const float scale = F == Fmt::Nvfp4Dp4a || F == Fmt::Nvfp4PosNeg ? a.tscale * 128.0f
                      : F == Fmt::Nvfp4F16                         ? a.tscale * 256.0f
                                                                   : 1.0f;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == r * M + m && n0 + r < a.N) a.y[size_t(m) * a.ldy + n0 + r] = v * scale;
    }
}

template <Fmt F, int M, int R, int U, bool PF>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const GemvArgs a) {
  gemv_warp<F, M, R, U, PF>(a, (blockIdx.x * kGemvWarps + threadIdx.x / 32) * R);
}

// Several weights reading the same activations, one launch: blocks [first[i], first[i+1])
// run weight i (its own codes, scales, tensor scale, N and y), as separate launches would.
constexpr int kGemvManyMax = 4;
struct GemvMany {
  GemvArgs a[kGemvManyMax];
  int first[kGemvManyMax + 1];
  int n;
};

// The epilogue K (kernels_cuda.h GemvEpilogue) by segments: a block owns 4 rows (R = 1), a
// segment is 32 outputs (kAddNormQ8, kSiluQ8: the rows of the gate and of the up weight) or
// one head (kRopeKv: q head h, or k and v head g); the block that completes a segment's
// rows runs that segment, and the segments' counters reset themselves. Register-capped at
// the GEMV's occupancy (10 blocks of 4 warps per SM): the GEMV loop does not spill.
constexpr int kEpiThreads = kGemvWarps * 32;

// Not inlined: the RoPE + NVFP4 encode (16 values, sincosf) spills under the cap in its own
// frame instead of the GEMV loop's registers. One item per thread (D/2 or D/16 .. D items).
__device__ __noinline__ void rope_kv_seg(const GemvMany& g, const GemvEpilogue& e, int seg) {
  const RopeKvArgs r{g.a[0].y, e.nh * e.D, e.nh, g.a[1].y, g.a[2].y, e.nkv * e.D, e.nkv, e.D, 1, e.pos, e.inv_freq,
                     e.kv_format, static_cast<uint8_t*>(e.k_pages), static_cast<uint8_t*>(e.v_pages), e.slots, e.ctx};
  const int half = e.D / 2, per = e.kv_format == 2 ? e.D / 16 : e.D;
  const bool qh = seg < e.nh;
  const size_t first = qh ? size_t(seg) * half : size_t(e.nh) * half + size_t(seg - e.nh) * per;
  const int items = qh ? half : per;
  for (int i = threadIdx.x; i < items; i += kEpiThreads) rope_kv_item(r, first + i);
}

template <int K>
__device__ __forceinline__ void gemv_epilogue(const GemvMany& g, const GemvEpilogue& e, int wi, int r0) {
  pdl_wait();  // every block: the counters (and the outputs) belong to the previous launch until then
  int seg, expect;
  if constexpr (K == GemvEpilogue::kRopeKv) {
    seg = wi == 0 ? r0 / e.D : e.nh + r0 / e.D;
    expect = (wi == 0 ? 1 : 2) * (e.D / kGemvWarps);
  } else {
    seg = r0 / 32;
    const int len = min(32, e.n - 32 * seg);
    expect = (K == GemvEpilogue::kSiluQ8 ? 2 : 1) * ((len + kGemvWarps - 1) / kGemvWarps);
  }
  // the block's rows, then one fence and count by thread 0 (as cooperative groups' grid sync:
  // the barrier orders the block's stores before thread 0's fence)
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(e.counter + seg, 1) == expect - 1;
    if (last) __threadfence();  // the segment's rows (other blocks') before the reads below
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x == 0) e.counter[seg] = 0;
  if constexpr (K == GemvEpilogue::kSiluQ8) {
    if (threadIdx.x < 32) silu_q8_seg(g.a[0].y, g.a[1].y, e.n, e.h, e.q, e.d, e.s, seg);
  } else if constexpr (K == GemvEpilogue::kRopeKv) {
    rope_kv_seg(g, e, seg);
  } else {
    if (threadIdx.x < 32) add_seg(e.x, g.a[0].y, e.n, e.part, seg);
    __syncthreads();
    int* done = e.counter + (kGemvEpiCounters - 1);
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(done, 1) == e.Kp / 32 - 1;
      if (last) __threadfence(), *done = 0;
    }
    __syncthreads();
    if (!last) return;
    norm_q8_final<kEpiThreads>(e.x, e.w, e.n, e.eps, e.h, e.Kp, e.q, e.d, e.s, e.part);
  }
}

template <Fmt F, int M, int R, int U, bool PF, int K>
__global__ void __launch_bounds__(kGemvWarps * 32, 10) gemv_many_kernel(const GemvMany g, const GemvEpilogue e) {
  int i = 0;
  while (i + 1 < g.n && int(blockIdx.x) >= g.first[i + 1]) ++i;
  const int r0 = (int(blockIdx.x) - g.first[i]) * kGemvWarps * R;
  gemv_warp<F, M, R, U, PF>(g.a[i], r0 + threadIdx.x / 32 * R);
  if constexpr (K != GemvEpilogue::kNone) gemv_epilogue<K>(g, e, i, r0);
}

// The kernel-level A/B switches (kernels_cuda.h reload_switches): read at the first launch
// and whenever a backend is created, so each engine of one process can run either way.
bool g_read = false, g_early = false, g_late = false, g_one_wave = false;

void read_switches() {
  if (!g_read) reload_switches();
}

// Blocks of kernel Kern resident at once on this device (occupancy x SMs; 0 if unknown).
template <auto Kern>
int wave_blocks() {
  static const int per_wave = [] {
    int dev = 0, sms = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, Kern, kGemvWarps * 32, 0))
      return 0;
    return per * sms;
  }();
  return per_wave;
}

// Batch 1 with KVDECK_CUDA_ONEWAVE=1 (opt-in: not yet measured in the engine): one chunk in
// flight per lane (U = 1) where that grid fits in one wave of resident blocks and U = 2 (more
// registers) would need a second, short one (the 8B's q/k/v: 1,536 blocks, 1,320 resident at
// U = 2, 1,584 at U = 1; alone, without PDL, 5.9 vs 7.2 µs in the session-3 tune rows). Same
// sums in the same order, so the same outputs bit for bit.
template <auto K1, auto K2>
bool use_u1(int blocks) {
  read_switches();
  return g_one_wave && blocks > wave_blocks<K2>() && blocks <= wave_blocks<K1>();
}

template <Fmt F>
cudaError_t launch_many(GemvMany g, const GemvEpilogue& e, cudaStream_t st, bool pdl) {
  const dim3 grid(g.first[g.n]), block(kGemvWarps * 32);
  read_switches();
  for (int i = 0; i < g.n; ++i) g.a[i].late = g_late;
  if (e.kind == GemvEpilogue::kNone &&
      use_u1<gemv_many_kernel<F, 1, 1, 1, true, 0>, gemv_many_kernel<F, 1, 1, 2, true, 0>>(g.first[g.n]))
    return launch_kernel(gemv_many_kernel<F, 1, 1, 1, true, 0>, grid, block, st, pdl, g, e);
  switch (e.kind) {
    case GemvEpilogue::kNone: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 0>, grid, block, st, pdl, g, e);
    case GemvEpilogue::kAddNormQ8: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 1>, grid, block, st, pdl, g, e);
    case GemvEpilogue::kSiluQ8: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 2>, grid, block, st, pdl, g, e);
    case GemvEpilogue::kRopeKv: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 3>, grid, block, st, pdl, g, e);
    default: return cudaErrorInvalidValue;
  }
}

// =====================================================================================
// Dispatch: (M, R, U) configurations
// =====================================================================================

template <Fmt F, int M, int R, int U, bool PF = false>
cudaError_t launch(GemvArgs a, cudaStream_t st, bool pdl = false) {
  static_assert(R * M <= 32, "one lane stores each output");
  const int warps = (a.N + R - 1) / R, blocks = (warps + kGemvWarps - 1) / kGemvWarps;
  read_switches();
  a.late = g_late;
  return launch_kernel(gemv_kernel<F, M, R, U, PF>, dim3(blocks), dim3(kGemvWarps * 32), st, pdl, a);
}

// The batch-1 configuration: R = 1, U = 2, pipelined, or U = 1 where that fits one wave (use_u1).
template <Fmt F>
cudaError_t launch_m1(const GemvArgs& a, cudaStream_t st, bool pdl) {
  if (use_u1<gemv_kernel<F, 1, 1, 1, true>, gemv_kernel<F, 1, 1, 2, true>>((a.N + kGemvWarps - 1) / kGemvWarps))
    return launch<F, 1, 1, 1, true>(a, st, pdl);
  return launch<F, 1, 1, 2, true>(a, st, pdl);
}

// The default configuration per batch size (measured on the H200: gemv_tune in gpu_bench).
template <Fmt F>
cudaError_t launch_default(const GemvArgs& a, int M, cudaStream_t st, bool pdl) {
  switch (M) {
    case 1: return launch_m1<F>(a, st, pdl);
    case 2: return launch<F, 2, 2, 2>(a, st, pdl);
    case 3: return launch<F, 3, 2, 2>(a, st, pdl);
    case 4: return launch<F, 4, 2, 2>(a, st, pdl);
    case 5: return launch<F, 5, 2, 1>(a, st, pdl);
    case 6: return launch<F, 6, 2, 1>(a, st, pdl);
    case 7: return launch<F, 7, 2, 1>(a, st, pdl);
    default: return launch<F, 8, 2, 1>(a, st, pdl);
  }
}

bool shape_ok(int N, int Kp, int M, int ldy) {
  return N >= 1 && Kp >= 32 && Kp % 32 == 0 && M >= 1 && M <= 8 && ldy >= N;
}

}  // namespace

// =====================================================================================
// Launchers
// =====================================================================================

void reload_switches() {
  auto on = [](const char* name, bool dflt) {
    const char* e = std::getenv(name);
    return e && *e ? e[0] != '0' : dflt;
  };
  g_early = on("KVDECK_CUDA_EARLY", false);
  g_late = on("KVDECK_CUDA_GEMV_LATE", false);
  g_one_wave = on("KVDECK_CUDA_ONEWAVE", false);
  g_read = true;
}

namespace detail {
bool early_trigger() {
  read_switches();
  return g_early;
}

bool pdl_supported() {
  static int v = -1;  // per process: the device current at the first call
  if (v < 0) {
    int dev = 0, major = 0;
    v = cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  }
  return v == 1;
}
}  // namespace detail

cudaError_t quantize_act_q8(const float* x, int M, int K, int Kp, int8_t* q, float* d, int32_t* s,
                            cudaStream_t stream, bool pdl) {
  if (M < 1 || K < 1 || Kp % 32 != 0 || Kp < K || Kp - K >= 32) return cudaErrorInvalidValue;
  const int blocks = M * (Kp / 32), per = 8;  // 8 warps (32-blocks) per CTA
  return launch_kernel(quantize_act_q8_kernel, dim3((blocks + per - 1) / per), dim3(per * 32), stream, pdl,
                       x, M, K, Kp, q, d, s);
}

cudaError_t convert_act_f16(const float* x, int M, int K, int Kp, uint16_t* h, cudaStream_t stream, bool pdl) {
  if (M < 1 || K < 1 || Kp % 32 != 0 || Kp < K) return cudaErrorInvalidValue;
  const size_t n = size_t(M) * Kp;
  return launch_kernel(convert_act_f16_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), stream, pdl,
                       x, M, K, Kp, reinterpret_cast<__half*>(h));
}

cudaError_t gemv_nvfp4_dp4a(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int Kp,
                            const int8_t* xq, const float* xd, int M, float* y, int ldy,
                            cudaStream_t stream, bool pdl) {
  if (!shape_ok(N, Kp, M, ldy)) return cudaErrorInvalidValue;
  const GemvArgs a{codes, scales, tscale, 16, N, Kp, xq, xd, nullptr, nullptr, y, ldy};
  // batch 1: the two-lookup decode (7-12% faster on every Llama-3-8B shape on the H200);
  // batch >= 2 keeps one signed lookup per word, whose cost is shared by the M rows
  if (M == 1) return launch_m1<Fmt::Nvfp4PosNeg>(a, stream, pdl);
  return launch_default<Fmt::Nvfp4Dp4a>(a, M, stream, pdl);
}

cudaError_t gemv_nvfp4_f16(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int Kp,
                           const uint16_t* xh, int M, float* y, int ldy, cudaStream_t stream, bool pdl) {
  if (!shape_ok(N, Kp, M, ldy)) return cudaErrorInvalidValue;
  const GemvArgs a{codes, scales, tscale, 16, N, Kp, nullptr, nullptr, nullptr,
                   reinterpret_cast<const __half*>(xh), y, ldy};
  return launch_default<Fmt::Nvfp4F16>(a, M, stream, pdl);
}

cudaError_t gemv_w4a8(const uint8_t* codes, const uint16_t* scales, int group, int N, int Kp,
                      const int8_t* xq, const float* xd, const int32_t* xs, int M, float* y, int ldy,
                      cudaStream_t stream, bool pdl) {
  if (!shape_ok(N, Kp, M, ldy) || group < 32 || group % 32 != 0 || Kp % group != 0)
    return cudaErrorInvalidValue;
  const GemvArgs a{codes, scales, 1.0f, group, N, Kp, xq, xd, xs, nullptr, y, ldy};
  return launch_default<Fmt::W4a8>(a, M, stream, pdl);
}

namespace {

bool epilogue_ok(const GemvEpilogue& e, const GemvWeight* w, int n) {
  switch (e.kind) {
    case GemvEpilogue::kNone: return true;
    case GemvEpilogue::kAddNormQ8:
    case GemvEpilogue::kSiluQ8:
      return e.counter && n == (e.kind == GemvEpilogue::kAddNormQ8 ? 1 : 2) && e.n >= 1 && w[0].N == e.n &&
             (n == 1 || w[1].N == e.n) && e.Kp % 32 == 0 && e.Kp >= e.n && e.Kp - e.n < 32 && e.h && e.q && e.d &&
             e.s && e.Kp / 32 < kGemvEpiCounters &&
             (e.kind == GemvEpilogue::kSiluQ8 || (e.x && e.w && e.part && e.n <= kGemvEpiNormMax));
    case GemvEpilogue::kRopeKv:
      return e.counter && n == 3 && e.nh >= 1 && e.nh + e.nkv < kGemvEpiCounters && e.nkv >= 1 && e.D >= 16 && e.D % 16 == 0 && w[0].N == e.nh * e.D &&
             w[1].N == e.nkv * e.D && w[2].N == e.nkv * e.D && e.kv_format >= 0 && e.kv_format <= 2 && e.pos &&
             e.inv_freq && e.k_pages && e.v_pages && e.slots;
    default: return false;
  }
}

}  // namespace

cudaError_t gemv_many_m1(int fmt, const GemvWeight* w, int n, int group, int Kp, const int8_t* xq,
                         const float* xd, const int32_t* xs, cudaStream_t stream, bool pdl, const GemvEpilogue* epi) {
  if (n < 1 || n > kGemvManyMax || Kp < 32 || Kp % 32 != 0 || (fmt == 1 && (group < 32 || group % 32 || Kp % group)))
    return cudaErrorInvalidValue;
  const GemvEpilogue e = epi ? *epi : GemvEpilogue{};
  if (!epilogue_ok(e, w, n)) return cudaErrorInvalidValue;
  // kSiluQ8's segments write their q8 while other blocks still read the input's: apart only
  if (e.kind == GemvEpilogue::kSiluQ8 && !(e.q + e.Kp <= xq || xq + Kp <= e.q)) return cudaErrorInvalidValue;
  GemvMany g{};
  g.n = n;
  g.first[0] = 0;
  for (int i = 0; i < n; ++i) {
    if (w[i].N < 1) return cudaErrorInvalidValue;
    g.a[i] = GemvArgs{w[i].codes, w[i].scales, w[i].tscale, fmt == 0 ? 16 : group, w[i].N, Kp, xq, xd, xs, nullptr,
                      w[i].y, w[i].N};
    g.first[i + 1] = g.first[i] + (w[i].N + kGemvWarps - 1) / kGemvWarps;  // R = 1: a warp per row
  }
  if (fmt == 0) return launch_many<Fmt::Nvfp4PosNeg>(g, e, stream, pdl);
  if (fmt == 1) return launch_many<Fmt::W4a8>(g, e, stream, pdl);
  return cudaErrorInvalidValue;
}

namespace detail {

// Batch-1 configurations (rows per warp R, chunks in flight per lane U) for gpu_bench's sweep.
cudaError_t gemv_m1_config(int fmt, int R, int U, bool pipelined, const uint8_t* codes, const void* scales, float tscale,
                           int group, int N, int Kp, const int8_t* xq, const float* xd, const int32_t* xs,
                           float* y, cudaStream_t stream) {
  const GemvArgs a{codes, scales, tscale, group, N, Kp, xq, xd, xs, nullptr, y, N};
  const int key = (pipelined ? 100 : 0) + R * 10 + U;  // + 100: software-pipelined (next step's weights in flight)
#define KVDECK_CFG(F)                                          \
  switch (key) {                                               \
    case 11: return launch<F, 1, 1, 1>(a, stream);             \
    case 12: return launch<F, 1, 1, 2>(a, stream);             \
    case 14: return launch<F, 1, 1, 4>(a, stream);             \
    case 22: return launch<F, 1, 2, 2>(a, stream);             \
    case 111: return launch<F, 1, 1, 1, true>(a, stream);      \
    case 112: return launch<F, 1, 1, 2, true>(a, stream);      \
    case 114: return launch<F, 1, 1, 4, true>(a, stream);      \
    case 122: return launch<F, 1, 2, 2, true>(a, stream);      \
    default: return cudaErrorInvalidValue;                     \
  }
  if (fmt == 0) KVDECK_CFG(Fmt::Nvfp4Dp4a)
  if (fmt == 2) KVDECK_CFG(Fmt::Nvfp4PosNeg)
  KVDECK_CFG(Fmt::W4a8)
#undef KVDECK_CFG
}

}  // namespace detail

}  // namespace kvdeck::cuda
