// attention_neon.cpp — one context segment of causal attention on AArch64 NEON (compiled with
// -march=armv8.2-a+dotprod -ffp-contract=off on aarch64 only; attention_segment in
// attention_cpu.cpp routes here while the neon kernel set is active). Same contract and same
// step order as attention_segment_ref (ops_cpu.h): per page and query head, the scores, the
// running max / sum update, then o = o * alpha + sum_t p_t v_t.
//
// f16 pages are widened with fcvtl, nvfp4 pages through a 16-entry table of 2*e2m1 times
// e4m3 / 2 (products of two 4-bit significands: exact, the values kv_nvfp4_decode_row gives;
// code 8, -0, widens to +0, which no sum here can tell apart: every accumulator starts at +0).
// Views with fresh f32 rows (a chunk attending to its own unrounded K/V) read those for the
// positions they cover, as the reference does. Float kernel: scores sum 4 lanes in a
// different order than the reference and e^x is the Cephes polynomial (vec_neon.h, ~1 ulp)
// instead of libm; kernel_check states the bound.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_neon.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {
namespace {

using namespace neon;

constexpr int kMaxBlock = 256;  // tokens per page handled here (the reference's limit too)

// ============================================================================
// Page widening
// ============================================================================

// One nvfp4 row (codes [D/2], e4m3 scales [D/16]) to f32 [D].
void decode_nvfp4_row(const uint8_t* row, int D, float* x) {
  const int8x16_t lut = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};  // kE2m1x2
  const float* e4m3 = e4m3_table();
  const uint8_t* scales = row + D / 2;
  for (int b = 0; b < D / 16; ++b) {
    float s = e4m3[scales[b]];
    if (std::isnan(s)) s = 0.0f;  // as kv_codec_cpu.cpp (the encoder never writes NaN)
    const float32x4_t hs = vdupq_n_f32(s * 0.5f);
    const uint8x8_t c = vld1_u8(row + 8 * b);
    const int8x8_t lo = vqtbl1_s8(lut, vand_u8(c, vdup_n_u8(0x0F))), hi = vqtbl1_s8(lut, vshr_n_u8(c, 4));
    const int8x8x2_t z = vzip_s8(lo, hi);  // elements 0..7, 8..15
    const int16x8_t e0 = vmovl_s8(z.val[0]), e1 = vmovl_s8(z.val[1]);
    float* dst = x + 16 * b;
    vst1q_f32(dst + 0, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(e0))), hs));
    vst1q_f32(dst + 4, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(e0)), hs));
    vst1q_f32(dst + 8, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(e1))), hs));
    vst1q_f32(dst + 12, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(e1)), hs));
  }
}

// A view's fresh f32 rows (KvView::fresh_k / fresh_v / fresh0 / fresh_ld: tokens at positions
// >= fresh0 read from them instead of the pages, as attention_segment_ref does), where KvView
// has those fields; a view without them has no fresh rows.
template <typename KV, typename = void>
struct Fresh {
  static const float* rows(const KV&, bool) { return nullptr; }
  static int first(const KV&) { return 0; }
  static size_t ld(const KV&) { return 0; }
};
template <typename KV>
struct Fresh<KV, std::void_t<decltype(KV::fresh_k), decltype(KV::fresh0), decltype(KV::fresh_ld)>> {
  static const float* rows(const KV& kv, bool v) { return v ? kv.fresh_v : kv.fresh_k; }
  static int first(const KV& kv) { return kv.fresh0; }
  static size_t ld(const KV& kv) { return kv.fresh_ld; }
};

// Rows [0, n) of KV head g of the page holding positions tp.. as f32 rows: into the page (f32
// without fresh rows) or the widened tile. Returns the row stride in floats.
size_t page_rows(const KvView& kv, bool v, int page, int tp, int g, int n, float* tile, const float** rows) {
  const int D = kv.D;
  const void* base = v ? kv.v : kv.k;
  const float* fresh = Fresh<KvView>::rows(kv, v);
  if (kv.dtype == KvDType::F32 && fresh == nullptr) {
    *rows = static_cast<const float*>(base) + (size_t(page) * kv.block * kv.nkv + g) * D;
    return size_t(kv.nkv) * D;
  }
  const size_t rb = kv_row_bytes(kv.dtype, D);
  const uint8_t* p = static_cast<const uint8_t*>(base) + (size_t(page) * kv.block * kv.nkv + g) * rb;
  for (int t = 0; t < n; ++t, p += rb * kv.nkv) {
    float* dst = tile + size_t(t) * D;
    if (fresh && tp + t >= Fresh<KvView>::first(kv)) {
      std::memcpy(dst, fresh + size_t(tp + t - Fresh<KvView>::first(kv)) * Fresh<KvView>::ld(kv) + size_t(g) * D,
                  sizeof(float) * D);
    } else if (kv.dtype == KvDType::F32) {
      std::memcpy(dst, p, sizeof(float) * D);
    } else if (kv.dtype == KvDType::F16) {
      const auto* h = reinterpret_cast<const uint16_t*>(p);
      for (int c = 0; c < D; c += 8) {
        const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h + c));
        vst1q_f32(dst + c, vcvt_f32_f16(vget_low_f16(v)));
        vst1q_f32(dst + c + 4, vcvt_high_f32_f16(v));
      }
    } else {
      decode_nvfp4_row(p, D, dst);
    }
  }
  *rows = tile;
  return size_t(D);
}

