// attention_prefill_avx2.cpp — prefill attention: many query rows over the pages of one
// segment, flash-attention style (AVX2 + FMA + F16C; compiled with -mavx2 -mfma -mf16c).
//
// The R rows of a task (its queries times the G query heads of the KV head: GQA) share every
// K / V row they read. The segment's pages are taken a group at a time (up to 64 keys: K and V
// of the group stay in L1): first every row's scores for the group's pages (3 rows x 4 keys per
// micro-kernel: each K load feeds 3 rows, each q load 4 keys; 12 accumulators, no broadcasts)
// and their online softmax update, page by page; then o += P·V for three rows at a time with
// the accumulators in registers across the group's pages (each V load feeds 3 rows).
//
// The arithmetic is decode's (page_group in attention_avx2.cpp) operation for operation, so
// prefill == decode bit for bit on f32 / f16 pages: the scores come from the same dot4 (lane l
// the FMA chain over q[8c+l]·k[8c+l], its hadd tree, times scale), softmax_update runs per row
// and page on the same masked scores, and o = o·alpha then fma(p_t, v_t, o) for t ascending. A
// key past a row's causal end weighs exactly 0 (P is zero there): fma(0, v, o) leaves o as it
// is (o is never -0: it starts at +0 and a sum that cancels rounds to +0).
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
using attn_avx2::dot4;
using attn_avx2::page_rows;
using attn_avx2::softmax_update;

constexpr int kGroupKeys = 64;  // keys per page group (the score / probability rows are 64 wide)

inline float* align32(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 31) & ~uintptr_t(31));
}

