// attention_nvfp4_avx512.cpp — decode attention over NVFP4 KV pages on AVX-512 BW + VNNI (the
// avx512vnni kernel set; compiled with -mavx512f/bw/vl/dq/vnni; reached only while that set is
// active, cpu::avx512_active()). A page's scores, its online softmax and its P·V;
// attention_avx2.cpp's decode loop (segment_heads) calls them in place of its own and
// attention_nvfp4_avx2.cpp's, so decode gives the avx2 set's bits. The same block
// scales (nvfp4_page_scales_heads, [D/64][n8][4] f16 of the value / 256) and the same q8 / qs /
// qc (quantize_q_int8).
//
// Scores: the same exact integers I_tb (vpdpbusd sums 4 u8 (2·e2m1 + 12) · s8 q8 products into
// int32: no saturation) and the same float operations per score as the AVX2 kernel —
// f_b = float(I_tb) · (ks_tb · qs_b), (D = 128: f_b + f_{b+4}), ((f0 + f1) + (f2 + f3)) — so the
// scores are the AVX2 kernel's bits. Two keys' 32 code bytes of a 64-value chunk in one zmm, the
// nibbles looked up with vpshufb (512-bit), two vpdpbusd per head give 8 half-block sums per key;
// three permute-and-add steps take 8 such vectors to 16 keys' scores.
// P·V: the contract of attention_nvfp4_pv_ref (ops_cpu.h), bit for bit (the weights' rounding is
// the same float operations; the sums are exact integers): four token rows' codes interleaved per
// value (a dword per value: one vpdpbusd adds 4 tokens' W·2·e2m1), one zmm per block of 16
// values, so a block's weights are one broadcast dword; 8 tokens per f32 FMA as before.
// Softmax: softmax_update's operations per row in 16 lanes (below).
//
// Nothing from a shared header's inline functions is used here (an AVX-512 copy of one could be
// the one the linker keeps for the AVX2 / portable callers).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/kernels_impl.h"

// GCC 12's avx512fintrin.h trips its own -Wuninitialized on the _mm512_undefined_* inside
// intrinsics like _mm512_broadcast_i32x4 (a false positive, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvdeck::cpu {
namespace {

// The even / odd dwords of the concatenation (a, b): a + b pairwise, every reduction step below.
inline __m512i even_lanes() { return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30); }
inline __m512i odd_lanes() { return _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31); }

template <int C>
void scores_c(const int8_t* q8, const float* qs, const int32_t* qc, int G, const uint8_t* k, size_t ts, int n,
              const uint16_t* ks, float* S) {
  const int n8 = (n + 7) / 8 * 8;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i ev = even_lanes(), od = odd_lanes();
  // qs / qc's lane pattern [b0 b1 b0 b1 | b2 b3 b2 b3] -> [4 keys x 4 blocks]
  const __m512i qpat = _mm512_setr_epi32(0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5);
  for (int j0 = 0; j0 < n8; j0 += 16) {
    const int nq = n8 - j0 >= 16 ? 4 : 2;  // groups of 4 keys in this tile (a tail of 8: 2)
    __m512i lo[C][8], hi[C][8];              // 2·e2m1 + 12 of the even / odd values of key pairs
    for (int c = 0; c < C; ++c)
      for (int p = 0; p < 2 * nq; ++p) {
        const int t = j0 + 2 * p;
        const __m256i a = t < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + t * ts + 32 * c))
                                : _mm256_setzero_si256();  // (code 0: +12 - 12 = 0)
        const __m256i b = t + 1 < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + (t + 1) * ts + 32 * c))
                                    : _mm256_setzero_si256();
        const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        lo[c][p] = _mm512_shuffle_epi8(tab, _mm512_and_si512(x, nib));
        hi[c][p] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(x, 4), nib));
      }
    __m512 kp[C][4];  // block scales, [4 keys x 4 blocks] per vector (ks is token-major)
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < nq; ++r)
        kp[c][r] = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ks + (size_t(c) * n8 + j0 + 4 * r) * 4)));
    for (int h = 0; h < G; ++h) {
      __m512 F[4];
      for (int c = 0; c < C; ++c) {
        const size_t hc = size_t(h) * C + c;  // q8's even / odd values of this chunk, in both key halves
        const __m512i qe = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + hc * 64)));
        const __m512i qo = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + hc * 64 + 32)));
        const __m512i corr = _mm512_permutexvar_epi32(qpat, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + hc * 8))));
        const __m512 sq = _mm512_permutexvar_ps(qpat, _mm512_castps256_ps512(_mm256_loadu_ps(qs + hc * 8)));
        for (int r = 0; r < nq; ++r) {
          const __m512i A = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[c][2 * r], qe), hi[c][2 * r], qo);
          const __m512i B =
              _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[c][2 * r + 1], qe), hi[c][2 * r + 1], qo);
          const __m512i I = _mm512_sub_epi32(
              _mm512_add_epi32(_mm512_permutex2var_epi32(A, ev, B), _mm512_permutex2var_epi32(A, od, B)), corr);
          const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(kp[c][r], sq));
          F[r] = c == 0 ? f : _mm512_add_ps(F[r], f);  // (D = 128: f_b + f_{b+4}, as the AVX2 kernel)
        }
      }
      if (nq == 2) F[2] = F[3] = _mm512_setzero_ps();
      const __m512 H0 = _mm512_add_ps(_mm512_permutex2var_ps(F[0], ev, F[1]), _mm512_permutex2var_ps(F[0], od, F[1]));
      const __m512 H1 = _mm512_add_ps(_mm512_permutex2var_ps(F[2], ev, F[3]), _mm512_permutex2var_ps(F[2], od, F[3]));
      _mm512_storeu_ps(S + h * 64 + j0,
                       _mm512_add_ps(_mm512_permutex2var_ps(H0, ev, H1), _mm512_permutex2var_ps(H0, od, H1)));
    }
  }
}

