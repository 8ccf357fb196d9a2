// kvdeck/formats.h — number formats and their scalar codecs.
//
// Owner: formats.cpp. Pure functions, no state. These are the C++ twins of the numpy
// reference codecs in models/quant/ and must agree with them bit for bit
// (tests/native/test_codecs.py).
//
// Weight formats (per tensor, chosen at convert time; DESIGN.md § Engine):
//   F32, F16  : dense reference formats, row-major [N, K].
//   NVFP4     : codes u8 [N, Kp/2], two E2M1 per byte, element 2i in the low nibble;
//               block scales u8 (E4M3) [N, Kp/16]; one f32 tensor scale g.
//               w = e2m1(code) * e4m3(scale) * g.
//   W4A8      : codes u8 [N, Kp/2], two int4 per byte, element 2i in the low nibble,
//               nibble = q + 8 (offset binary, q in [-8, 7]); scales f16 [N, Kp/group].
//               w = q * scale. Activations are quantised at run time to int8 per 32.
//               Optional mins f16 [N, Kp/32] (group 32 only): w = q * scale + min' where
//               min' = min + 8 * scale — GGUF Q4_1 blocks kept exactly (w = d * nibble + m).
//               Without mins, GGUF Q4_0 blocks are W4A8 group 32 as they are.
//   W8A8      : codes i8 [N, Kp], scales f16 [N, Kp/32]; w = q * scale (GGUF Q8_0 exactly).
//               Run on int8 x int8 dot products per 32-block, like the 4-bit formats.
// Kp = K rounded up to kQuantPad (32); padded weights are zero.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvdeck {

enum class DType : int32_t { F32 = 0, F16 = 1, NVFP4 = 2, W4A8 = 3, W8A8 = 4 };

constexpr int kNvfp4Block = 16;  // values per E4M3 block scale
constexpr int kQ8Block = 32;     // run-time int8 activation block
constexpr int kQuantPad = 32;    // K of quantised weights is padded to a multiple of this

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }
// Formats that run on the integer path and read run-time int8 activations.
inline bool is_integer(DType t) { return t == DType::NVFP4 || t == DType::W4A8 || t == DType::W8A8; }
const char* dtype_name(DType t);

// ---- scalar codecs -----------------------------------------------------------------
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);   // round to nearest even, overflow to inf
float e4m3_to_f32(uint8_t b);   // float8_e4m3fn: no inf, 0x7F/0xFF are NaN
uint8_t f32_to_e4m3(float f);   // RNE, saturate to ±448, NaN -> 0x7F (sign kept)
float e2m1_to_f32(uint8_t c);   // c in [0, 16): {0,.5,1,1.5,2,3,4,6} and negatives
uint8_t f32_to_e2m1(float f);   // RNE on the E2M1 grid, saturate to ±6

// ---- array codecs: the scalar codecs over n contiguous values (out[i] = codec(in[i])) --
void encode_f16(const float* x /*[n]*/, uint16_t* h /*[n]*/, size_t n);
void decode_f16(const uint16_t* h /*[n]*/, float* x /*[n]*/, size_t n);
void encode_e4m3(const float* x /*[n]*/, uint8_t* b /*[n]*/, size_t n);
void decode_e4m3(const uint8_t* b /*[n]*/, float* x /*[n]*/, size_t n);
void encode_e2m1(const float* x /*[n]*/, uint8_t* c /*[n]*/, size_t n);
void decode_e2m1(const uint8_t* c /*[n]*/, float* x /*[n]*/, size_t n);

// ---- tensor codecs (reference implementations, also used by the KV cache) ---------
// Scale recipes of the weight quantisers (models/quant/{nvfp4,w4a8}.py state them exactly).
//   Mse  (default): per block / group, the scale with the least squared error among a few
//                   candidates (the Amax one first; ties keep the earlier candidate), so its
//                   error is never above Amax's. W4A8 adds one least-squares refit.
//   Amax          : the DESIGN recipes below (converter_version 1).
enum class QuantRecipe : int32_t { Mse = 0, Amax = 1 };

// NVFP4 Amax recipe: g = amax(W)/(6*448) (1 if W is all zero);
//   s_b = e4m3(amax(block)/(6*g)); q = e2m1(w / (e4m3_to_f32(s_b)*g)) (0 if s_b decodes to 0).
//   Exact float32 operation order: models/quant/nvfp4.py (q = 0 wherever the divisor
//   e4m3_to_f32(s_b)*g is 0; dequantise as (e2m1 * e4m3) * g).
void nvfp4_quantize(const float* w /*[N,K]*/, int N, int K,
                    uint8_t* codes /*[N,Kp/2]*/, uint8_t* scales /*[N,Kp/16]*/, float* tscale);
// NVFP4 Mse recipe: same g; s_b = the best of the codes s6, s6-1, s6+1, s4, s4-1, s4+1
//   (s6 = the Amax code, s4 = e4m3(amax(block)/(4*g))) by sum of (w/g - e2m1*e4m3)^2.
//   The 6-argument form uses QuantRecipe::Mse.
void nvfp4_quantize(const float* w /*[N,K]*/, int N, int K, uint8_t* codes /*[N,Kp/2]*/,
                    uint8_t* scales /*[N,Kp/16]*/, float* tscale, QuantRecipe recipe);
void nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int K,
                      float* w /*[N,K]*/);
// W4A8 Amax recipe: per group of `group` values along K: d = amax/7; q = clamp(rint(w/d), -8, 7);
//   scale stored as f16(d) and q computed against the f16-rounded d.
//   Exact recipe (models/quant/w4a8.py): d16 = f32_to_f16(min(amax / 7.0f, 65504.0f));
//   q = 0 where d16 == 0. group <= 0 means row-wise (group = Kp); otherwise group must be
//   even and divide Kp (std::invalid_argument if not).
void w4a8_quantize(const float* w /*[N,K]*/, int N, int K, int group,
                   uint8_t* codes /*[N,Kp/2]*/, uint16_t* scales /*f16 [N,Kp/group]*/);
// W4A8 Mse recipe: d = the best of amax/7, smax/c for c in (-8, -8.5, -9, -9.5, 7.5)
//   (smax: the signed value of largest magnitude, so c < 0 uses the level -8), then one
//   least-squares refit d = sum(w*q)/sum(q^2), by sum of (w - q*d16)^2; scales may be
//   negative. The 6-argument form uses QuantRecipe::Mse.
void w4a8_quantize(const float* w /*[N,K]*/, int N, int K, int group, uint8_t* codes /*[N,Kp/2]*/,
                   uint16_t* scales /*f16 [N,Kp/group]*/, QuantRecipe recipe);
void w4a8_dequantize(const uint8_t* codes, const uint16_t* scales, int N, int K, int group,
                     float* w /*[N,K]*/);

}  // namespace kvdeck
