// attention_prefill_wide_avx2.cpp — prefill attention over an f32 view whose decode does not
// share its arithmetic (KvView::decode_order false: the backend's workspace of an NVFP4 pool,
// whose decode scores with int8 q): the rows of one 256-key segment computed a whole segment
// at a time instead of decode's page steps (AVX2 + FMA; compiled with -mavx2 -mfma -mf16c).
//
// Per task call (the rows of one KV head that see segment [t0, t1)): the segment's K rows are
// transposed once into chunks of 32 keys [chunk][D][32] (shared by every row of the call),
// then per block of 6 rows:
//   scores  2 rows x 32 keys per step: one K^T vector per 8 keys, q[r][d] broadcast, 8
//           accumulators; no horizontal sums (keys are in the lanes);
//   softmax the segment's max, e^(s - m) and their sum per row: no online rescaling within a
//           segment (m, l, o are the segment's partial as attention_combine takes it);
//   P·V     3 rows x 32 values per step over the whole segment in 12 accumulators (o written
//           once per segment, no alpha products), each V load feeding three FMAs.
// A row's result depends only on its q, the keys it sees and the fixed order above (never on
// which rows share a block, the tile sizes or the threads), so the cached == cold and thread
// agreements hold; it is not decode's order, so prefill != decode bit for bit here (they differ
// anyway by decode's int8 q; tests/native/test_attention*.py bound both against float64).
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

constexpr int kChunk = 32;   // keys per K^T chunk (4 vectors)
constexpr int kMaxKeys = 320;  // attn_segment(block) for block <= 64, rounded up to a chunk
constexpr int kMaxRows = 512;  // rows per call at most (attention_queries: kAttnWideRows)

// Scores of rows a, b for the 32 keys of one chunk of K^T (kt [D][32]): S[j] = scale · q · k_j.
template <int D>
inline void scores_pair(const float* qa, const float* qb, const float* kt, float scale, float* Sa, float* Sb) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  const float* k = kt;
#pragma GCC unroll 4
  for (int d = 0; d < D; ++d, k += kChunk) {
    const __m256 k0 = _mm256_load_ps(k), k1 = _mm256_load_ps(k + 8), k2 = _mm256_load_ps(k + 16),
                 k3 = _mm256_load_ps(k + 24);
    const __m256 x = _mm256_broadcast_ss(qa + d), y = _mm256_broadcast_ss(qb + d);
    a0 = _mm256_fmadd_ps(x, k0, a0), a1 = _mm256_fmadd_ps(x, k1, a1);
    a2 = _mm256_fmadd_ps(x, k2, a2), a3 = _mm256_fmadd_ps(x, k3, a3);
    b0 = _mm256_fmadd_ps(y, k0, b0), b1 = _mm256_fmadd_ps(y, k1, b1);
    b2 = _mm256_fmadd_ps(y, k2, b2), b3 = _mm256_fmadd_ps(y, k3, b3);
  }
  const __m256 vs = _mm256_set1_ps(scale);
  _mm256_store_ps(Sa, _mm256_mul_ps(a0, vs)), _mm256_store_ps(Sa + 8, _mm256_mul_ps(a1, vs));
  _mm256_store_ps(Sa + 16, _mm256_mul_ps(a2, vs)), _mm256_store_ps(Sa + 24, _mm256_mul_ps(a3, vs));
  _mm256_store_ps(Sb, _mm256_mul_ps(b0, vs)), _mm256_store_ps(Sb + 8, _mm256_mul_ps(b1, vs));
  _mm256_store_ps(Sb + 16, _mm256_mul_ps(b2, vs)), _mm256_store_ps(Sb + 24, _mm256_mul_ps(b3, vs));
}

// One row's softmax over its n keys (S -> P = e^(S - m) in place, 0 past n up to n rounded to
// 8): m the max, l the sum (lanes in 8 chains, then hsum).
inline void softmax_row(float* S, int n, float* m, float* l) {
  const int ng = (n + 7) / 8;
  for (int j = n; j < ng * 8; ++j) S[j] = -INFINITY;  // e^-inf = 0 (exp256: inputs below -87 give 0)
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int gi = 0; gi < ng; ++gi) vmax = _mm256_max_ps(vmax, _mm256_load_ps(S + 8 * gi));
  const float mx = attn_avx2::hmax(vmax);
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int gi = 0;
  for (; gi + 2 <= ng; gi += 2) {
    const __m256 e0 = exp256(_mm256_sub_ps(_mm256_load_ps(S + 8 * gi), vm));
    const __m256 e1 = exp256(_mm256_sub_ps(_mm256_load_ps(S + 8 * gi + 8), vm));
    _mm256_store_ps(S + 8 * gi, e0), _mm256_store_ps(S + 8 * gi + 8, e1);
    s0 = _mm256_add_ps(s0, e0), s1 = _mm256_add_ps(s1, e1);
  }
  if (gi < ng) {
    const __m256 e0 = exp256(_mm256_sub_ps(_mm256_load_ps(S + 8 * gi), vm));
    _mm256_store_ps(S + 8 * gi, e0);
    s0 = _mm256_add_ps(s0, e0);
  }
  *m = mx;
  *l = hsum(_mm256_add_ps(s0, s1));
}

