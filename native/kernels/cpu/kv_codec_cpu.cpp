// KV row codecs (see ops_cpu.h and kv_pool.h for the layouts):
//   nvfp4  : E2M1 codes with one E4M3 scale per 16 values, second-level scale 1;
//   nvfp4r : the same plus an f16 second-level scale per row (row max on 6 * 448);
//   int8   : symmetric int8 with an f16 scale per row (k8v4's K rows).
// The encoders run once per new token and head; the nvfp4 decoder runs in the attention inner
// loop, so it uses a byte -> (low, high) value table built once.
#include <cmath>
#include <cstring>
#include <stdexcept>

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

// E2M1 codes and E4M3 scales of D values in 16-blocks under a second-level scale g (1 for
// nvfp4): s_b = e4m3(amax_b / (6 g)), code = e2m1(x / (e4m3(s_b) g)); g = 0 (a zero row) -> 0.
void encode_blocks(const float* x, int D, float g, uint8_t* codes, uint8_t* scales) {
  for (int b = 0; b < D / 16; ++b) {
    const float* xb = x + b * 16;
    float amax = 0.f;
    for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const uint8_t s = g > 0.f ? f32_to_e4m3(amax / (6.0f * g)) : 0;
    const float sd = e4m3_to_f32(s) * g;
    scales[b] = s;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = sd > 0.f ? f32_to_e2m1(xb[i] / sd) : 0;
      const uint8_t hi = sd > 0.f ? f32_to_e2m1(xb[i + 1] / sd) : 0;
      codes[(b * 16 + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}
}  // namespace


void kv_nvfp4_encode_row(const float* x, int D, uint8_t* row) {
  encode_blocks(x, D, 1.0f, row, row + D / 2);  // codes [D/2], scales [D/16]
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

// ---- nvfp4r: nvfp4 with an f16 second-level scale per row ------------------------------
// g = f16(amax_row / (6 * 448)) (at least the smallest f16 subnormal when the row is not all
// zero); blocks: s_b = e4m3(amax_b / (6 g)), q = e2m1(x / (e4m3(s_b) * g)). The largest block
// scale lands near E4M3's top (448), so a row's blocks stay out of E4M3's subnormals unless a
// block is 2^-15 of the row max. A row's bytes depend on that row only (prefix-cache safe).
namespace {
inline uint16_t row_scale_f16(const float* x, int D, float top) {
  float amax = 0.f;
  for (int i = 0; i < D; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  if (!(amax > 0.f)) return 0;
  const uint16_t h = f32_to_f16(amax / top);
  return h ? h : uint16_t(1);  // 2^-24: tiny rows keep a usable scale
}
inline void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline uint16_t get_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
}  // namespace

void kv_nvfp4r_encode_row(const float* x, int D, uint8_t* row) {
  const uint16_t gh = row_scale_f16(x, D, 6.0f * 448.0f);
  put_u16(row + D / 2 + D / 16, gh);
  encode_blocks(x, D, f16_to_f32(gh), row, row + D / 2);  // codes [D/2], scales [D/16]
}

void kv_nvfp4r_decode_row(const uint8_t* row, int D, float* x) {
  const PairTable& t = table();
  const uint8_t* codes = row;
  const uint8_t* scales = row + D / 2;
  const float g = f16_to_f32(get_u16(row + D / 2 + D / 16));
  for (int b = 0; b < D / 16; ++b) {
    const float s = t.e4m3[scales[b]] * g;
    for (int i = 0; i < 8; ++i) {
      const float* pv = t.v[codes[b * 8 + i]];
      x[b * 16 + 2 * i] = pv[0] * s;
      x[b * 16 + 2 * i + 1] = pv[1] * s;
    }
  }
}

// ---- int8 rows: q = clamp(rint(x / g), -127, 127), g = f16(amax_row / 127) -----------------
void kv_int8_encode_row(const float* x, int D, uint8_t* row) {
  const uint16_t gh = row_scale_f16(x, D, 127.0f);
  put_u16(row + D, gh);
  const float g = f16_to_f32(gh);
  auto* q = reinterpret_cast<int8_t*>(row);
  for (int i = 0; i < D; ++i) {
    const float r = g > 0.f ? std::nearbyint(x[i] / g) : 0.f;
    q[i] = int8_t(std::fmax(-127.f, std::fmin(127.f, r)));
  }
}

void kv_int8_decode_row(const uint8_t* row, int D, float* x) {
  const float g = f16_to_f32(get_u16(row + D));
  const auto* q = reinterpret_cast<const int8_t*>(row);
  for (int i = 0; i < D; ++i) x[i] = float(q[i]) * g;
}

// ---- by format ---------------------------------------------------------------------------
void kv_encode_row(KvDType t, bool v, const float* x, int D, uint8_t* row) {
  switch (t) {
    case KvDType::F32: std::memcpy(row, x, sizeof(float) * D); return;
    case KvDType::F16: f32_to_f16_row(x, reinterpret_cast<uint16_t*>(row), D); return;
    case KvDType::NVFP4: kv_nvfp4_encode_row(x, D, row); return;
    case KvDType::NVFP4R: kv_nvfp4r_encode_row(x, D, row); return;
    case KvDType::K8V4: return v ? kv_nvfp4r_encode_row(x, D, row) : kv_int8_encode_row(x, D, row);
    case KvDType::KPC4:
      if (v) return kv_nvfp4_encode_row(x, D, row);
      throw std::invalid_argument("kv_encode_row: kpc4 K is per page (kpc4_encode_page), not per row");
  }
}

void kv_decode_row(KvDType t, bool v, const uint8_t* row, int D, float* x) {
  switch (t) {
    case KvDType::F32: std::memcpy(x, row, sizeof(float) * D); return;
    case KvDType::F16: f16_to_f32_row(reinterpret_cast<const uint16_t*>(row), x, D); return;
    case KvDType::NVFP4: kv_nvfp4_decode_row(row, D, x); return;
    case KvDType::NVFP4R: kv_nvfp4r_decode_row(row, D, x); return;
    case KvDType::K8V4: return v ? kv_nvfp4r_decode_row(row, D, x) : kv_int8_decode_row(row, D, x);
    case KvDType::KPC4:
      if (v) return kv_nvfp4_decode_row(row, D, x);
      throw std::invalid_argument("kv_decode_row: kpc4 K is per page (kpc4_decode_page), not per row");
  }
}

}  // namespace kvdeck::cpu
