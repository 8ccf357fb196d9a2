// attention_prefill_avx2.cpp — prefill attention: many query rows over the pages of one
// segment, flash-attention style (AVX2 + FMA + F16C; compiled with -mavx2 -mfma -mf16c).
//
// A page's K is transposed once into Kt [D, keys] and shared by every row of the tile (the
// queries of a tile times the G query heads of the KV head: GQA). Scores come from a 6-row ×
// 16-key micro-kernel (q broadcast, Kt rows as vectors of 8 keys: no horizontal adds, 12
// independent accumulators), the online softmax update runs per row, and o += p·V runs on
// two rows at once so each V load feeds two FMAs. The arithmetic is decode's (page_group in
// attention_avx2.cpp) operation for operation on f32 / f16 rows: lane l of a score is the FMA chain over
// q[8c+l]·k[8c+l], c ascending, and the 8 lanes are added as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))
// as its hadd tree does; softmax_update and pv_rows are shared. So prefill == decode bit for bit.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {
namespace {
using attn_avx2::page_rows;

constexpr int kPv = 3;    // rows per o update (12 accumulators: FMA latency x 2 pipes, slack)
constexpr int kRows = 6;  // rows per score micro-kernel (12 accumulators: FMA latency x 2 pipes)

// ============================================================================
// Kt [D, kp] (kp = keys rounded up to 16) from n rows of K (row stride ks); keys >= n are 0.
// ============================================================================
template <int D>
void transpose_k(const float* K, size_t ks, int n, int kp, float* kt) {
  alignas(32) static const float zero[D] = {};
  for (int j0 = 0; j0 < kp; j0 += 8) {
    const float* r[8];
    for (int j = 0; j < 8; ++j) r[j] = j0 + j < n ? K + size_t(j0 + j) * ks : zero;
    for (int c = 0; c < D; c += 8) {  // an 8x8 block: rows j0.., columns c..
      __m256 a[8], b[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm256_loadu_ps(r[j] + c);
      for (int j = 0; j < 8; j += 2) {
        b[j] = _mm256_unpacklo_ps(a[j], a[j + 1]);
        b[j + 1] = _mm256_unpackhi_ps(a[j], a[j + 1]);
      }
      for (int j = 0; j < 8; j += 4) {
        a[j] = _mm256_shuffle_ps(b[j], b[j + 2], 0x44);
        a[j + 1] = _mm256_shuffle_ps(b[j], b[j + 2], 0xEE);
        a[j + 2] = _mm256_shuffle_ps(b[j + 1], b[j + 3], 0x44);
        a[j + 3] = _mm256_shuffle_ps(b[j + 1], b[j + 3], 0xEE);
      }
      for (int j = 0; j < 4; ++j) {
        b[j] = _mm256_permute2f128_ps(a[j], a[j + 4], 0x20);
        b[j + 4] = _mm256_permute2f128_ps(a[j], a[j + 4], 0x31);
      }
      for (int i = 0; i < 8; ++i) _mm256_store_ps(kt + size_t(c + i) * kp + j0, b[i]);
    }
  }
}

// ============================================================================
// Scores of kRows rows × 16 keys (keys k0.. of Kt), scaled, masked past nr[r]: S[r][k0 ..].
// ============================================================================
template <int D>
inline void scores_rows(const float* const* q, const float* kt, int kp, int k0, const int* nr, float scale,
                        float* S /*[kRows][64]*/) {
  __m256 part[8][kRows][2];  // per lane l: the FMA chain over c
  for (int l = 0; l < 8; ++l) {
    __m256 acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int c = 0; c < D / 8; ++c) {
      const float* krow = kt + size_t(8 * c + l) * kp + k0;
      const __m256 ka = _mm256_load_ps(krow), kb = _mm256_load_ps(krow + 8);
      for (int r = 0; r < kRows; ++r) {
        const __m256 qb = _mm256_broadcast_ss(q[r] + 8 * c + l);
        acc[r][0] = _mm256_fmadd_ps(qb, ka, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qb, kb, acc[r][1]);
      }
    }
    for (int r = 0; r < kRows; ++r) part[l][r][0] = acc[r][0], part[l][r][1] = acc[r][1];
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < 2; ++h) {
      const __m256 lo = _mm256_add_ps(_mm256_add_ps(part[0][r][h], part[1][r][h]),
                                      _mm256_add_ps(part[2][r][h], part[3][r][h]));
      const __m256 hi = _mm256_add_ps(_mm256_add_ps(part[4][r][h], part[5][r][h]),
                                      _mm256_add_ps(part[6][r][h], part[7][r][h]));
      const __m256 sc = _mm256_mul_ps(_mm256_add_ps(lo, hi), vscale);
      const __m256 valid = _mm256_cmp_ps(lane, _mm256_set1_ps(float(nr[r] - k0 - 8 * h)), _CMP_LT_OQ);
      _mm256_store_ps(S + r * 64 + k0 + 8 * h, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, valid));
    }
}

