// attention_avx2.cpp — one context segment of causal attention, AVX2 + FMA + F16C
// (compiled with -mavx2 -mfma -mf16c; reached only when cpuid reports them, see
// attention_cpu.cpp). Same contract and same arithmetic order as attention_segment_ref.
//
// Online softmax a page at a time: for each query head, the scores of the page's keys
// (8 keys per register group, a horizontal-add tree turns 8 dot-product accumulators into
// one vector of 8 scores), the running max / sum update, then o = o·alpha + Σ p_t v_t with
// o [D] held in registers. f16 / nvfp4 pages are widened once per page into an f32 tile
// that the G heads of the group share (GQA).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {
namespace {


inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scores of 8 keys: lane j = q · k[j] (k rows of D floats, row stride ks).
template <int D>
inline __m256 dot8(const float* q, const float* k, size_t ks) {
  __m256 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
  for (int c = 0; c < D; c += 8) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + j * ks + c), a[j]);
  }
  // hadd tree: 8 accumulators -> [sum a0 .. sum a7]
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Rows [t, t+n) of KV head g of one page, as f32 rows: a pointer into the page (f32) or
// the widened tile (f16, nvfp4). Returns the row stride in floats.
size_t page_rows(const KvView& kv, const void* base, int page, int g, int n, float* tile,
                 const float** rows) {
  const int D = kv.D;
  if (kv.dtype == KvDType::F32) {
    *rows = static_cast<const float*>(base) + (size_t(page) * kv.block * kv.nkv + g) * D;
    return size_t(kv.nkv) * D;
  }
  const size_t rb = kv_row_bytes(kv.dtype, D);
  const uint8_t* p = static_cast<const uint8_t*>(base) + (size_t(page) * kv.block * kv.nkv + g) * rb;
  for (int t = 0; t < n; ++t, p += rb * kv.nkv) {
    float* dst = tile + size_t(t) * D;
    if (kv.dtype == KvDType::F16) {
      const auto* h = reinterpret_cast<const uint16_t*>(p);
      for (int c = 0; c < D; c += 8)
        _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + c))));
    } else {
      kv_nvfp4_decode_row(p, D, dst);
    }
  }
  *rows = tile;
  return size_t(D);
}

// One query head's step over one page: the scores of its n keys (masked past n), the online
// softmax update of (m, l), then o = o * alpha + sum_t p_t v_t with o [D] in registers.
// Every caller (one query's segment, or a tile of queries sharing the page) runs exactly this
// arithmetic per (query head, page), so decode and prefill agree bit for bit.
// D is a template parameter so the score accumulators and o [D] stay in registers (a run-
// time D left them on the stack: every FMA became a load + store).
template <int D>
inline void page_step(const float* qh, const float* K, size_t ks, const float* V, size_t vs, int n, float scale,
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
    const float* kr = K + j0 * ks;
    size_t stride = ks;
    if (j0 + 8 > n) {  // partial group: copy the valid rows next to zero rows
      for (int j = 0; j < n - j0; ++j) std::memcpy(kpad + j * D, kr + j * ks, sizeof(float) * D);
      kr = kpad, stride = D;
    }
    __m256 sc = _mm256_mul_ps(dot8<D>(qh, kr, stride), vscale);
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
    const float* vt = V + t * vs;
    for (int c = 0; c < Dv; ++c) acc[c] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * c), acc[c]);
  }
  for (int c = 0; c < Dv; ++c) _mm256_storeu_ps(oh + 8 * c, acc[c]);
}

template <int D>
void segment(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale, float* o,
             float* m, float* l, float* tile) {
  const int B = kv.block;
  float* ktile = tile;                    // [B, D]
  float* vtile = tile + size_t(B) * D;    // [B, D]
  alignas(32) float kpad[8 * D];          // zero rows that complete a group of 8 keys
  alignas(32) float p[64];                // probabilities of one page (B <= 64)
  std::memset(kpad, 0, sizeof(float) * 8 * D);
  for (int h = 0; h < G; ++h) m[h] = -INFINITY, l[h] = 0.0f;
  std::memset(o, 0, sizeof(float) * G * D);
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    const float *K, *V;
    const size_t ks = page_rows(kv, kv.k, page, g, n, ktile, &K);
    const size_t vs = page_rows(kv, kv.v, page, g, n, vtile, &V);
    for (int h = 0; h < G; ++h)
      page_step<D>(q + size_t(h) * D, K, ks, V, vs, n, scale, o + size_t(h) * D, m + h, l + h, kpad, p);
  }
}

// Rows r of a segment starting at t0 that share its pages: row r (a query head) ends at
// end[r] (> t0, at most t0 + segment); the page is loaded (widened) once for all of them.
template <int D>
void segment_rows(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0, float scale,
                  float* const* o, float* const* m, float* const* l, float* tile) {
  const int B = kv.block;
  int t1 = t0;
  for (int r = 0; r < R; ++r) t1 = end[r] > t1 ? end[r] : t1;
  float* ktile = tile;
  float* vtile = tile + size_t(B) * D;
  alignas(32) float kpad[8 * D];
  alignas(32) float p[64];
  std::memset(kpad, 0, sizeof(float) * 8 * D);
  for (int r = 0; r < R; ++r) {
    *m[r] = -INFINITY, *l[r] = 0.0f;
    std::memset(o[r], 0, sizeof(float) * D);
  }
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    const float *K, *V;
    const size_t ks = page_rows(kv, kv.k, page, g, n, ktile, &K);
    const size_t vs = page_rows(kv, kv.v, page, g, n, vtile, &V);
    for (int r = 0; r < R; ++r) {
      if (end[r] <= ps) continue;
      const int nr = end[r] - ps < n ? end[r] - ps : n;
      page_step<D>(q[r], K, ks, V, vs, nr, scale, o[r], m[r], l[r], kpad, p);
    }
  }
}

}  // namespace

void attention_segment_avx2(const KvView& kv, int g, const float* q, int G, int t0, int t1,
                            float scale, float* o, float* m, float* l, float* tile) {
  switch (kv.D) {
    case 64: return segment<64>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
    case 128: return segment<128>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
    case 32: return segment<32>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
    case 96: return segment<96>(kv, g, q, G, t0, t1, scale, o, m, l, tile);
    default: return attention_segment_ref(kv, g, q, G, t0, t1, scale, o, m, l, tile);
  }
}

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
