// kv_write_kpc4.cu — the KPC4 KV format on the GPU (kvdeck/kv_pce.h, kv_pool.h): the KV write
// into the open page's f32 staging slot with the V row as NVFP4, the K page encoded when its
// 16th row is written, and pages decoded to f32 (prefill, restaging). Byte for byte the CPU
// codec (kv_codec_pce.cpp, kv_codec_cpu.cpp): the encoder's min / max, directed E4M3 roundings
// and rint((x - lo) / step) run in float64 as there. Contracts: attention_kpc4.cuh.
#include <cstdint>

#include "attention_kpc4.cuh"
#include "common.cuh"

namespace kvdeck::cuda {

using namespace detail;

namespace {

constexpr int kPage = 16;  // tokens per page (kv_pool.h: kpc4 needs block 16)
constexpr int kThreads = 128, kThreadsF32 = 256;  // per block: the write / encode and the f32 kernels

#ifdef KVDECK_CUDA_EMU
__device__ __forceinline__ float div_rn(float a, float b) { return a / b; }
#else
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
#endif

__device__ __forceinline__ float e4m3_val(uint32_t c) {  // formats.cpp e4m3_to_f32 (the encoders never write NaN)
  return (c & 0x7Fu) == 0x7Fu ? 0.0f : e4m3_to_float(c);
}

// kv_codec_pce.cpp e4m3_at_or_below / e4m3_at_or_above.
__device__ __forceinline__ uint8_t e4m3_below(double v) {
  if (v <= -448.0) return 0xFEu;
  if (v >= 448.0) return 0x7Eu;
  const uint8_t c = f32_to_e4m3_dev(float(v));
  if (double(e4m3_val(c)) <= v) return c;
  if (!(c & 0x80u) && (c & 0x7Fu)) return uint8_t(c - 1);
  return uint8_t(0x80u | ((c & 0x7Fu) + 1));
}
__device__ __forceinline__ uint8_t e4m3_above(double v) {
  if (v >= 448.0) return 0x7Eu;
  if (v <= -448.0) return 0xFEu;
  const uint8_t c = f32_to_e4m3_dev(float(v));
  if (double(e4m3_val(c)) >= v) return c;
  if (c & 0x80u) {
    const uint32_t m = c & 0x7Fu;
    return m <= 1 ? uint8_t(0) : uint8_t(0x80u | (m - 1));
  }
  return uint8_t(c + 1);
}

__device__ __forceinline__ uint8_t to_e2m1(float f) {  // formats.cpp f32_to_e2m1
  const uint8_t sign = uint8_t((__float_as_uint(f) >> 28) & 0x8u);
  const float a = fabsf(f);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return uint8_t(sign | code);
}
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t a = code & 7u;
  const float mag = a < 2 ? 0.5f * float(a) : ((a & 1u) ? 1.5f : 1.0f) * float(1u << ((a >> 1) - 1));
  return (code & 8u) ? -mag : mag;
}

// =====================================================================================
// Rows into staging, V rows as NVFP4: one thread per (row m, KV head, 16-value block)
// =====================================================================================
__global__ void kpc4_stage_kernel(const Kpc4Write w, const float* __restrict__ k, const float* __restrict__ v,
                                  int ld, int M) {
  const int nb = w.D / 16, item = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (item >= M * w.n_kv * nb) return;
  const int b = item % nb, g = item / nb % w.n_kv, m = item / nb / w.n_kv;
  const size_t off = size_t(g) * w.D + size_t(b) * 16;
  const float* km = k + size_t(m) * ld + off;
  const float* vm = v + size_t(m) * ld + off;
  float* sk = w.stage_rows[m] + off;
  float* sv = sk + w.v_off;
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    sk[i] = km[i], sv[i] = vm[i];
    amax = fmaxf(amax, fabsf(vm[i]));
  }
  // kv_nvfp4_encode_row: s_b = e4m3(amax_b / 6), code = e2m1(x / e4m3(s_b))
  uint8_t* row = w.v_pages + (size_t(w.slots[m]) * w.n_kv + g) * (w.D / 2 + w.D / 16);
  const uint8_t s = f32_to_e4m3_dev(div_rn(amax, 6.0f));
  const float sd = e4m3_val(s);
  row[w.D / 2 + b] = s;
  for (int i = 0; i < 16; i += 2) {
    const uint8_t lo = sd > 0.f ? to_e2m1(div_rn(vm[i], sd)) : 0;
    const uint8_t hi = sd > 0.f ? to_e2m1(div_rn(vm[i + 1], sd)) : 0;
    row[(b * 16 + i) / 2] = uint8_t(lo | (hi << 4));
  }
}