// ============================================================================
// One query head over one page
// ============================================================================

// o[0, 4*NC) = o * alpha + sum_t p[t] * v_t[0, 4*NC), NC accumulators in registers.
template <int NC>
inline void accumulate(float* oh, const float* V, size_t vs, int n, const float* p, float alpha) {
  float32x4_t acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = vmulq_n_f32(vld1q_f32(oh + 4 * c), alpha);
  for (int t = 0; t < n; ++t) {
    const float32x4_t pt = vdupq_n_f32(p[t]);
    const float* vt = V + t * vs;
    for (int c = 0; c < NC; ++c) acc[c] = vfmaq_f32(acc[c], pt, vld1q_f32(vt + 4 * c));
  }
  for (int c = 0; c < NC; ++c) vst1q_f32(oh + 4 * c, acc[c]);
}

// Scores of the page's n keys 4 at a time (lanes past n: -inf), the online softmax update of
// (m, l), then the weighted sum of V into o [D] (64 floats of o in registers per pass).
template <int D>
void page_step(const float* qh, const float* K, size_t ks, const float* V, size_t vs, int n, float scale,
               float* oh, float* m, float* l, float* p /*[kMaxBlock + 4]*/) {
  constexpr int Dv = D / 4;
  const int32x4_t lane = {0, 1, 2, 3};
  const float32x4_t ninf = vdupq_n_f32(-INFINITY);
  float32x4_t vmax = ninf;
  for (int t = 0; t < n; t += 4) {
    const float* kr[4];
    for (int j = 0; j < 4; ++j) kr[j] = K + size_t(t + j < n ? t + j : n - 1) * ks;
    float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int c = 0; c < Dv; ++c) {
      const float32x4_t qc = vld1q_f32(qh + 4 * c);
      for (int j = 0; j < 4; ++j) a[j] = vfmaq_f32(a[j], qc, vld1q_f32(kr[j] + 4 * c));
    }
    float32x4_t s = vmulq_n_f32(vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])), scale);
    s = vbslq_f32(vcltq_s32(vaddq_s32(lane, vdupq_n_s32(t)), vdupq_n_s32(n)), s, ninf);
    vst1q_f32(p + t, s);
    vmax = vmaxq_f32(vmax, s);
  }
  const float mx = vmaxvq_f32(vmax);
  const float m_new = mx > *m ? mx : *m;
  const float alpha = flush_exp(*m - m_new);  // 0 on the first page (m = -inf)
  const float32x4_t vm = vdupq_n_f32(m_new);
  float32x4_t psum = vdupq_n_f32(0.0f);
  for (int t = 0; t < n; t += 4) {
    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(p + t), vm));  // -inf lanes: exactly 0
    vst1q_f32(p + t, e);
    psum = vaddq_f32(psum, e);
  }
  *l = *l * alpha + vaddvq_f32(psum);
  *m = m_new;
  constexpr int NC0 = Dv < 16 ? Dv : 16;
  accumulate<NC0>(oh, V, vs, n, p, alpha);
  if constexpr (Dv > 16) accumulate<Dv - 16>(oh + 64, V + 64, vs, n, p, alpha);
}

template <int D>
void segment(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale, float* o, float* m,
             float* l, float* tile) {
  const int B = kv.block;
  float* ktile = tile;                  // [B, D]
  float* vtile = tile + size_t(B) * D;  // [B, D]
  float p[kMaxBlock + 4];               // one page's scores / probabilities
  for (int h = 0; h < G; ++h) m[h] = -INFINITY, l[h] = 0.0f;
  std::memset(o, 0, sizeof(float) * G * D);
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    const float *K, *V;
    const size_t ks = page_rows(kv, false, page, ps, g, n, ktile, &K);
    const size_t vs = page_rows(kv, true, page, ps, g, n, vtile, &V);
    for (int h = 0; h < G; ++h)  // the G heads of the group share the widened page (GQA)
      page_step<D>(q + size_t(h) * D, K, ks, V, vs, n, scale, o + size_t(h) * D, m + h, l + h, p);
  }
}

}  // namespace

void attention_segment_neon(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale,
                            float* o, float* m, float* l, float* tile) {
  if (kv.block <= kMaxBlock) switch (kv.D) {
      case 64: return segment<64>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
      case 128: return segment<128>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
      case 32: return segment<32>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
      case 96: return segment<96>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
      default: break;
    }
  attention_segment_ref(kv, g, q, G, t0, t1, scale, o, m, l, tile);
}

}  // namespace kvdeck::cpu
#endif  // __aarch64__
