// attention_prefill_neon.cpp — prefill attention on AArch64 NEON: many query rows over the
// f32 pages of one segment, flash-attention style (compiled with -march=armv8.2-a+dotprod
// -ffp-contract=off on aarch64 only; attention_queries routes here while the neon set is
// active and the pages are f32 in place: the CPU backend's prefill workspace).
//
// The layout of attention_prefill_avx2.cpp with 4 rows to a vector: q transposed once per
// segment into Qt [D, R4]; a K row's 4 values at 4c.. feed by-element FMAs (vfmaq_laneq) of
// 16 rows x 2 keys, a V row's 16 columns the FMAs of 4 rows (p by element); the online softmax
// runs vertically, 4 rows per instruction.
//
// The arithmetic is the neon decode kernel's (page_step in attention_neon.cpp) operation for
// operation, so prefill == decode bit for bit (kernel_check_neon): lane l of a score's dot
// product is the FMA chain over q[4c+l]·k[4c+l], c ascending, added as (l0+l1)+(l2+l3) (its
// vpaddq tree), times scale; per page the max, alpha = flush_exp(m - m_new) (exactly 1 where
// the max did not move), e^(s - m) with exp4, the sum of the e's as its psum lanes then
// vaddvq's (u0+u1)+(u2+u3), l = l·alpha + sum (no contraction); o = o·alpha then fma(p_t,
// v_t) for t ascending. A key past a row's causal end weighs exactly 0 and leaves o as it is.
// No std containers here (vec_neon.h: no weak symbols in ARMv8.2 objects): buffers on the stack.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_neon.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {
namespace {

using namespace neon;

constexpr int kRv = 4;           // row vectors per block: 16 rows
constexpr int kLB = 4 * kRv;     // lanes of a block
constexpr int kMaxD = 128;
constexpr int kMaxRows = 64;     // rows per pass over the segment (Qt on the stack)
constexpr int kMaxSeg = 320;     // keys per segment: attn_segment(block) for block <= 64

// ============================================================================
// Scores of RB row vectors (Qt rows at qt, stride ldq) against keys j0, j0+1 (K rows at K,
// stride ks): S[j*lds + 4i ..] = scale·(q·k_j), -inf where j >= nr (per lane).
// ============================================================================
template <int D, int RB>
inline void scores_pair(const float* qt, size_t ldq, const float* K, size_t ks, int j0, float scale,
                        const int32x4_t* nr, float* S, size_t lds) {
  float32x4_t acc[4][RB][2];  // [lane l of the dot product][row vector][key]
  for (int l = 0; l < 4; ++l)
    for (int i = 0; i < RB; ++i) acc[l][i][0] = acc[l][i][1] = vdupq_n_f32(0.0f);
  const float* k0 = K + size_t(j0) * ks;
  const float* k1 = k0 + ks;
  for (int c = 0; c < D / 4; ++c) {
    const float32x4_t ka = vld1q_f32(k0 + 4 * c), kb = vld1q_f32(k1 + 4 * c);
    const float* qr = qt + size_t(4 * c) * ldq;
#define KVDECK_LANE(L)                                                  \
    for (int i = 0; i < RB; ++i) {                                      \
      const float32x4_t qv = vld1q_f32(qr + size_t(L) * ldq + 4 * i);   \
      acc[L][i][0] = vfmaq_laneq_f32(acc[L][i][0], qv, ka, L);          \
      acc[L][i][1] = vfmaq_laneq_f32(acc[L][i][1], qv, kb, L);          \
    }
    KVDECK_LANE(0) KVDECK_LANE(1) KVDECK_LANE(2) KVDECK_LANE(3)
#undef KVDECK_LANE
  }
  const float32x4_t ninf = vdupq_n_f32(-INFINITY);
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < RB; ++i) {
      const float32x4_t s = vmulq_n_f32(vaddq_f32(vaddq_f32(acc[0][i][j], acc[1][i][j]),
                                                  vaddq_f32(acc[2][i][j], acc[3][i][j])), scale);
      const uint32x4_t valid = vcgtq_s32(nr[i], vdupq_n_s32(j0 + j));
      vst1q_f32(S + size_t(j0 + j) * lds + 4 * i, vbslq_f32(valid, s, ninf));
    }
}

