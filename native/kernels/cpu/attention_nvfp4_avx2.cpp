// attention_nvfp4_avx2.cpp — decode attention over NVFP4 KV pages without widening K
// (AVX2 + FMA + F16C; compiled with -mavx2 -mfma -mf16c; see attention_avx2.h for the contract).
//
// Scores are integer dot products on the codes: q is quantised to int8 per block of 16 values
// (d = amax/127, q8 = nearbyint(q·127/amax), as quantize_act_q8 does per 32), the E2M1 codes
// are looked up as 2·e2m1 in int8 (vpshufb), and each block's integer sum is scaled by
// (d · 0.5 · scale) · e4m3(block scale) in f32:
//   s_t = Σ_b float(I_tb) · ((d_b · 0.5 · scale) · ks_tb),   I_tb = Σ_{i in b} q8_i · 2·e2m1(c_ti)
// summed as ((b0 + b1) + (b2 + b3)) over a 64-value chunk (D = 128: block b of the second chunk
// added to block b of the first before that, f_b + f_{b+4}). The
// integer part is exact (|I| <= 16·127·12); the f32 part rounds a few times per score.
// A 32-byte chunk of codes is split into low / high nibbles (even / odd values); q is stored
// in the same order. The codes are looked up as 2·e2m1 + 12 (unsigned, 0..24), so maddubs
// takes them as its unsigned operand and q straight from memory as its signed one (no
// per-head sign_epi8), and I_tb = Σ q8_i·(2·e2m1 + 12) - 12·Σ_{i in b} q8_i, the second term
// once per head and block (quantize_q_int8's qc): the same exact integer, so the same bits.
// V rows are widened into an f32 tile: each nibble looked up as the high byte of its f16 value
// (E2M1 values have a zero low byte in f16), vcvtph2ps, times the block scale: bit for bit
// kv_nvfp4_decode_row.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/kernels_impl.h"

namespace kvdeck::cpu::attn_avx2 {
void nvfp4_page_scales(const uint8_t* rows, size_t ts, int n, int nr, int D, uint16_t* ks) {
  nvfp4_page_scales_heads(rows, ts, 0, 1, n, nr, D, ks);
}

void nvfp4_page_scales_heads(const uint8_t* rows, size_t ts, size_t hs, int nh, int n, int nr, int D, uint16_t* ks) {
  // The scale dwords (4 blocks of a 64-value chunk) of 8 rows at a time gathered (vpgatherdd;
  // rows >= n masked to 0), the NaN codes 0x7F / 0xFF set to 0, then each byte as f16 bits:
  // the sign-extended byte << 7 with bit 14 cleared ((b & 0x7F) << 7 | sign << 15) is the
  // value / 256 (e4m3 subnormals become f16 subnormals: exact).
  const int C = D / 64;
  const __m256i keep = _mm256_set1_epi16(int16_t(0xBF80)), low7 = _mm256_set1_epi8(0x7F);
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(int(ts)));
  for (int h = 0; h < nh; ++h)
    for (int c = 0; c < C; ++c)
      for (int t0 = 0; t0 < nr; t0 += 8) {
        const int* base = reinterpret_cast<const int*>(rows + h * hs + t0 * ts + D / 2 + 4 * c);
        const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - t0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256i w = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, idx, live, 1);
        w = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(w, low7), low7), w);
        __m256i* dst = reinterpret_cast<__m256i*>(ks + ((size_t(h) * C + c) * nr + t0) * 4);
        _mm256_store_si256(dst, _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), 7), keep));
        _mm256_store_si256(dst + 1,
                           _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), 7), keep));
      }
}

