// NVFP4 KV rows (see ops_cpu.h): E2M1 codes with one E4M3 scale per 16 values, tensor scale 1.
// The encoder runs once per new token; the decoder runs in the attention inner loop, so it
// uses a byte -> (low, high) value table built once.
#include <cmath>

#include "kvdeck/formats.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {

namespace {
struct PairTable {
  float v[256][2];  // code byte -> {e2m1(low nibble), e2m1(high nibble)}
  float e4m3[256];
  PairTable() {
    for (int b = 0; b < 256; ++b) {
      v[b][0] = e2m1_to_f32(uint8_t(b & 15));
      v[b][1] = e2m1_to_f32(uint8_t(b >> 4));
      e4m3[b] = e4m3_to_f32(uint8_t(b));
      if (std::isnan(e4m3[b])) e4m3[b] = 0.f;  // the encoder never writes NaN
    }
  }
};
const PairTable& table() {
  static const PairTable t;
  return t;
}
}  // namespace

void kv_nvfp4_encode_row(const float* x, int D, uint8_t* row) {
  uint8_t* codes = row;          // [D/2]
  uint8_t* scales = row + D / 2; // [D/16]
  for (int b = 0; b < D / 16; ++b) {
    const float* xb = x + b * 16;
    float amax = 0.f;
    for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const uint8_t s = f32_to_e4m3(amax / 6.0f);
    const float sd = e4m3_to_f32(s);
    scales[b] = s;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = sd > 0.f ? f32_to_e2m1(xb[i] / sd) : 0;
      const uint8_t hi = sd > 0.f ? f32_to_e2m1(xb[i + 1] / sd) : 0;
      codes[(b * 16 + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

void kv_nvfp4_decode_row(const uint8_t* row, int D, float* x) {
  const PairTable& t = table();
  const uint8_t* codes = row;
  const uint8_t* scales = row + D / 2;
  for (int b = 0; b < D / 16; ++b) {
    const float s = t.e4m3[scales[b]];
    for (int i = 0; i < 8; ++i) {
      const float* pv = t.v[codes[b * 8 + i]];
      x[b * 16 + 2 * i] = pv[0] * s;
      x[b * 16 + 2 * i + 1] = pv[1] * s;
    }
  }
}

}  // namespace kvdeck::cpu
