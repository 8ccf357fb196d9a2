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
// in the same order, so sign_epi8 + maddubs multiply matching values.
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

void quantize_q_int8(const float* q, int G, int D, float scale, int8_t* q8, float* qs) {
  const int C = D / 64;
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) {
      int8_t* lo = q8 + (size_t(h) * C + c) * 64;  // [32 even values | 32 odd values]
      float* s = qs + (size_t(h) * C + c) * 8;
      float d[4];
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
      }
      // the lane pattern of a key pair's block sums: [b0 b1 b0 b1 | b2 b3 b2 b3]
      const int pat[8] = {0, 1, 0, 1, 2, 3, 2, 3};
      for (int i = 0; i < 8; ++i) s[i] = d[pat[i]] * 0.5f * scale * 256.0f;  // (x 256: the scales are stored / 256)
    }
}

// ============================================================================
// Scores of the n keys of a page (rows at k, token stride ts bytes) for G heads
// ============================================================================
template <int C>
static void scores_c(const int8_t* q8, const float* qs, int G, const uint8_t* k, size_t ts, int n,
                     const uint16_t* ks, float* S) {
  const int n8 = (n + 7) / 8 * 8;
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i tab = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12,  //
                                       0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12);
  alignas(32) float F[64 * 4 * 8];  // [h][pair][8]
  for (int j0 = 0; j0 < n8; j0 += 8) {
    for (int p = 0; p < 4; ++p) {
      const int t = j0 + 2 * p;
      for (int c = 0; c < C; ++c) {
        __m256i m[2][2], sg[2][2];
        for (int u = 0; u < 2; ++u) {
          const __m256i x = t + u < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + (t + u) * ts + 32 * c))
                                      : _mm256_setzero_si256();
          m[u][0] = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, nib));
          m[u][1] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));
          sg[u][0] = _mm256_slli_epi16(x, 4);  // bit 7 of each byte: the low nibble's sign
          sg[u][1] = x;                         // bit 7: the high nibble's sign
        }
        // [t b0 b1 t+1 b0 b1 | t b2 b3 t+1 b2 b3] scales of this chunk
        const __m256 kp = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_cvtph_ps(_mm_load_si128(
                                      reinterpret_cast<const __m128i*>(ks + (size_t(c) * n8 + t) * 4)))), 0xD8));
        for (int h = 0; h < G; ++h) {
          const __m256i qlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + (size_t(h) * C + c) * 64));
          const __m256i qhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + (size_t(h) * C + c) * 64 + 32));
          __m256i X[2];
          for (int u = 0; u < 2; ++u) {
            const __m256i a = _mm256_maddubs_epi16(m[u][0], _mm256_sign_epi8(qlo, sg[u][0]));
            const __m256i b = _mm256_maddubs_epi16(m[u][1], _mm256_sign_epi8(qhi, sg[u][1]));
            X[u] = _mm256_madd_epi16(_mm256_add_epi16(a, b), ones);
          }
          const __m256 sc = _mm256_mul_ps(kp, _mm256_loadu_ps(qs + (size_t(h) * C + c) * 8));
          const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(X[0], X[1])), sc);
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