// ---- P·V ----
// A zmm of block b for 4 tokens holds dword p = the 4 tokens' codes of value 2·(p % 8) + p / 8
// (even values from the low nibbles in lanes 0-7, odd ones in 8-15); o is permuted to match.
template <int C>
void pv_c(const uint8_t* v, size_t ts, int n, const uint16_t* ks, int G, const float* P, int ldp,
          const float* alpha, float* o) {
  constexpr int D = 64 * C;
  const int n8 = (n + 7) / 8 * 8, nqd = n8 / 4, ng = n8 / 8;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i tab = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
  const __m512i tr = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  // M0 / M1: 128-bit lane L = dword L (M1: L + 4) of the 4 rows; o's lanes <-> values
  const __m512i i0 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(4));
  const __m512i to_lane = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);  // lane p: value 2(p % 8) + p / 8
  const __m512i to_val = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);   // value v: lane (v & 1) 8 + v / 2
  alignas(64) __m512i vq[C * 16 * 4];  // [chunk][quad of tokens][block]
  for (int j = 0; j < nqd; ++j)
    for (int c = 0; c < C; ++c) {
      __m256i r[4];
      for (int u = 0; u < 4; ++u) {
        const int t = 4 * j + u;
        r[u] = t < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + t * ts + 32 * c)) : _mm256_setzero_si256();
      }
      const __m512i R01 = _mm512_inserti64x4(_mm512_castsi256_si512(r[0]), r[1], 1);
      const __m512i R23 = _mm512_inserti64x4(_mm512_castsi256_si512(r[2]), r[3], 1);
      for (int hb = 0; hb < 2; ++hb) {  // blocks 2hb, 2hb + 1
        const __m512i T = _mm512_shuffle_epi8(_mm512_permutex2var_epi32(R01, hb ? i1 : i0, R23), tr);
        const __m512i Lv = _mm512_shuffle_epi8(tab, _mm512_and_si512(T, nib));                         // even values
        const __m512i Hv = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(T, 4), nib));  // odd values
        __m512i* dst = vq + (size_t(c) * 16 + j) * 4 + 2 * hb;
        dst[0] = _mm512_shuffle_i64x2(Lv, Hv, _MM_SHUFFLE(1, 0, 1, 0));
        dst[1] = _mm512_shuffle_i64x2(Lv, Hv, _MM_SHUFFLE(3, 2, 3, 2));
      }
    }
  const __m512i pi0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);  // token m / 4
  const __m512i pi1 = _mm512_add_epi32(pi0, _mm512_set1_epi32(4));
  const __m256i wtr = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m256 k255 = _mm256_set1_ps(255.0f), half255 = _mm256_set1_ps(0.5f / 255.0f);
  const int K = C * ng;  // groups of 8 tokens x chunks, k = c·ng + gi
  constexpr int HB = 4;  // heads whose weights are made together (their divisions pipeline)
  alignas(64) uint8_t W[HB * 16 * 32];     // [head][k][quad][block][token] weights
  alignas(64) float Fw[HB * 16 * 4 + 4];   // [head][k][block] wm · 0.5/255
  alignas(64) float invv[HB * 16 * 4 + 4];  // [head][k][block] 255 / max w
  __m128 wmr[HB * 16 + 1];                   // [head][k] max w per block (registers / same-size spills:
                                             // two xmm stores read back as a ymm cannot be forwarded)
  alignas(64) __m512 wv[HB * 16 * 2];      // [head][k][tokens 0-3, 4-7] w
  alignas(64) __m512 sf[16 * 2];           // [k][tokens 0-3, 4-7] the block scales (every head's)
  for (int c = 0; c < C; ++c)  // (s/256)·256 exactly, so p·s rounds as (p·256)·(s/256) did
    for (int gi = 0; gi < ng; ++gi) {
      const __m512i sc = _mm512_loadu_si512(ks + (size_t(c) * n8 + 8 * gi) * 4);
      sf[2 * (c * ng + gi)] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(sc)), _mm512_set1_ps(256.0f));
      sf[2 * (c * ng + gi) + 1] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1)), _mm512_set1_ps(256.0f));
    }
  for (int h0 = 0; h0 < G; h0 += HB) {
    const int nh = G - h0 < HB ? G - h0 : HB, nk = nh * K;
    for (int hh = 0; hh < nh; ++hh) {
      const float* ph = P + size_t(h0 + hh) * ldp;
      for (int c = 0; c < C; ++c)
        for (int gi = 0; gi < ng; ++gi) {
          const int g0 = 8 * gi, hk = hh * K + c * ng + gi;
          // w = p_t · s_tb for the group's 8 tokens x 4 blocks (lane m: token m / 4, block m % 4)
          const __m512 p8 = _mm512_castps256_ps512(_mm256_loadu_ps(ph + g0));
          const __m512 w0 = _mm512_mul_ps(_mm512_permutexvar_ps(pi0, p8), sf[2 * (c * ng + gi)]);
          const __m512 w1 = _mm512_mul_ps(_mm512_permutexvar_ps(pi1, p8), sf[2 * (c * ng + gi) + 1]);
          wv[2 * hk] = w0, wv[2 * hk + 1] = w1;
          __m512 wm = _mm512_max_ps(w0, w1);
          wm = _mm512_max_ps(wm, _mm512_shuffle_f32x4(wm, wm, _MM_SHUFFLE(1, 0, 3, 2)));
          wm = _mm512_max_ps(wm, _mm512_shuffle_f32x4(wm, wm, _MM_SHUFFLE(2, 3, 0, 1)));  // every lane: its block's max
          wmr[hk] = _mm512_castps512_ps128(wm);
        }
    }
    if (nk & 1) wmr[nk] = _mm_setzero_ps();
    // 255 / max w: two groups to a ymm division, the heads' divisions independent (one zmm
    // division per group, each on its head's critical path, was 14% of this kernel)
    for (int hk = 0; hk < nk; hk += 2) {
      const __m256 wm = _mm256_insertf128_ps(_mm256_castps128_ps256(wmr[hk]), wmr[hk + 1], 1);
      _mm256_store_ps(invv + 4 * hk, _mm256_maskz_div_ps(_mm256_cmp_ps_mask(wm, _mm256_setzero_ps(), _CMP_GT_OQ), k255, wm));
      _mm256_store_ps(Fw + 4 * hk, _mm256_mul_ps(wm, half255));
    }
    for (int hk = 0; hk < nk; ++hk) {
      const __m512 inv = _mm512_broadcast_f32x4(_mm_load_ps(invv + 4 * hk));
      const __m128i q0 = _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(wv[2 * hk], inv)));
      const __m128i q1 = _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(wv[2 * hk + 1], inv)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(W + hk * 32),
                         _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1), wtr));
    }
    for (int hh = 0; hh < nh; ++hh)
      for (int c = 0; c < C; ++c) {
        const int h = h0 + hh;
        float* oc = o + size_t(h) * D + 64 * c;
        __m512 of[4];
        for (int b = 0; b < 4; ++b)
          of[b] = _mm512_mul_ps(_mm512_permutexvar_ps(to_lane, _mm512_loadu_ps(oc + 16 * b)), _mm512_set1_ps(alpha[h]));
        for (int gi = 0; gi < ng; ++gi) {
          const int hk = hh * K + c * ng + gi;
          const uint8_t* wg = W + hk * 32;
          const float* f = Fw + hk * 4;
          const __m512i* a0 = vq + (size_t(c) * 16 + 2 * gi) * 4;
          for (int b = 0; b < 4; ++b) {
            int32_t wa, wb;
            __builtin_memcpy(&wa, wg + 4 * b, 4);
            __builtin_memcpy(&wb, wg + 16 + 4 * b, 4);
            __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(wa), a0[b]);
            acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(wb), a0[4 + b]);
            of[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(f[b]), of[b]);
          }
        }
        for (int b = 0; b < 4; ++b) _mm512_storeu_ps(oc + 16 * b, _mm512_permutexvar_ps(to_val, of[b]));
      }
  }
}