// ============================================================================
// The online softmax update of the NA active rows act[..] of a row block (scores S[r*64 ..],
// ng vectors of 8; masked keys are -inf): softmax_update's operations per row in its order,
// phase by phase over the rows (every max, then the scalar m / alpha, then e^(s - m) and the
// sums) so the rows' dependency chains overlap. A vector past a row's last key is all -inf
// there: it leaves the max alone and adds e = 0 (exactly) to the sum.
// ============================================================================
template <int NA>
inline void softmax_rows(const int* act, int ng, const float* S, float* const* m, float* const* l, float* P,
                         float* alpha) {
  __m256 vmax[NA], ps[NA], vm[NA];
  for (int a = 0; a < NA; ++a) vmax[a] = _mm256_set1_ps(-INFINITY), ps[a] = _mm256_setzero_ps();
  for (int gi = 0; gi < ng; ++gi)
    for (int a = 0; a < NA; ++a) vmax[a] = _mm256_max_ps(vmax[a], _mm256_load_ps(S + act[a] * 64 + 8 * gi));
  float mx[NA];
  for (int a = 0; a < NA; ++a) mx[a] = attn_avx2::hmax(vmax[a]);
  for (int a = 0; a < NA; ++a) {
    const int r = act[a];
    const float mo = *m[r], m_new = mx[a] > mo ? mx[a] : mo;
    alpha[a] = m_new == mo && mo > -INFINITY ? 1.0f : flush_exp(mo - m_new);  // e^0 = 1 exactly
    *m[r] = m_new;
    vm[a] = _mm256_set1_ps(m_new);
  }
  for (int gi = 0; gi < ng; ++gi)
    for (int a = 0; a < NA; ++a) {
      const __m256 x = _mm256_load_ps(S + act[a] * 64 + 8 * gi);
      const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(x, vm[a])), valid);
      _mm256_store_ps(P + a * 64 + 8 * gi, e);
      ps[a] = _mm256_add_ps(ps[a], e);
    }
  for (int a = 0; a < NA; ++a) *l[act[a]] = std::fma(*l[act[a]], alpha[a], hsum(ps[a]));
}

// ============================================================================
// o = o·alpha + Σ_{t < n} p_t v_t for NR rows, 32 columns at a time (4·NR accumulators, each V
// load feeding NR FMAs): pv_rows's chains (o·alpha, then + p_t·v_t for t ascending), with the
// multiply left out where alpha is 1 (o·1 = o) and the causal edge's pass only for the rows
// that see more keys than the shortest.
// ============================================================================
template <int D, int NR>
inline void pv_block(const float* V, size_t vs, const float* P, const int* n, const float* alpha,
                     float* const* o) {
  static_assert(D % 32 == 0, "32 columns at a time");
  int nc = n[0];
  for (int r = 1; r < NR; ++r) nc = n[r] < nc ? n[r] : nc;
  for (int c0 = 0; c0 < D; c0 += 32) {
    __m256 x[NR][4];
    for (int r = 0; r < NR; ++r) {
      for (int c = 0; c < 4; ++c) x[r][c] = _mm256_loadu_ps(o[r] + c0 + 8 * c);
      if (alpha[r] != 1.0f)
        for (int c = 0; c < 4; ++c) x[r][c] = _mm256_mul_ps(x[r][c], _mm256_set1_ps(alpha[r]));
    }
    const float* vt = V + c0;
    for (int t = 0; t < nc; ++t, vt += vs) {
      __m256 p[NR];
      for (int r = 0; r < NR; ++r) p[r] = _mm256_broadcast_ss(P + r * 64 + t);
      for (int c = 0; c < 4; ++c) {
        __m256 v = _mm256_loadu_ps(vt + 8 * c);
        if (NR > 1) __asm__("" : "+x"(v));  // one load for the NR FMAs (else folded NR times)
        for (int r = 0; r < NR; ++r) x[r][c] = _mm256_fmadd_ps(p[r], v, x[r][c]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, x[r][c]);
  }
  for (int r = 0; r < NR; ++r)  // rows that see more keys of this page (the causal edge): the
    for (int c0 = 0; c0 < D && nc < n[r]; c0 += 32) {  // same chains, continued from the stored partials
      __m256 x[4];
      for (int c = 0; c < 4; ++c) x[c] = _mm256_loadu_ps(o[r] + c0 + 8 * c);
      for (int t = nc; t < n[r]; ++t)
        for (int c = 0; c < 4; ++c)
          x[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + r * 64 + t), _mm256_loadu_ps(V + t * vs + c0 + 8 * c), x[c]);
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, x[c]);
    }
}

