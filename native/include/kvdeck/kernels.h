// kvdeck/kernels.h — CPU compute kernels with run-time ISA dispatch.
//
// Owner: native/kernels/cpu/. Stateless functions over caller-owned memory. The engine
// splits work across threads by calling a kernel on disjoint output ranges; kernels
// never start threads themselves.
//
// Dispatch: the best ISA the CPU reports (cpuid) among avx512vnni > avx2 > scalar is chosen
// once (aarch64: neon with the dot product > scalar, from getauxval; KVDECK_ISA=NAME in the
// environment picks the first one instead); set_kernel_isa() forces one (tests run every
// path the machine supports).
#pragma once
#include <cstdint>

#include "kvdeck/formats.h"

namespace kvdeck {

// How a weight view's bytes are arranged (the tag kernels dispatch on).
//   File    : the model-folder layout of formats.h.
//   Nvfp4X4 : NVFP4 repacked at load for the integer SIMD kernels (repack_nvfp4_x4), in the
//             same two buffers and byte counts as the file layout (so it can be done in place):
//     rows in groups of 4 (the last group holds N % 4 rows when N is not a multiple of 4);
//     K in chunks of 128 (eight 16-blocks), the last chunk holding the remaining 1..3
//     32-blocks. Group g's codes start at byte 4g * Kp/2; for each chunk, each row of the group
//     in turn: two parts of 4 bytes per 16-block, part h of 16-block j = file code bytes
//     8j + 4h .. 8j + 4h + 3 of the chunk (a full chunk: [part 0: 32 B | part 1: 32 B] per
//     row). Group g's scales start at byte 4g * Kp/16: per chunk, each row's scale bytes of
//     the chunk's 16-blocks in order. A negative scale byte is stored as its magnitude with
//     the sign moved into the block's codes (code ^ 8), which is exact.
//   Q41X8   : GGUF Q4_1 (W4A8 group 32 with mins) codes repacked at load for the 16-bit-activation
//             kernels (repack_q4_1_x8; read by activations a16 only, gemm() refuses it with 8-bit
//             ones); scales and mins stay as in the file. Per row, in place, the same Kp/2 bytes:
//             K in chunks of eight 32-blocks (128 code bytes), then the nb % 8 remaining blocks
//             in file order. In chunk c, byte 32v + 4j + k (v, k < 4; j < 8) = file code byte
//             4v + k of block 8c + j, so int32 lane j of each of the four 32-byte vectors belongs
//             to block 8c + j (one float step per eight blocks).
enum class WeightLayout : int32_t { File = 0, Nvfp4X4 = 1, Q41X8 = 2 };

// A linear layer's weight W [N, K] (N outputs, K inputs) in one of the DType formats.
// Non-owning view; see formats.h for the layout of each format.
struct WeightView {
  DType dtype = DType::F32;
  int N = 0, K = 0;
  int Kp = 0;                  // K padded: round_up(K, 32) for NVFP4/W4A8, K otherwise
  int group = 32;              // W4A8 scale group (32, or Kp for row-wise); NVFP4: 16
  const void* data = nullptr;  // f32 [N,K] | f16 [N,K] | u8 codes [N,Kp/2]
  const void* scales = nullptr;  // NVFP4: u8 e4m3 [N,Kp/16] | W4A8: f16 [N,Kp/group] | W8A8: f16 [N,Kp/32]
  const void* mins = nullptr;    // W4A8 group 32 only, optional: f16 [N,Kp/32] (GGUF Q4_1 minimums)
  float tscale = 1.0f;           // NVFP4 tensor scale
  WeightLayout layout = WeightLayout::File;
};

// Activations quantised to int8 per block of 32 along K (symmetric):
//   amax = max|x|; d = amax / 127; q = rint(x * (127 / amax)) (all 0 and d = 0 if amax == 0);
//   s = sum of the block's q (used to undo the +8 offset of W4A8 weights).
// Rows are zero-padded from K to Kp. Buffers are caller-owned.
// 16-bit activations ("a16", set q16): the same per-32 scheme with 32767 in place of 127,
//   d = amax / 32767; q = rint(x * (32767 / amax)) in q16 (q is not written), s = sum of q16.
//   Read by W4A8 (group a multiple of 32, with or without mins) and W8A8 weights only; other
//   integer formats refuse them (std::invalid_argument from gemm).
struct ActQ8 {
  int M = 0, Kp = 0;
  int8_t* q = nullptr;   // [M, Kp]
  float* d = nullptr;    // [M, Kp/32]
  int32_t* s = nullptr;  // [M, Kp/32]
  int16_t* q16 = nullptr;  // [M, Kp] when set: the activations are 16-bit (see above)
};

// Writes q or (out.q16 set) q16, with d and s.
void quantize_act_q8(const float* x /*[M,K]*/, int M, int K, ActQ8& out);

// y[m, n] = sum_k x[m, k] * W[n, k] for m in [0, M), n in [n0, n1).
//   x  : f32 [M, K] (row stride K) — read by F32/F16 weights
//   xq : x quantised by quantize_act_q8 — read by NVFP4/W4A8 weights (may be null otherwise)
//   y  : f32, row stride ldy
void gemm(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy,
          int n0, int n1);

// The layout the active kernel set reads fastest for w (File where it has no repacked kernel:
// scalar, and the NEON set, read the file layout). Every kernel set reads every layout.
WeightLayout preferred_layout(const WeightView& w);
// NVFP4 file layout -> Nvfp4X4 (see WeightLayout). out buffers may be the input buffers
// (in place) or distinct ones of the same sizes (codes [N*Kp/2], scales [N*Kp/16] bytes).
void repack_nvfp4_x4(const uint8_t* codes, const uint8_t* scales, int N, int Kp, uint8_t* codes_out,
                     uint8_t* scales_out);

// GGUF Q4_1 codes (W4A8 + mins, group 32) file layout -> Q41X8 (see WeightLayout); out may be
// codes (in place) or a distinct buffer of N * Kp/2 bytes.
void repack_q4_1_x8(const uint8_t* codes, int N, int Kp, uint8_t* codes_out);
// The layout prepare_weight gives a W4A8 + mins weight that runs on 16-bit activations (Q41X8
// where the active set has a kernel for it: avx2 and avx512vnni; File otherwise).
WeightLayout preferred_layout_a16(const WeightView& w);

const char* kernel_isa();                 // "avx512vnni" | "avx2" | "scalar"
bool set_kernel_isa(const char* name);    // false if the CPU cannot run it
bool cpu_supports(const char* name);

}  // namespace kvdeck
