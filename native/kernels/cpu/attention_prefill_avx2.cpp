// attention_prefill_avx2.cpp — prefill attention: many query rows over the pages of one
// segment, flash-attention style (AVX2 + FMA + F16C; compiled with -mavx2 -mfma -mf16c).
//
// The R rows of a task (its queries times the G query heads of the KV head: GQA) sit in the
// lanes of vectors, 8 rows to a vector: q is transposed once per segment into Qt [D, R8] and a
// page's K and V rows are read as they lie in the page (f32, in place), one value broadcast to
// 8 rows at a time. Each K / V value loaded feeds the FMAs of 24 rows (3 row vectors x 4 keys
// for the scores, 3 rows x 32 columns for o), and the online softmax runs vertically, 8 rows
// per instruction (no horizontal max / sum per row).
//
// The arithmetic is decode's (page_group in attention_avx2.cpp) operation for operation, so
// prefill == decode bit for bit on f32 / f16 pages: lane l of a score's dot product is the FMA
// chain over q[8c+l]·k[8c+l], c ascending, the 8 chains are added as
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) (decode's hadd tree), then times scale; per page the max,
// alpha (1 when the max did not move, else flush_exp), e^(s - m) with exp256, the sum of the
// e's as decode's psum lanes then hsum's order, l = fma(l, alpha, sum); o = o·alpha then
// fma(p_t, v_t, o) for t ascending. A key past a row's causal end scores -inf and weighs
// exactly 0: fma(0, v, o) leaves o as it is (o is never -0: it starts at +0 and a sum that
// cancels rounds to +0).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {
namespace {
using attn_avx2::page_rows;

constexpr int kRv = 3;   // row vectors per block (24 rows): 12 score / o accumulators
constexpr int kKeys = 4;  // keys per score micro-kernel

// ============================================================================
// Scores of the RB row vectors at qt (Qt [D, ldq]) against keys j0 .. j0+3 (K rows, stride
// ks): S[j][8i ..] = scale·(q·k_j), -inf where j >= nr (per lane).
// ============================================================================
template <int D, int RB>
inline void scores_block(const float* qt, size_t ldq, const float* K, size_t ks, int j0, float scale,
                         const __m256i* nr, float* S, size_t lds) {
  alignas(32) float part[8][kKeys][RB][8];  // lane l's FMA chain of every (key, row)
  for (int l = 0; l < 8; ++l) {
    __m256 acc[RB][kKeys];
    for (int i = 0; i < RB; ++i)
      for (int j = 0; j < kKeys; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int c = 0; c < D / 8; ++c) {
      const float* qr = qt + size_t(8 * c + l) * ldq;
      __m256 qv[RB];
      for (int i = 0; i < RB; ++i) qv[i] = _mm256_load_ps(qr + 8 * i);
      for (int j = 0; j < kKeys; ++j) {
        const __m256 kb = _mm256_broadcast_ss(K + size_t(j0 + j) * ks + 8 * c + l);
        for (int i = 0; i < RB; ++i) acc[i][j] = _mm256_fmadd_ps(qv[i], kb, acc[i][j]);
      }
    }
    for (int j = 0; j < kKeys; ++j)
      for (int i = 0; i < RB; ++i) _mm256_store_ps(part[l][j][i], acc[i][j]);
  }
  const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
  for (int j = 0; j < kKeys; ++j)
    for (int i = 0; i < RB; ++i) {
      auto p = [&](int l) { return _mm256_load_ps(part[l][j][i]); };
      const __m256 lo = _mm256_add_ps(_mm256_add_ps(p(0), p(1)), _mm256_add_ps(p(2), p(3)));
      const __m256 hi = _mm256_add_ps(_mm256_add_ps(p(4), p(5)), _mm256_add_ps(p(6), p(7)));
      const __m256 sc = _mm256_mul_ps(_mm256_add_ps(lo, hi), vscale);
      const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(nr[i], _mm256_set1_epi32(j0 + j)));
      _mm256_store_ps(S + size_t(j0 + j) * lds + 8 * i, _mm256_blendv_ps(ninf, sc, valid));
    }
}

// ============================================================================
// The online softmax update of one row vector over nk (a multiple of 8) scores S[j*lds] (masked -inf): m, l
// updated, P[j*lds] = e^(S - m_new) (0 where masked), alpha[8] the factor for o. Lanes past
// the task's rows (live bit clear: padding) get alpha 0; a row without keys on this page keeps
// alpha 1 (its max did not move), l and o as they are.
// ============================================================================
inline void softmax_rows(const float* S, size_t lds, int nk, float* m, float* l, float* P, float* alpha,
                         int live) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int j = 0; j < nk; ++j) mx = _mm256_max_ps(mx, _mm256_load_ps(S + j * lds));
  const __m256 m_old = _mm256_load_ps(m);
  const __m256 m_new = _mm256_max_ps(mx, m_old);  // mx > m ? mx : m
  const __m256 same = _mm256_and_ps(_mm256_cmp_ps(m_new, m_old, _CMP_EQ_OQ), _mm256_cmp_ps(m_old, ninf, _CMP_GT_OQ));
  _mm256_store_ps(alpha, _mm256_set1_ps(1.0f));
  alignas(32) float mo[8], mn[8];
  _mm256_store_ps(mo, m_old);
  _mm256_store_ps(mn, m_new);
  for (int moved = ~_mm256_movemask_ps(same) & live; moved; moved &= moved - 1) {
    const int r = __builtin_ctz(moved);
    alpha[r] = flush_exp(mo[r] - mn[r]);  // decode's scalar e^(m - m_new)
  }
  for (int r = 0; r < 8; ++r)
    if (!(live >> r & 1)) alpha[r] = 0.0f;
  __m256 u[8];  // decode's psum lanes: u_k = e_k + e_{k+8} + ..., keys in groups of 8
  for (int k = 0; k < 8; ++k) u[k] = _mm256_setzero_ps();
  for (int j0 = 0; j0 < nk; j0 += 8)  // (nk a multiple of 8)
    for (int k = 0; k < 8; ++k) {
      const __m256 s = _mm256_load_ps(S + (j0 + k) * lds);
      const __m256 valid = _mm256_cmp_ps(s, ninf, _CMP_NEQ_OQ);
      const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(s, m_new)), valid);
      _mm256_store_ps(P + (j0 + k) * lds, e);
      u[k] = _mm256_add_ps(u[k], e);
    }
  // hsum's order: ((u0+u4)+(u2+u6)) + ((u1+u5)+(u3+u7))
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(u[0], u[4]), _mm256_add_ps(u[2], u[6])),
                                   _mm256_add_ps(_mm256_add_ps(u[1], u[5]), _mm256_add_ps(u[3], u[7])));
  _mm256_store_ps(l, _mm256_fmadd_ps(_mm256_load_ps(l), _mm256_load_ps(alpha), sum));
  _mm256_store_ps(m, m_new);
}