void quantize_q_int8(const float* q, int G, int D, float scale, int8_t* q8, float* qs, int32_t* qc) {
  const int C = D / 64;
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) {
      int8_t* lo = q8 + (size_t(h) * C + c) * 64;  // [32 even values | 32 odd values]
      float* s = qs + (size_t(h) * C + c) * 8;
      float d[4];
      int32_t sum[4] = {0, 0, 0, 0};
      for (int b = 0; b < 4; ++b) {
        const float* x = q + size_t(h) * D + 64 * c + 16 * b;
        const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
        const float amax = hmax(_mm256_max_ps(_mm256_and_ps(x0, absm), _mm256_and_ps(x1, absm)));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        alignas(32) int32_t r[16];  // nearbyint(x · id): vcvtps2dq rounds to nearest even
        _mm256_store_si256(reinterpret_cast<__m256i*>(r), _mm256_cvtps_epi32(_mm256_mul_ps(x0, _mm256_set1_ps(id))));
        _mm256_store_si256(reinterpret_cast<__m256i*>(r + 8), _mm256_cvtps_epi32(_mm256_mul_ps(x1, _mm256_set1_ps(id))));
        for (int i = 0; i < 8; ++i) {
          lo[8 * b + i] = int8_t(r[2 * i]);
          lo[32 + 8 * b + i] = int8_t(r[2 * i + 1]);
        }
        for (int i = 0; i < 16; ++i) sum[b] += r[i];
      }
      // the lane pattern of a key pair's block sums: [b0 b1 b0 b1 | b2 b3 b2 b3]
      const int pat[8] = {0, 1, 0, 1, 2, 3, 2, 3};
      for (int i = 0; i < 8; ++i) s[i] = d[pat[i]] * 0.5f * scale * 256.0f;  // (x 256: the scales are stored / 256)
      for (int i = 0; i < 8; ++i) qc[(size_t(h) * C + c) * 8 + i] = 12 * sum[pat[i]];  // the +12 of the codes' lookup
    }
}

// ============================================================================
// Scores of the n keys of a page (rows at k, token stride ts bytes) for G heads
// ============================================================================
template <int C>
static void scores_c(const int8_t* q8, const float* qs, const int32_t* qc, int G, const uint8_t* k, size_t ts,
                     int n, const uint16_t* ks, float* S) {
  const int n8 = (n + 7) / 8 * 8;
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i tab = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,  // 2·e2m1 + 12
                                       12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  alignas(32) float F[64 * 4 * 8];  // [h][pair][8]
  for (int j0 = 0; j0 < n8; j0 += 8) {
    for (int p = 0; p < 4; ++p) {
      const int t = j0 + 2 * p;
      for (int c = 0; c < C; ++c) {
        __m256i m[2][2];  // 2·e2m1 + 12 of the even (low nibble) and odd (high nibble) values
        for (int u = 0; u < 2; ++u) {
          const __m256i x = t + u < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + (t + u) * ts + 32 * c))
                                      : _mm256_setzero_si256();  // (code 0: +12 - 12 = 0)
          m[u][0] = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, nib));
          m[u][1] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));
        }
        // [t b0 b1 t+1 b0 b1 | t b2 b3 t+1 b2 b3] scales of this chunk
        const __m256 kp = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_cvtph_ps(_mm_load_si128(
                                      reinterpret_cast<const __m128i*>(ks + (size_t(c) * n8 + t) * 4)))), 0xD8));
        for (int h = 0; h < G; ++h) {
          const __m256i qlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + (size_t(h) * C + c) * 64));
          const __m256i qhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + (size_t(h) * C + c) * 64 + 32));
          __m256i X[2];  // (|sum| of a pair <= 2·24·127, of a + b <= 12,192: no int16 saturation)
          for (int u = 0; u < 2; ++u)
            X[u] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(m[u][0], qlo), _mm256_maddubs_epi16(m[u][1], qhi)),
                                     ones);
          const __m256i I = _mm256_sub_epi32(_mm256_hadd_epi32(X[0], X[1]),
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + (size_t(h) * C + c) * 8)));
          const __m256 sc = _mm256_mul_ps(kp, _mm256_loadu_ps(qs + (size_t(h) * C + c) * 8));
          const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(I), sc);
          float* fp = F + (size_t(h) * 4 + p) * 8;
          _mm256_store_ps(fp, c == 0 ? f : _mm256_add_ps(_mm256_load_ps(fp), f));
        }
      }
    }
    for (int h = 0; h < G; ++h) {
      const float* fp = F + size_t(h) * 32;
      const __m256 a = _mm256_hadd_ps(_mm256_load_ps(fp), _mm256_load_ps(fp + 8));
      const __m256 b = _mm256_hadd_ps(_mm256_load_ps(fp + 16), _mm256_load_ps(fp + 24));
      const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
      _mm256_store_ps(S + h * 64 + j0, s);
    }
  }
}

