// formats.cpp — scalar, array and tensor codecs of kvdeck's number formats.
//
// C++ twins of models/quant/*.py; every function must agree with its numpy reference bit
// for bit (tests/native/test_codecs.py). Encoders work on the float32 bit pattern with
// integer arithmetic, so the result never depends on the FP environment; the tensor
// quantisers use plain float32 arithmetic in the exact order the numpy docstrings state
// (no expression here has the a*b+c shape a compiler could contract into an FMA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvdeck/formats.h"

namespace kvdeck {

namespace {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even right shift of a non-negative integer by sh (1 <= sh <= 31).
inline uint32_t rne_shift(uint32_t v, uint32_t sh) {
  return (v + ((1u << (sh - 1)) - 1u) + ((v >> sh) & 1u)) >> sh;
}

// Mantissa of a float32 magnitude (implicit bit included), 0 for zero/subnormal inputs.
inline uint32_t f32_mant(uint32_t a) { return (a >> 23) ? ((a & 0x7FFFFFu) | 0x800000u) : 0u; }

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::NVFP4: return "nvfp4";
    case DType::W4A8: return "w4a8";
  }
  return "?";
}

// =====================================================================================
// f16 (IEEE binary16)
// =====================================================================================

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return bits_f32(sign | 0x7F800000u | (m << 13));  // inf / NaN (payload kept)
  if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in float32
  const float v = float(m) * bits_f32(0x33800000u);  // 2^-24
  return bits_f32(sign | f32_bits(v));
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN: top 10 payload bits kept (as numpy does), never inf
    const uint32_t m = (a >> 13) & 0x3FFu;
    return uint16_t(sign | 0x7C00u | (m ? m : 1u));
  }
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);              // >= 65520 -> inf
  if (a >= 0x38800000u)                                               // >= 2^-14: normal
    return uint16_t(sign | (rne_shift(a, 13) - ((127u - 15u) << 10)));
  // subnormal half: |f| / 2^-24 = mant >> (126 - e); shifts >= 25 round to 0
  const uint32_t e = a >> 23;
  const uint32_t sh = std::min<uint32_t>(126u - std::min<uint32_t>(e, 112u), 25u);
  return uint16_t(sign | rne_shift(f32_mant(a), sh));
}

// =====================================================================================
// E4M3 (float8_e4m3fn) and E2M1
// =====================================================================================

float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu;
  const uint32_t m = b & 7u;
  if ((b & 0x7Fu) == 0x7Fu) return bits_f32(sign | 0x7FC00000u);
  if (e != 0) return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
  const float v = float(m) * bits_f32(0x3B000000u);  // m * 2^-9, exact
  return bits_f32(sign | f32_bits(v));
}

