// The KPC4 K page decoder with AVX2 + FMA (kvdeck/kv_pce.h): 8 channels at a time, a dword of
// 8 codes broadcast and shifted by 4j so that lane j holds channel j, then fma(code, step, lo)
// exactly as the scalar reference (kv_codec_pce.cpp) rounds it; NVFP4 V rows through the
// attention kernels' decoder (attention_avx2.h).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#include "kvdeck/formats.h"
#include "kernels/cpu/attention_avx2.h"
#include "kvdeck/kv_pce.h"

namespace kvdeck::cpu {

void kpc4_decode_page_avx2(const uint8_t* src, int D, int n, float* dst, size_t ld) {
  const uint8_t* lo_b = src + size_t(kPceTokens) * D / 2;
  const uint8_t* st_b = lo_b + D;
  const float* e4m3 = kpc4_e4m3_table();
  const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32(15);
  for (int c = 0; c < D; c += 8) {  // 8 channels: their lo and step in registers for the page's rows
    int64_t lw, sw;
    std::memcpy(&lw, lo_b + c, 8);
    std::memcpy(&sw, st_b + c, 8);
    const __m256 lo = _mm256_i32gather_ps(e4m3, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(lw)), 4);
    const __m256 st = _mm256_i32gather_ps(e4m3, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sw)), 4);
    const uint8_t* row = src + c / 2;
    float* out = dst + c;
    for (int t = 0; t < n; ++t, row += D / 2, out += ld) {
      int32_t w;
      std::memcpy(&w, row, 4);
      const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), shift), mask);
      _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), st, lo));
    }
  }
}

void nvfp4_rows_avx2(const uint8_t* src, size_t stride, int n, int D, float* dst, size_t ld) {
  const float* e4m3 = attn_avx2::e4m3_kv_table();
  for (int t = 0; t < n; ++t) attn_avx2::nvfp4_row(src + size_t(t) * stride, D, dst + size_t(t) * ld, e4m3);
}

}  // namespace kvdeck::cpu
#endif