// o[r] += Σ_{t0 <= t < n[r]} P[r][t] v_t for NR rows over the keys t0.. of one chunk (n[r] > t0,
// t < t0 + kChunk), 32 values at a time in 4·NR accumulators over the keys every row sees, then
// each longer row's remaining keys (the causal edge).
template <int D, int NR>
inline void pv_chunk(const float* const* vrow, int t0, const float* const* P, const int* n, float* const* o) {
  int nc = n[0];
  for (int r = 1; r < NR; ++r) nc = n[r] < nc ? n[r] : nc;
  const int te = t0 + kChunk;
  nc = nc < te ? nc : te;
  for (int c0 = 0; c0 < D; c0 += 32) {
    __m256 x[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) x[r][c] = _mm256_loadu_ps(o[r] + c0 + 8 * c);
#pragma GCC unroll 2
    for (int t = t0; t < nc; ++t) {
      const float* vt = vrow[t] + c0;
      __m256 p[NR];
      for (int r = 0; r < NR; ++r) p[r] = _mm256_broadcast_ss(P[r] + t);
      attn_avx2::pv_key<NR>(x, p, vt);
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, x[r][c]);
  }
  for (int r = 0; r < NR; ++r) {  // the causal edge: a longer row's further keys, the same chains
    const int nr = n[r] < te ? n[r] : te;  // continued from the stored partials (its own
    for (int c0 = 0; c0 < D && nc < nr; c0 += 32) {  // registers: indexing x[r] here spilled them)
      __m256 y[4];
      for (int c = 0; c < 4; ++c) y[c] = _mm256_loadu_ps(o[r] + c0 + 8 * c);
      for (int t = nc; t < nr; ++t) {
        const __m256 p = _mm256_broadcast_ss(P[r] + t);
        for (int c = 0; c < 4; ++c) y[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vrow[t] + c0 + 8 * c), y[c]);
      }
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, y[c]);
    }
  }
}

// K rows krow[0..8) (8 keys) -> kt[d][j], d < D, j < 8 at row stride kChunk: 8x8 transposes.
template <int D>
inline void transpose8(const float* const* kr, float* kt) {
  for (int d = 0; d < D; d += 8) {
    __m256 r0 = _mm256_loadu_ps(kr[0] + d), r1 = _mm256_loadu_ps(kr[1] + d), r2 = _mm256_loadu_ps(kr[2] + d),
           r3 = _mm256_loadu_ps(kr[3] + d), r4 = _mm256_loadu_ps(kr[4] + d), r5 = _mm256_loadu_ps(kr[5] + d),
           r6 = _mm256_loadu_ps(kr[6] + d), r7 = _mm256_loadu_ps(kr[7] + d);
    const __m256 u0 = _mm256_unpacklo_ps(r0, r1), u1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 u2 = _mm256_unpacklo_ps(r2, r3), u3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 u4 = _mm256_unpacklo_ps(r4, r5), u5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 u6 = _mm256_unpacklo_ps(r6, r7), u7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 w0 = _mm256_shuffle_ps(u0, u2, 0x44), w1 = _mm256_shuffle_ps(u0, u2, 0xEE);
    const __m256 w2 = _mm256_shuffle_ps(u1, u3, 0x44), w3 = _mm256_shuffle_ps(u1, u3, 0xEE);
    const __m256 w4 = _mm256_shuffle_ps(u4, u6, 0x44), w5 = _mm256_shuffle_ps(u4, u6, 0xEE);
    const __m256 w6 = _mm256_shuffle_ps(u5, u7, 0x44), w7 = _mm256_shuffle_ps(u5, u7, 0xEE);
    float* o8 = kt + size_t(d) * kChunk;  // value d + i of the 8 keys at o8 + i·kChunk
    _mm256_store_ps(o8, _mm256_permute2f128_ps(w0, w4, 0x20));
    _mm256_store_ps(o8 + kChunk, _mm256_permute2f128_ps(w1, w5, 0x20));
    _mm256_store_ps(o8 + 2 * kChunk, _mm256_permute2f128_ps(w2, w6, 0x20));
    _mm256_store_ps(o8 + 3 * kChunk, _mm256_permute2f128_ps(w3, w7, 0x20));
    _mm256_store_ps(o8 + 4 * kChunk, _mm256_permute2f128_ps(w0, w4, 0x31));
    _mm256_store_ps(o8 + 5 * kChunk, _mm256_permute2f128_ps(w1, w5, 0x31));
    _mm256_store_ps(o8 + 6 * kChunk, _mm256_permute2f128_ps(w2, w6, 0x31));
    _mm256_store_ps(o8 + 7 * kChunk, _mm256_permute2f128_ps(w3, w7, 0x31));
  }
}