void nvfp4_page_scores(const int8_t* q8, const float* qs, int G, int D, const uint8_t* k, size_t ts, int n,
                       const uint16_t* ks, float* S) {
  if (D == 64) return scores_c<1>(q8, qs, G, k, ts, n, ks, S);
  return scores_c<2>(q8, qs, G, k, ts, n, ks, S);
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
// Per group of 16 tokens, four token rows' codes interleaved per value (a quad of bytes per
// value: E0..E3 even values, O0..O3 odd values, 32 bytes each), so vpmaddubsw sums tokens
// (t0, t1) into the low word and (t2, t3) into the high word of each value's dword; the
// quad's u8 weights W (per block: bytes t0..t3, repeated) come from one cvt + packs + packus +
// vpermd + vpshufb of w · 255/wm. Over the group's 4 quads the words add in int16 (4 · 2 ·
// 255 · 12 = 24480 < 32767), vpmaddwd by 1 sums the two words of a value (the exact int32
// I_i), then into natural order and one FMA per value: o_i = fma(float(I_i), wm · 0.5/255, o_i).
namespace {
// lane-wise code -> 2·e2m1 (signed)
inline void nvfp4_quad_codes(const uint8_t* v, size_t ts, int t, int n, int c, __m256i* out /*[8]*/) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i tab = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,  //
                                       0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  __m256i L[4], H[4];
  for (int u = 0; u < 4; ++u) {
    const __m256i x = t + u < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (t + u) * ts + 32 * c))
                                : _mm256_setzero_si256();
    L[u] = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, nib));                         // even values
    H[u] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));  // odd values
  }
  for (int k = 0; k < 2; ++k) {
    const __m256i* X = k ? H : L;
    const __m256i a01 = _mm256_unpacklo_epi8(X[0], X[1]), b01 = _mm256_unpackhi_epi8(X[0], X[1]);
    const __m256i a23 = _mm256_unpacklo_epi8(X[2], X[3]), b23 = _mm256_unpackhi_epi8(X[2], X[3]);
    out[4 * k + 0] = _mm256_unpacklo_epi16(a01, a23);  // values 0,2,4,6 | 32..38 (+1 for odd): blocks 0 | 2
    out[4 * k + 1] = _mm256_unpackhi_epi16(a01, a23);  // 8..14 | 40..46: blocks 0 | 2
    out[4 * k + 2] = _mm256_unpacklo_epi16(b01, b23);  // 16..22 | 48..54: blocks 1 | 3
    out[4 * k + 3] = _mm256_unpackhi_epi16(b01, b23);  // 24..30 | 56..62: blocks 1 | 3
  }
}
}  // namespace

