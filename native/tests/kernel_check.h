// kernel_check.h — what the kernel_check files share: the failure report, the seeded input
// generator (one stream, drawn in the order main() runs the checks) and independent decoders
// (formulas, not the library's bit tricks).
//   kernel_check.cpp            reporting, codecs, activation quantisation, main()
//   kernel_check_gemm.cpp       every GEMM format and the repacked NVFP4 layout
//   kernel_check_attention.cpp  row ops, NVFP4 KV rows, attention (decode, prefill, fresh rows)
//   kernel_check_neon.cpp       the neon set against the scalar set (its attention checks in
//                               kernel_check_neon_attention.cpp; shared helpers kernel_check_neon.h)
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace kc {

// A failed check is counted and printed (the first 20).
void check(bool ok, const std::string& what);

extern std::mt19937 rng;
inline int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
inline float rand_normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline double ref_f16(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
  const double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}
inline double ref_e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
inline double ref_e2m1(uint8_t c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return c & 8 ? -mag[c & 7] : mag[c & 7];
}
inline bool same(double ref, float got) {
  return std::isnan(ref) ? std::isnan(got) : double(got) == ref && std::signbit(ref) == std::signbit(got);
}

void check_gemm_formats(const char* isa);  // kernel_check_gemm.cpp: the set `isa` is active
void check_rows();                          // kernel_check_attention.cpp
void check_attention();                     // kernel_check_attention.cpp

}  // namespace kc