void nvfp4_page_scores(const int8_t* q8, const float* qs, const int32_t* qc, int G, int D, const uint8_t* k,
                       size_t ts, int n, const uint16_t* ks, float* S) {
  if (D == 64) return scores_c<1>(q8, qs, qc, G, k, ts, n, ks, S);
  return scores_c<2>(q8, qs, qc, G, k, ts, n, ks, S);
}

// ============================================================================
// V rows of a page -> f32 tile [n, D] (bit for bit kv_nvfp4_decode_row)
// ============================================================================
void nvfp4_page_rows(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int n8, float* tile) {
  const int C = D / 64;
  const __m256i nib = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
  // the f16 high byte of e2m1(code): 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives
  const __m256i hb = _mm256_setr_epi8(0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, char(0x80), char(0xB8),
                                      char(0xBC), char(0xBE), char(0xC0), char(0xC2), char(0xC4), char(0xC6),
                                      0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46, char(0x80), char(0xB8),
                                      char(0xBC), char(0xBE), char(0xC0), char(0xC2), char(0xC4), char(0xC6));
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < C; ++c) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + t * ts + 32 * c));
      const __m256i e = _mm256_shuffle_epi8(hb, _mm256_and_si256(x, nib));                         // even values
      const __m256i o = _mm256_shuffle_epi8(hb, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));  // odd values
      // f16 words: [b0 even | b2 even], [b1 even | b3 even], the same for odd; then natural order
      const __m256i e0 = _mm256_unpacklo_epi8(zero, e), e1 = _mm256_unpackhi_epi8(zero, e);
      const __m256i o0 = _mm256_unpacklo_epi8(zero, o), o1 = _mm256_unpackhi_epi8(zero, o);
      const __m256i w[4] = {_mm256_unpacklo_epi16(e0, o0), _mm256_unpackhi_epi16(e0, o0),   // v0-7 | v32-39, v8-15 | v40-47
                            _mm256_unpacklo_epi16(e1, o1), _mm256_unpackhi_epi16(e1, o1)};  // v16-23 | v48-55, v24-31 | v56-63
      float s[4];  // the block scales (stored / 256: x 256 is exact)
      for (int b = 0; b < 4; ++b) s[b] = _cvtsh_ss(ks[(size_t(c) * n8 + t) * 4 + b]) * 256.0f;
      float* dst = tile + size_t(t) * D + 64 * c;
      for (int i = 0; i < 4; ++i) {
        const int b = i / 2;  // lane 0: block b (values 8i..), lane 1: block b + 2
        _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(w[i])), _mm256_set1_ps(s[b])));
        _mm256_storeu_ps(dst + 32 + 8 * i,
                         _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(w[i], 1)), _mm256_set1_ps(s[b + 2])));
      }
    }
}

