// attention_avx2.cpp — decode attention: segments of one query's context, AVX2 + FMA + F16C
// (compiled with -mavx2 -mfma -mf16c; reached only when cpuid reports them, see
// attention_cpu.cpp). Same contract and same arithmetic order as attention_segment_ref.
//
// Online softmax a page at a time: for each query head, the scores of the page's keys
// (8 keys per register group, a horizontal-add tree turns 8 dot-product accumulators into
// one vector of 8 scores), the running max / sum update, then o = o·alpha + Σ p_t v_t with
// o [D] held in registers. f16 / nvfp4 pages are widened once per page into an f32 tile
// that the G heads of the group share (GQA); the pages of a segment are walked once for all
// KV heads (contiguous reads) with the next page prefetched. The prefill kernel
// (attention_prefill_avx2.cpp) reproduces page_step's arithmetic bit for bit.
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
using attn_avx2::hmax;
using attn_avx2::page_rows;

// 8 values of a K/V row as f32: f32 rows as they are, f16 rows widened in the register (exact).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Scores of 8 keys: lane j = q · k[j] (k rows of D values, row stride ks).
template <int D, typename T>
inline __m256 dot8(const float* q, const T* k, size_t ks) {
  __m256 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
  for (int c = 0; c < D; c += 8) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qc, load8(k + j * ks + c), a[j]);
  }
  // hadd tree: 8 accumulators -> [sum a0 .. sum a7]; lane j = ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// One query head's step over one page: the scores of its n keys (masked past n), the online
// softmax update of (m, l), then o = o * alpha + sum_t p_t v_t with o [D] in registers.
// D is a template parameter so the score accumulators and o [D] stay in registers (a run-
// time D left them on the stack: every FMA became a load + store).
// K, V: f32 rows, or f16 rows of the pool read in place (T = uint16_t: no widened tile).
template <int D, typename T>
inline void page_step(const float* qh, const T* K, size_t ks, const T* V, size_t vs, int n, float scale,
                      float* oh, float* m, float* l, float* kpad /*[8, D] zeros*/, float* p /*[64]*/) {
  constexpr int Dv = D / 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  // ---- scores of the page, masked past n ----
  __m256 s[8];  // B <= 64
  const int ng = (n + 7) / 8;
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int gi = 0; gi < ng; ++gi) {
    const int j0 = gi * 8;
    const T* kr = K + j0 * ks;
    __m256 dot;
    if (j0 + 8 > n) {  // partial group: the valid rows (as f32) next to zero rows
      for (int j = 0; j < n - j0; ++j)
        for (int c = 0; c < D; c += 8) _mm256_store_ps(kpad + j * D + c, load8(kr + j * ks + c));
      dot = dot8<D>(qh, static_cast<const float*>(kpad), size_t(D));
    } else {
      dot = dot8<D>(qh, kr, ks);
    }
    __m256 sc = _mm256_mul_ps(dot, vscale);
    const __m256 valid = _mm256_cmp_ps(lane, _mm256_set1_ps(float(n - j0)), _CMP_LT_OQ);
    sc = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, valid);
    s[gi] = sc;
    vmax = _mm256_max_ps(vmax, sc);
    if (j0 + 8 > n)
      for (int j = 0; j < n - j0; ++j) std::memset(kpad + j * D, 0, sizeof(float) * D);
  }
  // ---- online softmax update ----
  const float mx = hmax(vmax);
  const float m_new = mx > *m ? mx : *m;
  const float alpha = flush_exp(*m - m_new);  // 0 on the first page (m = -inf)
  __m256 psum = _mm256_setzero_ps();
  const __m256 vm = _mm256_set1_ps(m_new);
  for (int gi = 0; gi < ng; ++gi) {
    const __m256 valid = _mm256_cmp_ps(s[gi], _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(s[gi], vm)), valid);
    _mm256_store_ps(p + gi * 8, e);
    psum = _mm256_add_ps(psum, e);
  }
  *l = *l * alpha + hsum(psum);
  *m = m_new;
  // ---- o = o * alpha + sum_t p_t v_t ----
  __m256 acc[Dv];
  const __m256 va = _mm256_set1_ps(alpha);
  for (int c = 0; c < Dv; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(oh + 8 * c), va);
  for (int t = 0; t < n; ++t) {
    const __m256 pt = _mm256_broadcast_ss(p + t);
    const T* vt = V + t * vs;
    for (int c = 0; c < Dv; ++c) acc[c] = _mm256_fmadd_ps(pt, load8(vt + 8 * c), acc[c]);
  }
  for (int c = 0; c < Dv; ++c) _mm256_storeu_ps(oh + 8 * c, acc[c]);
}

