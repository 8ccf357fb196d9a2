// gemm_scalar.cpp — the readable reference kernels, and the fallback on non-x86 hosts
// (Jetson aarch64). Same integer math as the SIMD paths, written plainly.
//
// Contracts: kernels.h. Quantised formats (NVFP4, W4A8) compute exact int32 dot products per
// block of int8 activations and integer weights; floats only scale block results.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels_impl.h"

namespace kvdeck::cpu {

// ============================================================================
// Shared helpers
// ============================================================================

const int8_t kE2m1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);  // zero or subnormal: man * 2^-24, exact
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  uint32_t bits = exp == 31 ? (sign | 0x7F800000u | (man << 13))
                            : (sign | ((exp + 112) << 23) | (man << 13));
  std::memcpy(&f, &bits, 4);
  return f;
}

static float e4m3_decode(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}

const float* e4m3_table() {
  struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = e4m3_decode(uint8_t(i));
    }
  };
  static const Table table;
  return table.v;
}

namespace {

// ============================================================================
// Activation quantisation
// ============================================================================

void quantize_act_q8_scalar(const float* x /*[M,K]*/, int M, int K, ActQ8& out) {
  const int Kp = out.Kp, nb = Kp / kQ8Block;
  for (int m = 0; m < M; ++m) {
    const float* xr = x + size_t(m) * K;           // [K]
    int8_t* q = out.q + size_t(m) * Kp;            // [Kp]
    for (int b = 0; b < nb; ++b) {
      const int k0 = b * kQ8Block, k1 = std::min(K, k0 + kQ8Block);
      float amax = 0.0f;
      for (int k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(xr[k]));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t s = 0;
      for (int k = k0; k < k0 + kQ8Block; ++k) {
        // clamp: only matters where 127/amax overflows (amax < ~3.7e-37, unspecified)
        const int v = k < k1 ? int(std::fmax(-127.0f, std::fmin(127.0f, std::nearbyint(xr[k] * id)))) : 0;
        q[k] = int8_t(v);
        s += v;
      }
      out.d[size_t(m) * nb + b] = amax / 127.0f;
      out.s[size_t(m) * nb + b] = s;
    }
  }
}

// ============================================================================
// Dense formats (F32, F16)
// ============================================================================

template <typename LoadW>
void gemm_dense(const WeightView& w, const float* x /*[M,K]*/, int M, float* y, int ldy, int n0,
                int n1, LoadW load_w) {
  const int K = w.K;
  for (int n = n0; n < n1; ++n)
    for (int m = 0; m < M; ++m) {
      const float* xr = x + size_t(m) * K;  // [K]
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += xr[k] * load_w(size_t(n) * K + k);
      y[size_t(m) * ldy + n] = acc;
    }
}

// ============================================================================
// Quantised formats (W4A8, NVFP4): int8 activations x 4-bit weights, int32 per block
// ============================================================================

// W4A8 with a group that is not a multiple of 32 (any even divisor of Kp): the scale changes
// inside a 32-block, so each element pair (pairs never straddle a group) is scaled alone.
void gemm_w4a8_anygroup(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0,
                        int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, ng = Kp / w.group;
  const auto* codes = static_cast<const uint8_t*>(w.data);      // [N, Kp/2]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, Kp/group]
  for (int n = n0; n < n1; ++n) {
    const uint8_t* cr = codes + size_t(n) * (Kp / 2);  // [Kp/2]
    for (int m = 0; m < M; ++m) {
      const int8_t* qa = xq.q + size_t(m) * Kp;  // [Kp]
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        float blk = 0.0f;
        for (int i = 0; i < kQ8Block / 2; ++i) {
          const int k = b * kQ8Block + 2 * i;
          const uint8_t c = cr[k / 2];
          const int isum = (int(c & 0xF) - kW4a8Offset) * qa[k] + (int(c >> 4) - kW4a8Offset) * qa[k + 1];
          blk += half_to_float(scales[size_t(n) * ng + k / w.group]) * float(isum);
        }
        acc += xq.d[size_t(m) * nb + b] * blk;
      }
      y[size_t(m) * ldy + n] = acc;
    }
  }
}

// W4A8 block dot: d_a * d_w * (sum(nibble * q_a) - 8 * s_a). Group: a multiple of 32.
void gemm_w4a8(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, ng = Kp / w.group;
  const auto* codes = static_cast<const uint8_t*>(w.data);      // [N, Kp/2]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, Kp/group]
  for (int n = n0; n < n1; ++n) {
    const uint8_t* cr = codes + size_t(n) * (Kp / 2);  // [Kp/2]
    for (int m = 0; m < M; ++m) {
      const int8_t* qa = xq.q + size_t(m) * Kp;  // [Kp]
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int i = 0; i < kQ8Block / 2; ++i) {
          const uint8_t c = cr[b * 16 + i];
          isum += int(c & 0xF) * qa[b * 32 + 2 * i] + int(c >> 4) * qa[b * 32 + 2 * i + 1];
        }
        isum -= kW4a8Offset * xq.s[size_t(m) * nb + b];
        const float dw = half_to_float(scales[size_t(n) * ng + b * kQ8Block / w.group]);
        acc += xq.d[size_t(m) * nb + b] * dw * float(isum);
      }
      y[size_t(m) * ldy + n] = acc;
    }
  }
}