// ============================================================================
// o += P·V on the codes (integer V side; the contract: attention_nvfp4_pv_ref, ops_cpu.h)
// ============================================================================
// Two token rows' codes interleaved per value (A0..A3 below: 16 (t, t+1) byte pairs each), the
// weights W (u8, <= 255) of the pair broadcast per block, vpmaddubsw sums the pair into int16
// per value; 4 pairs (8 tokens) add in int16 (4 * 2 * 255 * 12 = 24480 < 32767), then int32,
// f32 and one FMA per value and group of 8 tokens.
template <int C>
static void pv_c(const uint8_t* v, size_t ts, int n, const uint16_t* ks, int G, const float* P, int ldp,
                 const float* alpha, float* o) {
  constexpr int D = 64 * C;
  const int n8 = (n + 7) / 8 * 8, np = (n + 1) / 2;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i tab = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,  //
                                       0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  alignas(32) __m256i vp[32 * C * 4];  // [pair][chunk][A0..A3]
  for (int j = 0; j < np; ++j)
    for (int c = 0; c < C; ++c) {
      __m256i R[2][2];
      for (int u = 0; u < 2; ++u) {
        const int t = 2 * j + u;
        const __m256i x = t < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + t * ts + 32 * c))
                                : _mm256_setzero_si256();
        const __m256i lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, nib));                         // even values
        const __m256i hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));  // odd values
        R[u][0] = _mm256_unpacklo_epi8(lo, hi);  // values 0-15 | 32-47
        R[u][1] = _mm256_unpackhi_epi8(lo, hi);  // values 16-31 | 48-63
      }
      __m256i* a = vp + (size_t(j) * C + c) * 4;
      a[0] = _mm256_unpacklo_epi8(R[0][0], R[1][0]);  // 0-7 | 32-39   (blocks 0 | 2)
      a[1] = _mm256_unpackhi_epi8(R[0][0], R[1][0]);  // 8-15 | 40-47  (blocks 0 | 2)
      a[2] = _mm256_unpacklo_epi8(R[0][1], R[1][1]);  // 16-23 | 48-55 (blocks 1 | 3)
      a[3] = _mm256_unpackhi_epi8(R[0][1], R[1][1]);  // 24-31 | 56-63 (blocks 1 | 3)
    }
  // the pair's (t, t+1) weights of block b (lane 0) and b + 2 (lane 1): bytes (b, 4 + b) repeated
  const __m256i ctl_a = _mm256_setr_epi8(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4,  //
                                         2, 6, 2, 6, 2, 6, 2, 6, 2, 6, 2, 6, 2, 6, 2, 6);
  const __m256i ctl_b = _mm256_add_epi8(ctl_a, _mm256_set1_epi8(1));
  const __m256i tok = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packed dwords -> token order
  const __m256 k255 = _mm256_set1_ps(255.0f), half255 = _mm256_set1_ps(0.5f / 255.0f);
  const int ng = (n + 7) / 8;
  alignas(32) uint8_t W[C * 8 * 32];  // [chunk][group][token][block] weights of one head
  alignas(32) float F[C * 8 * 8];     // [chunk][group] wm · 0.5/255 per block (both halves)
  for (int h = 0; h < G; ++h) {
    const float* ph = P + size_t(h) * ldp;
    for (int c = 0; c < C; ++c)  // the weights first: their chains overlap the V loop below
      for (int gi = 0; gi < ng; ++gi) {
        const int g0 = 8 * gi;  // < n8: P and ks are defined for the group's 8 tokens (0 past n)
        // w = p_t · scale_tb for the group's tokens, its max per block
        __m256 w[4];
        __m256 wm = _mm256_setzero_ps();
        const __m256 p8 = _mm256_mul_ps(_mm256_loadu_ps(ph + g0), _mm256_set1_ps(256.0f));  // (p·256)·(s/256) = p·s
        for (int u = 0; u < 4; ++u) {
          const __m256 pp = _mm256_permutevar8x32_ps(p8, _mm256_setr_epi32(2 * u, 2 * u, 2 * u, 2 * u, 2 * u + 1,
                                                                           2 * u + 1, 2 * u + 1, 2 * u + 1));
          w[u] = _mm256_mul_ps(pp, _mm256_cvtph_ps(_mm_load_si128(
                                       reinterpret_cast<const __m128i*>(ks + (size_t(c) * n8 + g0 + 2 * u) * 4))));
          wm = _mm256_max_ps(wm, w[u]);
        }
        wm = _mm256_max_ps(wm, _mm256_permute2f128_ps(wm, wm, 1));  // blocks 0-3 in both halves
        const __m256 inv = _mm256_and_ps(_mm256_div_ps(k255, wm), _mm256_cmp_ps(wm, _mm256_setzero_ps(), _CMP_GT_OQ));
        _mm256_store_ps(F + (c * 8 + gi) * 8, _mm256_mul_ps(wm, half255));
        __m256i q[4];
        for (int u = 0; u < 4; ++u) q[u] = _mm256_cvtps_epi32(_mm256_mul_ps(w[u], inv));
        const __m256i a = _mm256_packs_epi32(q[0], q[1]), b = _mm256_packs_epi32(q[2], q[3]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(W + (c * 8 + gi) * 32),
                           _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), tok));
      }
    for (int c = 0; c < C; ++c) {
      float* oc = o + size_t(h) * D + 64 * c;
      __m256 of[8];
      for (int i = 0; i < 8; ++i) of[i] = _mm256_mul_ps(_mm256_loadu_ps(oc + 8 * i), _mm256_set1_ps(alpha[h]));
      for (int gi = 0; gi < ng; ++gi) {
        const int g0 = 8 * gi;
        const uint8_t* wg = W + (c * 8 + gi) * 32;
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        auto pair = [&](int j) {  // tokens 2j, 2j + 1 of the page
          int64_t wq;
          std::memcpy(&wq, wg + 8 * (j - g0 / 2), 8);
          const __m256i wb = _mm256_set1_epi64x(wq);
          const __m256i wa = _mm256_shuffle_epi8(wb, ctl_a), wc = _mm256_shuffle_epi8(wb, ctl_b);
          const __m256i* a = vp + (size_t(j) * C + c) * 4;
          acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(wa, a[0]));
          acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(wa, a[1]));
          acc[2] = _mm256_add_epi16(acc[2], _mm256_maddubs_epi16(wc, a[2]));
          acc[3] = _mm256_add_epi16(acc[3], _mm256_maddubs_epi16(wc, a[3]));
        };
        const int j1 = (g0 + 8 < n ? g0 + 8 : n) + 1;
        if (j1 / 2 - g0 / 2 == 4) {  // a whole group: unrolled (the loop's register copies of acc cost
          pair(g0 / 2);              // 4 moves a pair, and its branch)
          pair(g0 / 2 + 1);
          pair(g0 / 2 + 2);
          pair(g0 / 2 + 3);
        } else {
          for (int j = g0 / 2; j < j1 / 2; ++j) pair(j);
        }
        const float* f = F + (c * 8 + gi) * 8;
        for (int k = 0; k < 4; ++k) {  // acc k: values 8k.. (block k / 2), 32 + 8k.. (block 2 + k / 2)
          const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc[k])));
          const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(acc[k], 1)));
          of[k] = _mm256_fmadd_ps(lo, _mm256_broadcast_ss(f + k / 2), of[k]);
          of[4 + k] = _mm256_fmadd_ps(hi, _mm256_broadcast_ss(f + 2 + k / 2), of[4 + k]);
        }
      }
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(oc + 8 * i, of[i]);
    }
  }
}