// ============================================================================
// o_r = Σ_pages (o_r·alpha_pr + Σ_{t < n_p} P[t*ldp + r] v_t) for NR rows over a segment's
// pages, 32 columns at a time in registers across the pages (4·NR accumulators, each V load
// feeding NR FMAs): decode's o·alpha then FMA chain, page after page. P is 0 past a row's own
// keys; a page the NR rows do not see (nn[p] == 0) is skipped (their alpha is 1 there).
// ============================================================================
template <int D, int NR>
inline void pv_segment(const float* const* Vp, const size_t* vs, int np, const int* nn, const float* P, size_t ldp,
                       int B, const float* alpha, size_t lda, float* const* o) {
  static_assert(D % 32 == 0, "32 columns at a time");
  for (int c0 = 0; c0 < D; c0 += 32) {
    __m256 x[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) x[r][c] = _mm256_setzero_ps();
    for (int p = 0; p < np; ++p) {
      if (nn[p] == 0) continue;
      for (int r = 0; r < NR; ++r) {
        const __m256 a = _mm256_set1_ps(alpha[p * lda + r]);
        for (int c = 0; c < 4; ++c) x[r][c] = _mm256_mul_ps(x[r][c], a);
      }
      const float* vt = Vp[p] + c0;
      const float* pt = P + size_t(p) * B * ldp;
      for (int t = 0; t < nn[p]; ++t, vt += vs[p], pt += ldp) {
        __m256 pr[NR];
        for (int r = 0; r < NR; ++r) pr[r] = _mm256_broadcast_ss(pt + r);
        for (int c = 0; c < 4; ++c) {
          __m256 v = _mm256_loadu_ps(vt + 8 * c);
          if (NR > 1) __asm__("" : "+x"(v));  // one load for the NR FMAs (else folded NR times)
          for (int r = 0; r < NR; ++r) x[r][c] = _mm256_fmadd_ps(pr[r], v, x[r][c]);
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, x[r][c]);
  }
}

inline float* align32(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 31) & ~uintptr_t(31));
}