// The online softmax update of one row vector over nk (a multiple of 4) scores S[j*lds]
// (masked -inf): m, l updated, P[j*lds] = e^(S - m_new), alpha[4] the factor for o. Lanes
// past the task's rows (live bit clear: padding) get alpha 0.
inline void softmax_rows(const float* S, size_t lds, int nk, float* m, float* l, float* P, float* alpha, int live) {
  float32x4_t mx = vdupq_n_f32(-INFINITY);
  for (int j = 0; j < nk; ++j) mx = vmaxq_f32(mx, vld1q_f32(S + j * lds));
  const float32x4_t m_old = vld1q_f32(m);
  const float32x4_t m_new = vbslq_f32(vcgtq_f32(mx, m_old), mx, m_old);  // mx > m ? mx : m
  float mo[4], mn[4];
  vst1q_f32(mo, m_old);
  vst1q_f32(mn, m_new);
  for (int r = 0; r < 4; ++r)  // decode's flush_exp(m - m_new): e^0 = 1 exactly where m did not move
    alpha[r] = !(live >> r & 1) ? 0.0f : mo[r] == mn[r] ? 1.0f : flush_exp(mo[r] - mn[r]);
  float32x4_t u[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  for (int j0 = 0; j0 < nk; j0 += 4)
    for (int k = 0; k < 4; ++k) {
      const float32x4_t e = exp4(vsubq_f32(vld1q_f32(S + (j0 + k) * lds), m_new));  // -inf: exactly 0
      vst1q_f32(P + (j0 + k) * lds, e);
      u[k] = vaddq_f32(u[k], e);
    }
  const float32x4_t sum = vaddq_f32(vaddq_f32(u[0], u[1]), vaddq_f32(u[2], u[3]));
  vst1q_f32(l, vaddq_f32(vmulq_f32(vld1q_f32(l), vld1q_f32(alpha)), sum));
  vst1q_f32(m, m_new);
}

// o_r = Σ_pages (o_r·alpha_pr + Σ_t P[t*ldp + r] v_t) for the 4 rows of one lane group over
// the segment's pages, 16 columns at a time in registers across the pages.
template <int D>
inline void pv_segment(const float* const* Vp, size_t vs, int np, const int* nn, const float* P, size_t ldp,
                       int B, const float* alpha, size_t lda, int nrows, float* const* o) {
  for (int c0 = 0; c0 < D; c0 += 16) {
    float32x4_t x[4][4];
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) x[r][c] = vdupq_n_f32(0.0f);
    for (int p = 0; p < np; ++p) {
      if (nn[p] == 0) continue;
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 4; ++c) x[r][c] = vmulq_n_f32(x[r][c], alpha[p * lda + r]);
      const float* vt = Vp[p] + c0;
      const float* pt = P + size_t(p) * B * ldp;
      for (int t = 0; t < nn[p]; ++t, vt += vs, pt += ldp) {
        const float32x4_t pr = vld1q_f32(pt);
        for (int c = 0; c < 4; ++c) {
          const float32x4_t v = vld1q_f32(vt + 4 * c);
          x[0][c] = vfmaq_laneq_f32(x[0][c], v, pr, 0);
          x[1][c] = vfmaq_laneq_f32(x[1][c], v, pr, 1);
          x[2][c] = vfmaq_laneq_f32(x[2][c], v, pr, 2);
          x[3][c] = vfmaq_laneq_f32(x[3][c], v, pr, 3);
        }
      }
    }
    for (int r = 0; r < nrows; ++r)
      for (int c = 0; c < 4; ++c) vst1q_f32(o[r] + c0 + 4 * c, x[r][c]);
  }
}