bool nvfp4_page_pv(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int G, const float* P, int ldp,
                   const float* alpha, float* o) {
  // negative block scales (the encoder writes none): the float path. Read from ks (the f16
  // sign bits; a NaN code is 0 there, as the reference reads it), 16 words per vector
  const int nw = D / 64 * ((n + 7) / 8 * 8) * 4;  // (a multiple of 32 words)
  __m256i sgn = _mm256_setzero_si256();
  for (int i = 0; i < nw; i += 16) sgn = _mm256_or_si256(sgn, _mm256_load_si256(reinterpret_cast<const __m256i*>(ks + i)));
  if (_mm256_movemask_epi8(_mm256_srai_epi16(sgn, 15))) return false;
  if (D == 64) pv_c<1>(v, ts, n, ks, G, P, ldp, alpha, o);
  else pv_c<2>(v, ts, n, ks, G, P, ldp, alpha, o);
  return true;
}

}  // namespace kvdeck::cpu::attn_avx2

namespace kvdeck::cpu {
bool attention_nvfp4_pv_avx2(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                             const float* alpha, float* o) {
  if ((D != 64 && D != 128) || n < 1 || n > 64) return false;
  alignas(32) uint16_t ks[2 * 64 * 4];
  attn_avx2::nvfp4_page_scales(v, ts, n, (n + 7) / 8 * 8, D, ks);
  return attn_avx2::nvfp4_page_pv(v, ts, n, D, ks, G, P, ldp, alpha, o);
}

bool attention_nvfp4_pv_avx512(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                               const float* alpha, float* o) {
  if ((D != 64 && D != 128) || n < 1 || n > 64) return false;
  alignas(32) uint16_t ks[2 * 64 * 4];
  attn_avx2::nvfp4_page_scales(v, ts, n, (n + 7) / 8 * 8, D, ks);
  return nvfp4_page_pv_avx512(v, ts, n, D, ks, G, P, ldp, alpha, o);
}
}  // namespace kvdeck::cpu
#endif  // __x86_64__
