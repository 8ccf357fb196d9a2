// kernels_cuda.h — kvdeck's CUDA kernels: contracts and shapes (sm_87 Orin, sm_90 Hopper).
//
// Owner: native/kernels/cuda/. Stateless host launchers over caller-owned device memory;
// every launcher only enqueues work on `stream` (no allocation, no sync) and returns the
// launch status (cudaSuccess, or cudaErrorInvalidValue for a shape it does not support,
// checked before anything is enqueued).
//
// pdl (the GEMV path): launch with programmatic dependent launch on sm_90+ (ignored below):
// the kernel may start while the previous kernel in the stream is still running, loads its
// weights, and waits (griddepcontrol.wait) for that kernel's completion before it reads its
// activations or writes anything. Safe after any kernel; pays off in a chain of kernels
// (a CUDA-graph decode step), where it hides the launch gap and the DRAM latency. Layouts are those of kvdeck/formats.h (weights)
// and kvdeck/kv_pool.h (KV pages); the CPU kernels (native/kernels/cpu) are the oracle.
//
// Validation and timing: native/kernels/cuda/bench (gpu_bench.cu, run_bench.py);
// tests/cuda/test_kernels_cuda.py runs the validation on a GPU.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace kvdeck::cuda {


// =====================================================================================
// Activations quantised per 32-block to int8 (the CPU's quantize_act_q8, kernels.h ActQ8)
// =====================================================================================
//   amax = max|x| over the block; d = amax / 127; q = rint(x * (127 / amax)), clamped to
//   ±127 (all 0 and d = 0 if amax == 0); s = sum of the block's q. Rows are zero-padded from
//   K to Kp. Bit-identical to the CPU's scalar quantize_act_q8.
//   x: f32 [M, K] (row stride K);  q: int8 [M, Kp];  d: f32 [M, Kp/32];  s: int32 [M, Kp/32]
//   Kp = round_up(K, 32). Any M >= 1; M > 8 with K % 4 == 0 and x 16-byte aligned runs four
//   values a lane (the same bits; KVDECK_CUDA_PREFILL_ROWS=0, read at every launch: the old kernel).
cudaError_t quantize_act_q8(const float* x, int M, int K, int Kp, int8_t* q, float* d, int32_t* s,
                            cudaStream_t stream, bool pdl = false);

// f32 -> f16 rows, zero-padded from K to Kp (the activations of the FP16 GEMV variant).
//   x: f32 [M, K];  h: f16 bits [M, Kp]
cudaError_t convert_act_f16(const float* x, int M, int K, int Kp, uint16_t* h, cudaStream_t stream,
                            bool pdl = false);

// =====================================================================================
// GEMV / skinny GEMM, batch M in [1, 8]: y[m, n] = sum_k x[m, k] * W[n, k]
// =====================================================================================
// Weight rows are read once for all M activation rows (memory-bound: the weight bytes are
// the cost). y: f32 [M, N], row stride ldy >= N. Kp = round_up(K, 32) (a multiple of 32).

// NVFP4, integer path (the faster NVFP4 path on the H200: 1.5-2.2x at batch 1): E2M1 codes
// mapped by byte permutes to 2*e2m1 in int8 (batch 1: two magnitude lookups, the other sign's
// codes zeroed by prmt's sign-replicate mode, and two __dp4a per word; batch >= 2: one signed
// 16-entry lookup of three permutes), __dp4a against the int8 activations, exact int32 per
// 16-block, then
//   y = tscale * sum_b d_a(b/2) * (e4m3(s_b) / 2) * isum_b          (the CPU's gemm_nvfp4)
//   codes: u8 [N, Kp/2] (element 2i low nibble); scales: u8 E4M3 [N, Kp/16]; tscale: f32
//   xq, xd: quantize_act_q8's q [M, Kp] and d [M, Kp/32]
// E4M3 scales are decoded as finite (0x7F/0xFF, NaN in E4M3, never written by the
// quantiser, decode as 480).
cudaError_t gemv_nvfp4_dp4a(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int Kp,
                            const int8_t* xq, const float* xd, int M, float* y, int ldy,
                            cudaStream_t stream, bool pdl = false);

