// kvdeck/ops_cpu.h — the CPU backend's non-GEMM kernels (norms, RoPE, activation, attention).
//
// Owner: native/kernels/cpu/ops_*.cpp and attention_cpu.cpp. Stateless, single-threaded
// over the ranges they are given; the CPU backend splits the work across threads.
// Vector paths are chosen at run time (target_clones on x86; plain loops elsewhere).
#pragma once
#include <cmath>
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
// One int8 row with an f16 scale per 32 (W8A8 / GGUF Q8_0) → f32: f[j] = f32(d[j/32]) * q[j],
// j < n (the embedding lookup of an 8-bit table).      q: i8 [n]; d: f16 [ceil(n/32)]
void w8a8_row_to_f32(const int8_t* q, const uint16_t* d, float* f, int n);

// NVFP4 KV rows: u8 codes [D/2] (element 2i low nibble) then E4M3 scales [D/16]; per block
// of 16: s = e4m3(amax/6), q = e2m1(x / decode(s)) (0 where decode(s) == 0); tensor scale 1.
void kv_nvfp4_encode_row(const float* x /*[D]*/, int D, uint8_t* row /*[D/2 + D/16]*/);
void kv_nvfp4_decode_row(const uint8_t* row, int D, float* x /*[D]*/);
// nvfp4r rows: the nvfp4 row then an f16 second-level scale g [2 bytes]: g = f16(amax/(6*448)),
// s_b = e4m3(amax_b / (6 g)), x = e2m1 * e4m3(s_b) * g. int8 rows: i8 [D] then f16 g = amax/127.
void kv_nvfp4r_encode_row(const float* x, int D, uint8_t* row /*[D/2 + D/16 + 2]*/);
void kv_nvfp4r_decode_row(const uint8_t* row, int D, float* x);
void kv_int8_encode_row(const float* x, int D, uint8_t* row /*[D + 2]*/);
void kv_int8_decode_row(const uint8_t* row, int D, float* x);
// Any KV format's K (v = false) or V (v = true) row, kv_row_bytes(t, D, v) bytes.
void kv_encode_row(KvDType t, bool v, const float* x, int D, uint8_t* row);
void kv_decode_row(KvDType t, bool v, const uint8_t* row, int D, float* x);

// A layer's K and V as attention reads them.
struct KvView {
  const void* k = nullptr;         // [n_pages, block, nkv, row] of dtype
  const void* v = nullptr;
  KvDType dtype = KvDType::F32;
  int block = 16, nkv = 1, D = 64;
  const int32_t* pages = nullptr;  // [ceil(ctx/block)] page table
  // Optional (attention_fresh): the tokens at positions >= fresh0 are read from these f32 rows
  // instead of the pages; token t's head g at fresh_k + (t - fresh0) * fresh_ld + g * D.
  const float* fresh_k = nullptr;
  const float* fresh_v = nullptr;
  int fresh0 = 0;
  size_t fresh_ld = 0;
  // Whether prefill over this view must repeat decode's arithmetic bit for bit (the page steps of
  // attention_avx2.cpp). False only for a view whose decode rounds differently anyway: the
  // backend's f32 workspace of an NVFP4 pool whose decode scores with int8 q
  // (attention_scores_int8); attention_queries may then run each segment whole
  // (attention_prefill_wide_avx2.cpp; KVDECK_ATTN_WIDE=0 keeps the page steps).
  bool decode_order = true;
};

// Keys per context segment. Attention runs an online softmax over each segment (a page at a
// time) and combines the segments' partials in order; decode spreads the segments of a long
// context over threads. Every path uses the same segments and order, so a query's result
// does not depend on how the work was split (decode == prefill, cached == cold).
constexpr int kAttnSegment = 256;
// The segment length for a pool: kAttnSegment rounded up to whole pages.
inline int attn_segment(int block) { return (kAttnSegment + block - 1) / block * block; }

// e^x, or exactly 0 below e^-87 (denormal factors slow every FMA that consumes them).
inline float flush_exp(float x) { return x < -87.0f ? 0.0f : std::exp(x); }

// One segment [t0, t1) of a query's context (t0 a multiple of attn_segment(block)):
//   o[h] = Σ_t e^(s_t - m[h]) v_t,  m[h] = max_t s_t,  l[h] = Σ_t e^(s_t - m[h]),  s_t = scale q[h]·k_t
//   q: f32 [G, D]; o: f32 [G, D]; m, l: f32 [G]; tile: f32 scratch [2, block, D]
void attention_segment(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale,
                       float* o, float* m, float* l, float* tile);
