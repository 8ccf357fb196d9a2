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
using attn_avx2::pv_rows;
using attn_avx2::softmax_update;

constexpr int kPv = 2;    // rows per o update (8 accumulators; measured faster than 3)
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
      float alpha[kRows];
      for (int i = 0; i < kRows; ++i)
        if (nr[i] > 0) alpha[i] = softmax_update(S + i * 64, nr[i], m[r0 + i], l[r0 + i], P + i * 64);
      for (int i0 = 0; i0 < kRows; i0 += kPv) {  // the active rows of each group
        const float* pr[kPv];
        float* orow[kPv];
        int nn[kPv], k = 0;
        float al[kPv];
        for (int i = i0; i < i0 + kPv && i < kRows; ++i)
          if (nr[i] > 0) pr[k] = P + i * 64, orow[k] = o[r0 + i], nn[k] = nr[i], al[k++] = alpha[i];
        if (k == 2) pv_rows<D, 2>(V, vs, pr, nn, al, orow);
        else if (k == 1) pv_rows<D, 1>(V, vs, pr, nn, al, orow);
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