// =====================================================================================
// K pages encoded from their staged rows: one thread per (page, KV head, channel pair)
// =====================================================================================
__global__ void kpc4_encode_kernel(const Kpc4Write w) {
  const int np = w.D / 2, item = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (item >= w.n_full * w.n_kv * np) return;
  const int i = item % np, g = item / np % w.n_kv, j = item / np / w.n_kv;
  const size_t ld = size_t(w.n_kv) * w.D;
  const float* x = w.full_src[j] + size_t(g) * w.D;
  uint8_t* dst = w.k_pages + (size_t(w.full_pages[j]) * w.n_kv + g) * kpc4_head_bytes(w.D);
  uint8_t* lo_b = dst + size_t(kPage) * w.D / 2;
  uint8_t* st_b = lo_b + w.D;
  uint32_t codes[kPage] = {};
  for (int h = 0; h < 2; ++h) {
    const int c = 2 * i + h;
    double mn = x[c], mx = x[c];
    for (int t = 1; t < kPage; ++t) {
      const double val = x[size_t(t) * ld + c];
      mn = fmin(mn, val), mx = fmax(mx, val);
    }
    const uint8_t lc = e4m3_below(mn);
    const double lo = e4m3_val(lc);
    const uint8_t sc = e4m3_above((mx - lo) / 15.0);
    const double d = e4m3_val(sc);
    lo_b[c] = lc, st_b[c] = sc;
    for (int t = 0; t < kPage; ++t) {
      const double q = d > 0 ? rint((double(x[size_t(t) * ld + c]) - lo) / d) : 0.0;
      codes[t] |= uint32_t(fmin(fmax(q, 0.0), 15.0)) << (4 * h);
    }
  }
  for (int t = 0; t < kPage; ++t) dst[size_t(t) * w.D / 2 + i] = uint8_t(codes[t]);
}

// =====================================================================================
// Pages to f32 rows (kpc4_decode_page_ref, kv_nvfp4_decode_row): one thread per value pair
// =====================================================================================
__global__ void kpc4_pages_f32_kernel(const uint8_t* __restrict__ kp, const uint8_t* __restrict__ vp,
                                      const int32_t* __restrict__ pages, int n, int n_kv, int D,
                                      float* __restrict__ wk, float* __restrict__ wv) {
  const int np = D / 2;
  const size_t item = size_t(blockIdx.x) * kThreadsF32 + threadIdx.x;
  if (item >= size_t(n) * kPage * n_kv * np) return;
  const int i = int(item % np), g = int(item / np % n_kv), t = int(item / np / n_kv % kPage);
  const int j = int(item / np / n_kv / kPage);
  const int page = pages[j];
  const uint8_t* kh = kp + (size_t(page) * n_kv + g) * kpc4_head_bytes(D);
  const uint8_t* lo_b = kh + size_t(kPage) * D / 2;
  const uint8_t* st_b = lo_b + D;
  const uint32_t code = kh[size_t(t) * D / 2 + i];
  const size_t o = ((size_t(j) * kPage + t) * n_kv + g) * D + 2 * i;
  wk[o] = fmaf(float(code & 15u), e4m3_val(st_b[2 * i]), e4m3_val(lo_b[2 * i]));
  wk[o + 1] = fmaf(float(code >> 4), e4m3_val(st_b[2 * i + 1]), e4m3_val(lo_b[2 * i + 1]));
  const uint8_t* vr = vp + ((size_t(page) * kPage + t) * n_kv + g) * (D / 2 + D / 16);
  const uint32_t vc = vr[i];
  const float s = e4m3_val(vr[D / 2 + 2 * i / 16]);
  wv[o] = e2m1_value(vc & 15u) * s;
  wv[o + 1] = e2m1_value(vc >> 4) * s;
}

}  // namespace

// =====================================================================================
// Launchers
// =====================================================================================
cudaError_t kpc4_kv_write(const Kpc4Write& w, const float* k, const float* v, int ld, int M, cudaStream_t stream) {
  if (w.D % 16 != 0 || w.D < 16 || w.n_kv < 1 || M < 0 || w.n_full < 0) return cudaErrorInvalidValue;
  if (M > 0) {
    const int items = M * w.n_kv * (w.D / 16);
    const cudaError_t e =
        launch_kernel(kpc4_stage_kernel, dim3(unsigned((items + kThreads - 1) / kThreads)), dim3(kThreads), stream, false, w, k, v, ld, M);
    if (e != cudaSuccess) return e;
  }
  if (w.n_full > 0) {  // after the stage kernel on the stream: the 16th rows are in place
    const int items = w.n_full * w.n_kv * (w.D / 2);
    return launch_kernel(kpc4_encode_kernel, dim3(unsigned((items + kThreads - 1) / kThreads)), dim3(kThreads), stream, false, w);
  }
  return cudaSuccess;
}

cudaError_t kpc4_pages_to_f32(const void* k_pages, const void* v_pages, const int32_t* pages, int n, int n_kv, int D,
                              float* wk, float* wv, cudaStream_t stream) {
  if (D % 16 != 0 || D < 16 || n_kv < 1) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  const size_t items = size_t(n) * kPage * n_kv * (D / 2);
  return launch_kernel(kpc4_pages_f32_kernel, dim3(unsigned((items + kThreadsF32 - 1) / kThreadsF32)), dim3(kThreadsF32), stream, false,
                       static_cast<const uint8_t*>(k_pages), static_cast<const uint8_t*>(v_pages), pages, n, n_kv, D,
                       wk, wv);
}

}  // namespace kvdeck::cuda