// NVFP4 16-block dot: (e4m3(scale) / 2) * sum((2*e2m1) * q_a), times d_a of the enclosing
// 32-block; the row total times the tensor scale.
void gemm_nvfp4(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block, ns = Kp / kNvfp4Block;
  const auto* codes = static_cast<const uint8_t*>(w.data);   // [N, Kp/2]
  const auto* scales = static_cast<const uint8_t*>(w.scales);  // e4m3 [N, Kp/16]
  const float* e4m3 = e4m3_table();
  for (int n = n0; n < n1; ++n) {
    const uint8_t* cr = codes + size_t(n) * (Kp / 2);  // [Kp/2]
    for (int m = 0; m < M; ++m) {
      const int8_t* qa = xq.q + size_t(m) * Kp;  // [Kp]
      float acc = 0.0f;
      for (int j = 0; j < ns; ++j) {
        int32_t isum = 0;
        for (int i = 0; i < kNvfp4Block / 2; ++i) {
          const uint8_t c = cr[j * 8 + i];
          isum += kE2m1x2[c & 0xF] * qa[j * 16 + 2 * i] + kE2m1x2[c >> 4] * qa[j * 16 + 2 * i + 1];
        }
        const float sw = e4m3[scales[size_t(n) * ns + j]] * 0.5f;
        acc += xq.d[size_t(m) * nb + j / 2] * sw * float(isum);
      }
      y[size_t(m) * ldy + n] = acc * w.tscale;
    }
  }
}

}  // namespace

// W4A8 + mins: y += d_a * s_a * (min + 8 * scale) per 32-block (see formats.h).
void w4a8_mins_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int nb = w.Kp / kQ8Block;
  const auto* mins = static_cast<const uint16_t*>(w.mins);      // f16 [N, nb]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  for (int n = n0; n < n1; ++n)
    for (int m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        const float off = half_to_float(mins[size_t(n) * nb + b]) + 8.0f * half_to_float(scales[size_t(n) * nb + b]);
        acc += xq.d[size_t(m) * nb + b] * float(xq.s[size_t(m) * nb + b]) * off;
      }
      y[size_t(m) * ldy + n] += acc;
    }
}

// W8A8 block dot: d_a * d_w * sum(q_w * q_a) per 32-block.
void gemm_w8a8_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const auto* codes = static_cast<const int8_t*>(w.data);       // [N, Kp]
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, nb]
  for (int n = n0; n < n1; ++n) {
    const int8_t* wr = codes + size_t(n) * Kp;
    for (int m = 0; m < M; ++m) {
      const int8_t* qa = xq.q + size_t(m) * Kp;
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int i = 0; i < kQ8Block; ++i) isum += int(wr[b * 32 + i]) * qa[b * 32 + i];
        acc += xq.d[size_t(m) * nb + b] * half_to_float(scales[size_t(n) * nb + b]) * float(isum);
      }
      y[size_t(m) * ldy + n] = acc;
    }
  }
}

namespace {

void gemm_scalar(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy,
                 int n0, int n1) {
  switch (w.dtype) {
    case DType::F32: {
      const auto* W = static_cast<const float*>(w.data);  // [N, K]
      gemm_dense(w, x, M, y, ldy, n0, n1, [W](size_t i) { return W[i]; });
      break;
    }
    case DType::F16: {
      const auto* W = static_cast<const uint16_t*>(w.data);  // f16 [N, K]
      gemm_dense(w, x, M, y, ldy, n0, n1, [W](size_t i) { return half_to_float(W[i]); });
      break;
    }
    case DType::W4A8:
      if (w.group % kQ8Block == 0)
        gemm_w4a8(w, *xq, M, y, ldy, n0, n1);
      else
        gemm_w4a8_anygroup(w, *xq, M, y, ldy, n0, n1);
      break;
    case DType::NVFP4: gemm_nvfp4(w, *xq, M, y, ldy, n0, n1); break;
    case DType::W8A8: gemm_w8a8_scalar(w, *xq, M, y, ldy, n0, n1); break;
  }
}

}  // namespace

const KernelSet& scalar_kernels() {
  static const KernelSet k{"scalar", quantize_act_q8_scalar, gemm_scalar, w4a8_mins_scalar, gemm_w8a8_scalar,
                           gemm_nvfp4_x4_scalar, WeightLayout::File};
  return k;
}

}  // namespace kvdeck::cpu
