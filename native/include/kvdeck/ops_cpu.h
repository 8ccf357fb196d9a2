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

// Causal attention for one query token and one KV head group.
//   q   : f32 [G, D]   the G = nh/nkv query heads that share KV head g, already roped
//   ctx : tokens visible to this query (its position + 1)
//   pages: i32 [ceil(ctx/block)] page table; K/V of layer: [n_pages, block, nkv, D]
//   out : f32 [G, D] (row stride D)
//   work: f32 scratch of at least G*ctx + 2*block*D floats
void attention_query(const KvPool& pool, int layer, int g, const float* q, int G, int ctx,
                     const int32_t* pages, float scale, float* out, float* work);

}  // namespace kvdeck::cpu
