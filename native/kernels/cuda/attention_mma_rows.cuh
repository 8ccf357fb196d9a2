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
  uint32_t rk[2], rv[2];      // row scales (f16): K rows g, g + 8 (low half); V rows {2t, 2t+1}, {2t+8, 2t+9} (pairs)
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

// A lane's byte offsets inside a chunk, fixed for the kernel (session 8: session 7's loader
// recomputed the 64-bit address of each of its 14 loads every chunk, ~100 of the chunk's ~550
// instructions; with these a chunk costs one 64-bit base per pool and an add per load). Row j of
// a chunk is pool row (row0 + j) n_kv + g_kv; the lane reads K rows g, g + 8 (D/4 values from
// t D/4, and their block scale bytes) and V rows 2t, 2t+1, 2t+8, 2t+9 (D/8 values from g D/8,
// one block scale byte). rk / rv: bytes from one token to the next (n_kv rows).
struct LaneRows {
  uint32_t kc, dks, dkr;  // K row g: the lane's codes; its block scale(s), the row scale (row-scaled formats) after them
  uint32_t vc, dvs, dvr;  // V row 2t: the same
  uint32_t rk, rv;
};
template <KvFormat F, int D>
__device__ __forceinline__ LaneRows lane_rows(int n_kv, int g_kv, int gid, int tig) {
  using T = Fmt<F>;
  constexpr uint32_t KR = uint32_t(T::template krow<D>()), VR = uint32_t(T::template vrow<D>());
  constexpr uint32_t KSEG = T::kK8 ? D / 4 : D / 8;  // bytes of a lane's K segment
  LaneRows o;
  o.rk = uint32_t(n_kv) * KR, o.rv = uint32_t(n_kv) * VR;
  // the scales lie after every lane's segment: the differences are positive
  o.kc = (uint32_t(gid * n_kv + g_kv)) * KR + uint32_t(tig) * KSEG;
  o.dks = D / 2 + (D == 128 ? 2 * tig : tig) - tig * KSEG;
  o.dkr = (T::kK8 ? D : D / 2 + D / 16) - tig * KSEG;
  o.vc = (uint32_t(2 * tig * n_kv + g_kv)) * VR + uint32_t(gid) * (D / 16);
  o.dvs = D / 2 + gid * (D / 8) / 16 - gid * (D / 16);
  o.dvr = D / 2 + D / 16 - gid * (D / 16);
  return o;
}