template <int C>
static void pv_c(const uint8_t* v, size_t ts, int n, const uint16_t* ks, int G, const float* P, int ldp,
                 const float* alpha, float* o) {
  constexpr int D = 64 * C;
  const int n16 = (n + 15) / 16 * 16, ng = n16 / 16;
  alignas(32) __m256i vp[4 * 4 * C * 8];  // [group][quad][chunk][E0..E3 O0..O3]
  for (int gq = 0; gq < 4 * ng; ++gq)
    for (int c = 0; c < C; ++c) nvfp4_quad_codes(v, ts, 4 * gq, n, c, vp + (size_t(gq) * C + c) * 8);
  const __m256i rep01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), rep23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  const __m256i rep45 = _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), rep67 = _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 4, 5, 0, 1, 4, 5);  // packed [t0 t2 | t1 t3] -> [t0 t2 t1 t3] per lane
  // per lane: the quad's bytes of block b (lane 0) / b + 2 (lane 1), t0..t3, repeated
  const __m256i ctl02 = _mm256_setr_epi8(0, 8, 4, 12, 0, 8, 4, 12, 0, 8, 4, 12, 0, 8, 4, 12,  //
                                         2, 10, 6, 14, 2, 10, 6, 14, 2, 10, 6, 14, 2, 10, 6, 14);
  const __m256i ctl13 = _mm256_add_epi8(ctl02, _mm256_set1_epi8(1));
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 k255 = _mm256_set1_ps(255.0f), half255 = _mm256_set1_ps(0.5f / 255.0f);
  for (int h = 0; h < G; ++h) {
    const float* ph = P + size_t(h) * ldp;
    float* oh = o + size_t(h) * D;
    if (alpha[h] != 1.0f)  // (o · 1 is o: skipped)
      for (int i = 0; i < D; i += 8)
        _mm256_storeu_ps(oh + i, _mm256_mul_ps(_mm256_loadu_ps(oh + i), _mm256_set1_ps(alpha[h])));
    for (int gi = 0; gi < ng; ++gi) {
      const int g0 = 16 * gi;
      // the group's p · 256 (0 past n): whole 32-byte loads of what softmax stored as such (a
      // narrower or scalar access there stalls store forwarding), masked past n
      const __m256i first = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      __m256 p8s[2];
      for (int k = 0; k < 2; ++k)
        p8s[k] = _mm256_mul_ps(_mm256_set1_ps(256.0f),
                               g0 + 8 * k + 8 <= n ? _mm256_loadu_ps(ph + g0 + 8 * k)
                                                   : _mm256_maskload_ps(ph + g0 + 8 * k, _mm256_cmpgt_epi32(
                                                                            _mm256_set1_epi32(n - g0 - 8 * k), first)));
      for (int c = 0; c < C; ++c) {
        // w = p_t · s_tb ([t][block] per quad: [t0 | t1], [t2 | t3]) and its max per block
        __m256 w[8];
        __m256 wm = _mm256_setzero_ps();
        const __m128i* kc = reinterpret_cast<const __m128i*>(ks + (size_t(c) * n16 + g0) * 4);
        for (int u = 0; u < 4; ++u) {  // (p · 256) · (s / 256): the product p · s exactly
          const __m256 p8 = p8s[u / 2];
          const __m256i r0 = u & 1 ? rep45 : rep01, r1 = u & 1 ? rep67 : rep23;
          w[2 * u] = _mm256_mul_ps(_mm256_permutevar8x32_ps(p8, r0), _mm256_cvtph_ps(_mm_load_si128(kc + 2 * u)));
          w[2 * u + 1] = _mm256_mul_ps(_mm256_permutevar8x32_ps(p8, r1), _mm256_cvtph_ps(_mm_load_si128(kc + 2 * u + 1)));
          wm = _mm256_max_ps(wm, _mm256_max_ps(w[2 * u], w[2 * u + 1]));
        }
        wm = _mm256_max_ps(wm, _mm256_permute2f128_ps(wm, wm, 1));  // blocks 0-3 in both halves
        const __m256 inv = _mm256_and_ps(_mm256_div_ps(k255, wm), _mm256_cmp_ps(wm, _mm256_setzero_ps(), _CMP_GT_OQ));
        const __m256 f = _mm256_mul_ps(wm, half255);
        __m256i acc[8];
        for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_si256();
        for (int u = 0; u < 4; ++u) {
          const __m256i q = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w[2 * u], inv)),
                                               _mm256_cvtps_epi32(_mm256_mul_ps(w[2 * u + 1], inv)));
          const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(q, q), lanes);
          const __m256i w02 = _mm256_shuffle_epi8(b, ctl02), w13 = _mm256_shuffle_epi8(b, ctl13);
          const __m256i* a = vp + ((size_t(gi) * 4 + u) * C + c) * 8;
          for (int k = 0; k < 8; ++k)
            acc[k] = _mm256_add_epi16(acc[k], _mm256_maddubs_epi16(k & 2 ? w13 : w02, a[k]));
        }
        // I per value (int32), natural order: (E_k, O_k) -> values 8k'.. of blocks b | b + 2
        float* oc = oh + 64 * c;
        for (int k = 0; k < 4; ++k) {
          const __m256i e = _mm256_madd_epi16(acc[k], ones), od = _mm256_madd_epi16(acc[4 + k], ones);
          const __m256i lo = _mm256_unpacklo_epi32(e, od), hi = _mm256_unpackhi_epi32(e, od);
          const int b = k / 2;  // values 8k..8k+7 (block b) and 32 + 8k.. (block b + 2)
          const __m256 f0 = _mm256_permutevar8x32_ps(f, _mm256_set1_epi32(b));
          const __m256 f2 = _mm256_permutevar8x32_ps(f, _mm256_set1_epi32(b + 2));
          const __m256 i0 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo, hi, 0x20));
          const __m256 i2 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo, hi, 0x31));
          _mm256_storeu_ps(oc + 8 * k, _mm256_fmadd_ps(i0, f0, _mm256_loadu_ps(oc + 8 * k)));
          _mm256_storeu_ps(oc + 32 + 8 * k, _mm256_fmadd_ps(i2, f2, _mm256_loadu_ps(oc + 32 + 8 * k)));
        }
      }
    }
  }
}

bool nvfp4_page_pv(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int G, const float* P, int ldp,
                   const float* alpha, float* o) {
  uint64_t sgn = 0;  // negative block scales (the encoder writes none): the float path
  for (int t = 0; t < n; ++t) {
    uint32_t w[2] = {0, 0};
    std::memcpy(w, v + t * ts + D / 2, 4);
    if (D == 128) std::memcpy(w + 1, v + t * ts + D / 2 + 4, 4);
    sgn |= w[0] | w[1];
  }
  if (sgn & 0x80808080u) return false;
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
  attn_avx2::nvfp4_page_scales(v, ts, n, (n + 15) / 16 * 16, D, ks);
  return attn_avx2::nvfp4_page_pv(v, ts, n, D, ks, G, P, ldp, alpha, o);
}
}  // namespace kvdeck::cpu
#endif  // __x86_64__
