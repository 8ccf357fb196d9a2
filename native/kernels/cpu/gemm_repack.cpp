// gemm_repack.cpp — the NVFP4 repack to the Nvfp4X4 layout (kernels.h), the layout choice per
// kernel set, and the scalar reader of the repacked layout (the reference the SIMD readers
// are checked against, and what a kernel set without a repacked kernel falls back to). The
// activation packing the AVX2 reader eats (X4Acts) is in gemm_repack_avx2.cpp, its only user.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_repack.h"
#include "kernels/cpu/kernels_impl.h"

namespace kvdeck {

void repack_nvfp4_x4(const uint8_t* codes, const uint8_t* scales, int N, int Kp, uint8_t* codes_out,
                     uint8_t* scales_out) {
  if (N <= 0 || Kp <= 0 || Kp % kQuantPad != 0)
    throw std::invalid_argument("repack_nvfp4_x4: need N > 0 and Kp a positive multiple of 32, got N " +
                                std::to_string(N) + ", Kp " + std::to_string(Kp));
  const cpu::X4Geom geo(Kp);
  const size_t row_codes = size_t(Kp) / 2, row_scales = size_t(Kp) / kNvfp4Block;
  std::vector<uint8_t> c(cpu::kX4Rows * row_codes), s(cpu::kX4Rows * row_scales);  // one group, file layout
  for (int g0 = 0; g0 < N; g0 += cpu::kX4Rows) {
    const int R = cpu::x4_group_rows(N, g0);
    std::memcpy(c.data(), codes + size_t(g0) * row_codes, R * row_codes);
    std::memcpy(s.data(), scales + size_t(g0) * row_scales, R * row_scales);
    // A negative scale: its magnitude, and the block's codes negated (E2M1 sign = bit 3).
    for (int r = 0; r < R; ++r)
      for (size_t j = 0; j < row_scales; ++j) {
        uint8_t& sc = s[r * row_scales + j];
        if (!(sc & 0x80)) continue;
        sc &= 0x7F;
        for (int i = 0; i < 8; ++i) c[r * row_codes + 8 * j + i] ^= 0x88;
      }
    WeightView v;  // the group's geometry inside the output buffers
    v.N = N, v.Kp = Kp, v.data = codes_out, v.scales = scales_out;
    for (int r = 0; r < R; ++r) {
      const cpu::X4Row row = cpu::x4_row(v, g0 + r);
      const uint8_t* cr = c.data() + r * row_codes;   // [Kp/2] file codes of the row
      const uint8_t* sr = s.data() + r * row_scales;  // [Kp/16]
      for (int ch = 0; ch < geo.chunks(); ++ch) {
        const bool tail = ch == geo.C;
        const int nj = tail ? 2 * geo.t : 8;       // 16-blocks in the chunk
        const size_t part = tail ? 8 * geo.t : 32;  // bytes per part
        uint8_t* dc = const_cast<uint8_t*>(tail ? row.tcodes : row.codes + ch * row.cstride);
        uint8_t* ds = const_cast<uint8_t*>(tail ? row.tscales : row.scales + ch * row.sstride);
        for (int j = 0; j < nj; ++j) {
          const uint8_t* src = cr + size_t(ch) * 64 + 8 * j;  // the 16-block's 8 file bytes
          std::memcpy(dc + 4 * j, src, 4);
          std::memcpy(dc + part + 4 * j, src + 4, 4);
          ds[j] = sr[size_t(ch) * 8 + j];
        }
      }
    }
  }
}

namespace cpu {

void gemm_nvfp4_x4_scalar(const WeightView& w, const ActQ8& xq, int M, float* y, int ldy, int n0, int n1) {
  const int Kp = w.Kp, nb = Kp / kQ8Block;
  const X4Geom geo(Kp);
  const float* e4m3 = e4m3_table();
  for (int n = n0; n < n1; ++n) {
    const X4Row row = x4_row(w, n);
    for (int m = 0; m < M; ++m) {
      const int8_t* qa = xq.q + size_t(m) * Kp;  // [Kp]
      float acc = 0.0f;
      for (int ch = 0; ch < geo.chunks(); ++ch) {
        const bool tail = ch == geo.C;
        const int nj = tail ? 2 * geo.t : 8;
        const size_t part = tail ? 8 * geo.t : 32;
        const uint8_t* cc = tail ? row.tcodes : row.codes + ch * row.cstride;
        const uint8_t* sc = tail ? row.tscales : row.scales + ch * row.sstride;
        for (int j = 0; j < nj; ++j) {  // gemm_nvfp4's block dot, in its order
          const int jb = 8 * ch + j;     // 16-block of the row
          int32_t isum = 0;
          for (int i = 0; i < kNvfp4Block / 2; ++i) {
            const uint8_t c = cc[(i / 4) * part + 4 * j + i % 4];
            isum += kE2m1x2[c & 0xF] * qa[jb * 16 + 2 * i] + kE2m1x2[c >> 4] * qa[jb * 16 + 2 * i + 1];
          }
          const float sw = e4m3[sc[j]] * 0.5f;
          acc += xq.d[size_t(m) * nb + jb / 2] * sw * float(isum);
        }
      }
      y[size_t(m) * ldy + n] = acc * w.tscale;
    }
  }
}

}  // namespace cpu
}  // namespace kvdeck