// NVFP4, floating path (the measured alternative): codes mapped by the same byte-permute
// lookup to f16, half2 FMA against f16 activations within a 16-block (a 16-term f16 sum),
// then f32 accumulation of block sums times e4m3(s_b), times tscale.
//   xh: f16 bits [M, Kp] from convert_act_f16. Other arguments as gemv_nvfp4_dp4a.
cudaError_t gemv_nvfp4_f16(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int Kp,
                           const uint16_t* xh, int M, float* y, int ldy, cudaStream_t stream,
                           bool pdl = false);

// W4A8: offset-binary int4 codes (nibble = q + 8), __dp4a against int8 activations,
//   y = sum_b d_a(b) * f16(scale[b*32/group]) * (isum_b - 8 * s_a(b))  (the CPU's gemm_w4a8)
//   codes: u8 [N, Kp/2]; scales: f16 bits [N, Kp/group]; group: a multiple of 32 dividing Kp
//   (row-wise is group = Kp); other groups -> cudaErrorInvalidValue.
//   xq, xd, xs: quantize_act_q8's q, d, s.
cudaError_t gemv_w4a8(const uint8_t* codes, const uint16_t* scales, int group, int N, int Kp,
                      const int8_t* xq, const float* xd, const int32_t* xs, int M, float* y, int ldy,
                      cudaStream_t stream, bool pdl = false);

// Batch 1 with the activation quantisation fused in (gemv_fused.cu): x f32 [K] is quantised
// per 32-block into shared memory exactly as quantize_act_q8 does, then y[n] = the GEMV above
// (y: f32 [N]). One kernel instead of two; Kp <= kFusedMaxKp. Measured on the H200: slower
// than quantize_act_q8 + GEMV on every shape (each block re-quantises x before its rows;
// down 26.8 vs 12.9 µs) — the measured alternative there, not used by the backend (its use for
// a small model's o projection, KVDECK_CUDA_OQ8, measured slower in the engine: 590.4 vs 567.3
// µs/token on SmolLM2, session 6, and was removed).
constexpr int kFusedMaxKp = 16384;
cudaError_t gemv_nvfp4_q8fused(const uint8_t* codes, const uint8_t* scales, float tscale, int N, int K,
                               int Kp, const float* x, float* y, cudaStream_t stream, bool pdl = false);
cudaError_t gemv_w4a8_q8fused(const uint8_t* codes, const uint16_t* scales, int group, int N, int K, int Kp,
                              const float* x, float* y, cudaStream_t stream, bool pdl = false);

// Batch 1, several weights of one format reading the same activations (q/k/v, gate/up) in
// one launch: the same kernel and results as one gemv_nvfp4_dp4a (fmt 0) / gemv_w4a8 (fmt 1)
// per weight (y_i: f32 [N_i]); fewer launches, which is what a small model's decode step
// pays for. At most 4 weights; Kp (and group) shared. u4: each lane loads four 32-value chunks
// together and is not pipelined (one wave of loads, then the math) instead of two chunks with
// the next two in flight; the same sums in the same order (bit for bit). The backend takes it
// for gate/up with Kp >= 2048 (Llama-3-8B decode 1,919.7 -> 1,891.9 µs/token; NOTES.md session 8).
struct GemvWeight {
  const uint8_t* codes;
  const void* scales;
  float tscale;  // nvfp4
  int N;
  float* y;
};
cudaError_t gemv_many_m1(int fmt, const GemvWeight* w, int n, int group, int Kp, const int8_t* xq,
                         const float* xd, const int32_t* xs, cudaStream_t stream, bool pdl = false,
                         bool u4 = false);

