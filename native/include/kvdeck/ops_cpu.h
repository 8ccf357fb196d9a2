// kvdeck/ops_cpu.h — the CPU backend's non-GEMM kernels (norms, RoPE, activation, attention).
//
// Owner: native/kernels/cpu/ops_*.cpp and attention_cpu.cpp. Stateless, single-threaded
// over the ranges they are given; the CPU backend splits the work across threads.
// Vector paths are chosen at run time (target_clones on x86; plain loops elsewhere).
#pragma once
#include <cstdint>

#include "kvdeck/kv_pool.h"

namespace kvdeck::cpu {

// y[:] = x[:] / sqrt(mean(x^2) + eps) * w[:]          x, y, w: f32 [n]
void rmsnorm_row(const float* x, const float* w, int n, float eps, float* y);
// Rotate-half RoPE of one token's heads in place.      x: f32 [n_heads, D]; cs, sn: f32 [D/2]
void rope_row(float* x, int n_heads, int D, const float* cs, const float* sn);
// y[:] = silu(a[:]) * b[:]                             f32 [n]
void silu_mul_row(const float* a, const float* b, int n, float* y);
// f16 → f32 for n values (F16C where the CPU has it)
void f16_to_f32_row(const uint16_t* h, float* f, int n);
void f32_to_f16_row(const float* f, uint16_t* h, int n);

// NVFP4 KV rows: u8 codes [D/2] (element 2i low nibble) then E4M3 scales [D/16]; per block
// of 16: s = e4m3(amax/6), q = e2m1(x / decode(s)) (0 where decode(s) == 0); tensor scale 1.
void kv_nvfp4_encode_row(const float* x /*[D]*/, int D, uint8_t* row /*[D/2 + D/16]*/);
void kv_nvfp4_decode_row(const uint8_t* row, int D, float* x /*[D]*/);

// A layer's K and V as attention reads them.
struct KvView {
  const void* k = nullptr;         // [n_pages, block, nkv, row] of dtype
  const void* v = nullptr;
  KvDType dtype = KvDType::F32;
  int block = 16, nkv = 1, D = 64;
  const int32_t* pages = nullptr;  // [ceil(ctx/block)] page table
};

// Causal attention for one query token and one KV head group.
//   q   : f32 [G, D]   the G = nh/nkv query heads that share KV head g, already roped
//   ctx : tokens visible to this query (its position + 1)
//   out : f32 [G, D] (row stride D)
//   work: f32 scratch of at least G*ctx + 2*block*D floats
// f16 and nvfp4 rows are widened a page at a time inside the kernel.
void attention_query(const KvView& kv, int g, const float* q, int G, int ctx, float scale, float* out,
                     float* work);

}  // namespace kvdeck::cpu
