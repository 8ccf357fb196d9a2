// gemv_seg.cu — batch-1 GEMV of short rows (Kp <= kSegMaxKp) whose blocks each own a segment
// of outputs whole, so the op consuming them runs in the same block with no counters or
// atomics (kernels_cuda.h gemv_seg_m1): q/k/v + RoPE + KV write (a block per q head, or per KV
// head's k and v rows) and gate/up + silu + q8 (a block per 32 outputs of both). A small
// model's decode step is bound by its count of dependent kernels; this removes two a layer.
//
// Mapping: a block of kSegWarps warps; warp w owns rows w * RW .. + RW - 1 of its segment, each
// lane one 32-value chunk of every row (nc = Kp / 32 <= 32 chunks), all loaded before the PDL
// wait. The dot of a row is gemv.cu's (gemv_warp for nc <= 32: one chunk a lane, then a warp
// sum), so y is bit-identical to gemv_many_m1's; the outputs go to y, and after a barrier the
// epilogue re-reads them through L2 with fused_impl.cuh's device code (rope_kv_item,
// kv_nvfp4_value, silu_q8_seg): the same bytes as rope_kv_write / silu_mul_q8.
#include <cstdint>

#include "common.cuh"
#include "fused_impl.cuh"
#include "gemv_impl.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {

using namespace detail;
using namespace detail::gemv;

namespace {

constexpr int kSegWarps = 16;
constexpr int kSegRows = 128;                  // rows a segment holds at most
constexpr int kSegRW = kSegRows / kSegWarps;  // rows per warp

struct SegArgs {
  GemvArgs a[3];
  GemvEpilogue e;
};

// Row ri of segment seg -> (weight, row), or false past the segment's end.
template <int K>
__device__ __forceinline__ bool seg_row(const SegArgs& g, int seg, int ri, int& wi, int& r) {
  if constexpr (K == GemvEpilogue::kSiluQ8) {  // 32 rows of gate, then the same 32 of up
    wi = ri / 32, r = 32 * seg + ri % 32;
    return ri < 64 && r < g.a[0].N;
  } else {  // a q head: D rows of q; a KV head: D rows of k, then D of v
    const int D = g.e.D;
    if (seg < g.e.nh) return wi = 0, r = seg * D + ri, ri < D;
    wi = 1 + ri / D, r = (seg - g.e.nh) * D + ri % D;
    return ri < 2 * D;
  }
}

// The RoPE + KV-write epilogue of one head (segment seg), out of line: its encode code keeps
// its registers out of the GEMV part's frame.
__device__ __noinline__ void rope_kv_head(const RopeKvArgs r, int nh, int seg) {
  const int D = r.D, half = D / 2, t = threadIdx.x;
  if (seg < nh) {  // q head: rotated in place (item 0 also writes ctx)
    if (t < half) rope_kv_item(r, size_t(seg) * half + t);
  } else if (r.fmt == 2) {  // NVFP4 rows, one value a thread (whole warps: 2 D % 32 == 0)
    const int gk = seg - nh;
    if (t < 2 * D) kv_nvfp4_value(r, size_t(gk) * 2 * D + t, true);
  } else if (t < D) {  // f32 / f16: roped k and v value t of this head
    rope_kv_item(r, size_t(nh) * half + size_t(seg - nh) * D + t);
  }
}

template <Fmt F, int K>
__global__ void __launch_bounds__(kSegWarps * 32) gemv_seg_kernel(const SegArgs g) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, seg = blockIdx.x, nc = g.a[0].Kp / 32;
  Chunk<F> w[kSegRW];
#pragma unroll
  for (int j = 0; j < kSegRW; ++j) {  // weights never change: all loaded before the PDL wait
    int wi = 0, r = 0;
    if (seg_row<K>(g, seg, warp * kSegRW + j, wi, r) && lane < nc) w[j] = load_chunk<F>(g.a[wi], r, lane);
  }
  pdl_launch_dependents();
  pdl_wait();
  Act<F> x{};
  if (lane < nc) x = load_act<F>(g.a[0], 0, lane);
#pragma unroll
  for (int j = 0; j < kSegRW; ++j) {
    int wi = 0, r = 0;
    const bool ok = seg_row<K>(g, seg, warp * kSegRW + j, wi, r);  // warp-uniform
    if (!ok) continue;
    const float v = warp_sum(lane < nc ? dot<F>(decode<F>(w[j]), x, 0.0f) : 0.0f);
    const float scale = F == Fmt::W4a8 ? 1.0f : g.a[wi].tscale * 128.0f;  // as gemv_warp
    if (lane == 0) g.a[wi].y[r] = v * scale;
  }
  __syncthreads();  // the segment's outputs, stored above, are read back below (L2)
  if constexpr (K == GemvEpilogue::kSiluQ8) {
    const GemvEpilogue& e = g.e;
    if (warp == 0) silu_q8_seg(g.a[0].y, g.a[1].y, e.n, e.h, e.q, e.d, e.s, seg);
  } else {
    const GemvEpilogue& e = g.e;
    rope_kv_head({g.a[0].y, e.nh * e.D, e.nh, g.a[1].y, g.a[2].y, e.nkv * e.D, e.nkv, e.D, 1, e.pos, e.inv_freq,
                  e.kv_format, static_cast<uint8_t*>(e.k_pages), static_cast<uint8_t*>(e.v_pages), e.slots, e.ctx},
                 e.nh, seg);
  }
}