// KV heads g0..g1-1 of one segment, pages outermost: a page's rows of every head are read
// together and the next page is prefetched while this one is computed.
template <int D>
void segment_heads(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                   float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile) {
  const int B = kv.block;
  float* ktile = tile;                  // [B, D]
  float* vtile = tile + size_t(B) * D;  // [B, D]
  alignas(32) float kpad[8 * D];        // zero rows that complete a group of 8 keys
  alignas(32) float p[64];              // probabilities of one page (B <= 64)
  std::memset(kpad, 0, sizeof(float) * 8 * D);
  for (int g = g0; g < g1; ++g) {
    for (int h = 0; h < G; ++h) m[(g - g0) * mg + h] = -INFINITY, l[(g - g0) * mg + h] = 0.0f;
    for (int h = 0; h < G; ++h) std::memset(o + (g - g0) * og + size_t(h) * D, 0, sizeof(float) * D);
  }
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    if (ps + B < t1) attn_avx2::prefetch_page(kv, kv.pages[ps / B + 1]);
    const bool in_place16 = kv.dtype == KvDType::F16 && !(kv.fresh_k && ps + n > kv.fresh0);
    for (int g = g0; g < g1; ++g) {
      const float* qh = q + (g - g0) * qg;
      float *oh = o + (g - g0) * og, *mh = m + (g - g0) * mg, *lh = l + (g - g0) * mg;
      if (in_place16) {  // f16 rows widened in registers as they are used (no tile stores)
        const size_t ts = size_t(kv.nkv) * D, at = (size_t(page) * B * kv.nkv + g) * D;
        const uint16_t* K = static_cast<const uint16_t*>(kv.k) + at;
        const uint16_t* V = static_cast<const uint16_t*>(kv.v) + at;
        for (int h = 0; h < G; ++h)
          page_step<D>(qh + size_t(h) * D, K, ts, V, ts, n, scale, oh + size_t(h) * D, mh + h, lh + h, kpad, p);
        continue;
      }
      const float *K, *V;
      const size_t ks = page_rows<D>(kv, kv.k, kv.fresh_k, page, ps, g, n, ktile, &K);
      const size_t vs = page_rows<D>(kv, kv.v, kv.fresh_v, page, ps, g, n, vtile, &V);
      for (int h = 0; h < G; ++h)
        page_step<D>(qh + size_t(h) * D, K, ks, V, vs, n, scale, oh + size_t(h) * D, mh + h, lh + h, kpad, p);
    }
  }
}

}  // namespace

void attention_heads_avx2(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                          float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile) {
  switch (kv.D) {
    case 64: return segment_heads<64>(kv, g0, g1, q, qg, G, t0, t1, scale, o, og, m, l, mg, tile);
    case 128: return segment_heads<128>(kv, g0, g1, q, qg, G, t0, t1, scale, o, og, m, l, mg, tile);
    case 32: return segment_heads<32>(kv, g0, g1, q, qg, G, t0, t1, scale, o, og, m, l, mg, tile);
    case 96: return segment_heads<96>(kv, g0, g1, q, qg, G, t0, t1, scale, o, og, m, l, mg, tile);
    default:
      for (int g = g0; g < g1; ++g)
        attention_segment_ref(kv, g, q + (g - g0) * qg, G, t0, t1, scale, o + (g - g0) * og, m + (g - g0) * mg,
                              l + (g - g0) * mg, tile);
  }
}

void attention_segment_avx2(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale,
                            float* o, float* m, float* l, float* tile) {
  attention_heads_avx2(kv, g, g + 1, q, 0, G, t0, t1, scale, o, 0, m, l, 0, tile);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
