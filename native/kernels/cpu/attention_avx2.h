// attention_avx2.h — private to attention_avx2.cpp / attention_prefill_avx2.cpp (compiled
// with -mavx2 -mfma -mf16c): the f32 rows a page step reads, the horizontal max, prefetch.
//
// Rows come from the pool page (f32: read in place; f16: F16C; nvfp4: decoded with a permute
// of a per-block scaled table, bit for bit kv_nvfp4_decode_row) or, for the tokens at
// positions >= kv.fresh0 when kv.fresh_k is set (attention_fresh), from the chunk's f32 rows.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvdeck/formats.h"
#include "kernels/cpu/vec_avx2.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu::attn_avx2 {

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// E4M3 (float8_e4m3fn) code -> f32, NaN codes as 0 (the KV encoder never writes them), as
// the scalar row decoder does.
inline const float* e4m3_kv_table() {
  struct T {
    float v[256];
    T() {
      for (int i = 0; i < 256; ++i) {
        v[i] = e4m3_to_f32(uint8_t(i));
        if (std::isnan(v[i])) v[i] = 0.0f;
      }
    }
  };
  static const T t;
  return t.v;
}

// One NVFP4 KV row (codes [D/2], E4M3 scales [D/16]) -> f32 [D]. Per block of 16: the table
// {0, .5, 1, 1.5, 2, 3, 4, 6} times the block's scale; a dword of 8 codes broadcast and shifted
// by 4j puts code j in lane j's low bits, vpermps looks up its magnitude (low 3 bits), the
// code's bit 3 becomes the sign. (±m)·s rounds as m·s, so this is kv_nvfp4_decode_row exactly.
inline void nvfp4_row(const uint8_t* row, int D, float* dst, const float* e4m3) {
  const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
  const uint8_t* sc = row + D / 2;
  for (int b = 0; b < D / 16; ++b) {
    const __m256 tab = _mm256_mul_ps(mag, _mm256_set1_ps(e4m3[sc[b]]));
    for (int h = 0; h < 2; ++h) {
      int32_t w;
      std::memcpy(&w, row + b * 8 + h * 4, 4);
      const __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(w), shift);
      const __m256 v = _mm256_permutevar8x32_ps(tab, c);
      const __m256 s = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(c, 28)), sign);
      _mm256_storeu_ps(dst + b * 16 + h * 8, _mm256_xor_ps(v, s));
    }
  }
}

// Rows [0, n) of KV head g of the page holding positions tp.. (K or V: base, fresh), as f32
// rows: a pointer into the page (f32 pool, no fresh rows among them) or rows written into
// tile [n, D]. Returns the row stride in floats.
template <int D>
inline size_t page_rows(const KvView& kv, const void* base, const float* fresh, int page, int tp, int g, int n,
                        float* tile, const float** rows) {
  int pooled = n;  // rows read from the pool; the rest from the fresh f32 rows
  if (fresh) pooled = kv.fresh0 - tp < 0 ? 0 : (kv.fresh0 - tp < n ? kv.fresh0 - tp : n);
  const size_t rb = kv_row_bytes(kv.dtype, D), ts = rb * kv.nkv;
  const uint8_t* p = static_cast<const uint8_t*>(base) + (size_t(page) * kv.block * kv.nkv + g) * rb;
  if (kv.dtype == KvDType::F32 && pooled == n) {
    *rows = reinterpret_cast<const float*>(p);
    return size_t(kv.nkv) * D;
  }
  const float* e4m3 = kv.dtype == KvDType::NVFP4 ? e4m3_kv_table() : nullptr;
  for (int t = 0; t < pooled; ++t, p += ts) {
    float* dst = tile + size_t(t) * D;
    if (kv.dtype == KvDType::F16) {
      const auto* h = reinterpret_cast<const __m128i*>(p);
      for (int c = 0; c < D / 8; ++c) _mm256_storeu_ps(dst + 8 * c, _mm256_cvtph_ps(_mm_loadu_si128(h + c)));
    } else if (kv.dtype == KvDType::NVFP4) {
      nvfp4_row(p, D, dst, e4m3);
    } else {
      std::memcpy(dst, p, sizeof(float) * D);
    }
  }
  for (int t = pooled; t < n; ++t)
    std::memcpy(tile + size_t(t) * D, fresh + size_t(tp + t - kv.fresh0) * kv.fresh_ld + size_t(g) * D,
                sizeof(float) * D);
  *rows = tile;
  return size_t(D);
}

