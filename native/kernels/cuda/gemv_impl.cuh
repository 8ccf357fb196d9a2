// gemv_impl.cuh — the GEMV building blocks shared by gemv.cu, gemv_many.cu and gemv_fused.cu:
// argument struct, per-format chunk loads, weight decode, the int8 / f16 dot of
// one 32-value chunk, the warp body of the batch-1..8 GEMV and its one-wave configuration.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"

namespace kvdeck::cuda::detail::gemv {

// A lane handles chunks c = lane, lane + 32, ... of a row: 32 values, 16 code bytes (one
// 16-byte load) and their scale bits; the chunk's activations are loaded once per activation
// row and dotted with every weight row the warp owns.

// Nvfp4PosNeg: the alternative integer decode, by measurement (gpu_bench's tune rows): two
// byte-permute lookups of the magnitudes (prmt's sign-replicate mode zeroes the codes of the
// other sign) and two __dp4a per word, instead of a signed three-permute lookup.
enum class Fmt { Nvfp4Dp4a, Nvfp4F16, W4a8, Nvfp4PosNeg };

struct GemvArgs {
  const uint8_t* codes;    // [N, Kp/2]
  const void* scales;      // nvfp4: u8 [N, Kp/16] | w4a8: f16 [N, Kp/group]
  float tscale;            // nvfp4 only
  int group;               // w4a8 only
  int N, Kp;
  const int8_t* xq;        // [M, Kp]   (int8 paths)
  const float* xd;         // [M, Kp/32]
  const int32_t* xs;       // [M, Kp/32] (w4a8)
  const __half* xh;        // [M, Kp]   (f16 path)
  float* y;
  int ldy;
};

constexpr int kGemvWarps = 4;  // warps per block (each independent)

template <Fmt F>
struct Chunk {  // one row's chunk: 16 code bytes and its scale bits
  uint4 w;
  uint32_t sc;
};

template <Fmt F>
__device__ __forceinline__ Chunk<F> load_chunk(const GemvArgs& a, int n, int c) {
  Chunk<F> k;
  k.w = __ldg(reinterpret_cast<const uint4*>(a.codes + size_t(n) * (a.Kp / 2)) + c);
  if constexpr (F == Fmt::W4a8) {
    const int ng = a.Kp / a.group;
    k.sc = __ldg(static_cast<const uint16_t*>(a.scales) + size_t(n) * ng + c / (a.group / 32));
  } else {
    k.sc = __ldg(reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(a.scales) +
                                                    size_t(n) * (a.Kp / 16)) + c);
  }
  return k;
}

template <Fmt F>
struct Act {  // one activation row's chunk
  uint4 v[F == Fmt::Nvfp4F16 ? 4 : 2];
  float d;
  int s;
};

template <Fmt F>
__device__ __forceinline__ Act<F> load_act(const GemvArgs& a, int m, int c) {
  Act<F> x;
  if constexpr (F == Fmt::Nvfp4F16) {
    const uint4* p = reinterpret_cast<const uint4*>(a.xh + size_t(m) * a.Kp) + 4 * c;
#pragma unroll
    for (int j = 0; j < 4; ++j) x.v[j] = __ldg(p + j);
    x.d = 0.f, x.s = 0;
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(a.xq + size_t(m) * a.Kp) + 2 * c;
    x.v[0] = __ldg(p);
    x.v[1] = __ldg(p + 1);
    x.d = __ldg(a.xd + size_t(m) * (a.Kp / 32) + c);
    x.s = F == Fmt::W4a8 ? __ldg(a.xs + size_t(m) * (a.Kp / 32) + c) : 0;
  }
  return x;
}

// Weights of a chunk decoded once, then dotted with each activation row.
template <Fmt F>
struct Decoded {
  uint32_t v[F == Fmt::Nvfp4F16 || F == Fmt::Nvfp4PosNeg ? 16 : 8];
  float2 sw;
};