// Prefill GEMM, M > 8, on the tensor cores (gemm_mma.cu): int8 mma.sync of the weight codes
// (fmt 0 NVFP4 as 2*e2m1, 1 W4A8 as nibble - 8, 2 W8A8) against quantize_act_q8's q, exact
// int32 per weight block, scaled in f32 as the GEMVs above (d_a, weight scales, tscale for
// NVFP4): the same results to f32 summation order. W4A8 minimums are not included (add
// w4a8_mins_add). y: f32 [M, N], row stride ldy. Needs Kp % 32 == 0, W4A8 group a multiple
// of 32 dividing Kp, codes and xq 16-byte aligned, scales 2-byte aligned; otherwise
// cudaErrorInvalidValue.
cudaError_t gemm_q8_mma(int fmt, const uint8_t* codes, const void* scales, float tscale, int group, int N, int Kp,
                        const int8_t* xq, const float* xd, int M, float* y, int ldy, cudaStream_t stream);
// Up to 4 weights of one format sharing Kp (and group) over the same activations in one launch
// (q/k/v, gate/up): weight i writes y_i [M, N_i], row stride ldy_i.
struct GemmQ8Weight {
  const uint8_t* codes;
  const void* scales;
  float tscale;
  int N;
  float* y;
  int ldy;
};
cudaError_t gemm_q8_mma_many(int fmt, const GemmQ8Weight* w, int n, int group, int Kp, const int8_t* xq,
                             const float* xd, int M, cudaStream_t stream);

namespace detail {
// gemm_q8_mma_many with a chosen tile shape (0: 128 x 128, 1: 64 x 128, 2: 128 x 64, 3: 32 x 128
// tokens x outputs, two blocks per SM; 4: 128 x 128, one block per SM; -1 picks by shape as the
// engine does) and kernel format (0 NVFP4 on the int8 mma, 1 W4A8, 2 W8A8, 3 NVFP4 on the f16
// mma, the tiles made f16 in shared memory once per block). For bench_gemm_mma's sweep only.
cudaError_t gemm_q8_mma_config(int cfg, int fmt, const GemmQ8Weight* w, int n, int group, int Kp, const int8_t* xq,
                               const float* xd, int M, cudaStream_t stream);
// Batch-1 GEMV in a chosen configuration (R, U) in {(1,1), (1,2), (1,4), (2,2)}: R rows per
// warp, U chunks per lane per step; pipelined: the next step's weights are loaded before this
// step is computed. fmt 0 = NVFP4 dp4a, 1 = W4A8, 2 = NVFP4 with the two-lookup (positive /
// negative magnitude) decode; y row stride N. For gpu_bench's sweep only.
cudaError_t gemv_m1_config(int fmt, int R, int U, bool pipelined, const uint8_t* codes, const void* scales, float tscale,
                           int group, int N, int Kp, const int8_t* xq, const float* xd, const int32_t* xs,
                           float* y, cudaStream_t stream);
}  // namespace detail

// =====================================================================================
// Paged decode attention (one query token per sequence, GQA)
// =====================================================================================
// KV of one layer as kv_pool.h stores it: K and V [n_pages, block, n_kv, row], where row is
// one head's D values: F32: f32 [D]; F16: f16 [D]; NVFP4: u8 codes [D/2] then u8 E4M3 scales [D/16]
// (tensor scale 1). Token t of the sequence lives in page pages[t / block], slot t % block.
enum class KvFormat : int32_t { F32 = 0, F16 = 1, NVFP4 = 2, NVFP4R = 3, K8V4 = 4 };  // the values of kvdeck::KvDType
// (NVFP4R / K8V4: the row layouts of kv_pool.h)

struct PagedKv {
  const void* k = nullptr;          // device: [n_pages, block, n_kv, row]
  const void* v = nullptr;
  const int32_t* pages = nullptr;   // device: [ceil(max_ctx / block)] (entries past ctx unused
                                    // but readable: they are loaded before ctx is read)
  KvFormat format = KvFormat::F16;
  int block = 16, n_kv = 8, D = 128;
};

