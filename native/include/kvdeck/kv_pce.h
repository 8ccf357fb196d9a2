// kvdeck/kv_pce.h — the KPC4 KV format's K codec (kv_pool.h): int4 per (page, channel).
//
// One page's K of one KV head, 16 tokens x D channels, in 10 D bytes:
//   codes u8 [16][D/2]  token t's channel 2i in the low nibble of byte t * D/2 + i, 2i+1 high;
//   lo    u8 [D]        E4M3, per channel: the largest E4M3 value <= the channel's minimum;
//   step  u8 [D]        E4M3, per channel: the smallest E4M3 value >= (max - lo) / 15;
//   code = clamp(rint((x - lo) / step), 0, 15) (float64, ties to even; step 0: code 0),
//   x'   = fma(code, step, lo) in f32 (exact in float64 too: both terms have 4-bit significands).
// The directed roundings keep every value of the channel inside [lo, lo + 15 step]. E4M3 NaN
// codes are never written; a minimum below -448 saturates to -448, a step above 448 to 448.
// The encoder runs once per page (when its 16th token is written); the decoder in attention
// (scalar reference + AVX2, bit for bit equal: tests/native/test_kv_pce.py).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvdeck::cpu {

constexpr int kPceTokens = 16;
inline size_t kpc4_head_bytes(int D) { return size_t(D) * 10; }

// E4M3 code -> f32 (float8_e4m3fn, e4m3_to_f32), a table built once: the decoders' lookups.
const float* kpc4_e4m3_table();
// The largest E4M3 value <= v, the smallest >= v (codes; v finite, saturating at ±448).
uint8_t e4m3_at_or_below(double v);
uint8_t e4m3_at_or_above(double v);

// 16 rows x (row t at x + t * ld, D values) -> dst [kpc4_head_bytes(D)].
void kpc4_encode_page(const float* x, size_t ld, int D, uint8_t* dst);
// The first n rows of a page (n <= 16) -> row t at dst + t * ld.
void kpc4_decode_page_ref(const uint8_t* src, int D, int n, float* dst, size_t ld);
#if defined(__x86_64__)
void kpc4_decode_page_avx2(const uint8_t* src, int D, int n, float* dst, size_t ld);  // D % 8 == 0
#endif
using Kpc4DecodeFn = void (*)(const uint8_t*, int, int, float*, size_t);
// The decoder of the active kernel ISA (kernels.h: scalar when KVDECK_ISA / set_kernel_isa
// picked it, AVX2 where the CPU has it).
Kpc4DecodeFn kpc4_decoder(int D);

}  // namespace kvdeck::cpu

namespace kvdeck::cpu {
// n NVFP4 rows (row t at src + t * stride bytes) -> row t at dst + t * ld, bit for bit
// kv_nvfp4_decode_row (the AVX2 version decodes with the attention kernels' nvfp4_row).
void nvfp4_rows_ref(const uint8_t* src, size_t stride, int n, int D, float* dst, size_t ld);
#if defined(__x86_64__)
void nvfp4_rows_avx2(const uint8_t* src, size_t stride, int n, int D, float* dst, size_t ld);
#endif
using Nvfp4RowsFn = void (*)(const uint8_t*, size_t, int, int, float*, size_t);
Nvfp4RowsFn nvfp4_rows_decoder(int D);
}  // namespace kvdeck::cpu
