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

// M > 8 rows (prefill): four values a lane, 8 lanes a 32-block (fused_impl.cuh quant_block4:
// the same q, d, s bit for bit), float4 loads; the kernel above gives one warp and one byte
// store per lane to each 32-block (12.7 µs for 512 x 4096 under CUPTI, session 7 profile).
// Needs K % 4 == 0 and x 16-byte aligned.
__global__ void __launch_bounds__(128) quantize_act_q8_vec_kernel(const float* __restrict__ x, int M, int K, int Kp,
                                                                  int8_t* __restrict__ q, float* __restrict__ d,
                                                                  int32_t* __restrict__ s) {
  pdl_launch_dependents();
  pdl_wait();
  const int per = Kp / 4;
  const size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool row_ok = j < size_t(M) * per;  // 8-lane groups are wholly in or out (per % 8 == 0)
  const int m = row_ok ? int(j / per) : 0, k = row_ok ? int(j % per) * 4 : Kp;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (k < K) {
    const float4 f = *reinterpret_cast<const float4*>(x + size_t(m) * K + k);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  }
  quant_block4(v, k, Kp, q + size_t(m) * Kp, d + size_t(m) * (Kp / 32), s + size_t(m) * (Kp / 32));
}

// KVDECK_CUDA_PREFILL_ROWS=0: M > 8 on the warp-per-block kernel (read at every launch: the A/B).
bool vec_rows_off() {
  const char* e = std::getenv("KVDECK_CUDA_PREFILL_ROWS");
  return e && e[0] == '0';
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

template <Fmt F, int M, int R, int U, bool PF>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const GemvArgs a) {
  gemv_warp<F, M, R, U, PF>(a, (blockIdx.x * kGemvWarps + threadIdx.x / 32) * R);
}

// =====================================================================================
// Dispatch: (M, R, U) configurations
// =====================================================================================

template <Fmt F, int M, int R, int U, bool PF = false>
cudaError_t launch(GemvArgs a, cudaStream_t st, bool pdl = false) {
  static_assert(R * M <= 32, "one lane stores each output");
  const int warps = (a.N + R - 1) / R, blocks = (warps + kGemvWarps - 1) / kGemvWarps;
  return launch_kernel(gemv_kernel<F, M, R, U, PF>, dim3(blocks), dim3(kGemvWarps * 32), st, pdl, a);
}

// The batch-1 configuration: R = 1, U = 2, pipelined (measured in the engine's 8B step against
// U = 1 where that fits one wave, which allocates the same 48 registers, and U = 4 unpipelined,
// +2%: NOTES.md, session 6).
template <Fmt F>
cudaError_t launch_m1(const GemvArgs& a, cudaStream_t st, bool pdl) {
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

namespace detail {
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
  if (M > 8 && K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && !vec_rows_off()) {
    const size_t items = size_t(M) * (Kp / 4);
    return launch_kernel(quantize_act_q8_vec_kernel, dim3(unsigned((items + 127) / 128)), dim3(128), stream, pdl, x, M,
                         K, Kp, q, d, s);
  }
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