// ---- the online softmax of a page (attention_avx2.cpp softmax_heads' operations, 16 lanes) ----
// Per head the same values in the same order as softmax_update: the max (exact in any order),
// m / alpha in scalar, e^(s - m) by exp256's operations lane for lane, their sum accumulated 8
// lanes at a time in the AVX2 order (+0 for the padding lanes: exact) and hsum's tree.
inline float hmax8(__m256 v) {  // attn_avx2::hmax
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hsum8(__m256 v) {  // vec_avx2.h hsum
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float flush_exp1(float x) { return x < -87.0f ? 0.0f : __builtin_expf(x); }  // ops_cpu.h flush_exp
inline __m512 exp512(__m512 x) {  // vec_avx2.h exp256, operation for operation
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(live, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

template <int HB>
void softmax_block(int nz, float* m, float* l, const float* S, float* P, float* alpha) {
  __m512 vmax[HB], vm[HB];
  __m256 ps[HB];
  for (int h = 0; h < HB; ++h) vmax[h] = _mm512_set1_ps(-__builtin_inff()), ps[h] = _mm256_setzero_ps();
  for (int z = 0; z < nz; ++z)
    for (int h = 0; h < HB; ++h) vmax[h] = _mm512_max_ps(vmax[h], _mm512_loadu_ps(S + h * 64 + 16 * z));
  for (int h = 0; h < HB; ++h) {
    const float mx = hmax8(_mm256_max_ps(_mm512_castps512_ps256(vmax[h]), _mm512_extractf32x8_ps(vmax[h], 1)));
    const float m_new = mx > m[h] ? mx : m[h];
    alpha[h] = m_new == m[h] && m[h] > -__builtin_inff() ? 1.0f : flush_exp1(m[h] - m_new);  // e^0 = 1 exactly
    m[h] = m_new;
    vm[h] = _mm512_set1_ps(m_new);
  }
  for (int z = 0; z < nz; ++z)
    for (int h = 0; h < HB; ++h) {
      const __m512 x = _mm512_loadu_ps(S + h * 64 + 16 * z);
      const __mmask16 valid = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_OQ);
      const __m512 e = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(x, vm[h])));
      _mm512_storeu_ps(P + h * 64 + 16 * z, e);
      ps[h] = _mm256_add_ps(ps[h], _mm512_castps512_ps256(e));
      ps[h] = _mm256_add_ps(ps[h], _mm512_extractf32x8_ps(e, 1));
    }
  for (int h = 0; h < HB; ++h) l[h] = __builtin_fmaf(l[h], alpha[h], hsum8(ps[h]));
}

}  // namespace