// ============================================================================
// R rows of one segment starting at t0 that share its pages: row r sees keys [t0, end[r]).
// Rows in blocks of 24 (3 row vectors); per block two passes over the segment's pages: the
// scores and softmax of every page (P and the pages' alphas kept for the segment), then o
// with its accumulators in registers across the pages.
// ============================================================================
template <int D>
void segment_rows(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0, float scale,
                  float* const* o, float* const* m, float* const* l, float* tile) {
  constexpr int LB = 8 * kRv;  // lanes of a block
  const int B = kv.block, NV = (R + 7) / 8, R8 = 8 * NV;
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  const int NP = (t1 - t0 + B - 1) / B;  // pages of the segment
  const bool in_place = kv.dtype == KvDType::F32 && !(kv.fresh_k && t1 > kv.fresh0);  // no widened rows
  thread_local std::vector<float> buf;
  thread_local std::vector<int> ends, nn;
  thread_local std::vector<const float*> Kp, Vp;
  thread_local std::vector<size_t> ks, vs;
  const size_t seg_keys = size_t(NP) * B;
  const size_t need = size_t(D) * R8 + seg_keys * LB + size_t(NP) * LB + 2 * LB + (in_place ? 0 : 2 * seg_keys * D) + 16;
  if (buf.size() < need) buf.resize(need);
  if (ends.size() < size_t(R8)) ends.resize(R8);
  if (nn.size() < size_t(NP)) nn.resize(NP), Kp.resize(NP), Vp.resize(NP), ks.resize(NP), vs.resize(NP);
  float* qt = align32(buf.data());        // Qt [D, R8]
  float* P = qt + size_t(D) * R8;         // [seg_keys, LB] a block's scores, then e^(s - m)
  float* av = P + seg_keys * LB;          // [NP, LB] the pages' alphas
  float* mv = av + size_t(NP) * LB;       // [LB] running max
  float* lv = mv + LB;                    // [LB] running sum
  float* wide = lv + LB;                  // [2, seg_keys, D] widened pages (not in place)
  for (int r = 0; r < R8; ++r) {
    ends[r] = r < R ? end[r] : t0;
    for (int c = 0; c < D; ++c) qt[size_t(c) * R8 + r] = r < R ? q[r][c] : 0.0f;
  }
  for (int p = 0; p < NP; ++p) {  // f32 pages read in place, others widened (page_rows)
    const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    ks[p] = page_rows<D>(kv, kv.k, kv.fresh_k, page, ps, g, n, wide + size_t(p) * B * D, &Kp[p]);
    vs[p] = page_rows<D>(kv, kv.v, kv.fresh_v, page, ps, g, n, wide + (seg_keys + size_t(p) * B) * D, &Vp[p]);
  }
  for (int v0 = 0; v0 < NV; v0 += kRv) {
    const int rb = NV - v0 < kRv ? NV - v0 : kRv;
    const float* qb = qt + 8 * v0;
    const int* eb = ends.data() + 8 * v0;
    for (int i = 0; i < LB; ++i) mv[i] = -INFINITY, lv[i] = 0.0f;
    // ---- pass 1: scores and the online softmax, page by page -------------------------
    for (int p = 0; p < NP; ++p) {
      const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B;
      __m256i nr[kRv];
      int nk = 0;  // keys of this page the block's rows see
      for (int i = 0; i < rb; ++i) {
        alignas(32) int e[8];
        for (int k = 0; k < 8; ++k) {
          const int c = eb[8 * i + k] - ps;
          e[k] = c < 0 ? 0 : (c < n ? c : n);
          nk = e[k] > nk ? e[k] : nk;
        }
        nr[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(e));
      }
      nn[p] = nk;
      if (nk == 0) continue;
      float* Sp = P + size_t(p) * B * LB;
      const int nk4 = (nk + kKeys - 1) / kKeys * kKeys;  // (block % 8 == 0: within the page)
      for (int j0 = 0; j0 < nk4; j0 += kKeys) {
        if (rb == 3) scores_block<D, 3>(qb, R8, Kp[p], ks[p], j0, scale, nr, Sp, LB);
        else if (rb == 2) scores_block<D, 2>(qb, R8, Kp[p], ks[p], j0, scale, nr, Sp, LB);
        else scores_block<D, 1>(qb, R8, Kp[p], ks[p], j0, scale, nr, Sp, LB);
      }
      const int nk8 = (nk + 7) / 8 * 8;
      for (int j = nk4; j < nk8; ++j)
        for (int i = 0; i < rb; ++i) _mm256_store_ps(Sp + size_t(j) * LB + 8 * i, _mm256_set1_ps(-INFINITY));
      for (int i = 0; i < rb; ++i) {
        int live = 0;
        for (int k = 0; k < 8; ++k) live |= (8 * (v0 + i) + k < R) << k;  // rows past R: padding
        softmax_rows(Sp + 8 * i, LB, nk8, mv + 8 * i, lv + 8 * i, Sp + 8 * i, av + size_t(p) * LB + 8 * i, live);
      }
    }
    // ---- pass 2: o = P·V over the segment, three rows at a time ---------------------
    const int r_end = 8 * (v0 + rb) < R ? 8 * (v0 + rb) : R;
    for (int r = 8 * v0; r < r_end;) {
      const int k = r_end - r >= 3 ? 3 : r_end - r;
      int e = 0;
      for (int i = 0; i < k; ++i) e = ends[r + i] > e ? ends[r + i] : e;
      int np = 0;
      for (int p = 0; p < NP; ++p) {  // keys of each page these rows see
        const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B;
        nn[p] = e - ps <= 0 ? 0 : (e - ps < n ? e - ps : n);
        np = nn[p] ? p + 1 : np;
      }
      const int lane = r - 8 * v0;
      if (k == 3) pv_segment<D, 3>(Vp.data(), vs.data(), np, nn.data(), P + lane, LB, B, av + lane, LB, o + r);
      else if (k == 2) pv_segment<D, 2>(Vp.data(), vs.data(), np, nn.data(), P + lane, LB, B, av + lane, LB, o + r);
      else pv_segment<D, 1>(Vp.data(), vs.data(), np, nn.data(), P + lane, LB, B, av + lane, LB, o + r);
      r += k;
    }
    for (int r = 8 * v0; r < r_end; ++r) *m[r] = mv[r - 8 * v0], *l[r] = lv[r - 8 * v0];
  }
}

}  // namespace

bool attention_rows_avx2(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                         float scale, float* const* o, float* const* m, float* const* l, float* tile) {
  if (kv.block % 8 != 0 || kv.block > 64) return false;
  switch (kv.D) {
    case 64: segment_rows<64>(kv, g, R, q, end, t0, scale, o, m, l, tile); return true;
    case 128: segment_rows<128>(kv, g, R, q, end, t0, scale, o, m, l, tile); return true;
    case 32: segment_rows<32>(kv, g, R, q, end, t0, scale, o, m, l, tile); return true;
    case 96: segment_rows<96>(kv, g, R, q, end, t0, scale, o, m, l, tile); return true;
    default: return false;
  }
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
