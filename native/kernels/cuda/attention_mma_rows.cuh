// attention_mma_rows.cuh — the KV rows of attention_mma.cu's split kernel: the pool formats'
// layouts (Fmt), a lane's raw K / V bytes for one 16-token chunk (KvRegs, load_chunk; 2-byte
// aligned rows by funnel shifts) and their conversion to f16 pairs for the MMAs (E2M1 x E4M3
// and int8, exact in f16). Included by attention_mma.cu and attention_kpc4.cu (inside their anonymous namespaces).
#pragma once
#include <cstdint>

#include "common.cuh"
#include "kernels_cuda.h"

namespace kvdeck::cuda {
namespace {

using namespace detail;

__device__ __forceinline__ uint32_t h2bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits2h(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// An E4M3 byte as an exact f16 (the /256 bit placement, then x256, exact in f16).
__device__ __forceinline__ __half2 e4m3_h2(uint32_t b) {
  const uint32_t h = ((b & 0x7Fu) << 7) | ((b & 0x80u) << 8);
  return __hmul2(bits2h(h | (h << 16)), __float2half2_rn(256.0f));
}

// Row layouts (kv_pool.h): F16 f16 [D]; NVFP4 codes [D/2] + E4M3 block scales [D/16]; NVFP4R
// the same + an f16 row scale (K and V); K8V4 K int8 [D] + f16 row scale, V as NVFP4R.
template <KvFormat F>
struct Fmt {
  static constexpr bool kF16 = F == KvFormat::F16;
  static constexpr bool kK8 = F == KvFormat::K8V4;                            // K rows int8
  static constexpr bool kRowScale = F == KvFormat::NVFP4R || F == KvFormat::K8V4;  // f16 row scales
  template <int D>
  __host__ __device__ static constexpr size_t krow() { return kF16 ? 2 * D : kK8 ? D + 2 : D / 2 + D / 16 + (kRowScale ? 2 : 0); }
  template <int D>
  __host__ __device__ static constexpr size_t vrow() { return kF16 ? 2 * D : D / 2 + D / 16 + (kRowScale ? 2 : 0); }
  // the alignment a lane's K / V segment can rely on (row start + segment offset)
  template <int D>
  __host__ __device__ static constexpr int align() { return kF16 ? 16 : kRowScale ? 2 : D == 128 ? 8 : 4; }
};

// Raw bytes of the lane's K segment (D/4 values: E2M1 codes or int8) and V rows (4-bit formats).
template <KvFormat F, int D>
struct KvRegs {
  using T = Fmt<F>;
  static constexpr int KW = T::kK8 ? D / 16 : D / 32;  // u32 per K segment (D/4 values)
  static constexpr int VW = D / 64;                     // u32 per V slice (D/8 values)
  uint32_t k[2][KW], ks[2];   // tiles 0, 1: token g and g + 8; ks: block scale bytes (4-bit K)
  uint32_t v[4][VW], vs[4];   // rows 2t, 2t+1, 2t+8, 2t+9
  uint32_t rk[2], rv[2];      // row scales (f16 pairs) of the K / V rows {2t, 2t+1}, {2t+8, 2t+9}
};

// n u32 words from p, which is A-byte aligned (A = 2: aligned words joined by funnel shifts).
template <int A>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t* w, int n) {
  if constexpr (A == 16) {
    for (int i = 0; i < n; i += 4) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i / 4);
      w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
    }
  } else if constexpr (A == 8) {
    for (int i = 0; i < n; i += 2) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i / 2);
      w[i] = v.x, w[i + 1] = v.y;
    }
  } else if constexpr (A == 4) {
    for (int i = 0; i < n; ++i) w[i] = __ldg(reinterpret_cast<const uint32_t*>(p) + i);
  } else {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* b = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    const uint32_t sh = uint32_t(a & 3u) * 8u;  // 0 or 16
    uint32_t prev = __ldg(b);
    for (int i = 0; i < n; ++i) {
      const uint32_t next = i + 1 < n || sh ? __ldg(b + i + 1) : 0u;  // no read past the segment
      w[i] = __funnelshift_r(prev, next, sh);
      prev = next;
    }
  }
}

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }

template <KvFormat F, int D>
__device__ __forceinline__ void load_chunk(KvRegs<F, D>& r, const uint8_t* kb, const uint8_t* vb, size_t row0,
                                           int n_kv, int g_kv, int valid, int gid, int tig) {
  using R = KvRegs<F, D>;
  using T = Fmt<F>;
  constexpr size_t KR = T::template krow<D>(), VR = T::template vrow<D>();
  constexpr int A = T::template align<D>();
  auto row = [&](int j) { return (row0 + size_t(min(j, valid - 1))) * n_kv + g_kv; };
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
    const uint8_t* p = kb + row(gid + 8 * tile) * KR;
    if constexpr (T::kK8) {
      load_words<2>(p + tig * (D / 4), r.k[tile], R::KW);
      r.ks[tile] = 0;
    } else {
      load_words<A>(p + tig * (D / 8), r.k[tile], R::KW);
      r.ks[tile] = D == 128 ? ld_u16(p + D / 2 + 2 * tig) : __ldg(p + D / 2 + tig);
    }
  }
  const int rows[4] = {2 * tig, 2 * tig + 1, 2 * tig + 8, 2 * tig + 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const size_t ri = row(rows[i]);
    const uint8_t* p = vb + ri * VR;
    load_words<A>(p + gid * (D / 16), r.v[i], R::VW);
    r.vs[i] = __ldg(p + D / 2 + gid * (D / 8) / 16);
    if constexpr (T::kRowScale) {
      const uint32_t sv = ld_u16(p + D / 2 + D / 16);
      const uint32_t sk = ld_u16(kb + ri * KR + (T::kK8 ? D : D / 2 + D / 16));
      if (i % 2 == 0) r.rv[i / 2] = sv, r.rk[i / 2] = sk;
      else r.rv[i / 2] |= sv << 16, r.rk[i / 2] |= sk << 16;
    }
  }
}

// Four int8 (one word) as two exact half2: 1024 + (x + 128) by bit placement, minus 1152.
__device__ __forceinline__ void i8x4_to_half2x2(uint32_t w, uint32_t h[2]) {
  const uint32_t t = w ^ 0x80808080u;
  const __half2 off = __float2half2_rn(1152.0f);
  h[0] = h2bits(__hsub2(bits2h(prmt(t, 0x64646464u, 0x4140u)), off));
  h[1] = h2bits(__hsub2(bits2h(prmt(t, 0x64646464u, 0x4342u)), off));
}

// A lane's NVFP4 codes (nw words) as half2, times the scale of each 16-value block (exact).
template <KvFormat F>
__device__ __forceinline__ void to_half2(const uint32_t* w, int nw, uint32_t scales, uint32_t* h) {
  for (int i = 0; i < nw; ++i) {
    uint32_t q[4];
    e2m1x8_to_half2x4(w[i], q);
    const __half2 s = e4m3_h2((scales >> (8 * (i / 2))) & 0xFFu);  // words 2b, 2b+1: block b
#pragma unroll
    for (int j = 0; j < 4; ++j) h[4 * i + j] = h2bits(__hmul2(bits2h(q[j]), s));
  }
}

}  // namespace
}  // namespace kvdeck::cuda