// The R rows (row r sees keys t0 .. end[r]) of one segment, in three passes over its chunks of
// 32 keys, each chunk's K^T (D·32 floats) or V rows (32·D) in L1 while every row uses them:
// scores of every row, then each row's softmax over the whole segment, then o += P·V.
template <int D>
void segment_rows_wide(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0, float scale,
                       float* const* o, float* const* m, float* const* l) {
  const int B = kv.block;
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  const int n = t1 - t0, n_chunks = (n + kChunk - 1) / kChunk;
  thread_local std::vector<float> buf;  // K^T of one chunk [D][32], then S / P [R][kMaxKeys]
  const size_t kt_floats = size_t(D) * kChunk;
  buf.resize(kt_floats + size_t(R + 1) * kMaxKeys + 8);
  float* kt = buf.data() + (-reinterpret_cast<uintptr_t>(buf.data()) / 4 & 7);
  float* S = kt + kt_floats;
  const float* krow[kMaxKeys];
  const float* vrow[kMaxKeys];
  int nr[kMaxRows];
  const size_t ts = size_t(kv.nkv) * D;  // f32 in place: token stride within a page
  for (int t = 0; t < n; ++t) {
    const size_t at = (size_t(kv.pages[(t0 + t) / B]) * B + (t0 + t) % B) * ts + size_t(g) * D;
    krow[t] = static_cast<const float*>(kv.k) + at;
    vrow[t] = static_cast<const float*>(kv.v) + at;
  }
  alignas(32) static const float zero[128] = {};
  for (int t = n; t < n_chunks * kChunk; ++t) krow[t] = zero;
  for (int r = 0; r < R; ++r) nr[r] = end[r] - t0;
  for (int c = 0; c < n_chunks; ++c) {  // scores
    for (int j0 = 0; j0 < kChunk; j0 += 8) transpose8<D>(krow + c * kChunk + j0, kt + j0);
    for (int i = 0; i < R; i += 2) {
      const int j = i + 1 < R ? i + 1 : R;  // an odd last row pairs with a scratch row (S[R])
      if (nr[i] <= c * kChunk && (j == R || nr[j] <= c * kChunk)) continue;  // neither sees this chunk
      scores_pair<D>(q[i], q[j < R ? j : i], kt, scale, S + size_t(i) * kMaxKeys + c * kChunk,
                     S + size_t(j) * kMaxKeys + c * kChunk);
    }
  }
  for (int r = 0; r < R; ++r) {
    softmax_row(S + size_t(r) * kMaxKeys, nr[r], m[r], l[r]);
    std::memset(o[r], 0, sizeof(float) * D);
  }
  for (int c = 0; c < n_chunks; ++c) {  // o += P·V, row triples sharing each V load
    const int tc = c * kChunk;
    int act[kMaxRows], na = 0;
    for (int r = 0; r < R; ++r)
      if (nr[r] > tc) act[na++] = r;
    for (int a = 0; a < na;) {  // any rows may share a triple: a row's sums are its own
      const int k = na - a >= 3 ? 3 : na - a;
      float* orow[3];
      const float* prow[3];
      int nn[3];
      for (int i = 0; i < k; ++i)
        orow[i] = o[act[a + i]], prow[i] = S + size_t(act[a + i]) * kMaxKeys, nn[i] = nr[act[a + i]];
      if (k == 3) pv_chunk<D, 3>(vrow, tc, prow, nn, orow);
      else if (k == 2) pv_chunk<D, 2>(vrow, tc, prow, nn, orow);
      else pv_chunk<D, 1>(vrow, tc, prow, nn, orow);
      a += k;
    }
  }
}

}  // namespace

bool attention_rows_wide_avx2(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                              float scale, float* const* o, float* const* m, float* const* l) {
  if (kv.dtype != KvDType::F32 || kv.fresh_k || kv.block > 64 || R > kMaxRows) return false;
  switch (kv.D) {
    case 64: segment_rows_wide<64>(kv, g, R, q, end, t0, scale, o, m, l); return true;
    case 128: segment_rows_wide<128>(kv, g, R, q, end, t0, scale, o, m, l); return true;
    case 32: segment_rows_wide<32>(kv, g, R, q, end, t0, scale, o, m, l); return true;
    case 96: segment_rows_wide<96>(kv, g, R, q, end, t0, scale, o, m, l); return true;
    default: return false;
  }
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
