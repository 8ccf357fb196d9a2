// gemm_repack.h — private to native/kernels/cpu: the geometry of the Nvfp4X4 weight layout
// (kernels.h, WeightLayout), shared by the repack (gemm_repack.cpp) and every reader of it
// (the scalar reference there, gemm_repack_avx2.cpp, gemm_repack_avx512.cpp).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

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

}  // namespace kvdeck::cpu