// 8 values of a K/V row as f32: f32 rows as they are, f16 rows widened in the register (exact).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Scores of 4 keys (rows k, k + ks, ..) for HB query rows q[0..HB) sharing the K loads: lane
// j of out[h*64 ..] = scale·(q_h · k_j), summed as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) over the
// 8 lanes of the FMA chains q[8c+l]·k[8c+l] (c ascending). Decode (page_group) and prefill
// (segment_rows) both score with it, so their scores agree bit for bit.
template <int D, int HB, typename T>
inline void dot4(const float* const* q, const T* k, size_t ks, float scale, float* out /*[HB][64] at key j0*/) {
  __m256 a[HB][4];
  for (int h = 0; h < HB; ++h)
    for (int j = 0; j < 4; ++j) a[h][j] = _mm256_setzero_ps();
  for (int c = 0; c < D; c += 8)  // one K vector live at a time, q as the FMAs' memory operand:
    for (int j = 0; j < 4; ++j) {   // 4·HB accumulators + 1 (HB = 3: 13 of the 16 registers, no spills)
      const __m256 kc = load8(k + j * ks + c);
      for (int h = 0; h < HB; ++h) {
        __m256 qc = _mm256_loadu_ps(q[h] + c);
        if (HB > 1) __asm__("" : "+x"(qc));  // (keeps the compiler from hoisting HB·4 q loads)
        a[h][j] = _mm256_fmadd_ps(qc, kc, a[h][j]);
      }
    }
  for (int h = 0; h < HB; ++h) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[h][0], a[h][1]), _mm256_hadd_ps(a[h][2], a[h][3]));
    const __m128 sc = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    _mm_storeu_ps(out + h * 64, _mm_mul_ps(sc, _mm_set1_ps(scale)));
  }
}

// The online softmax update of one row over its nr scores S (the reference order: a page's max, alpha, e^(s - m), their sum):
// m, l updated (l = fma(l, alpha, sum)), P = e^(S - m_new) (0 where masked); returns alpha.
inline float softmax_update(const float* S, int nr, float* m, float* l, float* P) {
  const int ng = (nr + 7) / 8;
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int gi = 0; gi < ng; ++gi) vmax = _mm256_max_ps(vmax, _mm256_load_ps(S + 8 * gi));
  const float mx = hmax(vmax);
  const float m_new = mx > *m ? mx : *m;
  const float alpha = m_new == *m && *m > -INFINITY ? 1.0f : flush_exp(*m - m_new);  // e^0 = 1 exactly
  __m256 psum = _mm256_setzero_ps();
  const __m256 vm = _mm256_set1_ps(m_new);
  for (int gi = 0; gi < ng; ++gi) {
    const __m256 s = _mm256_load_ps(S + 8 * gi);
    const __m256 valid = _mm256_cmp_ps(s, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(s, vm)), valid);
    _mm256_store_ps(P + 8 * gi, e);
    psum = _mm256_add_ps(psum, e);
  }
  *l = std::fma(*l, alpha, hsum(psum));  // one rounding, whatever the caller's inlining lets the compiler contract
  *m = m_new;
  return alpha;
}

// One key's p_t · v_t into NR rows' 32-value slices (x[r][c]: 8 values each), each V vector
// loaded once for its NR FMAs: the inner step of pv_rows, pv_block (attention_prefill_avx2.cpp)
// and the whole-segment prefill (attention_prefill_wide_avx2.cpp).
template <int NR, typename T>
inline void pv_key(__m256 (&x)[NR][4], const __m256 (&p)[NR], const T* vt) {
  for (int c = 0; c < 4; ++c) {
    __m256 v = load8(vt + 8 * c);
    if (NR > 1) __asm__("" : "+x"(v));  // one load for the NR FMAs (else folded NR times)
    for (int r = 0; r < NR; ++r) x[r][c] = _mm256_fmadd_ps(p[r], v, x[r][c]);
  }
}

