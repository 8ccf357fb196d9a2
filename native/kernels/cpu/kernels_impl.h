// kernels_impl.h — private to native/kernels/cpu: per-ISA kernel tables and shared helpers.
//
// Each ISA file (gemm_scalar.cpp, gemm_avx2.cpp, gemm_avx512.cpp) exports one KernelSet;
// dispatch.cpp picks one from cpuid and routes the public kernels.h calls to it.
// Contracts are those of kernels.h; every entry point handles all four DTypes.
#pragma once
#include <cstdint>

#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

namespace kvdeck::cpu {

struct KernelSet {
  const char* name;  // "scalar" | "avx2" | "avx512vnni"
  void (*quantize_act_q8)(const float* x /*[M,K]*/, int M, int K, ActQ8& out);
  void (*gemm)(const WeightView& w, const float* x /*[M,K]*/, const ActQ8* xq, int M,
               float* y /*[M,ldy]*/, int ldy, int n0, int n1);
  // W4A8 with mins: y[m, n] += sum_b d_a[m,b] * s_a[m,b] * (min[n,b] + 8 * scale[n,b])
  // over rows [n0, n1), after gemm() wrote the plain W4A8 product.
  void (*w4a8_mins)(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
  // W8A8: y[m, n] = sum_b d_a[m,b] * scale[n,b] * sum_i q_w * q_a (rows [n0, n1)).
  void (*gemm_w8a8)(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
  // NVFP4 in the Nvfp4X4 layout (kernels.h): the same product as gemm() on the file layout.
  // Null: dispatch falls back to the scalar reader. nvfp4_layout: the layout prepare_weight
  // repacks NVFP4 weights into for this set (File: no repack).
  void (*gemm_nvfp4_x4)(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0,
                        int n1) = nullptr;
  WeightLayout nvfp4_layout = WeightLayout::File;
  // gemm() adds the W4A8 mins term itself (dispatch then skips w4a8_mins).
  bool gemm_fuses_mins = false;
  // 16-bit activations (ActQ8::q16; gemm_a16.cpp): the quantiser, and the W4A8 (group a
  // multiple of 32, mins fused) / W8A8 product on them. Null: the scalar reference.
  void (*quantize_act_q16)(const float* x /*[M,K]*/, int M, int K, ActQ8& out) = nullptr;
  void (*gemm_a16)(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) = nullptr;
  // The layout prepare_weight gives GGUF Q4_1 weights on 16-bit activations (kernels.h
  // preferred_layout_a16): Q41X8 where gemm_a16 has a kernel for it.
  WeightLayout q41_a16_layout = WeightLayout::File;
};

// ---- 16-bit activations (gemm_a16.cpp: the contract and the scalar reference) ---------
constexpr float kA16Max = 32767.0f;
void quantize_act_q16_scalar(const float* x /*[M,K]*/, int M, int K, ActQ8& out);
void gemm_a16_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// The Q41X8 layout (kernels.h): a chunk of eight 32-blocks is 128 code bytes; chunk byte i
// holds file byte x8_file_byte(i) of the chunk (block i / 4 % 8, byte 4 (i / 32) + i % 4).
constexpr int kX8Blocks = 8;
constexpr int kX8ChunkBytes = 128;
constexpr int x8_file_byte(int i) { return 16 * (i / 4 % 8) + 4 * (i / 32) + i % 4; }
void repack_q4_1_x8_rows(const uint8_t* codes, int N, int Kp, uint8_t* out);
// std::invalid_argument unless w has an a16 kernel (W4A8 group % 32 == 0 file layout, W4A8 +
// mins group 32 in Q41X8, W8A8).
void check_a16_weight(const WeightView& w);

const KernelSet& scalar_kernels();
const KernelSet& active_kernels();  // the set dispatch.cpp routes to now
#if defined(__x86_64__)
const KernelSet& avx2_kernels();    // needs avx2 + fma + f16c
const KernelSet& avx512_kernels();  // needs avx512f + bw + vl + vnni (+ avx2/fma/f16c)
// The AVX2 activation quantiser, shared by the AVX-512 set (not a hot path).
void quantize_act_q8_avx2(const float* x /*[M,K]*/, int M, int K, ActQ8& out);
// silu_mul_row (ops_cpu.h) with a vector exp (activation_avx2.cpp).
void silu_mul_row_avx2(const float* a, const float* b, int n, float* y);
// attention_segment (ops_cpu.h) for D % 8 == 0, D <= 128, block <= 64 (attention_avx2.cpp).
void attention_segment_avx2(const KvView& kv, int g, const float* q, int G, int t0, int t1,
                            float scale, float* o, float* m, float* l, float* tile);
// attention_segment_heads (ops_cpu.h) for the same shapes (attention_avx2.cpp).
void attention_heads_avx2(const KvView& kv, int g0, int g1, const float* q, size_t qg, int G, int t0, int t1,
                          float scale, float* o, size_t og, float* m, float* l, size_t mg, float* tile);
// attention_nvfp4_pv (ops_cpu.h) on AVX2 (attention_nvfp4_avx2.cpp): false (o untouched) unless
// D is 64 or 128, n <= 64 and no block scale is negative.
bool attention_nvfp4_pv_avx2(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                             const float* alpha, float* o);
// The same on AVX-512 (attention_nvfp4_avx2.cpp: the AVX2 block scales, the AVX-512 P·V).
bool attention_nvfp4_pv_avx512(const uint8_t* v, size_t ts, int n, int D, int G, const float* P, int ldp,
                               const float* alpha, float* o);
// The avx512vnni set is the active one: decode over NVFP4 pages (attention_avx2.cpp's
// segment_heads, attention_nvfp4_pv) then runs the AVX-512 page kernels below.
bool avx512_active();
// NVFP4 page scores and P·V on AVX-512 BW + VNNI (attention_nvfp4_avx512.cpp): the contracts of
// attn_avx2::nvfp4_page_scores / nvfp4_page_pv (attention_avx2.h), and their bits (the scores:
// the same integers and float operations; P·V: attention_nvfp4_pv_ref's).
void nvfp4_page_scores_avx512(const int8_t* q8, const float* qs, const int32_t* qc, int G, int D, const uint8_t* k,
                              size_t ts, int n, const uint16_t* ks, float* S);
// softmax_heads (attention_avx2.cpp: a page's online softmax for G heads, S / P [G][64], S past
// n set to -inf) in 16 lanes, bit for bit; S past n is padded to a multiple of 16 keys.
void softmax_heads_avx512(int G, int n, float* m, float* l, float* S, float* P, float* alpha);
bool nvfp4_page_pv_avx512(const uint8_t* v, size_t ts, int n, int D, const uint16_t* ks, int G, const float* P,
                          int ldp, const float* alpha, float* o);
// Page-sharing rows of one segment, flash style (attention_prefill_avx2.cpp): false when D
// has no AVX2 kernel.
bool attention_rows_avx2(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                         float scale, float* const* o, float* const* m, float* const* l, float* tile);
// The same rows a whole segment at a time, not in decode's order, for f32 views with
// decode_order false (attention_prefill_wide_avx2.cpp): false when the view or D has no kernel.
bool attention_rows_wide_avx2(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                              float scale, float* const* o, float* const* m, float* const* l);
// W4A8 mins correction and the W8A8 GEMV/GEMM (gemm_w8a8_avx2.cpp; the AVX-512 set has its own W8A8 and fuses the mins).
void w4a8_mins_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
void gemm_w8a8_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// F32 / F16 weights (gemm_dense_avx2.cpp).
void gemm_dense_avx2(const WeightView& w, const float* x, int M, float* y, int ldy, int n0, int n1);
// W4A8 (group % 32 == 0; with mins: group 32, the term fused) on AVX-512 VNNI (gemm_w4a8_avx512.cpp).
void gemm_w4a8_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// W8A8 on AVX-512 VNNI (gemm_w8a8_avx512.cpp).
void gemm_w8a8_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// F32 / F16 weights on AVX-512 (gemm_dense_avx512.cpp).
void gemm_dense_avx512(const WeightView& w, const float* x, int M, float* y, int ldy, int n0, int n1);
// The NVFP4 Nvfp4X4 readers: AVX2 (gemm_repack_avx2.cpp) and AVX-512 VNNI (gemm_repack_avx512.cpp).
void gemm_nvfp4_x4_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
void gemm_nvfp4_x4_avx512(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// 16-bit activations (gemm_a16_avx2.cpp; the AVX-512 set uses them too).
void quantize_act_q16_avx2(const float* x /*[M,K]*/, int M, int K, ActQ8& out);
void gemm_a16_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// W4A8 + mins (GGUF Q4_1) in the Q41X8 layout on 16-bit activations (gemm_a16_x8_avx2.cpp).
void gemm_q41x8_a16_avx2(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
#endif
// The scalar Nvfp4X4 reader (gemm_repack.cpp): gemm_nvfp4's float operations in its order, so
// bit-identical to the scalar kernel on the file layout.
void gemm_nvfp4_x4_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// The scalar references of the two (gemm_scalar.cpp).
void w4a8_mins_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
void gemm_w8a8_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);

// ---- shared scalar helpers (defined in gemm_scalar.cpp) ---------------------------
// 256-entry E4M3 (float8_e4m3fn) decode table, built once (thread-safe static init).
const float* e4m3_table();
// IEEE binary16 -> binary32, exact (subnormals, inf, NaN).
float half_to_float(uint16_t h);
// 2 * E2M1(code) for the 16 codes: exact int8 {0,1,2,3,4,6,8,12} and negatives (bit 3 = sign).
extern const int8_t kE2m1x2[16];

// Offsets that make 4-bit weights unsigned for u8 x s8 dot products (VNNI / maddubs):
//   W4A8 : nibble = q + 8, so sum(q*a) = sum(nibble*a) - 8*sum(a)
//   NVFP4: u = 2*e2m1 + 12 in [0, 24], so sum(2*e2m1*a) = sum(u*a) - 12*sum(a)
constexpr int kW4a8Offset = 8;
constexpr int kNvfp4Offset = 12;

#if defined(__aarch64__)
// The fourth set, "neon": NEON + dot product (ARMv8.2-A, e.g. Cortex-A78AE), files *_neon.cpp.
const KernelSet& neon_kernels();  // needs asimd + asimddp (getauxval(AT_HWCAP), dispatch.cpp)
bool neon_active();               // the active set is neon: attention / SiLU route to it too
// F32 / F16 GEMM (gemm_dense_neon.cpp); the W4A8 mins term and W8A8 (gemm_neon.cpp).
void gemm_dense_neon(const WeightView& w, const float* x /*[M,K]*/, int M, float* y, int ldy, int n0, int n1);
void w4a8_mins_neon(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
void gemm_w8a8_neon(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// 16-bit activations: W4A8 (file layout, group 32k) and W8A8 with sdot / udot (gemm_a16_neon.cpp).
void gemm_a16_neon(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1);
// silu_mul_row and attention_segment (ops_cpu.h) on NEON (activation_neon.cpp, attention_neon.cpp;
// D in {32, 64, 96, 128} and block <= 256, otherwise the reference).
void silu_mul_row_neon(const float* a, const float* b, int n, float* y);
void attention_segment_neon(const KvView& kv, int g, const float* q, int G, int t0, int t1,
                            float scale, float* o, float* m, float* l, float* tile);
// Page-sharing rows of one segment over f32 pages in place, flash style (attention_prefill_neon.cpp;
// bit for bit attention_segment_neon per row): false for other views, D or blocks (block % 4, <= 64).
bool attention_rows_neon(const KvView& kv, int g, int R, const float* const* q, const int* end, int t0,
                         float scale, float* const* o, float* const* m, float* const* l);
#endif

}  // namespace kvdeck::cpu
