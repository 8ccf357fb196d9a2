// attention_avx2.cpp — decode attention: segments of one query's context, AVX2 + FMA + F16C
// (compiled with -mavx2 -mfma -mf16c; reached only when cpuid reports them, see
// attention_cpu.cpp). Same contract as attention_segment_ref (not the same summation order).
//
// Online softmax a page at a time (page_group): the scores of the page's keys for the G query
// heads of a KV head (4 keys × up to 3 heads per block, so each K load feeds 3 FMAs), the
// running max / sum update per head, then o = o·alpha + Σ p_t v_t up to three heads at a time.
// f16 pages are read in place (F16C in registers). nvfp4 pages (attention_scores_int8) are
// scored with integer dot products on the codes (attention_nvfp4_avx2.cpp) and their V rows
// widened once per page into an f32 tile the G heads share. While the avx512vnni set is active
// (cpu::avx512_active) nvfp4 pages run attention_nvfp4_avx512.cpp's scores, softmax and P·V
// instead, every KV head's softmax of a page in one call: the same bits as this file's. A
// segment's pages are walked once for all KV heads (contiguous reads), the page after next
// prefetched a few lines at a time.
// The prefill kernel (attention_prefill_avx2.cpp) runs the same arithmetic on f32 / f16 rows
// (summation tree, softmax_update, pv_rows), so there prefill == decode bit for bit; over nvfp4
// pages decode differs from it by q's int8 rounding (ops_cpu.h).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {
namespace {
using attn_avx2::dot4;
using attn_avx2::load8;
using attn_avx2::page_rows;
using attn_avx2::pv_rows;

// softmax_update (attention_avx2.h) for HB heads at once, phase by phase (every head's max,
// then their scalar m / alpha, then their e^(s - m) and sums): per head the same operations
// in the same order, so the same bits, but the heads' dependency chains (max -> m -> e^x ->
// sum) sit side by side in program order for the out-of-order core to overlap; one head at a
// time, each chain's latency was exposed (the softmax was 16% of nvfp4 decode).
template <int HB>
inline void softmax_block(int ng, float* m, float* l, const float* S, float* P, float* alpha) {
  __m256 vmax[HB], ps[HB], vm[HB];
  for (int h = 0; h < HB; ++h) vmax[h] = _mm256_set1_ps(-INFINITY), ps[h] = _mm256_setzero_ps();
  for (int gi = 0; gi < ng; ++gi)
    for (int h = 0; h < HB; ++h) vmax[h] = _mm256_max_ps(vmax[h], _mm256_load_ps(S + h * 64 + 8 * gi));
  for (int h = 0; h < HB; ++h) {
    const float mx = attn_avx2::hmax(vmax[h]);
    const float m_new = mx > m[h] ? mx : m[h];
    alpha[h] = m_new == m[h] && m[h] > -INFINITY ? 1.0f : flush_exp(m[h] - m_new);  // e^0 = 1 exactly
    m[h] = m_new;
    vm[h] = _mm256_set1_ps(m_new);
  }
  for (int gi = 0; gi < ng; ++gi)
    for (int h = 0; h < HB; ++h) {
      const __m256 x = _mm256_load_ps(S + h * 64 + 8 * gi);
      const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(x, vm[h])), valid);
      _mm256_store_ps(P + h * 64 + 8 * gi, e);
      ps[h] = _mm256_add_ps(ps[h], e);
    }
  for (int h = 0; h < HB; ++h) l[h] = std::fma(l[h], alpha[h], hsum(ps[h]));  // softmax_update's fma, not left to -ffp-contract
}

// The online softmax update of the G heads' scores S of one page (n keys; S[h*64 + j] for j
// >= n masked here): m, l, P = e^(S - m) per head, alpha[h] the factor for o; bit for bit
// softmax_update per head (prefill's), up to four heads interleaved.
inline void softmax_heads(int G, int n, float* m, float* l, float* S, float* P, float* alpha) {
  const int ne = (n + 7) / 8 * 8, ng = ne / 8;
  for (int h = 0; h < G; ++h)
    for (int j = n; j < ne; ++j) S[h * 64 + j] = -INFINITY;
  for (int h = 0; h < G;) {
    const int r = G - h >= 4 ? 4 : G - h;
    float* Sh = S + h * 64;
    float* Ph = P + h * 64;
    if (r == 4) softmax_block<4>(ng, m + h, l + h, Sh, Ph, alpha + h);
    else if (r == 3) softmax_block<3>(ng, m + h, l + h, Sh, Ph, alpha + h);
    else if (r == 2) softmax_block<2>(ng, m + h, l + h, Sh, Ph, alpha + h);
    else softmax_block<1>(ng, m + h, l + h, Sh, Ph, alpha + h);
    h += r;
  }
}

