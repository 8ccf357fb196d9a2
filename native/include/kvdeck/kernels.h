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
};

// Activations quantised to int8 per block of 32 along K (symmetric):
//   amax = max|x|; d = amax / 127; q = rint(x * (127 / amax)) (all 0 and d = 0 if amax == 0);
//   s = sum of the block's q (used to undo the +8 offset of W4A8 weights).
// Rows are zero-padded from K to Kp. Buffers are caller-owned.
struct ActQ8 {
  int M = 0, Kp = 0;
  int8_t* q = nullptr;   // [M, Kp]
  float* d = nullptr;    // [M, Kp/32]
  int32_t* s = nullptr;  // [M, Kp/32]
};

void quantize_act_q8(const float* x /*[M,K]*/, int M, int K, ActQ8& out);

// y[m, n] = sum_k x[m, k] * W[n, k] for m in [0, M), n in [n0, n1).
//   x  : f32 [M, K] (row stride K) — read by F32/F16 weights
//   xq : x quantised by quantize_act_q8 — read by NVFP4/W4A8 weights (may be null otherwise)
//   y  : f32, row stride ldy
void gemm(const WeightView& w, const float* x, const ActQ8* xq, int M, float* y, int ldy,
          int n0, int n1);

const char* kernel_isa();                 // "avx512vnni" | "avx2" | "scalar"
bool set_kernel_isa(const char* name);    // false if the CPU cannot run it
bool cpu_supports(const char* name);

}  // namespace kvdeck
