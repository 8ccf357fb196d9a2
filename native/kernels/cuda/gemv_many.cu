// gemv_many.cu — batch 1, several weights reading the same activations in one launch (q/k/v,
// gate/up: gemv_many_m1). The warp body is gemv.cu's (gemv_impl.cuh gemv_warp). (The GEMV
// epilogues that ran the consuming op inside this launch, KVDECK_CUDA_FUSE, measured slower in
// sessions 4 and 6 and were removed: NOTES.md.)
#include <cstdint>

#include "common.cuh"
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

template <Fmt F, int M, int R, int U, bool PF>
__global__ void __launch_bounds__(kGemvWarps * 32, 10) gemv_many_kernel(const GemvMany g) {
  int i = 0;
  while (i + 1 < g.n && int(blockIdx.x) >= g.first[i + 1]) ++i;
  const int r0 = (int(blockIdx.x) - g.first[i]) * kGemvWarps * R;
  gemv_warp<F, M, R, U, PF>(g.a[i], r0 + threadIdx.x / 32 * R);
}

}  // namespace

cudaError_t gemv_many_m1(int fmt, const GemvWeight* w, int n, int group, int Kp, const int8_t* xq,
                         const float* xd, const int32_t* xs, cudaStream_t stream, bool pdl, bool u4) {
  if (n < 1 || n > kGemvManyMax || Kp < 32 || Kp % 32 != 0 || (fmt == 1 && (group < 32 || group % 32 || Kp % group)))
    return cudaErrorInvalidValue;
  GemvMany g{};
  g.n = n;
  g.first[0] = 0;
  for (int i = 0; i < n; ++i) {
    if (w[i].N < 1) return cudaErrorInvalidValue;
    g.a[i] = GemvArgs{w[i].codes, w[i].scales, w[i].tscale, fmt == 0 ? 16 : group, w[i].N, Kp, xq, xd, xs, nullptr,
                      w[i].y, w[i].N};
    g.first[i + 1] = g.first[i] + (w[i].N + kGemvWarps - 1) / kGemvWarps;  // R = 1: a warp per row
  }
  const dim3 grid(g.first[n]), block(kGemvWarps * 32);
  // u4: four chunks a lane loaded together, not pipelined (the 8B's gate/up; kernels_cuda.h)
  if (fmt == 0)
    return u4 ? launch_kernel(gemv_many_kernel<Fmt::Nvfp4PosNeg, 1, 1, 4, false>, grid, block, stream, pdl, g)
              : launch_kernel(gemv_many_kernel<Fmt::Nvfp4PosNeg, 1, 1, 2, true>, grid, block, stream, pdl, g);
  if (fmt == 1)
    return u4 ? launch_kernel(gemv_many_kernel<Fmt::W4a8, 1, 1, 4, false>, grid, block, stream, pdl, g)
              : launch_kernel(gemv_many_kernel<Fmt::W4a8, 1, 1, 2, true>, grid, block, stream, pdl, g);
  return cudaErrorInvalidValue;
}

}  // namespace kvdeck::cuda