// o = o·alpha + Σ p_t v_t for the G heads up to three at a time (each V load feeds their FMAs).
template <int D, typename T>
void pv_heads(int G, const T* V, size_t vs, int n, float* o, const float* P, const float* alpha) {
  for (int h = 0; h < G;) {  // three heads at a time (12 FMA chains: FMA latency x 2 pipes), then 2, 1
    const int r = G - h >= 3 ? 3 : G - h;
    const float* pr[3] = {P + h * 64, P + (h + 1) * 64, P + (h + 2) * 64};
    float* orow[3] = {o + size_t(h) * D, o + size_t(h + 1) * D, o + size_t(h + 2) * D};
    const int nn[3] = {n, n, n};
    if (r == 3)
      pv_rows<D, 3>(V, vs, pr, nn, alpha + h, orow);
    else if (r == 2)
      pv_rows<D, 2>(V, vs, pr, nn, alpha + h, orow);
    else
      pv_rows<D, 1>(V, vs, pr, nn, alpha + h, orow);
    h += r;
  }
}

template <int D, typename T>
void softmax_pv(int G, const T* V, size_t vs, int n, float* o, float* m, float* l, float* S, float* P) {
  float alpha[64];
  softmax_heads(G, n, m, l, S, P, alpha);
  pv_heads<D>(G, V, vs, n, o, P, alpha);
}

// The G query heads of one KV head over one page of n keys (K, V: f32 rows or f16 rows read
// in place): scores (heads in blocks of 3 sharing each K load), the online softmax update per
// head, then o = o·alpha + Σ p_t v_t two heads at a time (each V load feeds two FMAs).
template <int D, typename T>
void page_group(const float* q, int G, const T* K, size_t ks, const T* V, size_t vs, int n, float scale, float* o,
                float* m, float* l, float* S /*[G][64]*/, float* P /*[G][64]*/, attn_avx2::PageFetch& pf,
                size_t lines) {
  alignas(32) float kpad[4 * D];  // the last keys of a partial group of 4, zero rows after them
  const size_t per4 = (lines + (n + 3) / 4 - 1) / ((n + 3) / 4);  // next-page lines per group of 4 keys
  for (int j0 = 0; j0 < n; j0 += 4) {
    pf.step(per4);
    const T* kr = K + j0 * ks;
    const float* kf = nullptr;
    if (j0 + 4 > n) {
      std::memset(kpad, 0, sizeof(kpad));
      for (int j = 0; j < n - j0; ++j)
        for (int c = 0; c < D; c += 8) _mm256_store_ps(kpad + j * D + c, load8(kr + j * ks + c));
      kf = kpad;
    }
    for (int h0 = 0; h0 < G; h0 += 3) {
      float* out = S + h0 * 64 + j0;
      const float* qh[3] = {q + size_t(h0) * D, q + size_t(h0 + 1) * D, q + size_t(h0 + 2) * D};
      switch (G - h0 < 3 ? G - h0 : 3) {
        case 3: kf ? dot4<D, 3>(qh, kf, D, scale, out) : dot4<D, 3>(qh, kr, ks, scale, out); break;
        case 2: kf ? dot4<D, 2>(qh, kf, D, scale, out) : dot4<D, 2>(qh, kr, ks, scale, out); break;
        default: kf ? dot4<D, 1>(qh, kf, D, scale, out) : dot4<D, 1>(qh, kr, ks, scale, out); break;
      }
    }
  }
  softmax_pv<D>(G, V, vs, n, o, m, l, S, P);
}