template <Fmt F>
cudaError_t launch_seg(const SegArgs& g, int segs, cudaStream_t st, bool pdl) {
  auto* k = g.e.kind == GemvEpilogue::kSiluQ8 ? gemv_seg_kernel<F, GemvEpilogue::kSiluQ8>
                                               : gemv_seg_kernel<F, GemvEpilogue::kRopeKv>;
  return launch_kernel(k, dim3(segs), dim3(kSegWarps * 32), st, pdl, g);
}

}  // namespace

cudaError_t gemv_seg_m1(int fmt, const GemvWeight* w, int n, int group, int Kp, const int8_t* xq, const float* xd,
                        const int32_t* xs, const GemvEpilogue& e, cudaStream_t stream, bool pdl) {
  if ((fmt != 0 && fmt != 1) || Kp < 32 || Kp % 32 || Kp > kSegMaxKp || (fmt == 1 && (group < 32 || group % 32 || Kp % group)))
    return cudaErrorInvalidValue;
  SegArgs g{};
  g.e = e;
  for (int i = 0; i < n && i < 3; ++i)
    g.a[i] = GemvArgs{w[i].codes, w[i].scales, w[i].tscale, fmt == 0 ? 16 : group, w[i].N, Kp, xq, xd, xs, nullptr,
                      w[i].y, w[i].N};
  int segs = 0;
  if (e.kind == GemvEpilogue::kSiluQ8) {
    if (n != 2 || w[0].N != e.n || w[1].N != e.n || e.Kp % 32 || e.Kp < e.n || e.Kp - e.n >= 32 || !e.h || !e.q ||
        !e.d || !e.s || (e.q < xq + Kp && xq < e.q + e.Kp))  // its q8 must not be the input's (read by other blocks)
      return cudaErrorInvalidValue;
    segs = e.Kp / 32;
  } else if (e.kind == GemvEpilogue::kRopeKv) {
    if (n != 3 || e.nh < 1 || e.nkv < 1 || e.D < 16 || e.D % 16 || 2 * e.D > kSegRows || w[0].N != e.nh * e.D ||
        w[1].N != e.nkv * e.D || w[2].N != e.nkv * e.D || e.kv_format < 0 || e.kv_format > 2 || !e.pos ||
        !e.inv_freq || !e.k_pages || !e.v_pages || !e.slots)
      return cudaErrorInvalidValue;
    segs = e.nh + e.nkv;
  } else {
    return cudaErrorInvalidValue;
  }
  return fmt == 0 ? launch_seg<Fmt::Nvfp4PosNeg>(g, segs, stream, pdl) : launch_seg<Fmt::W4a8>(g, segs, stream, pdl);
}

}  // namespace kvdeck::cuda
