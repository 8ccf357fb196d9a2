// The KPC4 K codec (kvdeck/kv_pce.h): encoder and the scalar reference decoder.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvdeck/formats.h"
#include "kvdeck/kernels.h"
#include "kvdeck/kv_pce.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {

namespace {
// E4M3 code -> value; codes 0x00..0x7E ascend, 0x80 | m is -(value of m).
inline double e4m3_value(uint8_t c) { return double(e4m3_to_f32(c)); }
constexpr uint8_t kMaxMag = 0x7E;  // 448
}  // namespace

uint8_t e4m3_at_or_below(double v) {
  if (v <= -448.0) return 0x80 | kMaxMag;
  if (v >= 448.0) return kMaxMag;
  uint8_t c = f32_to_e4m3(float(v));
  if (e4m3_value(c) <= v) return c;
  // one code step down: towards 0 for a positive code, away from 0 for a negative one
  if (!(c & 0x80) && (c & 0x7F)) return uint8_t(c - 1);
  const uint8_t m = c & 0x7F;
  return uint8_t(0x80 | (m + 1));
}

uint8_t e4m3_at_or_above(double v) {
  if (v >= 448.0) return kMaxMag;
  if (v <= -448.0) return 0x80 | kMaxMag;
  uint8_t c = f32_to_e4m3(float(v));
  if (e4m3_value(c) >= v) return c;
  if (c & 0x80) {  // negative: towards 0
    const uint8_t m = c & 0x7F;
    return m <= 1 ? uint8_t(0) : uint8_t(0x80 | (m - 1));
  }
  return uint8_t(c + 1);
}

void kpc4_encode_page(const float* x, size_t ld, int D, uint8_t* dst) {
  uint8_t* codes = dst;
  uint8_t* lo_b = dst + size_t(kPceTokens) * D / 2;
  uint8_t* st_b = lo_b + D;
  std::memset(codes, 0, size_t(kPceTokens) * D / 2);
  for (int c = 0; c < D; ++c) {
    double mn = x[c], mx = x[c];
    for (int t = 1; t < kPceTokens; ++t) {
      const double v = x[size_t(t) * ld + c];
      mn = std::min(mn, v), mx = std::max(mx, v);
    }
    const uint8_t lc = e4m3_at_or_below(mn);
    const double lo = e4m3_value(lc);
    const uint8_t sc = e4m3_at_or_above((mx - lo) / 15.0);
    const double d = e4m3_value(sc);
    lo_b[c] = lc, st_b[c] = sc;
    for (int t = 0; t < kPceTokens; ++t) {
      const double q = d > 0 ? std::nearbyint((double(x[size_t(t) * ld + c]) - lo) / d) : 0.0;
      const int code = int(std::clamp(q, 0.0, 15.0));
      codes[size_t(t) * D / 2 + c / 2] |= uint8_t(code << (4 * (c & 1)));
    }
  }
}

const float* kpc4_e4m3_table() {
  struct T {
    float v[256];
    T() {
      for (int i = 0; i < 256; ++i) v[i] = e4m3_to_f32(uint8_t(i));
    }
  };
  static const T t;
  return t.v;
}

void kpc4_decode_page_ref(const uint8_t* src, int D, int n, float* dst, size_t ld) {
  const uint8_t* lo_b = src + size_t(kPceTokens) * D / 2;
  const uint8_t* st_b = lo_b + D;
  const float* e4m3 = kpc4_e4m3_table();
  for (int t = 0; t < n; ++t) {
    const uint8_t* row = src + size_t(t) * D / 2;
    for (int c = 0; c < D; ++c) {
      const int code = (row[c / 2] >> (4 * (c & 1))) & 15;
      dst[size_t(t) * ld + c] = std::fma(float(code), e4m3[st_b[c]], e4m3[lo_b[c]]);
    }
  }
}

void nvfp4_rows_ref(const uint8_t* src, size_t stride, int n, int D, float* dst, size_t ld) {
  for (int t = 0; t < n; ++t) kv_nvfp4_decode_row(src + size_t(t) * stride, D, dst + size_t(t) * ld);
}

namespace {
inline bool use_avx2(int D) {
#if defined(__x86_64__)
  return D % 16 == 0 && std::strcmp(kernel_isa(), "scalar") != 0 && cpu_supports("avx2");
#else
  return false;
#endif
}
}  // namespace

Nvfp4RowsFn nvfp4_rows_decoder(int D) {
#if defined(__x86_64__)
  if (use_avx2(D)) return nvfp4_rows_avx2;
#endif
  return nvfp4_rows_ref;
}

Kpc4DecodeFn kpc4_decoder(int D) {
#if defined(__x86_64__)
  if (use_avx2(D)) return kpc4_decode_page_avx2;
#endif
  return kpc4_decode_page_ref;
}

}  // namespace kvdeck::cpu