// KV heads g0..g1-1 of one segment, pages outermost: a page's rows of every head are read
// together and the next page is prefetched while this one is computed.
template <int D>
void segment_heads(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                   float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile) {
  const int B = kv.block;
  float* ktile = tile;                  // [B, D]
  float* vtile = tile + size_t(B) * D;  // [B, D]
  alignas(32) float S[64 * 64], P[64 * 64];  // scores, probabilities [G <= 64][B <= 64]
  for (int g = g0; g < g1; ++g) {
    for (int h = 0; h < G; ++h) m[(g - g0) * mg + h] = -INFINITY, l[(g - g0) * mg + h] = 0.0f;
    for (int h = 0; h < G; ++h) std::memset(o + (g - g0) * og + size_t(h) * D, 0, sizeof(float) * D);
  }
  // nvfp4 pages (D 64 / 128, whole groups of 8 rows): q quantised once per segment and KV head
  const bool int8_scores = attention_scores_int8(kv);  // (and this kernel's G <= 64)
  const bool int_v = int8_scores && attention_int_v();
  const bool z512 = int8_scores && avx512_active();  // the avx512vnni set: its page kernels (same bits)
  auto page_scores = z512 ? nvfp4_page_scores_avx512 : attn_avx2::nvfp4_page_scores;
  auto page_pv = z512 ? nvfp4_page_pv_avx512 : attn_avx2::nvfp4_page_pv;
  thread_local std::vector<int8_t> q8;
  thread_local std::vector<float> qs;
  thread_local std::vector<int32_t> qc;
  thread_local std::vector<uint16_t> ks_buf;  // a page's K / V block scales (32-byte aligned below)
  if (int8_scores) {
    q8.resize(size_t(g1 - g0) * G * D);
    qs.resize(size_t(g1 - g0) * G * (D / 8));
    qc.resize(qs.size());
    for (int g = g0; g < g1; ++g)
      attn_avx2::quantize_q_int8(q + (g - g0) * qg, G, D, scale, q8.data() + size_t(g - g0) * G * D,
                                 qs.data() + size_t(g - g0) * G * (D / 8), qc.data() + size_t(g - g0) * G * (D / 8));
  }
  for (int ps = t0; ps < t1; ps += B) {
    const int n = t1 - ps < B ? t1 - ps : B;
    const int page = kv.pages[ps / B];
    // two pages ahead, spread over this page's work (the segment's second page at its start)
    if (ps == t0 && ps + B < t1) attn_avx2::PageFetch(kv, kv.pages[ps / B + 1]).step(size_t(1) << 30);
    attn_avx2::PageFetch pf = ps + 2 * B < t1 ? attn_avx2::PageFetch(kv, kv.pages[ps / B + 2]) : attn_avx2::PageFetch();
    const size_t lines = (pf.bytes / 64 + (g1 - g0) - 1) / (g1 - g0) + 1;  // per KV head
    const bool pooled = !(kv.fresh_k && ps + n > kv.fresh0);  // no fresh rows in this page
    const bool in_place16 = kv.dtype == KvDType::F16 && pooled;
    if (int8_scores && pooled) {  // nvfp4: integer scores and P·V on the codes (a page with fresh rows: f32)
      const size_t rb = kv_row_bytes(kv.dtype, D), ts = rb * kv.nkv;
      const int n8 = (n + 7) / 8 * 8;
      // the block scales of every head's K and V rows of this page: [head][D/64][n8][4]
      const size_t kss = size_t(D / 64) * n8 * 4, vss = kss;
      ks_buf.resize((g1 - g0) * (kss + vss) + 16);
      uint16_t* ksk = ks_buf.data() + (-reinterpret_cast<uintptr_t>(ks_buf.data()) / 2 & 15);
      uint16_t* ksv = ksk + (g1 - g0) * kss;
      const size_t at0 = (size_t(page) * B * kv.nkv + g0) * rb;
      attn_avx2::nvfp4_page_scales_heads(static_cast<const uint8_t*>(kv.k) + at0, ts, rb, g1 - g0, n, n8, D, ksk);
      attn_avx2::nvfp4_page_scales_heads(static_cast<const uint8_t*>(kv.v) + at0, ts, rb, g1 - g0, n, n8, D, ksv);
      // avx512vnni: every KV head's scores, one softmax over all (KV head, query head) rows
      // (their chains interleaved 4 at a time; m / l gathered and put back), then each head's
      // P·V. Per row the same operations as one KV head at a time: the same bits.
      const bool batch = z512 && (g1 - g0) * G <= 64;
      float alpha[64];
      if (batch) {
        for (int g = g0; g < g1; ++g) {
          pf.step(lines);
          page_scores(q8.data() + size_t(g - g0) * G * D, qs.data() + size_t(g - g0) * G * (D / 8),
                      qc.data() + size_t(g - g0) * G * (D / 8), G, D,
                      static_cast<const uint8_t*>(kv.k) + (size_t(page) * B * kv.nkv + g) * rb, ts, n,
                      ksk + (g - g0) * kss, S + (g - g0) * G * 64);
        }
        float mb[64], lb[64];
        for (int g = g0; g < g1; ++g)
          for (int h = 0; h < G; ++h) mb[(g - g0) * G + h] = m[(g - g0) * mg + h], lb[(g - g0) * G + h] = l[(g - g0) * mg + h];
        softmax_heads_avx512((g1 - g0) * G, n, mb, lb, S, P, alpha);
        for (int g = g0; g < g1; ++g)
          for (int h = 0; h < G; ++h) m[(g - g0) * mg + h] = mb[(g - g0) * G + h], l[(g - g0) * mg + h] = lb[(g - g0) * G + h];
      }
      for (int g = g0; g < g1; ++g) {
        const size_t at = (size_t(page) * B * kv.nkv + g) * rb;
        const uint8_t* K = static_cast<const uint8_t*>(kv.k) + at;
        const uint8_t* V = static_cast<const uint8_t*>(kv.v) + at;
        const uint16_t* ks = ksv + (g - g0) * vss;
        float* Pg = batch ? P + (g - g0) * G * 64 : P;
        float* ag = batch ? alpha + (g - g0) * G : alpha;
        if (!batch) {
          pf.step(lines);
          page_scores(q8.data() + size_t(g - g0) * G * D, qs.data() + size_t(g - g0) * G * (D / 8),
                      qc.data() + size_t(g - g0) * G * (D / 8), G, D, K, ts, n, ksk + (g - g0) * kss, S);
          (z512 ? softmax_heads_avx512 : softmax_heads)(G, n, m + (g - g0) * mg, l + (g - g0) * mg, S, P, alpha);
        }
        if (int_v && page_pv(V, ts, n, D, ks, G, Pg, 64, ag, o + (g - g0) * og))
          continue;  // o += P·V on the codes
        attn_avx2::nvfp4_page_rows(V, ts, n, D, ks, n8, vtile);
        pv_heads<D>(G, static_cast<const float*>(vtile), D, n, o + (g - g0) * og, Pg, ag);
      }
      continue;
    }
    for (int g = g0; g < g1; ++g) {
      const float* qh = q + (g - g0) * qg;
      float *oh = o + (g - g0) * og, *mh = m + (g - g0) * mg, *lh = l + (g - g0) * mg;
      if (in_place16) {  // f16 rows widened in registers as they are used (no tile stores)
        const size_t ts = size_t(kv.nkv) * D, at = (size_t(page) * B * kv.nkv + g) * D;
        const uint16_t* K = static_cast<const uint16_t*>(kv.k) + at;
        const uint16_t* V = static_cast<const uint16_t*>(kv.v) + at;
        page_group<D>(qh, G, K, ts, V, ts, n, scale, oh, mh, lh, S, P, pf, lines);
        continue;
      }
      const float *K, *V;
      const size_t ks = page_rows<D>(kv, kv.k, kv.fresh_k, page, ps, g, n, ktile, &K);
      const size_t vs = page_rows<D>(kv, kv.v, kv.fresh_v, page, ps, g, n, vtile, &V);
      page_group<D>(qh, G, K, ks, V, vs, n, scale, oh, mh, lh, S, P, pf, lines);
    }
  }
}

}  // namespace

void attention_heads_avx2(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                          float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile) {
  if (G > 64) {  // beyond the kernel's score buffers: the portable kernel
    for (int g = g0; g < g1; ++g)
      attention_segment_ref(kv, g, q + (g - g0) * qg, G, t0, t1, scale, o + (g - g0) * og, m + (g - g0) * mg,
                            l + (g - g0) * mg, tile);
    return;
  }
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