// A lane's K / V bytes of one chunk (KvRegs) through lane_rows' offsets: row0 = the chunk's first
// token's pool row (page slot x block + offset); one 64-bit base per pool and chunk, then a
// 64-bit add per pointer (the +8 of a K segment's second word is the load's immediate).
// kClamp (rows >= valid re-read row valid - 1): the row-scaled formats need it (a stale f16
// scale can be Inf / NaN). NVFP4 rows decode to finite values from any bytes, and a chunk never
// leaves its page, so past-the-end rows are read as they are (their scores are masked, their p
// is 0): no clamp.
template <KvFormat F, int D, bool kClamp>
__device__ __forceinline__ void load_chunk(KvRegs<F, D>& r, const uint8_t* kb, const uint8_t* vb, uint32_t row0,
                                              const LaneRows& o, int valid, int gid, int tig) {
  using R = KvRegs<F, D>;
  using T = Fmt<F>;
  constexpr int A = T::template align<D>();
  const uint8_t* kl = kb + (size_t(row0) * o.rk + o.kc);  // K row g, the lane's segment
  const uint8_t* vl = vb + (size_t(row0) * o.rv + o.vc);  // V row 2t
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
    const int j = gid + 8 * tile;
    const uint8_t* p = kClamp ? kl + ptrdiff_t(min(j, valid - 1) - gid) * int(o.rk) : kl + (tile ? 8 * o.rk : 0u);
    if constexpr (T::kK8) {
      load_words<2>(p, r.k[tile], R::KW);
      r.ks[tile] = 0;
    } else {
      load_words<A>(p, r.k[tile], R::KW);
      r.ks[tile] = D == 128 ? ld_u16(p + o.dks) : __ldg(p + o.dks);
    }
    if constexpr (T::kRowScale) r.rk[tile] = ld_u16(p + o.dkr);
  }
  constexpr int rows[4] = {0, 1, 8, 9};  // V rows 2t + these
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* p = kClamp ? vl + ptrdiff_t(min(2 * tig + rows[i], valid - 1) - 2 * tig) * int(o.rv)
                              : vl + uint32_t(rows[i]) * o.rv;
    load_words<A>(p, r.v[i], R::VW);
    r.vs[i] = __ldg(p + o.dvs);
    if constexpr (T::kRowScale) {
      const uint32_t sv = ld_u16(p + o.dvr);
      if (i % 2 == 0) r.rv[i / 2] = sv;
      else r.rv[i / 2] |= sv << 16;
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

// ---- NVFP4 by bit placement (attention_mma.cu's split kernel) ----------------------------------
// An E2M1 code's bits placed in an f16 (sign to bit 15, the exponent's two bits to the f16
// exponent's low two, the mantissa bit to the f16 mantissa's top) is the code's value x 2^-14,
// for all 16 codes (E2M1's subnormal 0.5 lands on f16's subnormal 2^-15). Per byte of w: the
// high byte of that f16 for the byte's low nibble (e) and high nibble (o); 7 integer ops.
__device__ __forceinline__ void e2m1_hi_bytes(uint32_t w, uint32_t& e, uint32_t& o) {
  o = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
  e = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t hi_bytes02(uint32_t y) { return prmt(y, 0u, 0x2404u); }  // [0, b0, 0, b2]
__device__ __forceinline__ uint32_t hi_bytes13(uint32_t y) { return prmt(y, 0u, 0x3414u); }  // [0, b1, 0, b3]

// The NVFP4 scale factor: block scales (E4M3) are applied as f16 scale x 2^7 (448 x 2^7 fits
// f16), so a decoded value is value x 2^-7 (exact: e2m1 x e4m3 products have <= 6 significant
// bits and are multiples of 2^-17 >= f16's 2^-24); Q (K side) and the output (V side) carry 2^7.
constexpr float kNvfp4Shift = 128.0f;
// Two E4M3 bytes (b0 bits 0-7, b1 bits 16-23) as f16 pair of scale x 2^7 (bit placement: / 256).
__device__ __forceinline__ __half2 e4m3x2_h2_x128(uint32_t b) {
  const uint32_t h = ((b & 0x007F007Fu) << 7) | ((b & 0x00800080u) << 8);
  return __hmul2(bits2h(h), __float2half2_rn(32768.0f));
}

// The two E4M3 block scales of a u16 (blocks b, b + 1: bits 0-7, 8-15) as the f16 pair (s_b, s_b+1) x 2^7.
__device__ __forceinline__ __half2 e4m3_u16_h2_x128(uint32_t u) { return e4m3x2_h2_x128(prmt(u, 0u, 0x4140u)); }

// One K word (8 codes c0..c7 of one token) times its block scale, given as the f16 pair (s, s)
// x 2^7 (a half of e4m3_u16_h2_x128): kh = (c0, c4), (c1, c5), (c2, c6), (c3, c7), each value
// x 2^-7 (Q pairs its D index the same way).
__device__ __forceinline__ void k_word_h2(uint32_t w, __half2 sc, uint32_t kh[4]) {
  uint32_t e, o;
  e2m1_hi_bytes(w, e, o);
  kh[0] = h2bits(__hmul2(bits2h(hi_bytes02(e)), sc));
  kh[1] = h2bits(__hmul2(bits2h(hi_bytes02(o)), sc));
  kh[2] = h2bits(__hmul2(bits2h(hi_bytes13(e)), sc));
  kh[3] = h2bits(__hmul2(bits2h(hi_bytes13(o)), sc));
}

// The same word of two V rows (tokens r0, r1; their scales sc = (s0, s1) x 2^7): h[p] = the
// half2 (r0, r1) of code p (p = 0..7), value x 2^-7 — the A operand's token pairs directly.
__device__ __forceinline__ void v_pair_h2(uint32_t w0, uint32_t w1, __half2 sc, uint32_t h[8]) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const uint32_t x = prmt(w0, w1, hf ? 0x7632u : 0x5410u);  // codes 4 hf .. 4 hf + 3 of r0, then r1
    uint32_t e, o;
    e2m1_hi_bytes(x, e, o);  // e: (r0 c0, r0 c2, r1 c0, r1 c2), o: the odd codes (of this half)
    h[4 * hf + 0] = h2bits(__hmul2(bits2h(hi_bytes02(e)), sc));
    h[4 * hf + 1] = h2bits(__hmul2(bits2h(hi_bytes02(o)), sc));
    h[4 * hf + 2] = h2bits(__hmul2(bits2h(hi_bytes13(e)), sc));
    h[4 * hf + 3] = h2bits(__hmul2(bits2h(hi_bytes13(o)), sc));
  }
}

}  // namespace
}  // namespace kvdeck::cuda
