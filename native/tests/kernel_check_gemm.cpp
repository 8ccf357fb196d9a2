// kernel_check_gemm.cpp — every GEMM format against a float64 reference (part of kernel_check):
// exact inputs (power-of-two scales, small integers: bit for bit) and random ones (relative
// error 1e-5 of sum |x*w|), the GGUF Q4_1 mins, and NVFP4 repacked to WeightLayout::Nvfp4X4.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernel_check.h"
#include "kvdeck/formats.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

using namespace kvdeck;

namespace kc {
namespace {

// ============================================================================
// GEMM: every format, exact (power-of-two scales) and random (float64 bound)
// ============================================================================
struct Case {
  WeightView w;
  std::vector<float> wf;        // the dequantised weight [N, K] (float64 reference input)
  std::vector<float> f32;       // storage
  std::vector<uint16_t> f16;    // storage (weights or w4a8 scales)
  std::vector<uint16_t> mins;   // w4a8 group 32 with mins (GGUF Q4_1): f16 [N, Kp/32]
  std::vector<uint8_t> codes, scales;
};

// exact: small integer values and power-of-two scales, so every product and sum is exact.
Case make_case(DType t, int N, int K, int group, bool exact, bool with_mins = false) {
  Case c;
  c.w.dtype = t;
  c.w.N = N;
  c.w.K = K;
  c.wf.assign(size_t(N) * K, 0.0f);
  if (t == DType::F32 || t == DType::F16) {
    c.w.Kp = K;
    for (auto& v : c.wf) v = exact ? float(rand_int(-8, 8)) : float(ref_f16(f32_to_f16(rand_normal())));
    if (t == DType::F32) {
      c.f32 = c.wf;
      c.w.data = c.f32.data();
    } else {
      for (float v : c.wf) c.f16.push_back(f32_to_f16(v));
      c.w.data = c.f16.data();
    }
    return c;
  }
  const int Kp = round_up(K, kQuantPad);
  c.w.Kp = Kp;
  if (t == DType::W8A8) {  // int8 codes [N, Kp] (-128 included), one f16 scale per 32-block
    c.w.group = kQ8Block;
    c.codes.assign(size_t(N) * Kp, 0);
    c.w.data = c.codes.data();
    for (int i = 0; i < N * Kp / kQ8Block; ++i)
      c.f16.push_back(f32_to_f16(exact ? std::ldexp(1.0f, rand_int(-1, 1)) : 0.01f + 0.05f * std::fabs(rand_normal())));
    c.w.scales = c.f16.data();
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {  // padding k in [K, Kp) keeps code 0
        const int code = rand_int(-128, 127);
        c.codes[size_t(n) * Kp + k] = uint8_t(int8_t(code));
        c.wf[size_t(n) * K + k] = float(code * ref_f16(c.f16[size_t(n) * (Kp / kQ8Block) + k / kQ8Block]));
      }
    return c;
  }
  c.codes.assign(size_t(N) * Kp / 2, 0);
  c.w.data = c.codes.data();
  const int gs = t == DType::NVFP4 ? kNvfp4Block : group;
  c.w.group = gs;
  std::vector<double> scale(size_t(N) * (Kp / gs));
  for (auto& s : scale) s = exact ? std::ldexp(1.0, rand_int(-1, 1)) : 0.01 + 0.05 * std::fabs(rand_normal());
  if (t == DType::NVFP4)  // negative E4M3 scales are valid in the file format (the repack folds them)
    for (auto& s : scale) s = rand_int(0, 9) == 0 ? -s : s;
  if (t == DType::NVFP4) {
    c.w.tscale = exact ? 0.5f : 1.7f;
    for (double s : scale) c.scales.push_back(f32_to_e4m3(float(s)));
    c.w.scales = c.scales.data();
  } else {
    for (double s : scale) c.f16.push_back(f32_to_f16(float(s)));
    c.w.scales = c.f16.data();
    if (with_mins) {  // w = scale * code + min (formats.h)
      for (int i = 0; i < N * Kp / 32; ++i)
        c.mins.push_back(f32_to_f16(exact ? float(rand_int(-4, 4)) * 0.25f : 0.05f * rand_normal()));
      c.w.mins = c.mins.data();
    }
  }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {  // padding k in [K, Kp) keeps code 0 (value 0)
      const int code = rand_int(0, 15);
      c.codes[(size_t(n) * Kp + k) / 2] |= uint8_t(code << (4 * (k & 1)));
      const size_t si = size_t(n) * (Kp / gs) + k / gs;
      c.wf[size_t(n) * K + k] = t == DType::NVFP4
                                    ? float(ref_e2m1(uint8_t(code)) * ref_e4m3(c.scales[si]) * c.w.tscale)
                                    : float((code - 8) * ref_f16(c.f16[si]) +
                                            (with_mins ? ref_f16(c.mins[size_t(n) * (Kp / 32) + k / 32]) + 8 * ref_f16(c.f16[si]) : 0.0));
    }
  return c;
}

// x4: NVFP4 repacked to WeightLayout::Nvfp4X4 (as the CPU backend does at load) first.
// Rows [n0, N) are computed; columns [0, n0) must stay untouched.
void check_gemm(const char* isa, DType t, int group, bool exact, bool x4 = false, int M = 3, int N = 7,
                int K = 80, int n0 = 1, bool with_mins = false) {
  const int Kp = round_up(K, kQ8Block);
  Case c = make_case(t, N, K, group, exact, with_mins);
  if (x4) {
    repack_nvfp4_x4(c.codes.data(), c.scales.data(), N, Kp, c.codes.data(), c.scales.data());  // in place
    c.w.layout = WeightLayout::Nvfp4X4;
  }
  std::vector<float> x(size_t(M) * K);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) {
      // exact: integers with each 32-block's amax = 127 * 2^e, so d = 2^e and q = x / d exactly
      const int b = k / 32, e = (m + b) % 3 - 1;
      const float v = exact ? float(k % 32 == 0 ? 127 : rand_int(-127, 127)) : rand_normal();
      x[size_t(m) * K + k] = exact && is_integer(t) ? std::ldexp(v, e) : (exact ? float(rand_int(-8, 8)) : v);
    }
  std::vector<int8_t> q(size_t(M) * Kp);
  std::vector<float> d(size_t(M) * Kp / 32);
  std::vector<int32_t> s(size_t(M) * Kp / 32);
  ActQ8 a{M, Kp, q.data(), d.data(), s.data()};
  quantize_act_q8(x.data(), M, K, a);
  const int ldy = N + 2;
  std::vector<float> y(size_t(M) * ldy, -1.0f);
  gemm(c.w, x.data(), &a, M, y.data(), ldy, n0, N);
  int bad = 0;
  double worst = 0.0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < K; ++k) {
        // integer formats multiply the quantised activations; the dense ones x itself
        const double xv = is_integer(t) ? double(q[size_t(m) * Kp + k]) * d[size_t(m) * Kp / 32 + k / 32]
                                        : double(x[size_t(m) * K + k]);
        ref += xv * c.wf[size_t(n) * K + k];
        mag += std::fabs(xv * c.wf[size_t(n) * K + k]);
      }
      const float got = y[size_t(m) * ldy + n];
      if (n < n0) {
        bad += got != -1.0f;
      } else if (exact) {
        bad += double(got) != ref;
      } else {
        const double err = std::fabs(got - ref) / (mag + 1e-30);
        worst = std::max(worst, err);
        bad += err > 1e-5;
      }
    }
  const std::string name = std::string(isa) + " gemm " + dtype_name(t) + (x4 ? " x4" : "") +
                           (t == DType::W4A8 ? " group " + std::to_string(group) : "") + (with_mins ? " mins" : "") +
                           " M " + std::to_string(M) +
                           " N " + std::to_string(N) + " K " + std::to_string(K);
  check(bad == 0, name + (exact ? " exact: " : " random: ") + std::to_string(bad) + " outputs differ" +
                      (exact ? "" : " (worst relative error " + std::to_string(worst) + ", bound 1e-5)"));
}

}  // namespace

