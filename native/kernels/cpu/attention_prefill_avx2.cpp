// attention_prefill_avx2.cpp — prefill attention: many query rows over the pages of one
// segment, flash-attention style (AVX2 + FMA + F16C; compiled with -mavx2 -mfma -mf16c).
//
// Each page is shared by every row of the call (the queries of a sub-tile times the G query
// heads of the KV head: GQA), 6 rows at a time: scores by decode's dot4 (attention_avx2.h: 3
// rows x 4 keys, K read in place, q as the FMAs' memory operand), the online softmax update
// of the 6 rows phase by phase, then o = o·alpha + Σ p·V three rows at a time (each V load
// feeds three FMAs). The arithmetic is decode's (page_group in attention_avx2.cpp) operation
// for operation on f32 / f16 rows: the same dot4, softmax_update's operations per row
// (softmax_rows), pv_rows's chains per value (pv_block; the multiply by alpha = 1 left out,
// o·1 = o). So prefill == decode bit for bit (tests/native/test_attention*.py), which is what
// lets a cached call whose prefix holds decoded tokens equal a cold prefill.
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
constexpr int kRows = 6;  // rows per block: two dot4<3> per 4 keys

// ============================================================================
// The online softmax update of the NA active rows act[..] of a row block (scores S[r*64 ..],
// ng vectors of 8; masked keys are -inf): softmax_update's operations per row in its order,
// phase by phase over the rows (every max, then the scalar m / alpha, then each row's e^(s - m)
// and sum) so the rows' dependency chains overlap. A vector past a row's last key is all -inf
// there: it leaves the max alone and adds e = 0 (exactly) to the sum.
// ============================================================================
template <int NA>
inline void softmax_rows(const int* act, int ng, const float* S, float* const* m, float* const* l, float* P,
                         float* alpha) {
  __m256 vmax[NA];
  for (int a = 0; a < NA; ++a) vmax[a] = _mm256_set1_ps(-INFINITY);
  for (int gi = 0; gi < ng; ++gi)
    for (int a = 0; a < NA; ++a) vmax[a] = _mm256_max_ps(vmax[a], _mm256_load_ps(S + act[a] * 64 + 8 * gi));
  float mx[NA];
  for (int a = 0; a < NA; ++a) mx[a] = attn_avx2::hmax(vmax[a]);
  for (int a = 0; a < NA; ++a) {
    const int r = act[a];
    const float mo = *m[r], m_new = mx[a] > mo ? mx[a] : mo;
    alpha[a] = m_new == mo && mo > -INFINITY ? 1.0f : flush_exp(mo - m_new);  // e^0 = 1 exactly
    *m[r] = m_new;
  }
#pragma GCC unroll 1
  for (int a = 0; a < NA; ++a) {  // (a loop: the rows' e^x are independent already; unrolled
    __m256 ps = _mm256_setzero_ps();  // over the rows they spilled the polynomial's constants)
    const __m256 vm = _mm256_set1_ps(*m[act[a]]);
    for (int gi = 0; gi < ng; ++gi) {
      const __m256 x = _mm256_load_ps(S + act[a] * 64 + 8 * gi);
      const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(x, vm)), valid);
      _mm256_store_ps(P + a * 64 + 8 * gi, e);
      ps = _mm256_add_ps(ps, e);
    }
    *l[act[a]] = std::fma(*l[act[a]], alpha[a], hsum(ps));
  }
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
      attn_avx2::pv_key<NR>(x, p, vt);
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
  const int B = kv.block;
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  float* ktile = tile;
  float* vtile = tile + size_t(B) * D;
  alignas(32) float S[kRows * 64], P[kRows * 64];
  alignas(32) float kpad[4 * D];  // a partial last group of 4 keys, zero rows after them
  for (int r = 0; r < R; ++r) {
    *m[r] = -INFINITY, *l[r] = 0.0f;
    std::memset(o[r], 0, sizeof(float) * D);
  }
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    const float *K, *V;
    const size_t ks = page_rows<D>(kv, kv.k, kv.fresh_k, page, ps, g, n, ktile, &K);
    const size_t vs = page_rows<D>(kv, kv.v, kv.fresh_v, page, ps, g, n, vtile, &V);
    // The next page's rows of head g (f32 pages read in place: the backend's workspace) into L1
    // a few lines per row block while this page is computed: each page is read from L2 once
    // per sub-tile, and its first row block otherwise waits on those misses.
    const char *nk = nullptr, *nv = nullptr;
    const int nlines = B * (D / 16);  // 64-byte lines of the next page's K (and V) rows
    if (kv.dtype == KvDType::F32 && !kv.fresh_k && ps + B < t1) {
      const size_t off = (size_t(kv.pages[ps / B + 1]) * B * kv.nkv + g) * D;
      nk = reinterpret_cast<const char*>(static_cast<const float*>(kv.k) + off);
      nv = reinterpret_cast<const char*>(static_cast<const float*>(kv.v) + off);
    }
    const int blocks = (R + kRows - 1) / kRows, per = (nlines + blocks - 1) / blocks;
    int line = 0;
    const int n8 = (n + 7) / 8 * 8, n4 = n / 4 * 4;
    if (n4 < n) {
      std::memset(kpad, 0, sizeof(kpad));
      for (int j = n4; j < n; ++j) std::memcpy(kpad + (j - n4) * D, K + j * ks, sizeof(float) * D);
    }
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
      for (int e = line + per; nk && line < e && line < nlines; ++line) {
        const size_t at = size_t(line / (D / 16)) * kv.nkv * D * 4 + size_t(line % (D / 16)) * 64;
        _mm_prefetch(nk + at, _MM_HINT_T0);
        _mm_prefetch(nv + at, _MM_HINT_T0);
      }
      if (!any) continue;
      // Scores: decode's dot4, 3 rows x 4 keys per call (K read in place; a partial last group
      // from kpad, as decode does); the keys a row does not see are masked here.
      for (int j0 = 0; j0 < n4; j0 += 4) {
        attn_avx2::dot4<D, 3>(qr, K + j0 * ks, ks, scale, S + j0);
        attn_avx2::dot4<D, 3>(qr + 3, K + j0 * ks, ks, scale, S + 3 * 64 + j0);
      }
      if (n4 < n) {
        attn_avx2::dot4<D, 3>(qr, kpad, D, scale, S + n4);
        attn_avx2::dot4<D, 3>(qr + 3, kpad, D, scale, S + 3 * 64 + n4);
      }
      for (int i = 0; i < kRows; ++i)
        for (int j = nr[i]; j < n8; ++j) S[i * 64 + j] = -INFINITY;
      int act[kRows], na = 0;  // the rows that see keys of this page
      for (int i = 0; i < kRows; ++i)
        if (nr[i] > 0) act[na++] = i;
      float alpha[kRows];
      switch (na) {  // P, alpha: the compacted rows
        case 6: softmax_rows<6>(act, n8 / 8, S, m + r0, l + r0, P, alpha); break;
        case 5: softmax_rows<5>(act, n8 / 8, S, m + r0, l + r0, P, alpha); break;
        case 4: softmax_rows<4>(act, n8 / 8, S, m + r0, l + r0, P, alpha); break;
        case 3: softmax_rows<3>(act, n8 / 8, S, m + r0, l + r0, P, alpha); break;
        case 2: softmax_rows<2>(act, n8 / 8, S, m + r0, l + r0, P, alpha); break;
        default: softmax_rows<1>(act, n8 / 8, S, m + r0, l + r0, P, alpha);
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