// Tokens per split of the sequence, fixed by max_ctx at launch (CUDA-graph friendly): about
// 64 splits (n_kv * 64 blocks: ~16 warps per SM on an H200 for 8 KV heads), each a multiple
// of 64 tokens in [64, 2048]; at most kMaxAttnSplits splits (max_ctx <= 524288).
constexpr int kMaxAttnSplits = 256;
inline int attn_split_tokens(int max_ctx) {
  const int s = ((max_ctx + 63) / 64 + 63) / 64 * 64;
  return s < 64 ? 64 : s > 2048 ? 2048 : s;
}
inline int attn_splits(int max_ctx) {
  const int sp = attn_split_tokens(max_ctx);
  return (max_ctx + sp - 1) / sp;
}
// f32 workspace the decode needs: [n_heads, splits, D + 2] (partial o, m, l per split).
inline size_t attn_workspace_floats(int n_heads, int max_ctx, int D) {
  return size_t(n_heads) * attn_splits(max_ctx) * (D + 2);
}

// out[h] = softmax_t(scale * q[h] . k_t) . v_t over t in [0, ctx), for head h of KV head
// h / (n_heads / n_kv). Split over the sequence: one block per (KV head, split)
// (attn_split_tokens) computes every query head of its group with an online softmax,
// dequantising 4-bit rows in registers; a second kernel merges the splits. f16 and f32 pages
// run on f32 SIMT cores (relative error ~1e-6); NVFP4, NVFP4R and K8V4 pages on the tensor cores
// (detail::attention_decode_mma: q and p rounded to f16, ~5e-4 relative), the faster of the
// two measured on the H200 for NVFP4.
//   q: f32 [n_heads, D] (roped);  out: f32 [n_heads, D];  ctx >= 1 (a device int so that a
//   CUDA graph can replay it: ctx_dev[0]); max_ctx bounds ctx and sizes the grid and
//   workspace (attn_workspace_floats(n_heads, max_ctx, D) floats).
//   Supported: D in {64, 128}, block a multiple of 16, n_heads / n_kv in [1, 8], max_ctx <= 524288
//   (Llama-3-8B 32/8, SmolLM2-135M 9/3).
//   fresh_k / fresh_v (optional, f32 [n_kv, D]: the step's own K / V rows, unrounded,
//   Backend::attention_fresh): ctx_dev then counts the pooled tokens read from the pages
//   (ctx - 1, i.e. pos[0]; it may be 0) and the fresh token is the ctx-th, merged by the
//   combine kernel with its score in f32. rope_pos / rope_inv (optional): fresh_k is not yet
//   rotated (rope_kv_write leaves k as it was): rotate-half at rope_pos[0] with inv_freq rope_inv.
//   q8 (optional, all three pointers or none): out quantised as quantize_act_q8(out, 1,
//   n_heads * D, n_heads * D, q8.q, q8.d, q8.s) would (bit-identical), by the combine kernel
//   that finishes each 32-block: the o projection's input without a kernel of its own.
//   NVFP4 pages with n_heads / n_kv <= 4 and max_ctx <= 256 (<= 4 splits): the splits and the
//   combine run as one kernel, one block per KV head (attention_impl.cuh; the same results bit
//   for bit; KVDECK_CUDA_ATTN_FUSED=0, read at every launch: the two kernels).
struct ActQ8Out {
  int8_t* q = nullptr;
  float* d = nullptr;
  int32_t* s = nullptr;
};
cudaError_t attention_decode(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                             int max_ctx, float scale, float* workspace, float* out,
                             cudaStream_t stream, const float* fresh_k = nullptr, const float* fresh_v = nullptr,
                             const int32_t* rope_pos = nullptr, const float* rope_inv = nullptr,
                             const ActQ8Out& q8 = {});

