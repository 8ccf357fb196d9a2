// gemv_many.cu — batch 1, several weights reading the same activations in one launch (q/k/v,
// gate/up: gemv_many_m1), optionally with the op consuming the outputs as an epilogue run by
// segments (kernels_cuda.h GemvEpilogue; opt-in KVDECK_CUDA_FUSE=1 in the backend, measured
// slower on the H200: NOTES.md). The warp body is gemv.cu's (gemv_impl.cuh gemv_warp).
#include <cstdint>

#include "common.cuh"
#include "fused_impl.cuh"
#include "gemv_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;
using namespace detail::gemv;

namespace {

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

template <Fmt F>
cudaError_t launch_many(GemvMany g, const GemvEpilogue& e, cudaStream_t st, bool pdl) {
  const dim3 grid(g.first[g.n]), block(kGemvWarps * 32);
  if (e.kind == GemvEpilogue::kNone && use_u4(g.a[0].Kp))
    return launch_kernel(gemv_many_kernel<F, 1, 1, 4, false, 0>, grid, block, st, pdl, g, e);
  switch (e.kind) {
    case GemvEpilogue::kNone: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 0>, grid, block, st, pdl, g, e);
    case GemvEpilogue::kAddNormQ8: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 1>, grid, block, st, pdl, g, e);
    case GemvEpilogue::kSiluQ8: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 2>, grid, block, st, pdl, g, e);
    case GemvEpilogue::kRopeKv: return launch_kernel(gemv_many_kernel<F, 1, 1, 2, true, 3>, grid, block, st, pdl, g, e);
    default: return cudaErrorInvalidValue;
  }
}

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

}  // namespace kvdeck::cuda
