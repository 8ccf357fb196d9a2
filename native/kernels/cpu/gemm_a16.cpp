// gemm_a16.cpp — the scalar reference of 16-bit activations ("a16", ActQ8::q16): the
// quantiser and the W4A8 (GGUF Q4_0 / Q4_1) and W8A8 (Q8_0) products on them.
//
// Why: the exact import of a GGUF file (weights format "gguf") keeps the file's own 4- and
// 8-bit weights, so what is left between it and the f32 engine is the rounding of the
// activations. Per-32 int8 activations cost ~4 top-1 points on the default model (0.956 vs
// f32); 16-bit ones 0.0005 (models/quant/act_study.py). Integer math as the 8-bit path: an
// exact int32 dot product per 32-block, floats only scale block results.
//
// Contracts (kernels.h ActQ8): d = amax / 32767, q16 = rint(x * (32767 / amax)), s = sum q16.
//   W4A8 (group a multiple of 32): per 32-block b, nibble sum t = sum(nibble * q16) (int32):
//     without mins  y += d_a[b] * scale * float(t - 8 * s[b])
//     with mins     y += d_a[b] * (scale * float(t) + min * float(s[b]))
//   W8A8:           y += d_a[b] * scale[b] * float(sum(q_w * q16))
//   Bounds: |t| <= 15 * 32767 * 32 < 2^24; |W8A8 sum| <= 128 * 32767 * 32 < 2^31.
// W4A8 + mins may be in the Q41X8 layout (kernels.h; repack_q4_1_x8 here): the reference reads
// each code byte where the repack moved it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/kernels_impl.h"

namespace kvdeck::cpu {

void quantize_act_q16_scalar(const float* x /*[M,K]*/, int M, int K, ActQ8& out) {
  const int Kp = out.Kp, nb = Kp / kQ8Block;
  for (int m = 0; m < M; ++m) {
    const float* xr = x + size_t(m) * K;      // [K]
    int16_t* q = out.q16 + size_t(m) * Kp;    // [Kp]
    for (int b = 0; b < nb; ++b) {
      const int k0 = b * kQ8Block, k1 = std::min(K, k0 + kQ8Block);
      float amax = 0.0f;
      for (int k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(xr[k]));
      const float id = amax > 0.0f ? kA16Max / amax : 0.0f;
      int32_t s = 0;
      for (int k = k0; k < k0 + kQ8Block; ++k) {
        const int v = k < k1 ? int(std::nearbyint(std::fmax(-kA16Max, std::fmin(kA16Max, xr[k] * id)))) : 0;
        q[k] = int16_t(v);
        s += v;
      }
      out.d[size_t(m) * nb + b] = amax / kA16Max;
      out.s[size_t(m) * nb + b] = s;
    }
  }
}

// ============================================================================
// The Q41X8 layout (kernels.h): repack and the byte a file offset moved to
// ============================================================================
void repack_q4_1_x8_rows(const uint8_t* codes, int N, int Kp, uint8_t* out) {
  const int nb = Kp / kQ8Block, C = nb / kX8Blocks;
  for (int n = 0; n < N; ++n) {
    const uint8_t* r = codes + size_t(n) * (Kp / 2);  // [Kp/2]
    uint8_t* o = out + size_t(n) * (Kp / 2);
    for (int c = 0; c < C; ++c) {
      uint8_t tmp[kX8ChunkBytes];
      for (int i = 0; i < kX8ChunkBytes; ++i) tmp[i] = r[c * kX8ChunkBytes + x8_file_byte(i)];
      std::memcpy(o + c * kX8ChunkBytes, tmp, kX8ChunkBytes);
    }
    if (o != r) std::memcpy(o + C * kX8ChunkBytes, r + C * kX8ChunkBytes, size_t(Kp / 2 - C * kX8ChunkBytes));
  }
}

// Where file code byte i (< 16) of block b of a row lies in the row's Q41X8 bytes.
inline int x8_offset(int b, int i, int C) {
  if (b >= C * kX8Blocks) return b * 16 + i;  // the tail keeps the file order
  const int j = b % kX8Blocks;
  return b / kX8Blocks * kX8ChunkBytes + 32 * (i / 4) + 4 * j + i % 4;
}

void check_a16_weight(const WeightView& w) {
  const bool x8 = w.layout == WeightLayout::Q41X8 && w.dtype == DType::W4A8 && w.group == kQ8Block && w.mins;
  const bool ok = (w.dtype == DType::W4A8 && w.group % kQ8Block == 0 && w.layout == WeightLayout::File) || x8 ||
                  w.dtype == DType::W8A8;
  if (!ok)
    throw std::invalid_argument(std::string("activations a16: weights of format ") + dtype_name(w.dtype) +
                                " have no 16-bit-activation kernel (W4A8 group 32k or W8A8 only; use activations a8)");
}

void gemm_a16_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  check_a16_weight(w);
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const auto* scales = static_cast<const uint16_t*>(w.scales);  // f16 [N, Kp/group]
  const auto* mins = static_cast<const uint16_t*>(w.mins);      // f16 [N, nb] or null
  const int ng = w.dtype == DType::W4A8 ? Kp / w.group : nb;
  const bool x8 = w.layout == WeightLayout::Q41X8;
  const int C = nb / kX8Blocks;
  for (int n = n0; n < n1; ++n)
    for (int m = 0; m < M; ++m) {
      const int16_t* qa = xq.q16 + size_t(m) * Kp;  // [Kp]
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        int32_t t = 0;
        if (w.dtype == DType::W8A8) {
          const int8_t* wr = static_cast<const int8_t*>(w.data) + size_t(n) * Kp + b * kQ8Block;
          for (int i = 0; i < kQ8Block; ++i) t += int(wr[i]) * qa[b * kQ8Block + i];
        } else {
          const uint8_t* cr = static_cast<const uint8_t*>(w.data) + size_t(n) * (Kp / 2);
          for (int i = 0; i < 16; ++i) {
            const uint8_t c = cr[x8 ? x8_offset(b, i, C) : b * 16 + i];
            t += int(c & 0xF) * qa[b * 32 + 2 * i] + int(c >> 4) * qa[b * 32 + 2 * i + 1];
          }
        }
        const float da = xq.d[size_t(m) * nb + b];
        const int32_t s = xq.s[size_t(m) * nb + b];
        const float dw = half_to_float(scales[size_t(n) * ng + b * kQ8Block / (w.dtype == DType::W4A8 ? w.group : kQ8Block)]);
        if (w.dtype == DType::W8A8)
          acc += da * dw * float(t);
        else if (mins)
          acc += da * (dw * float(t) + half_to_float(mins[size_t(n) * nb + b]) * float(s));
        else
          acc += da * dw * float(t - kW4a8Offset * s);
      }
      y[size_t(m) * ldy + n] = acc;
    }
}

}  // namespace kvdeck::cpu

namespace kvdeck {
void repack_q4_1_x8(const uint8_t* codes, int N, int Kp, uint8_t* codes_out) {
  cpu::repack_q4_1_x8_rows(codes, N, Kp, codes_out);
}
}  // namespace kvdeck