// ============================================================================
// o_r = o_r·alpha_r,p + Σ_{t < nn[p]} P_r[p·B + t] v_t for NR rows over the group's pages p (in
// order), 32 columns at a time in registers across the pages (4·NR accumulators, each V load
// feeding NR FMAs). first: o starts at 0 (the segment's first group) instead of being loaded.
// ============================================================================
template <int D, int NR>
inline void pv_group(const float* const* Vp, const size_t* vs, int np, const int* nn, const float* const* P, int B,
                     const float* const* alpha, bool first, float* const* o) {
  static_assert(D % 32 == 0, "32 columns at a time");
  for (int c0 = 0; c0 < D; c0 += 32) {
    __m256 x[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) x[r][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o[r] + c0 + 8 * c);
    for (int p = 0; p < np; ++p) {
      if (nn[p] == 0) continue;
      for (int r = 0; r < NR; ++r) {
        const __m256 a = _mm256_set1_ps(alpha[r][p]);
        for (int c = 0; c < 4; ++c) x[r][c] = _mm256_mul_ps(x[r][c], a);
      }
      const float* vt = Vp[p] + c0;
      const float* pp[NR];
      for (int r = 0; r < NR; ++r) pp[r] = P[r] + p * B;
      const int n = nn[p];
      const size_t step = vs[p];
#pragma GCC unroll 2
      for (int t = 0; t < n; ++t, vt += step) {
        __m256 pr[NR];
        for (int r = 0; r < NR; ++r) pr[r] = _mm256_broadcast_ss(pp[r] + t);
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

// ============================================================================
// R rows of one segment starting at t0 that share its pages: row r sees keys [t0, end[r]).
// ============================================================================
template <int D>
void segment_rows(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0, float scale,
                  float* const* o, float* const* m, float* const* l, float* tile) {
  const int B = kv.block, PG = kGroupKeys / B;  // pages per group (block % 8 == 0, <= 64)
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  const int NP = (t1 - t0 + B - 1) / B;  // pages of the segment
  thread_local std::vector<float> buf;
  thread_local std::vector<const float*> Kp, Vp;
  thread_local std::vector<size_t> ks, vs;
  const size_t seg_keys = size_t(NP) * B;
  const size_t need = 2 * size_t(R) * kGroupKeys + size_t(R) * PG + 2 * seg_keys * D + 16;
  if (buf.size() < need) buf.resize(need);
  if (Kp.size() < size_t(NP)) Kp.resize(NP), Vp.resize(NP), ks.resize(NP), vs.resize(NP);
  float* S = align32(buf.data());                // [R, 64] a group's scores of each row
  float* P = S + size_t(R) * kGroupKeys;         // [R, 64] their e^(s - m), 0 past a row's keys
  float* av = P + size_t(R) * kGroupKeys;        // [R, PG] each page's alpha
  float* wide = av + size_t(R) * PG;             // [2, seg_keys, D] widened pages (not f32 in place)
  for (int p = 0; p < NP; ++p) {  // f32 pages read in place, others widened (page_rows)
    const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    ks[p] = page_rows<D>(kv, kv.k, kv.fresh_k, page, ps, g, n, wide + size_t(p) * B * D, &Kp[p]);
    vs[p] = page_rows<D>(kv, kv.v, kv.fresh_v, page, ps, g, n, wide + (seg_keys + size_t(p) * B) * D, &Vp[p]);
  }
  // The pages are scattered in the pool and each task reads its KV head's whole context from
  // L3 or DRAM: page p + PG's K and V rows are prefetched into L2 while page p is scored, a
  // row of each per three query rows (the segment's first group in one go).
  auto fetch = [&](int p, int i0, int i1) {
    if (p >= NP) return;
    const int n = t1 - (t0 + p * B) < B ? t1 - (t0 + p * B) : B;
    for (int i = i0; i < i1 && i < n; ++i)
      for (int c = 0; c < D; c += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(Kp[p] + i * ks[p] + c), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(Vp[p] + i * vs[p] + c), _MM_HINT_T1);
      }
  };
  for (int p = 1; p < PG; ++p) fetch(p, 0, B);
  for (int r = 0; r < R; ++r) *m[r] = -INFINITY, *l[r] = 0.0f;
  for (int p0 = 0; p0 < NP; p0 += PG) {
    const int np = NP - p0 < PG ? NP - p0 : PG;
    // ---- the group's scores and online softmax, page by page, three rows at a time ----
    for (int p = p0; p < p0 + np; ++p) {
      const int ps = t0 + p * B, n = t1 - ps < B ? t1 - ps : B, pg = p - p0;
      if (3 * B > R) fetch(p + PG, 0, B);  // few rows: the next page at once
      for (int r0 = 0; r0 < R; r0 += 3) {
        if (3 * B <= R) fetch(p + PG, r0 / 3, r0 / 3 + 1);
        const int k = R - r0 < 3 ? R - r0 : 3;
        int nr[3] = {0, 0, 0}, nk = 0;
        for (int i = 0; i < k; ++i) {
          const int c = end[r0 + i] - ps;
          nr[i] = c < 0 ? 0 : (c < n ? c : n);
          nk = nr[i] > nk ? nr[i] : nk;
        }
        if (nk > 0) {
          const float* qr[3] = {q[r0], q[r0 + (k > 1)], q[r0 + (k > 2 ? 2 : 0)]};
          float* out = S + size_t(r0) * kGroupKeys;
          const float* K = Kp[p];
          for (int j0 = 0; j0 < nk; j0 += 4) {  // (keys up to nk rounded to 4: within the page)
            if (k == 3) dot4<D, 3>(qr, K + j0 * ks[p], ks[p], scale, out + j0);
            else if (k == 2) dot4<D, 2>(qr, K + j0 * ks[p], ks[p], scale, out + j0);
            else dot4<D, 1>(qr, K + j0 * ks[p], ks[p], scale, out + j0);
          }
        }
        for (int i = 0; i < k; ++i) {
          const int r = r0 + i;
          float* Pr = P + size_t(r) * kGroupKeys + pg * B;
          if (nr[i] == 0) {  // no key of this page: m, l, o as they are
            av[size_t(r) * PG + pg] = 1.0f;
            std::memset(Pr, 0, sizeof(float) * B);
            continue;
          }
          float* Sr = S + size_t(r) * kGroupKeys;
          const int ne = (nr[i] + 7) / 8 * 8;
          for (int j = nr[i]; j < ne; ++j) Sr[j] = -INFINITY;
          av[size_t(r) * PG + pg] = softmax_update(Sr, nr[i], m[r], l[r], Pr);
          for (int j = ne; j < B; ++j) Pr[j] = 0.0f;
        }
      }
    }
    // ---- o += P·V over the group, three rows at a time ---------------------------------
    for (int r0 = 0; r0 < R; r0 += 3) {
      const int k = R - r0 < 3 ? R - r0 : 3;
      int e = 0, nn[kGroupKeys / 8];
      for (int i = 0; i < k; ++i) e = end[r0 + i] > e ? end[r0 + i] : e;
      int last = 0;
      for (int pg = 0; pg < np; ++pg) {  // keys of each page these rows see
        const int ps = t0 + (p0 + pg) * B, n = t1 - ps < B ? t1 - ps : B;
        nn[pg] = e - ps <= 0 ? 0 : (e - ps < n ? e - ps : n);
        last = nn[pg] ? pg + 1 : last;
      }
      if (last == 0) continue;  // (every row starts in the segment's first page: not the first group)
      const float* pr[3];
      const float* ar[3];
      for (int i = 0; i < k; ++i) pr[i] = P + size_t(r0 + i) * kGroupKeys, ar[i] = av + size_t(r0 + i) * PG;
      const bool first = p0 == 0;
      if (k == 3) pv_group<D, 3>(Vp.data() + p0, vs.data() + p0, last, nn, pr, B, ar, first, o + r0);
      else if (k == 2) pv_group<D, 2>(Vp.data() + p0, vs.data() + p0, last, nn, pr, B, ar, first, o + r0);
      else pv_group<D, 1>(Vp.data() + p0, vs.data() + p0, last, nn, pr, B, ar, first, o + r0);
    }
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