void nvfp4_page_scores_avx512(const int8_t* q8, const float* qs, const int32_t* qc, int G, int D, const uint8_t* k,
                              size_t ts, int n, const uint16_t* ks, float* S) {
  if (D == 64) return scores_c<1>(q8, qs, qc, G, k, ts, n, ks, S);
  return scores_c<2>(q8, qs, qc, G, k, ts, n, ks, S);
}

bool nvfp4_page_pv_avx512(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int G, const float* P,
                          int ldp, const float* alpha, float* o) {
  // negative block scales (the encoder writes none): the float path (the f16 sign bits of ks)
  const int nw = D / 64 * ((n + 7) / 8 * 8) * 4;  // (a multiple of 32 words)
  __m512i sgn = _mm512_setzero_si512();
  for (int i = 0; i < nw; i += 32) sgn = _mm512_or_si512(sgn, _mm512_loadu_si512(ks + i));
  if (_mm512_movepi16_mask(sgn)) return false;
  if (D == 64) pv_c<1>(v, ts, n, ks, G, P, ldp, alpha, o);
  else pv_c<2>(v, ts, n, ks, G, P, ldp, alpha, o);
  return true;
}

}  // namespace kvdeck::cpu

namespace kvdeck::cpu {
void softmax_heads_avx512(int G, int n, float* m, float* l, float* S, float* P, float* alpha) {
  const int nz = (n + 15) / 16;
  for (int h = 0; h < G; ++h)
    for (int j = n; j < 16 * nz; ++j) S[h * 64 + j] = -__builtin_inff();
  for (int h = 0; h < G;) {
    const int r = G - h >= 4 ? 4 : G - h;
    if (r == 4) softmax_block<4>(nz, m + h, l + h, S + h * 64, P + h * 64, alpha + h);
    else if (r == 3) softmax_block<3>(nz, m + h, l + h, S + h * 64, P + h * 64, alpha + h);
    else if (r == 2) softmax_block<2>(nz, m + h, l + h, S + h * 64, P + h * 64, alpha + h);
    else softmax_block<1>(nz, m + h, l + h, S + h * 64, P + h * 64, alpha + h);
    h += r;
  }
}
}  // namespace kvdeck::cpu
#endif  // __x86_64__