// ============================================================================
// Up to kMaxRows rows of one segment [t0, max end) over f32 pages read in place.
// ============================================================================
template <int D>
void segment_rows(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0, float scale,
                  float* const* o, float* const* m, float* const* l) {
  const int B = kv.block, NV = (R + 3) / 4, R4 = 4 * NV;
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  const int NP = (t1 - t0 + B - 1) / B;
  float qt[kMaxD * kMaxRows];          // Qt [D, R4]
  float P[kMaxSeg * kLB];              // [NP*B, kLB] a block's scores, then e^(s - m)
  float av[kMaxSeg * kLB / 4];         // [NP, kLB] the pages' alphas (pages of >= 4 keys)
  float mv[kLB], lv[kLB];
  int ends[kMaxRows], nn[kMaxSeg / 4];
  const float* Kp[kMaxSeg / 4];
  const float* Vp[kMaxSeg / 4];
  const size_t ts = size_t(kv.nkv) * D;  // row stride in a page
  for (int r = 0; r < R4; ++r) {
    ends[r] = r < R ? end[r] : t0;
    for (int c = 0; c < D; ++c) qt[size_t(c) * R4 + r] = r < R ? q[r][c] : 0.0f;
  }
  for (int p = 0; p < NP; ++p) {
    const size_t at = (size_t(kv.pages[(t0 + p * B) / B]) * B * kv.nkv + g) * D;
    Kp[p] = static_cast<const float*>(kv.k) + at;
    Vp[p] = static_cast<const float*>(kv.v) + at;
  }
  for (int v0 = 0; v0 < NV; v0 += kRv) {
    const int rb = NV - v0 < kRv ? NV - v0 : kRv;
    const float* qb = qt + 4 * v0;
    const int* eb = ends + 4 * v0;
    for (int i = 0; i < kLB; ++i) mv[i] = -INFINITY, lv[i] = 0.0f;
    // ---- pass 1: scores and the online softmax, page by page -------------------------
    for (int p = 0; p < NP; ++p) {
      const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B;
      int32x4_t nr[kRv];
      int nk = 0;
      for (int i = 0; i < rb; ++i) {
        int e[4];
        for (int k = 0; k < 4; ++k) {
          const int c = eb[4 * i + k] - ps;
          e[k] = c < 0 ? 0 : (c < n ? c : n);
          nk = e[k] > nk ? e[k] : nk;
        }
        nr[i] = vld1q_s32(e);
      }
      nn[p] = nk;
      if (nk == 0) continue;
      float* Sp = P + size_t(p) * B * kLB;
      const int nk4 = (nk + 3) / 4 * 4;  // (block % 4 == 0: within the page)
      for (int j0 = 0; j0 < nk4; j0 += 2) {
        switch (rb) {
          case 4: scores_pair<D, 4>(qb, R4, Kp[p], ts, j0, scale, nr, Sp, kLB); break;
          case 3: scores_pair<D, 3>(qb, R4, Kp[p], ts, j0, scale, nr, Sp, kLB); break;
          case 2: scores_pair<D, 2>(qb, R4, Kp[p], ts, j0, scale, nr, Sp, kLB); break;
          default: scores_pair<D, 1>(qb, R4, Kp[p], ts, j0, scale, nr, Sp, kLB); break;
        }
      }
      for (int i = 0; i < rb; ++i) {
        int live = 0;
        for (int k = 0; k < 4; ++k) live |= (4 * (v0 + i) + k < R) << k;
        softmax_rows(Sp + 4 * i, kLB, nk4, mv + 4 * i, lv + 4 * i, Sp + 4 * i, av + size_t(p) * kLB + 4 * i, live);
      }
    }
    // ---- pass 2: o = P·V over the segment, four rows (one lane group) at a time -----------
    const int r_end = 4 * (v0 + rb) < R ? 4 * (v0 + rb) : R;
    for (int r = 4 * v0; r < r_end; r += 4) {
      int e = 0;
      for (int i = 0; i < 4 && r + i < r_end; ++i) e = ends[r + i] > e ? ends[r + i] : e;
      int np = 0;
      for (int p = 0; p < NP; ++p) {
        const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B;
        nn[p] = e - ps <= 0 ? 0 : (e - ps < n ? e - ps : n);
        np = nn[p] ? p + 1 : np;
      }
      const int lane = r - 4 * v0;
      pv_segment<D>(Vp, ts, np, nn, P + lane, kLB, B, av + lane, kLB, r_end - r < 4 ? r_end - r : 4, o + r);
    }
    for (int r = 4 * v0; r < r_end; ++r) *m[r] = mv[r - 4 * v0], *l[r] = lv[r - 4 * v0];
  }
}

}  // namespace

bool attention_rows_neon(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                         float scale, float* const* o, float* const* m, float* const* l) {
  if (kv.dtype != KvDType::F32 || kv.fresh_k || kv.block % 4 != 0 || kv.block > 64) return false;
  for (int r0 = 0; r0 < R; r0 += kMaxRows) {
    const int n = R - r0 < kMaxRows ? R - r0 : kMaxRows;
    switch (kv.D) {
      case 64: segment_rows<64>(kv, g, n, q + r0, end + r0, t0, scale, o + r0, m + r0, l + r0); break;
      case 128: segment_rows<128>(kv, g, n, q + r0, end + r0, t0, scale, o + r0, m + r0, l + r0); break;
      case 32: segment_rows<32>(kv, g, n, q + r0, end + r0, t0, scale, o + r0, m + r0, l + r0); break;
      case 96: segment_rows<96>(kv, g, n, q + r0, end + r0, t0, scale, o + r0, m + r0, l + r0); break;
      default: return false;  // (D is the same for every chunk: nothing written yet)
    }
  }
  return true;
}

}  // namespace kvdeck::cpu
#endif  // __aarch64__
