// fused_impl.cuh — device code of the fused decode-step kernels (fused.cu): the q8 quantiser of
// 32 values held four per lane (one per lane: common.cuh quant_block), and RoPE + KV-row
// encoding of one work item.
#pragma once
#include <cstdint>

#include "common.cuh"

namespace kvdeck::cuda::detail {

// quant_block's quantiser over 32 values held 4 per lane by 8 aligned lanes (lanes 8j .. 8j+7 of a
// warp hold one 32-block, values 4 * (lane % 8) ..): bit-identical q, d, s (max and integer
// sum do not depend on order). v: values (0 where not live); k: index of v[0] in the row;
// every lane calls it (shuffles), only k < Kp stores.
__device__ __forceinline__ void quant_block4(const float (&v)[4], int k, int Kp, int8_t* q, float* d, int32_t* s) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int qi[4], sum = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) sum += qi[e] = int(fmaxf(-127.0f, fminf(127.0f, rintf(v[e] * id))));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (k >= Kp) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) q[k + e] = int8_t(qi[e]);
  if ((k & 31) == 0) {
    d[k / 32] = amax / 127.0f;
    s[k / 32] = sum;
  }
}

// ---- RoPE of q and k and the KV write ------------------------------------------------
__device__ __forceinline__ float from_e4m3(uint8_t b) {  // formats.cpp e4m3_to_f32 (finite codes)
  const uint32_t sign = uint32_t(b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
  if (e != 0) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
  return __uint_as_float(sign | __float_as_uint(float(m) * __uint_as_float(0x3B000000u)));
}
__device__ __forceinline__ uint8_t to_e2m1(float f) {  // formats.cpp f32_to_e2m1
  const uint8_t sign = uint8_t((__float_as_uint(f) >> 28) & 0x8u);
  const float a = fabsf(f);
  return uint8_t(sign | ((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f)));
}

// Rotated value d of a head x (rotate-half, as elementwise.cu's rope_kernel); roped_sc with the
// sine and cosine of its angle given (the rows kernel computes them once for all heads).
__device__ __forceinline__ float roped_sc(const float* x, int d, int half, float sn, float cs) {
  const int i = d < half ? d : d - half;
  const float a = __ldcg(x + i), b = __ldcg(x + i + half);  // L2: another block may have written x
  return d < half ? a * cs - b * sn : b * cs + a * sn;
}
__device__ __forceinline__ float roped(const float* x, int d, int half, float p, const float* inv_freq) {
  float sn, cs;
  sincosf(p * inv_freq[d < half ? d : d - half], &sn, &cs);
  return roped_sc(x, d, half, sn, cs);
}

struct RopeKvArgs {
  float* q;
  int ldq, nh;  // nh = 0: no q
  const float* k;
  const float* v;
  int ldk, nkv, D, M;
  const int32_t* pos;
  const float* inv_freq;
  int fmt;  // 0 f32, 1 f16, 2 NVFP4 (kv_write's formats)
  uint8_t* kb;
  uint8_t* vb;
  const int32_t* slots;
  int32_t* ctx;  // optional: ctx[0] = pos[0] + 1
};

// Items: [0, M*nh*D/2) rotate q pairs in place; then (m, g, unit) items write K (roped) and
// V rows of token m into its slot: a unit is one value (f32 / f16) or one 16-value block
// (NVFP4, the CPU's kv_nvfp4_encode_row).
__host__ __device__ __forceinline__ size_t rope_kv_items(const RopeKvArgs& a) {
  return size_t(a.M) * a.nh * (a.D / 2) + size_t(a.M) * a.nkv * (a.fmt == 2 ? a.D / 16 : a.D);
}

__device__ __forceinline__ void rope_kv_item(const RopeKvArgs& a, size_t idx) {
  const int D = a.D, half = D / 2;
  const size_t nq = size_t(a.M) * a.nh * half;
  const int per = a.fmt == 2 ? D / 16 : D;
  if (idx == 0 && a.ctx) a.ctx[0] = a.pos[0] + 1;
  if (idx < nq) {
    const int i = int(idx % half);
    const size_t rh = idx / half;
    const int r = int(rh / a.nh), h = int(rh % a.nh);
    float sn, cs;
    sincosf(float(a.pos[r]) * a.inv_freq[i], &sn, &cs);
    float* xh = a.q + size_t(r) * a.ldq + size_t(h) * D;
    const float x0 = __ldcg(xh + i), x1 = __ldcg(xh + i + half);
    xh[i] = x0 * cs - x1 * sn;
    xh[i + half] = x1 * cs + x0 * sn;
    return;
  }
  const size_t j = idx - nq;
  if (j >= size_t(a.M) * a.nkv * per) return;
  const int u = int(j % per), g = int(j / per % a.nkv), m = int(j / per / a.nkv);
  const int row_bytes = a.fmt == 0 ? 4 * D : a.fmt == 1 ? 2 * D : D / 2 + D / 16;
  const size_t dst = (size_t(a.slots[m]) * a.nkv + g) * row_bytes;
  const float* kr = a.k + size_t(m) * a.ldk + size_t(g) * D;
  const float* vr = a.v + size_t(m) * a.ldk + size_t(g) * D;
  const float p = float(a.pos[m]);
  if (a.fmt == 0) {
    reinterpret_cast<float*>(a.kb + dst)[u] = roped(kr, u, half, p, a.inv_freq);
    reinterpret_cast<float*>(a.vb + dst)[u] = __ldcg(vr + u);
    return;
  }
  if (a.fmt == 1) {
    reinterpret_cast<__half*>(a.kb + dst)[u] = __float2half_rn(roped(kr, u, half, p, a.inv_freq));
    reinterpret_cast<__half*>(a.vb + dst)[u] = __float2half_rn(__ldcg(vr + u));
    return;
  }
  for (int t = 0; t < 2; ++t) {
    float xb[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) xb[e] = t ? __ldcg(vr + u * 16 + e) : roped(kr, u * 16 + e, half, p, a.inv_freq);
    uint8_t* row = (t ? a.vb : a.kb) + dst;
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(xb[e]));
    const uint8_t sc = f32_to_e4m3_dev(__fdiv_rn(amax, 6.0f));
    const float sd = from_e4m3(sc);
    row[D / 2 + u] = sc;
#pragma unroll
    for (int e = 0; e < 16; e += 2) {
      const uint8_t lo = sd > 0.f ? to_e2m1(__fdiv_rn(xb[e], sd)) : 0;
      const uint8_t hi = sd > 0.f ? to_e2m1(__fdiv_rn(xb[e + 1], sd)) : 0;
      row[(u * 16 + e) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

// NVFP4 KV rows one value per thread (rope_kv_write's NVFP4 path): j = ((m * nkv + g) * 2 +
// t) * D + d (t 0: K roped, 1: V), so 16 aligned lanes hold one 16-value block; the block's
// amax by shuffles, then the same E4M3 scale and E2M1 codes as rope_kv_item's per-block loop
// (kv_nvfp4_encode_row), byte for byte. Every lane of the warp calls it (live: j in range).
// nvfp4_store_value is that encode and store of one value v at column d of a row (row: null where
// the lane is not live), also used by fused.cu's rows kernel.
__device__ __forceinline__ void nvfp4_store_value(float v, uint8_t* row, int d, int D) {
  float amax = fabsf(v);
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const uint8_t sc = f32_to_e4m3_dev(__fdiv_rn(amax, 6.0f));
  const float sd = from_e4m3(sc);
  const uint32_t code = sd > 0.f ? to_e2m1(__fdiv_rn(v, sd)) : 0u;
  const uint32_t other = __shfl_xor_sync(0xffffffffu, code, 1);
  if (!row) return;
  if (d % 2 == 0) row[d / 2] = uint8_t(code | (other << 4));
  if (d % 16 == 0) row[D / 2 + d / 16] = sc;
}
__device__ __forceinline__ void kv_nvfp4_value(const RopeKvArgs& a, size_t j, bool live) {
  const int D = a.D, d = int(j % D), t = int(j / D % 2), g = int(j / D / 2 % a.nkv), m = int(j / D / 2 / a.nkv);
  float v = 0.0f;
  uint8_t* row = nullptr;
  if (live) {
    const float* kr = a.k + size_t(m) * a.ldk + size_t(g) * D;
    const float* vr = a.v + size_t(m) * a.ldk + size_t(g) * D;
    v = t ? __ldcg(vr + d) : roped(kr, d, D / 2, float(a.pos[m]), a.inv_freq);
    row = (t ? a.vb : a.kb) + (size_t(a.slots[m]) * a.nkv + g) * (D / 2 + D / 16);
  }
  nvfp4_store_value(v, row, d, D);
}

}  // namespace kvdeck::cuda::detail