// ============================================================================
// R rows of one segment starting at t0 that share its pages: row r ends at end[r].
// ============================================================================
template <int D>
void segment_rows(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0, float scale,
                  float* const* o, float* const* m, float* const* l, float* tile) {
  const int B = kv.block, kp = (B + 15) / 16 * 16;
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  float* ktile = tile;
  float* vtile = tile + size_t(B) * D;
  alignas(32) float kt[D * 64];           // Kt [D, kp]
  alignas(32) float S[kRows * 64], P[kRows * 64];
  for (int r = 0; r < R; ++r) {
    *m[r] = -INFINITY, *l[r] = 0.0f;
    std::memset(o[r], 0, sizeof(float) * D);
  }
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    const float *K, *V;  // (no prefetch: a prefill reads the pages again and again, from cache)
    const size_t ks = page_rows<D>(kv, kv.k, kv.fresh_k, page, ps, g, n, ktile, &K);
    const size_t vs = page_rows<D>(kv, kv.v, kv.fresh_v, page, ps, g, n, vtile, &V);
    const int kn = (n + 15) / 16 * 16;
    transpose_k<D>(K, ks, n, kp, kt);
    for (int r0 = 0; r0 < R; r0 += kRows) {
      const float* qr[kRows];
      int nr[kRows], any = 0;
      for (int i = 0; i < kRows; ++i) {
        const int r = r0 + i < R ? r0 + i : R - 1;
        qr[i] = q[r];
        const int e = r0 + i < R ? end[r] - ps : 0;  // keys of this page the row sees
        nr[i] = e < 0 ? 0 : (e < n ? e : n);
        any |= nr[i];
      }
      if (!any) continue;
      for (int k0 = 0; k0 < kn; k0 += 16) scores_rows<D>(qr, kt, kp, k0, nr, scale, S);
      int act[kRows], na = 0;  // the rows that see keys of this page
      for (int i = 0; i < kRows; ++i)
        if (nr[i] > 0) act[na++] = i;
      float alpha[kRows];
      switch (na) {  // P, alpha: the compacted rows
        case 6: softmax_rows<6>(act, kn / 8, S, m + r0, l + r0, P, alpha); break;
        case 5: softmax_rows<5>(act, kn / 8, S, m + r0, l + r0, P, alpha); break;
        case 4: softmax_rows<4>(act, kn / 8, S, m + r0, l + r0, P, alpha); break;
        case 3: softmax_rows<3>(act, kn / 8, S, m + r0, l + r0, P, alpha); break;
        case 2: softmax_rows<2>(act, kn / 8, S, m + r0, l + r0, P, alpha); break;
        default: softmax_rows<1>(act, kn / 8, S, m + r0, l + r0, P, alpha);
      }
      for (int a0 = 0; a0 < na; a0 += kPv) {
        const int k = na - a0 < kPv ? na - a0 : kPv;
        float* orow[kPv];
        int nn[kPv];
        for (int j = 0; j < k; ++j) orow[j] = o[r0 + act[a0 + j]], nn[j] = nr[act[a0 + j]];
        if (k == 3) pv_block<D, 3>(V, vs, P + a0 * 64, nn, alpha + a0, orow);
        else if (k == 2) pv_block<D, 2>(V, vs, P + a0 * 64, nn, alpha + a0, orow);
        else pv_block<D, 1>(V, vs, P + a0 * 64, nn, alpha + a0, orow);
      }
    }
  }
}

}  // namespace

bool attention_rows_avx2(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                         float scale, float* const* o, float* const* m, float* const* l, float* tile) {
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