namespace detail {
// attention_decode's f32 SIMT kernel (f16 / f32 pages; what attention_decode runs for them).
cudaError_t attention_decode_simt(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                  int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream);
// attention_decode on the tensor cores (mma.sync m16n8k16, sm_80+) for NVFP4 / NVFP4R / K8V4
// pages (what attention_decode runs for them; others: invalid): S = Q K^T with Q rounded to f16
// (K is exact in f16), O^T += V^T P^T with P rounded to f16, f32 accumulation. Same arguments,
// workspace and results (to ~5e-4 relative).
cudaError_t attention_decode_mma(const PagedKv& kv, const float* q, int n_heads, const int32_t* ctx_dev,
                                 int max_ctx, float scale, float* workspace, float* out, cudaStream_t stream,
                                 const float* fresh_k = nullptr, const float* fresh_v = nullptr,
                                 const int32_t* rope_pos = nullptr, const float* rope_inv = nullptr,
                                 const ActQ8Out& q8 = {});
}  // namespace detail

// =====================================================================================
// Row-wise elementwise ops (f32)
// =====================================================================================
// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]     x, y: [rows, n]; w: [n]
cudaError_t rmsnorm(const float* x, const float* w, int rows, int n, float eps, float* y,
                    cudaStream_t stream);
// Rotate-half RoPE in place (the CPU backend's rope): row r of x (row stride ld floats)
// holds n_heads heads of D values at position pos[r] (device ints); for i < D/2, with
// a = float(pos[r]) * inv_freq[i] in f32 (as HF) and c, s = cos a, sin a:
//   (x_i, x_{i+D/2}) <- (x_i c - x_{i+D/2} s, x_{i+D/2} c + x_i s)        inv_freq: f32 [D/2]
cudaError_t rope(float* x, int rows, int n_heads, int D, int ld, const int32_t* pos,
                 const float* inv_freq, cudaStream_t stream);
// y[r, i] = silu(a[r, i]) * b[r, i] for i < n; a, b row stride ld_ab (a fused gate|up matmul:
// b = a + n, ld_ab = 2n); y: [rows, n] packed.
cudaError_t silu_mul(const float* a, const float* b, int rows, int n, int ld_ab, float* y,
                     cudaStream_t stream);

// =====================================================================================
// The CUDA backend's remaining ops (gemv_dense.cu, backend_ops.cu)
// =====================================================================================
// Dense GEMV, batch M in [1, 8]: y[m, n] = sum_k x[m, k] * W[n, k], W f32 or f16 [N, K],
// x f32 [M, K] (row stride K), y row stride ldy. f32 accumulation.
cudaError_t gemv_float(bool f16_weights, const void* w, int N, int K, const float* x, int M, float* y, int ldy,
                       cudaStream_t stream);
// W8A8 (formats.h: codes i8 [N, Kp], scales f16 [N, Kp/32]) against quantize_act_q8's q, d:
//   y = sum_b d_a(b) * f16(scale_b) * isum_b (exact int32 per 32-block; the CPU's gemm_w8a8).
cudaError_t gemv_w8a8(const int8_t* codes, const uint16_t* scales, int N, int Kp, const int8_t* xq,
                      const float* xd, int M, float* y, int ldy, cudaStream_t stream);
// W4A8 minimums (GGUF Q4_1, group 32), added after gemv_w4a8 (the CPU's w4a8_mins):
//   y[m, n] += sum_b d_a(m, b) * s_a(m, b) * (min(n, b) + 8 * scale(n, b))    any M >= 1
cudaError_t w4a8_mins_add(const uint16_t* mins, const uint16_t* scales, int N, int Kp, const float* xd,
                          const int32_t* xs, int M, float* y, int ldy, cudaStream_t stream);