// attention_segment for the KV heads g0..g1-1 at once, a page at a time (each page's rows of
// all these heads are read together: one stream through memory, the next page prefetched).
// Head g's q at q + (g - g0) * qg, its o at o + (g - g0) * og, m and l at + (g - g0) * mg.
void attention_segment_heads(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                             float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile);
// Whether attention_segment / attention_segment_heads score this view's pages with integer
// dot products (AVX2, NVFP4 pages, D 64 or 128, block % 8 == 0; a page holding fresh rows,
// attention_fresh's, is read in f32 as elsewhere): q is then
// quantised to int8 per block of 16 values (d = amax/127) and each block's integer sum scaled by
// d times the E4M3 block scale (attention_nvfp4_avx2.cpp), so decode differs from the f32
// scores of attention_queries / attention_segment_ref by q's rounding (<= amax/254 per value).
// Their V side then runs on the codes too (attention_nvfp4_pv) unless attention_int_v() is off.
// The avx512vnni set runs AVX-512 BW + VNNI page kernels for both, bit for bit the AVX2 ones.
bool attention_scores_int8(const KvView& kv);
// Whether decode over such pages adds P·V on the codes (KVDECK_ATTN_INT_V=0: V widened to f32
// and float FMAs, the exact P·V; read once).
bool attention_int_v();
// o[h] = o[h]·alpha[h] + P·V for G heads over the n NVFP4 V rows at v (token stride ts bytes;
// P[h*ldp + t], t < n, >= 0; o [G, D]) with the weights rounded to 8 bits: per group of 8
// tokens and block b of 16 values, w_t = P_t·s_tb (s_tb the E4M3 block scale, NaN read as 0),
// wm = max_t |w_t|, W_t = nearbyint(w_t · (255/wm)) (0 when wm = 0), and per value i of block b
//   I_i = Σ_t W_t · 2e2m1(c_ti)  (exact int32),   o_i = fma(float(I_i), wm · (0.5/255), o_i)
// for the groups in order. Each weight moves by at most wm/510: |Δo_i| <= Σ_groups 8 · wm/510 ·
// max|v| — a bound relative to the page's largest weight, not to |o|. The reference order;
// attention_nvfp4_pv (AVX2 when the CPU has it, D 64 / 128, n <= 64, no negative block scale;
// else this) returns the same bits.
void attention_nvfp4_pv_ref(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                            const float* alpha, float* o);
void attention_nvfp4_pv(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                        const float* alpha, float* o);
// The reference (portable) version of attention_segment, also the non-x86 path.
void attention_segment_ref(const KvView& kv, int g, const float* q, int G, int t0, int t1, float scale,
                           float* o, float* m, float* l, float* tile);
// out[h] = Σ_s e^(m_s[h] - M) o_s[h] / Σ_s e^(m_s[h] - M) l_s[h], M = max_s m_s[h]; s = 0..S-1 in order.
//   o: f32 [S, G, D]; m, l: f32 [S, G]; out: f32 [G, D]
void attention_combine(const float* o, const float* m, const float* l, int S, int G, int D, float* out);

// Causal attention for one query token and one KV head group: attention_segment over each
// segment of [0, ctx), then attention_combine.
//   q   : f32 [G, D]   the G = nh/nkv query heads that share KV head g, already roped
//   ctx : tokens visible to this query (its position + 1)
//   out : f32 [G, D] (row stride D)
//   work: f32 scratch of at least attention_work_floats(G, ctx, block, D) floats
// f16 and nvfp4 rows are widened a page at a time inside the kernel.
void attention_query(const KvView& kv, int g, const float* q, int G, int ctx, float scale, float* out,
                     float* work);
inline size_t attention_work_floats(int G, int ctx, int block, int D) {
  const size_t S = (ctx + attn_segment(block) - 1) / attn_segment(block);
  return S * G * (D + 2) + 2 * size_t(block) * D;
}

// Causal attention of the queries m0..m1-1 (at positions p0+m, ctx p0+m+1) for KV head g,
// computed as a tile: each page of the context is loaded once for every query (and head) of
// the tile that sees it, instead of once per query. Bit for bit the result of attention_query
// per query (the same page steps, segments and combine), so a prefill still equals decode.
//   q  : query m's G heads at q + m*ldq + g*G*D (f32, roped)
//   out: query m's G heads at out + m*ldo + g*G*D
//   work: attention_queries_work_floats(m1 - m0, G, p0 + m1, block, D) floats
// Queries per tile at most: a tile walks each 256-key segment (K and V: 2·256·D floats, in L2)
// in sub-tiles of kAttnSubTile queries (x G rows, their q and o in L1), so the pages come from
// DRAM / L3 once per tile (2026-12-02, 500 new over 4,000 cached, 1 thread, load ~8: 16 -> 64
// queries 1.14x; docs/ENGINE.md).
constexpr int kAttnQueryTile = 64;
constexpr int kAttnSubTile = 16;
// Rows (queries x G) per call of the whole-segment kernel (KvView::decode_order false): their
// scores [rows, 320] stay in L2.
constexpr int kAttnWideRows = 192;
void attention_queries(const KvView& kv, int g, const float* q, size_t ldq, int G, int m0, int m1, int p0,
                       float scale, float* out, size_t ldo, float* work);
inline size_t attention_queries_work_floats(int n_queries, int G, int ctx, int block, int D) {
  const size_t S = (ctx + attn_segment(block) - 1) / attn_segment(block);
  return size_t(n_queries) * S * G * (D + 2) + 2 * size_t(block) * D;
}

}  // namespace kvdeck::cpu