template <Fmt F>
__device__ __forceinline__ Decoded<F> decode(const Chunk<F>& k) {
  Decoded<F> d;
  const uint32_t q[4] = {k.w.x, k.w.y, k.w.z, k.w.w};
  if constexpr (F == Fmt::Nvfp4Dp4a) {
#pragma unroll
    for (int j = 0; j < 4; ++j) e2m1x8_to_i8x2(q[j], d.v[2 * j], d.v[2 * j + 1]);
    d.sw = e4m3x2_to_float2_div256(k.sc);
  } else if constexpr (F == Fmt::Nvfp4F16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) e2m1x8_to_half2x4(q[j], d.v + 4 * j);
    d.sw = e4m3x2_to_float2_div256(k.sc);
  } else if constexpr (F == Fmt::Nvfp4PosNeg) {
    // 2*|e2m1| table; a selector nibble with bit 3 set (the other sign) yields 0x00
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t qx = q[j] ^ 0x88888888u;
      d.v[2 * j] = prmt(kE2m1x2Pos0, kE2m1x2Pos1, q[j]);             // positive codes, elements 0-3
      d.v[2 * j + 1] = prmt(kE2m1x2Pos0, kE2m1x2Pos1, q[j] >> 16);   // elements 4-7
      d.v[8 + 2 * j] = prmt(kE2m1x2Pos0, kE2m1x2Pos1, qx);           // negative codes' magnitudes
      d.v[8 + 2 * j + 1] = prmt(kE2m1x2Pos0, kE2m1x2Pos1, qx >> 16);
    }
    d.sw = e4m3x2_to_float2_div256(k.sc);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = q[j] & 0x0F0F0F0Fu, hi = (q[j] >> 4) & 0x0F0F0F0Fu;
      d.v[2 * j] = prmt(lo, hi, 0x5140u);      // elements 8j .. 8j+3 (offset binary)
      d.v[2 * j + 1] = prmt(lo, hi, 0x7362u);  // elements 8j+4 .. 8j+7
    }
    d.sw.x = __half2float(__ushort_as_half(uint16_t(k.sc)));
    d.sw.y = 0.f;
  }
  return d;
}

template <Fmt F>
__device__ __forceinline__ float dot(const Decoded<F>& w, const Act<F>& x, float acc) {
  if constexpr (F == Fmt::Nvfp4F16) {
    const uint32_t* av = reinterpret_cast<const uint32_t*>(x.v);
    __half2 b0 = __float2half2_rn(0.0f), b1 = b0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      b0 = __hfma2(*reinterpret_cast<const __half2*>(&w.v[j]), *reinterpret_cast<const __half2*>(&av[j]), b0);
      b1 = __hfma2(*reinterpret_cast<const __half2*>(&w.v[8 + j]), *reinterpret_cast<const __half2*>(&av[8 + j]), b1);
    }
    const float2 f0 = __half22float2(b0), f1 = __half22float2(b1);
    return fmaf(w.sw.x, f0.x + f0.y, fmaf(w.sw.y, f1.x + f1.y, acc));
  } else {
    const int* av = reinterpret_cast<const int*>(x.v);
    if constexpr (F == Fmt::Nvfp4PosNeg) {
      int s0 = 0, s1 = 0, n0 = 0, n1 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) s0 = __dp4a(int(w.v[j]), av[j], s0), n0 = __dp4a(int(w.v[8 + j]), av[j], n0);
#pragma unroll
      for (int j = 4; j < 8; ++j) s1 = __dp4a(int(w.v[j]), av[j], s1), n1 = __dp4a(int(w.v[8 + j]), av[j], n1);
      return fmaf(x.d, fmaf(w.sw.x, float(s0 - n0), w.sw.y * float(s1 - n1)), acc);
    } else if constexpr (F == Fmt::Nvfp4Dp4a) {
      int s0 = 0, s1 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) s0 = __dp4a(int(w.v[j]), av[j], s0);
#pragma unroll
      for (int j = 4; j < 8; ++j) s1 = __dp4a(int(w.v[j]), av[j], s1);
      return fmaf(x.d, fmaf(w.sw.x, float(s0), w.sw.y * float(s1)), acc);
    } else {
      int s = -8 * x.s;
#pragma unroll
      for (int j = 0; j < 8; ++j) s = __dp4a(int(w.v[j]), av[j], s);
      return fmaf(x.d * w.sw.x, float(s), acc);
    }
  }
}

// =====================================================================================
// The GEMV warp and its launch configuration (gemv.cu, gemv_many.cu)
// =====================================================================================

// The body of one warp: rows n0 .. n0 + R - 1 of a (gemv_kernel; gemv_many_kernel per weight).
template <Fmt F, int M, int R, int U, bool PF>
__device__ __forceinline__ void gemv_warp(const GemvArgs& a, int n0) {
  const int lane = threadIdx.x & 31;
  if (n0 >= a.N) return;
  const int nc = a.Kp / 32;
  pdl_launch_dependents();
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

}  // namespace kvdeck::cuda::detail::gemv
