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
    case DType::W8A8: return "w8a8";
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

namespace {

// "mse" recipe error of block code s (models/quant/nvfp4.py): sum over j in order of
// double(x[j] - e2m1(q_j) * sv)^2, x = blk / g. e2m1 * sv is exact and the squares are exact
// in double, so a contracted (FMA) form gives the same bits.
double nvfp4_block_err(const float* blk, const float* x, uint8_t s, float g) {
  const float sv = e4m3_to_f32(s);
  const float den = sv * g;
  double acc = 0.0;
  for (int j = 0; j < kNvfp4Block; ++j) {
    const uint8_t q = den != 0.0f ? f32_to_e2m1(blk[j] / den) : 0;
    const double e = double(x[j] - e2m1_to_f32(q) * sv);
    acc = j == 0 ? e * e : acc + e * e;
  }
  return acc;
}

inline uint8_t e4m3_step(uint8_t s, int delta) {  // neighbouring positive code, in [0, 0x7E]
  return uint8_t(std::min(std::max(int(s) + delta, 0), 0x7E));
}

}  // namespace

void nvfp4_quantize(const float* w, int N, int K, uint8_t* codes, uint8_t* scales,
                    float* tscale) {
  nvfp4_quantize(w, N, K, codes, scales, tscale, QuantRecipe::Mse);
}

void nvfp4_quantize(const float* w, int N, int K, uint8_t* codes, uint8_t* scales,
                    float* tscale, QuantRecipe recipe) {
  const int Kp = round_up(K, kQuantPad);
  const int nb = Kp / kNvfp4Block;
  float amax = 0.0f;
  for (size_t i = 0, n = size_t(N) * size_t(K); i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float g = amax > 0.0f ? amax / 2688.0f : 1.0f;
  const float sden = 6.0f * g;
  const bool mse = recipe == QuantRecipe::Mse && g != 0.0f;
  *tscale = g;
  float blk[kNvfp4Block];  // one zero-padded block
  float x[kNvfp4Block];    // blk / g (mse recipe)
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
      uint8_t s = f32_to_e4m3(bmax / sden);
      if (mse) {
        for (int j = 0; j < kNvfp4Block; ++j) x[j] = blk[j] / g;
        const uint8_t s6 = s, s4 = f32_to_e4m3(bmax / (4.0f * g));
        const uint8_t cand[5] = {e4m3_step(s6, -1), e4m3_step(s6, 1), s4, e4m3_step(s4, -1),
                                 e4m3_step(s4, 1)};
        double best = nvfp4_block_err(blk, x, s6, g);
        for (uint8_t c : cand) {
          const double e = nvfp4_block_err(blk, x, c, g);
          if (e < best) best = e, s = c;  // strictly less: earlier candidates win ties
        }
      }
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

namespace {

inline uint16_t w4a8_scale16(float d) {  // f16, saturated to +-65504 (never inf)
  return f32_to_f16(std::min(std::max(d, -65504.0f), 65504.0f));
}

inline int w4a8_round(float v, float dd) {  // clip(rint(v / dd), -8, 7); 0 if dd == 0
  return dd != 0.0f ? int(std::min(std::max(std::nearbyint(v / dd), -8.0f), 7.0f)) : 0;
}

// "mse" recipe error of scale d16 on one group v[G] (models/quant/w4a8.py); q[G] gets the
// rounded values. q*dd is exact and the squares are exact in double (FMA-proof).
double w4a8_group_err(const float* v, int G, uint16_t d16, int* q) {
  const float dd = f16_to_f32(d16);
  double acc = 0.0;
  for (int j = 0; j < G; ++j) {
    q[j] = w4a8_round(v[j], dd);
    const double e = double(v[j] - float(q[j]) * dd);
    acc = j == 0 ? e * e : acc + e * e;
  }
  return acc;
}

// The "mse" recipe's f16 scale of one group v[G]; q, qc: scratch [G].
uint16_t w4a8_mse_scale(const float* v, int G, int* q, int* qc) {
  float amax = std::fabs(v[0]), smax = v[0];  // first element of largest magnitude
  for (int j = 1; j < G; ++j)
    if (std::fabs(v[j]) > amax) amax = std::fabs(v[j]), smax = v[j];
  uint16_t d16 = w4a8_scale16(amax / 7.0f);
  double best = w4a8_group_err(v, G, d16, q);
  static const float kDiv[5] = {-8.0f, -8.5f, -9.0f, -9.5f, 7.5f};
  for (float c : kDiv) {
    const uint16_t c16 = w4a8_scale16(smax / c);
    const double e = w4a8_group_err(v, G, c16, qc);
    if (e < best) {  // strictly less: earlier candidates win ties
      best = e, d16 = c16;
      std::copy(qc, qc + G, q);
    }
  }
  // one least-squares refit on the best q: d = float(sum w*q / sum q^2), all in double
  double num = 0.0, den = 0.0;
  for (int j = 0; j < G; ++j) {
    const double p = double(v[j]) * double(q[j]);
    num = j == 0 ? p : num + p;
    den += double(q[j]) * double(q[j]);
  }
  if (den != 0.0) {
    const uint16_t c16 = w4a8_scale16(float(num / den));
    if (w4a8_group_err(v, G, c16, qc) < best) d16 = c16;
  }
  return d16;
}

}  // namespace

void w4a8_quantize(const float* w, int N, int K, int group, uint8_t* codes, uint16_t* scales) {
  w4a8_quantize(w, N, K, group, codes, scales, QuantRecipe::Mse);
}

void w4a8_quantize(const float* w, int N, int K, int group, uint8_t* codes, uint16_t* scales,
                   QuantRecipe recipe) {
  const int Kp = round_up(K, kQuantPad);
  const int G = w4a8_group(group, Kp);
  const int ng = Kp / G;
  std::vector<float> v(G);          // one zero-padded group
  std::vector<int> q(G), qc(G);     // mse scratch
  for (int r = 0; r < N; ++r) {
    const float* wr = w + size_t(r) * K;          // wr: f32 [K]
    uint8_t* cr = codes + size_t(r) * (Kp / 2);   // cr: u8 [Kp/2]
    uint16_t* sr = scales + size_t(r) * ng;       // sr: f16 [Kp/G]
    for (int gi = 0; gi < ng; ++gi) {
      const int k0 = gi * G;
      float amax = 0.0f;
      for (int j = 0; j < G; ++j) {
        v[j] = k0 + j < K ? wr[k0 + j] : 0.0f;
        amax = std::max(amax, std::fabs(v[j]));
      }
      const uint16_t d16 = recipe == QuantRecipe::Mse ? w4a8_mse_scale(v.data(), G, q.data(), qc.data())
                                                      : w4a8_scale16(amax / 7.0f);
      const float dd = f16_to_f32(d16);
      sr[gi] = d16;
      for (int j = 0; j < G; j += 2)
        cr[(k0 + j) / 2] = uint8_t((w4a8_round(v[j], dd) + 8) | ((w4a8_round(v[j + 1], dd) + 8) << 4));
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
