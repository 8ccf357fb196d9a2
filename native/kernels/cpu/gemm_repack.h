// gemm_repack.h — private to native/kernels/cpu: the geometry of the Nvfp4X4 weight layout
// (kernels.h, WeightLayout), shared by the repack (gemm_repack.cpp) and every reader of it
// (the scalar reference there, gemm_repack_avx2.cpp, gemm_repack_avx512.cpp).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvdeck/kernels.h"

namespace kvdeck::cpu {

constexpr int kX4Rows = 4;         // weight rows per group
constexpr int kX4Chunk = 128;      // values of K per chunk (eight 16-blocks)
constexpr int kX4ChunkBytes = 64;  // code bytes of one row's full chunk: [part 0 | part 1]

// Where one weight row's bytes are. Full chunk c (c < C): codes at codes + c*cstride
// (part 0: 32 bytes, part 1: the next 32), scales at scales + c*sstride (8 bytes). The tail
// chunk (t > 0 32-blocks, 2t 16-blocks): codes at tcodes (part 0: 8t bytes, then part 1),
// scales at tscales (2t bytes). Part h, bytes 4j..4j+3 = file code bytes 8j+4h..8j+4h+3 of
// the chunk (16-block j: low nibble = element 2i, high = 2i+1, as in the file layout).
struct X4Row {
  const uint8_t* codes;
  const uint8_t* scales;
  size_t cstride, sstride;
  const uint8_t* tcodes;
  const uint8_t* tscales;
};

struct X4Geom {
  int C;  // full chunks: Kp / 128
  int t;  // 32-blocks in the tail chunk: (Kp % 128) / 32, 0..3
  explicit X4Geom(int Kp) : C(Kp / kX4Chunk), t((Kp % kX4Chunk) / 32) {}
  int chunks() const { return C + (t > 0); }
};

// Rows in the group of row n (4, or N % 4 for a last partial group).
inline int x4_group_rows(int N, int n) { return std::min(kX4Rows, N - n / kX4Rows * kX4Rows); }

inline X4Row x4_row(const WeightView& w, int n) {
  const X4Geom g(w.Kp);
  const int g0 = n / kX4Rows * kX4Rows, r = n - g0, R = x4_group_rows(w.N, n);
  const uint8_t* gc = static_cast<const uint8_t*>(w.data) + size_t(g0) * (w.Kp / 2);
  const uint8_t* gs = static_cast<const uint8_t*>(w.scales) + size_t(g0) * (w.Kp / kNvfp4Block);
  X4Row row;
  row.cstride = size_t(R) * kX4ChunkBytes;
  row.sstride = size_t(R) * 8;
  row.codes = gc + size_t(r) * kX4ChunkBytes;
  row.scales = gs + size_t(r) * 8;
  row.tcodes = gc + size_t(g.C) * row.cstride + size_t(r) * 16 * g.t;
  row.tscales = gs + size_t(g.C) * row.sstride + size_t(r) * 2 * g.t;
  return row;
}

// ---- activations packed for the AVX2 reader (gemm_repack_avx2.cpp) ----------------------
// One activation row's chunk, laid out to meet the two code parts.
//   Full chunk: lane j of part h is 16-block j (a 64-byte [part 0 | part 1] load of e or o
//   meets a 64-byte load of codes; a 32-byte load meets one part).
//   Tail chunk (t 32-blocks): its 4t code dwords are loaded as they are stored, [part 0 of
//   16-blocks 0..2t-1 | part 1 of them], 8 lanes per vector (t = 3: a second vector, packed in
//   the next X4Acts, e[0] / o[0] only); lane L is part L / 2t of 16-block L % 2t. The block's
//   correction goes on its part-0 lane only; scale and d_a on both.
//   The u8 weights are u = 2*e2m1 + 12 and the scales E4M3 * 2^-8 (f16 bit placement), so
//   corr = -12 * the 16-block's activation sum and d = d_a * 128 (= 2^8 / 2).
struct alignas(64) X4Acts {
  int8_t e[2][32];   // part h, bytes 4j+i: q[16j + 8h + 2i]      (j: 16-block of the chunk)
  int8_t o[2][32];   //                     q[16j + 8h + 2i + 1]
  int32_t corr[8];   // lane j: -12 * sum of the 16-block's q
  float d[8];        // lane j: d_a of the 32-block holding 16-block j, * 128
};

// Packed chunks per activation row: the full ones, then 0, 1 or 2 for the tail.
inline int x4_packed_chunks(const X4Geom& g) { return g.C + (g.t > 0) + (g.t == 3); }
// Rows [m0, m0 + mb) of xq -> out [mb, x4_packed_chunks] (gemm_repack_avx2.cpp: SSSE3 code,
// called from the AVX2 reader only).
void pack_acts_x4(const ActQ8& xq, const X4Geom& geo, int m0, int mb, X4Acts* out);

// Scale byte per lane of the tail vectors (-1: zero), per t = 1..3 and vector 0 / 1.
alignas(16) inline const int8_t kX4TailSpread[3][2][16] = {
    {{0, 1, 0, 1, -1, -1, -1, -1}, {-1, -1, -1, -1, -1, -1, -1, -1}},
    {{0, 1, 2, 3, 0, 1, 2, 3}, {-1, -1, -1, -1, -1, -1, -1, -1}},
    {{0, 1, 2, 3, 4, 5, 0, 1}, {2, 3, 4, 5, -1, -1, -1, -1}}};

// The 2t scale bytes of a tail chunk, zero-extended (fixed-size loads: a variable-length
// memcpy is a library call, which costs more than the whole tail).
inline uint64_t x4_tail_scale_bytes(const uint8_t* p, int t) {
  uint32_t a = 0;
  uint16_t b = 0;
  if (t == 1) {
    std::memcpy(&b, p, 2);
    return b;
  }
  std::memcpy(&a, p, 4);
  if (t == 2) return a;
  std::memcpy(&b, p + 4, 2);
  return a | uint64_t(b) << 32;
}

}  // namespace kvdeck::cpu