// x[m, :] = table[ids[m], :] (f32 or f16 table [V, H]; ids are not range-checked here).
cudaError_t embed_rows(const void* table, bool f16, const int32_t* ids, int M, int H, float* x, cudaStream_t stream);
// 8-bit rows (W8A8): codes i8 [V, Kp], scales f16 [V, Kp/32]; x f32 [M, H].
cudaError_t embed_rows_w8a8(const void* codes, const void* scales, const int32_t* ids, int M, int H, int Kp,
                            float* x, cudaStream_t stream);
// x[i] += y[i], i < n.
cudaError_t add_inplace(float* x, const float* y, size_t n, cudaStream_t stream);
// x[m * ld + j] += b[j].
cudaError_t add_bias(float* x, const float* b, int M, int n, int ld, cudaStream_t stream);
// ctx[0] = pos[0] + 1 (a decode step's context length, from the device positions array).
cudaError_t ctx_from_pos(const int32_t* pos, int32_t* ctx, cudaStream_t stream);
// Write k, v rows (f32 [M, n_kv*D], row stride ld) into pool slots (kv_pool.h layout), format
// 0 f32, 1 f16 (RNE), 2 NVFP4 (the CPU's kv_nvfp4_encode_row, byte for byte). D % 16 == 0.
cudaError_t kv_write(int format, void* k_pages, void* v_pages, int n_kv, int D, const float* k, const float* v,
                     int ld, const int32_t* slots, int M, cudaStream_t stream);
// nvfp4r (format 3) / k8v4 (format 4) rows (kv_pool.h), byte for byte the CPU's
// kv_nvfp4r_encode_row / kv_int8_encode_row (attention_paged.cu). D % 16 == 0.
cudaError_t kv_write_q(int format, void* k_pages, void* v_pages, int n_kv, int D, const float* k, const float* v,
                       int ld, const int32_t* slots, int M, cudaStream_t stream);
// Causal attention of M queries over paged KV of any pool format (0 f32, 1 f16, 2 NVFP4,
// 3 NVFP4R, 4 K8V4; attention_paged.cu): query m (q row stride ldq) attends to tokens
// [0, pos[m]] (pos: device i32 [M]); out f32 [M, n_heads*D] packed. One warp per (query,
// head), f32 online softmax, rows decoded as the CPU's kv_decode_row. D % 32 == 0, D <= 256.
// The prefill path, the f32 / NVFP4R / K8V4 decode path (attention_decode covers f16 / NVFP4
// decode). fresh_k / fresh_v (optional, f32 [M, n_kv*D], row stride fresh_ld): tokens
// t >= pos[0] (the chunk's own) are read from row t - pos[0] of these instead of the pages
// (Backend::attention_fresh).
// ws (optional, for small M: decode over f32 KV): split the sequence into
// paged_attn_splits(max_ctx) pieces of paged_attn_split_len(max_ctx) tokens (max_ctx >= every
// pos[m] + 1), one warp each, merged by a second kernel; ws holds
// paged_attn_ws_floats(M, n_heads, max_ctx, D) floats.
inline int paged_attn_splits(int max_ctx) { return max_ctx <= 64 ? 1 : max_ctx / 64 < 64 ? (max_ctx + 63) / 64 : 64; }
inline int paged_attn_split_len(int max_ctx) {
  const int s = paged_attn_splits(max_ctx);
  return ((max_ctx + s - 1) / s + 31) / 32 * 32;
}
inline size_t paged_attn_ws_floats(int M, int n_heads, int max_ctx, int D) {
  return size_t(M) * n_heads * paged_attn_splits(max_ctx) * (D + 2);
}
cudaError_t attention_paged(int format, const void* k_pages, const void* v_pages, const int32_t* pages, int block,
                            int n_kv, int D, const float* q, int ldq, int M, int n_heads, const int32_t* pos,
                            float scale, float* out, cudaStream_t stream, int max_ctx = 0, float* ws = nullptr,
                            const float* fresh_k = nullptr, const float* fresh_v = nullptr, int fresh_ld = 0);