uint8_t f32_to_e4m3(float f) {
  const uint32_t x = f32_bits(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint8_t(sign | 0x7Fu);     // NaN
  if (a >= 0x43E00000u) return uint8_t(sign | 0x7Eu);    // |f| >= 448 (incl. inf): saturate
  if (a >= 0x3C800000u)                                  // >= 2^-6: normal
    return uint8_t(sign | (rne_shift(a, 20) - ((127u - 7u) << 3)));
  // subnormal: |f| / 2^-9 = mant >> (141 - e); shifts >= 25 round to 0
  const uint32_t e = a >> 23;
  const uint32_t sh = std::min<uint32_t>(141u - std::min<uint32_t>(e, 120u), 25u);
  return uint8_t(sign | rne_shift(f32_mant(a), sh));
}

float e2m1_to_f32(uint8_t c) {
  static const float kVals[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kVals[c & 0xFu];
}

uint8_t f32_to_e2m1(float f) {
  // '>' where the tie goes down to the even code, '>=' where it goes up; NaN -> 0 | sign.
  const uint8_t sign = uint8_t((f32_bits(f) >> 28) & 0x8u);
  const float a = std::fabs(f);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                   (a >= 3.5f) + (a > 5.0f);
  return uint8_t(sign | code);
}

void encode_f16(const float* x, uint16_t* h, size_t n) {
  for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(x[i]);
}
void decode_f16(const uint16_t* h, float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = f16_to_f32(h[i]);
}
void encode_e4m3(const float* x, uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_e4m3(x[i]);
}
void decode_e4m3(const uint8_t* b, float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = e4m3_to_f32(b[i]);
}
void encode_e2m1(const float* x, uint8_t* c, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = f32_to_e2m1(x[i]);
}
void decode_e2m1(const uint8_t* c, float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = e2m1_to_f32(c[i]);
}

// =====================================================================================
// NVFP4 tensors
// =====================================================================================

void nvfp4_quantize(const float* w, int N, int K, uint8_t* codes, uint8_t* scales,
                    float* tscale) {
  const int Kp = round_up(K, kQuantPad);
  const int nb = Kp / kNvfp4Block;
  float amax = 0.0f;
  for (size_t i = 0, n = size_t(N) * size_t(K); i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float g = amax > 0.0f ? amax / 2688.0f : 1.0f;
  const float sden = 6.0f * g;
  *tscale = g;
  float blk[kNvfp4Block];  // one zero-padded block
  for (int r = 0; r < N; ++r) {
    const float* wr = w + size_t(r) * K;            // wr: f32 [K]
    uint8_t* cr = codes + size_t(r) * (Kp / 2);     // cr: u8 [Kp/2]
    uint8_t* sr = scales + size_t(r) * nb;          // sr: u8 [Kp/16]
    for (int b = 0; b < nb; ++b) {
      float bmax = 0.0f;
      for (int j = 0; j < kNvfp4Block; ++j) {
        const int k = b * kNvfp4Block + j;
        blk[j] = k < K ? wr[k] : 0.0f;
        bmax = std::max(bmax, std::fabs(blk[j]));
      }
      const uint8_t s = f32_to_e4m3(bmax / sden);
      const float den = e4m3_to_f32(s) * g;
      sr[b] = s;
      for (int j = 0; j < kNvfp4Block; j += 2) {
        const uint8_t lo = den != 0.0f ? f32_to_e2m1(blk[j] / den) : 0;
        const uint8_t hi = den != 0.0f ? f32_to_e2m1(blk[j + 1] / den) : 0;
        cr[(b * kNvfp4Block + j) / 2] = uint8_t(lo | (hi << 4));
      }
    }
  }
}

void nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int K,
                      float* w) {
  const int Kp = round_up(K, kQuantPad);
  const int nb = Kp / kNvfp4Block;
  for (int r = 0; r < N; ++r) {
    const uint8_t* cr = codes + size_t(r) * (Kp / 2);  // cr: u8 [Kp/2]
    const uint8_t* sr = scales + size_t(r) * nb;       // sr: u8 [Kp/16]
    float* wr = w + size_t(r) * K;                     // wr: f32 [K]
    for (int k = 0; k < K; ++k) {
      const uint8_t c = (k & 1) ? uint8_t(cr[k / 2] >> 4) : uint8_t(cr[k / 2] & 0xFu);
      const float sv = e4m3_to_f32(sr[k / kNvfp4Block]);
      wr[k] = (e2m1_to_f32(c) * sv) * tscale;
    }
  }
}

// =====================================================================================
// W4A8 tensors
// =====================================================================================

namespace {

int w4a8_group(int group, int Kp) {
  if (group <= 0) return Kp;
  if (group % 2 != 0 || Kp % group != 0)
    throw std::invalid_argument("w4a8 group " + std::to_string(group) +
                                " must be even and divide Kp=" + std::to_string(Kp));
  return group;
}

}  // namespace

void w4a8_quantize(const float* w, int N, int K, int group, uint8_t* codes, uint16_t* scales) {
  const int Kp = round_up(K, kQuantPad);
  const int G = w4a8_group(group, Kp);
  const int ng = Kp / G;
  for (int r = 0; r < N; ++r) {
    const float* wr = w + size_t(r) * K;          // wr: f32 [K]
    uint8_t* cr = codes + size_t(r) * (Kp / 2);   // cr: u8 [Kp/2]
    uint16_t* sr = scales + size_t(r) * ng;       // sr: f16 [Kp/G]
    for (int gi = 0; gi < ng; ++gi) {
      const int k0 = gi * G, k1 = std::min(k0 + G, K);
      float amax = 0.0f;
      for (int k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(wr[k]));
      const uint16_t d16 = f32_to_f16(std::min(amax / 7.0f, 65504.0f));
      const float dd = f16_to_f32(d16);
      sr[gi] = d16;
      for (int k = k0; k < k0 + G; k += 2) {
        int q[2] = {0, 0};
        for (int t = 0; t < 2; ++t) {
          const float v = k + t < K ? wr[k + t] : 0.0f;
          if (dd != 0.0f) q[t] = int(std::min(std::max(std::nearbyint(v / dd), -8.0f), 7.0f));
        }
        cr[k / 2] = uint8_t((q[0] + 8) | ((q[1] + 8) << 4));
      }
    }
  }
}

void w4a8_dequantize(const uint8_t* codes, const uint16_t* scales, int N, int K, int group,
                     float* w) {
  const int Kp = round_up(K, kQuantPad);
  const int G = w4a8_group(group, Kp);
  const int ng = Kp / G;
  for (int r = 0; r < N; ++r) {
    const uint8_t* cr = codes + size_t(r) * (Kp / 2);  // cr: u8 [Kp/2]
    const uint16_t* sr = scales + size_t(r) * ng;      // sr: f16 [Kp/G]
    float* wr = w + size_t(r) * K;                     // wr: f32 [K]
    for (int k = 0; k < K; ++k) {
      const int nib = (k & 1) ? (cr[k / 2] >> 4) : (cr[k / 2] & 0xF);
      wr[k] = float(nib - 8) * f16_to_f32(sr[k / G]);
    }
  }
}

}  // namespace kvdeck