// ============================================================================
// o = o·alpha + Σ_{t < n} p_t v_t for NR rows at once, 32 columns at a time (4·NR
// accumulators, each V load feeding NR FMAs); per element the FMA chain o·alpha, then + p_t·v_t for t ascending.
// ============================================================================
template <int D, int NR, typename T>
inline void pv_rows(const T* V, size_t vs, const float* const* P, const int* n, const float* alpha,
                    float* const* o) {
  static_assert(D % 32 == 0, "32 columns at a time");
  int nc = n[0];
  for (int r = 1; r < NR; ++r) nc = n[r] < nc ? n[r] : nc;
  for (int c0 = 0; c0 < D; c0 += 32) {  // the keys every row sees: accumulators in registers
    __m256 x[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) x[r][c] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + c0 + 8 * c), _mm256_set1_ps(alpha[r]));
    const T* vt = V + c0;
    for (int t = 0; t < nc; ++t, vt += vs) {
      __m256 p[NR];
      for (int r = 0; r < NR; ++r) p[r] = _mm256_broadcast_ss(P[r] + t);
      pv_key<NR>(x, p, vt);
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, x[r][c]);
  }
  for (int r = 0; r < NR; ++r)  // rows that see more keys of this page (the causal edge): the
    for (int c0 = 0; c0 < D; c0 += 32) {  // same chains, continued from the stored partials
      __m256 x[4];
      for (int c = 0; c < 4; ++c) x[c] = _mm256_loadu_ps(o[r] + c0 + 8 * c);
      for (int t = nc; t < n[r]; ++t)
        for (int c = 0; c < 4; ++c)
          x[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(P[r] + t), load8(V + t * vs + c0 + 8 * c), x[c]);
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[r] + c0 + 8 * c, x[c]);
    }
}

// ============================================================================
// NVFP4 pages without widening K (attention_nvfp4_avx2.cpp; D = 64 or 128)
// ============================================================================
// q of G heads [G, D] -> q8 [G, D/64, 64] (per 64-value chunk: its 32 even values, then its
// 32 odd ones; int8 per block of 16, d = amax/127) and qs [G, D/64, 8], the factors
// d_b · 0.5 · scale · 256 in the lane pattern [b0 b1 b0 b1 | b2 b3 b2 b3], and qc [G, D/64, 8]
// the corrections 12 · Σ_{i in block} q8_i in the same pattern (the scores' unsigned codes).
void quantize_q_int8(const float* q, int G, int D, float scale, int8_t* q8, float* qs, int32_t* qc);
// The E4M3 block scales of n rows (token stride ts bytes) as f16 bits of the value / 256, ks
// [D/64, nr, 4], nr >= n a multiple of 8 (rows >= n: 0; scores and P·V read nr = n rounded
// up to 8); NaN codes read as 0. The consumers fold the 256 into q's factors (qs) and
// p (exact: powers of 2). _heads: nh KV heads at once (head h's rows at rows + h·hs), ks
// [nh][D/64][nr][4].
void nvfp4_page_scales(const uint8_t* rows, size_t ts, int n, int nr, int D, uint16_t* ks);
void nvfp4_page_scales_heads(const uint8_t* rows, size_t ts, size_t hs, int nh, int n, int nr, int D, uint16_t* ks);
// S[h*64 + j] = s_j for the n keys at k (stride ts), j < n rounded up to 8 (keys >= n score 0):
// the integer-dot score of attention_nvfp4_avx2.cpp's header. ks from nvfp4_page_scales; q8,
// qs, qc from quantize_q_int8.
void nvfp4_page_scores(const int8_t* q8, const float* qs, const int32_t* qc, int G, int D, const uint8_t* k,
                       size_t ts, int n, const uint16_t* ks, float* S);
// n V rows at v (stride ts) -> tile f32 [n, D], bit for bit kv_nvfp4_decode_row (ks: nr rows).
void nvfp4_page_rows(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int n8, float* tile);
// o[h] = o[h]·alpha[h] + Σ_t P[h*ldp + t] v_t over the n V rows at v (stride ts) on the codes,
// bit for bit attention_nvfp4_pv_ref (ops_cpu.h); ks from nvfp4_page_scales. P[h*ldp + t] is
// read for t < n rounded up to 8 (0 past n). False (o untouched) when a block scale is negative.
bool nvfp4_page_pv(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int G, const float* P, int ldp,
                   const float* alpha, float* o);

// The next page's K and V (every head) prefetched into L2 a few lines at a time while this page
// is computed: pages are scattered in the pool, so the hardware's stream prefetcher cannot see
// the next one coming, and a whole page's prefetches at once stall on the miss buffers
// (measured: a page-sized burst ran no faster than no overlap at all).
struct PageFetch {
  const char* k = nullptr;
  const char* v = nullptr;
  size_t bytes = 0, off = 0;
  PageFetch() = default;
  PageFetch(const KvView& kv, int page) : bytes(size_t(kv.block) * kv.nkv * kv_row_bytes(kv.dtype, kv.D)) {
    k = static_cast<const char*>(kv.k) + size_t(page) * bytes;
    v = static_cast<const char*>(kv.v) + size_t(page) * bytes;
  }
  void step(size_t lines) {
    for (; lines && off < bytes; --lines, off += 64) {
      _mm_prefetch(k + off, _MM_HINT_T1);
      _mm_prefetch(v + off, _MM_HINT_T1);
    }
  }
};

}  // namespace kvdeck::cpu::attn_avx2
#endif  // __x86_64__