// Causal prefill attention of M queries over paged KV on the tensor cores
// (attention_prefill.cu): the arguments of attention_paged (q row stride ldq, pos: device i32
// [M], out f32 [M, n_heads*D] packed, fresh_k / fresh_v as there), kv.format F32 / F16 /
// NVFP4 / NVFP4R / K8V4, kv.pages covering every pos[m]. Any G = n_heads / n_kv. q and p are
// rounded to f16 (q_split: q as f16 hi + lo, f32-level scores); K / V values reach the MMAs as
// f16: exact for F16 and NVFP4, rounded once for F32 rows, the row-scaled formats and fresh
// rows (finite range: |x| <= 65504); accumulation in f32.
// Returns cudaErrorNotSupported (nothing launched) for what it does not take: D not 64 / 128,
// other formats, unaligned q / pages / fresh rows; attention_paged covers those.
cudaError_t attention_prefill(const PagedKv& kv, const float* q, int ldq, int M, int n_heads, const int32_t* pos,
                              float scale, float* out, cudaStream_t stream, const float* fresh_k = nullptr,
                              const float* fresh_v = nullptr, int fresh_ld = 0, bool q_split = true);
// out[0] = the first index of max(x[0..n)) (numpy.argmax), one block.
cudaError_t argmax(const float* x, int n, int32_t* out, cudaStream_t stream);

// ---- the next token on the device (sampling.cu; Backend::sample) ----
struct SampleArgs {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // (0, 1]
  double u = 0.0;            // the CPU Sampler's draw, [0, 1)
};
// Device workspace sample_token needs for V logits (bytes).
size_t sample_workspace_bytes(int V);
// out[0] = sample_with_uniform's id (sampler.h) over logits [V] with the tokens whose bit is
// clear in mask (u32 [ceil(V / 32)], null: none) as -inf; greedy: the first index of the
// allowed maximum, no workspace. The same id as the CPU except where the draw or the top_p
// cut lands within ~1e-13 relative of a boundary (double sums in another order; see the file).
cudaError_t sample_token(const float* logits, int V, const uint32_t* mask, const SampleArgs& args, void* ws,
                         size_t ws_bytes, int32_t* out, cudaStream_t stream);

// ---- fused decode-step kernels (fused.cu; launched with PDL on sm_90+) ----
// x[r] += y[r] (y may be null), h[r] = x[r] / rms(x[r]) * w (h may equal x), and, when q is
// given, h's q8 exactly as quantize_act_q8 (q [M, Kp], d, s [M, Kp/32]). One block per row.
cudaError_t add_rmsnorm_q8(float* x, const float* y, const float* w, int M, int n, float eps, float* h, int Kp,
                           int8_t* q, float* d, int32_t* s, cudaStream_t stream);
// y = silu(a) * b (a, b, y [M, n] packed) and y's q8 (q [M, Kp], d, s [M, Kp/32]).
cudaError_t silu_mul_q8(const float* a, const float* b, int M, int n, int Kp, float* y, int8_t* q, float* d,
                        int32_t* s, cudaStream_t stream);
// RoPE (rotate-half at pos[m]) of q in place (q may be null) and of k, and kv_write of the
// roped k and of v into the pool slots (format as kv_write); k itself is left unrotated.
// ctx (may be null): ctx[0] = pos[0] + 1, for attention_decode. M > 8 (prefill): one sine and
// cosine per (row, angle) for all heads (the same bytes; KVDECK_CUDA_PREFILL_ROWS=0, read at every
// launch: one per item as for decode).
cudaError_t rope_kv_write(float* q, int ldq, int n_heads, const float* k, const float* v, int ldk, int n_kv, int D,
                          int M, const int32_t* pos, const float* inv_freq, int format, void* k_pages,
                          void* v_pages, const int32_t* slots, int32_t* ctx, cudaStream_t stream);

}  // namespace kvdeck::cuda