void check_gemm_formats(const char* isa) {
  for (bool exact : {true, false}) {
    check_gemm(isa, DType::F32, 0, exact);
    check_gemm(isa, DType::F16, 0, exact);
    check_gemm(isa, DType::NVFP4, 0, exact);
    for (int group : {16, 32, 96}) check_gemm(isa, DType::W4A8, group, exact);
    // GGUF Q4_1 blocks (mins; AVX2 fuses their term into the tile): GEMV, GEMM, odd block counts
    for (int M : {1, 3, 9}) check_gemm(isa, DType::W4A8, 32, exact, false, M, 7, M == 1 ? 576 : 80, 1, true);
    // W4A8 in steps of eight 32-blocks (the AVX-512 kernel): whole steps, a partial last step
    // of 1..7 blocks, GEMV on 4-row strips and their remainder, GEMM tiles of 8, 4 and 1 rows;
    // group 96 (scales expanded per 32-block) and the GGUF mins (fused).
    struct WShape { int M, N, K, n0; };
    for (const WShape& sh : {WShape{1, 13, 576, 2}, WShape{1, 8, 256, 0}, WShape{1, 7, 224, 0}, WShape{21, 5, 480, 1},
                             WShape{13, 6, 1536, 0}, WShape{9, 9, 288, 1}}) {
      check_gemm(isa, DType::W4A8, 32, exact, false, sh.M, sh.N, sh.K, sh.n0);
      check_gemm(isa, DType::W4A8, 32, exact, false, sh.M, sh.N, sh.K, sh.n0, true);
      if (sh.K % 96 == 0) check_gemm(isa, DType::W4A8, 96, exact, false, sh.M, sh.N, sh.K, sh.n0);
    }
    // W8A8 (GGUF Q8_0): steps of two blocks, a last single block (odd nb), groups of eight
    // blocks and their partial last one, 4-row strips and the remainder, several activation rows.
    for (const WShape& sh : {WShape{1, 13, 576, 2}, WShape{3, 7, 80, 1}, WShape{5, 9, 160, 0}, WShape{1, 8, 256, 0},
                             WShape{2, 6, 1536, 1}, WShape{1, 5, 288, 0}})
      check_gemm(isa, DType::W8A8, 32, exact, false, sh.M, sh.N, sh.K, sh.n0);
    // The repacked NVFP4 layout: tails of 0..3 32-blocks, partial last groups, GEMV (M = 1)
    // on whole groups and on rows of a split group, GEMM tiles and their remainders.
    struct Shape { int M, N, K, n0; };
    for (const Shape& sh : {Shape{3, 7, 80, 1}, Shape{1, 13, 576, 0}, Shape{1, 13, 576, 2}, Shape{1, 8, 256, 0},
                            Shape{8, 9, 288, 1}, Shape{13, 6, 160, 0}, Shape{1, 5, 32, 0}, Shape{7, 4, 1536, 0},
                            // odd full-chunk counts (the AVX-512 reader pairs chunks), with and without a
                            // tail; GEMM tiles of 8, 4 and 1 rows (21 = 8 + 8 + 4 + 1)
                            Shape{1, 8, 384, 0}, Shape{12, 9, 384, 0}, Shape{1, 12, 480, 4}, Shape{21, 5, 480, 1},
                            Shape{21, 7, 576, 0}})
      check_gemm(isa, DType::NVFP4, 0, exact, true, sh.M, sh.N, sh.K, sh.n0);
  }
}

}  // namespace kc
