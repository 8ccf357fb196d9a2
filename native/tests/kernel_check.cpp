// kernel_check.cpp — the CPU kernels against plain reference loops, without Python.
//
// Built with -DKVDECK_TESTS=ON (CMakeLists.txt) and run by `make cross-check` under
// qemu-aarch64, so the portable (scalar) paths that a Jetson runs are checked on every CI
// run. Integer results are compared bit for bit: codecs over all their codes, activation
// quantisation, and every GEMM format on inputs whose float scales are powers of two (so
// every product and partial sum is exact in any order). Float results (random GEMM inputs,
// row ops, attention) are compared with a float64 reference within a stated bound.
// Each ISA the CPU supports runs the GEMM checks; on aarch64 with dotprod that includes "neon",
// which kernel_check_neon.cpp also compares with the scalar set on random inputs (bit for bit
// where the math is integer). `kernel_check --expect NAME` also fails unless NAME is the set
// the dispatcher chose (make cross-check: neon on a dotprod CPU, scalar without, KVDECK_ISA);
// with KVDECK_ISA set, only that set is checked.
// Exit status: 0 when every check passed, 1 otherwise (each failure is printed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvdeck/formats.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

using namespace kvdeck;

bool check_neon_vs_scalar(void (*check)(bool, const std::string&));  // kernel_check_neon.cpp

namespace {

// ---- reporting -----------------------------------------------------------------------
int g_failures = 0, g_checks = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok && ++g_failures <= 20) std::printf("FAIL %s\n", what.c_str());
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::mt19937 rng(12345);
int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
float rand_normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }

// ---- independent decoders (formulas, not the library's bit tricks) ----------------------
double ref_f16(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
  const double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}
double ref_e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
double ref_e2m1(uint8_t c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return c & 8 ? -mag[c & 7] : mag[c & 7];
}
bool same(double ref, float got) { return std::isnan(ref) ? std::isnan(got) : double(got) == ref && std::signbit(ref) == std::signbit(got); }

// ============================================================================
// Codecs: every code
// ============================================================================
void check_codecs() {
  int bad = 0;
  for (int h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    bad += !same(ref_f16(uint16_t(h)), f);
    if (!std::isnan(f)) bad += f32_to_f16(f) != uint16_t(h);
  }
  // Round to nearest even: the midpoint between two adjacent finite halves goes to the even one.
  for (int h = 0; h < 0x7BFF; ++h) {
    const float mid = float((ref_f16(uint16_t(h)) + ref_f16(uint16_t(h + 1))) / 2);  // exact in f32
    bad += f32_to_f16(mid) != uint16_t(h % 2 == 0 ? h : h + 1);
  }
  check(bad == 0, "f16 codec: " + std::to_string(bad) + " codes differ from the reference");
  bad = 0;
  for (int b = 0; b < 256; ++b) {
    const float f = e4m3_to_f32(uint8_t(b));
    bad += !same(ref_e4m3(uint8_t(b)), f);
    if (!std::isnan(f)) bad += f32_to_e4m3(f) != uint8_t(b);
  }
  check(bad == 0, "e4m3 codec: " + std::to_string(bad) + " codes differ from the reference");
  bad = 0;
  for (int c = 0; c < 16; ++c) {
    bad += !same(ref_e2m1(uint8_t(c)), e2m1_to_f32(uint8_t(c)));
    bad += f32_to_e2m1(e2m1_to_f32(uint8_t(c))) != uint8_t(c);
  }
  check(bad == 0, "e2m1 codec: " + std::to_string(bad) + " codes differ from the reference");
}

// ============================================================================
// Activation quantisation: bit for bit
// ============================================================================
void check_quantize(const char* isa) {
  const int M = 16, K = 272, Kp = round_up(K, kQ8Block), nb = Kp / kQ8Block;
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = rand_normal() * 3.0f;
  for (int k = 32; k < 64; ++k) x[k] = 0.0f;  // an all-zero block: d = 0, q = 0
  std::vector<int8_t> q(size_t(M) * Kp);
  std::vector<float> d(size_t(M) * nb);
  std::vector<int32_t> s(size_t(M) * nb);
  ActQ8 a{M, Kp, q.data(), d.data(), s.data()};
  quantize_act_q8(x.data(), M, K, a);
  int bad = 0;
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int k = b * 32; k < std::min(K, b * 32 + 32); ++k) amax = std::fmax(amax, std::fabs(x[size_t(m) * K + k]));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int k = b * 32; k < b * 32 + 32; ++k) {
        const int v = k < K ? int(std::nearbyint(x[size_t(m) * K + k] * id)) : 0;
        bad += q[size_t(m) * Kp + k] != v;
        sum += v;
      }
      bad += bits(d[size_t(m) * nb + b]) != bits(amax / 127.0f);
      bad += s[size_t(m) * nb + b] != sum;
    }
  check(bad == 0, std::string(isa) + " quantize_act_q8: " + std::to_string(bad) + " values differ");
}

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

// ============================================================================
// Row ops, NVFP4 KV rows and attention (portable paths)
// ============================================================================
void check_rows() {
  const int n = 96;
  std::vector<float> x(n), w(n), y(n), b(n);
  for (int i = 0; i < n; ++i) x[i] = rand_normal(), w[i] = rand_normal(), b[i] = rand_normal();
  cpu::rmsnorm_row(x.data(), w.data(), n, 1e-5f, y.data());
  double ss = 0.0, worst = 0.0;
  for (float v : x) ss += double(v) * v;
  for (int i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(y[i] - x[i] / std::sqrt(ss / n + 1e-5) * w[i]) / (std::fabs(w[i]) + 1e-3));
  check(worst < 1e-5, "rmsnorm_row: error " + std::to_string(worst));
  cpu::silu_mul_row(x.data(), b.data(), n, y.data());
  worst = 0.0;
  for (int i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(y[i] - x[i] / (1.0 + std::exp(-double(x[i]))) * b[i]) / (std::fabs(b[i]) + 1e-3));
  check(worst < 1e-5, "silu_mul_row: error " + std::to_string(worst));

  // NVFP4 KV rows: the encoder's bytes against the spec written with the scalar codecs.
  const int D = 64;
  std::vector<uint8_t> row(D / 2 + D / 16), ref(D / 2 + D / 16, 0);
  std::vector<float> back(D);
  int bad = 0;
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<float> kx(D);
    for (auto& v : kx) v = rand_normal() * (rep % 5 == 0 ? 0.0f : 1.0f + rep);
    cpu::kv_nvfp4_encode_row(kx.data(), D, row.data());
    cpu::kv_nvfp4_decode_row(row.data(), D, back.data());
    std::fill(ref.begin(), ref.end(), 0);
    for (int blk = 0; blk < D / 16; ++blk) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(kx[blk * 16 + i]));
      const uint8_t sc = f32_to_e4m3(amax / 6.0f);
      const float sd = e4m3_to_f32(sc);
      ref[D / 2 + blk] = sc;
      for (int i = 0; i < 16; ++i) {
        const uint8_t code = sd > 0.0f ? f32_to_e2m1(kx[blk * 16 + i] / sd) : 0;
        ref[(blk * 16 + i) / 2] |= uint8_t(code << (4 * (i & 1)));
        bad += bits(back[blk * 16 + i]) != bits(float(ref_e2m1(code) * sd));
      }
    }
    bad += std::memcmp(row.data(), ref.data(), row.size()) != 0;
  }
  check(bad == 0, "kv_nvfp4 rows: " + std::to_string(bad) + " bytes or values differ from the spec");
}

// f16 and nvfp4 pages, prefill tiles and fresh rows: the dispatched kernels against float64
// on the values the pages hold, and a prefill tile bit for bit equal to decode steps.
void check_attention_paths() {
  const int block = 16, nkv = 2, D = 64, G = 3, ctx = 300, n_pages = (ctx + block - 1) / block, M = 20;
  const int p0 = ctx - M;
  const float scale = 1.0f / std::sqrt(float(D));
  for (KvDType dt : {KvDType::F16, KvDType::NVFP4}) {
    const size_t rb = kv_row_bytes(dt, D), rows = size_t(n_pages) * block * nkv;
    std::vector<uint8_t> k(rows * rb), v(rows * rb);
    std::vector<float> kf(rows * D), vf(rows * D), kd(rows * D), vd(rows * D);  // f32 rows, stored values
    for (size_t r = 0; r < rows; ++r)
      for (int pass = 0; pass < 2; ++pass) {
        float* x = (pass ? vf : kf).data() + r * D;
        float* back = (pass ? vd : kd).data() + r * D;
        uint8_t* row = (pass ? v : k).data() + r * rb;
        for (int i = 0; i < D; ++i) x[i] = rand_normal();
        if (dt == KvDType::F16) {
          cpu::f32_to_f16_row(x, reinterpret_cast<uint16_t*>(row), D);
          cpu::f16_to_f32_row(reinterpret_cast<const uint16_t*>(row), back, D);
        } else {
          cpu::kv_nvfp4_encode_row(x, D, row);
          cpu::kv_nvfp4_decode_row(row, D, back);
        }
      }
    std::vector<int32_t> pages(n_pages);
    for (int p = 0; p < n_pages; ++p) pages[p] = (p * 7) % n_pages;  // n_pages = 19: a permutation
    std::vector<float> q(size_t(M) * nkv * G * D), fk(size_t(M) * nkv * D), fv(fk.size());
    for (auto& e : q) e = rand_normal();
    auto slot = [&](int t, int g) { return (size_t(pages[t / block]) * block + t % block) * nkv + g; };
    for (int t = p0; t < ctx; ++t)  // the chunk's f32 rows (attention_fresh)
      for (int g = 0; g < nkv; ++g) {
        std::memcpy(&fk[(size_t(t - p0) * nkv + g) * D], &kf[slot(t, g) * D], sizeof(float) * D);
        std::memcpy(&fv[(size_t(t - p0) * nkv + g) * D], &vf[slot(t, g) * D], sizeof(float) * D);
      }
    const char* name = dt == KvDType::F16 ? "f16" : "nvfp4";
    for (bool fresh : {false, true}) {
      cpu::KvView kv{k.data(), v.data(), dt, block, nkv, D, pages.data()};
      if (fresh) kv.fresh_k = fk.data(), kv.fresh_v = fv.data(), kv.fresh0 = p0, kv.fresh_ld = size_t(nkv) * D;
      const size_t ld = size_t(nkv) * G * D;
      std::vector<float> tile_out(size_t(M) * ld), step(size_t(G) * D);
      std::vector<float> work(cpu::attention_queries_work_floats(M, G, ctx, block, D));
      double worst = 0.0;
      int differ = 0;
      for (int g = 0; g < nkv; ++g) {
        cpu::attention_queries(kv, g, q.data(), ld, G, 0, M, p0, scale, tile_out.data(), ld, work.data());
        for (int i = 0; i < M; ++i) {
          const int c = p0 + i + 1;
          std::vector<float> w1(cpu::attention_work_floats(G, c, block, D));
          cpu::attention_query(kv, g, q.data() + i * ld + size_t(g) * G * D, G, c, scale, step.data(), w1.data());
          differ += std::memcmp(step.data(), tile_out.data() + i * ld + size_t(g) * G * D, sizeof(float) * G * D) != 0;
          for (int h = 0; h < G; ++h) {  // float64 over the stored (or fresh f32) values
            const float* qh = q.data() + i * ld + (size_t(g) * G + h) * D;
            auto key = [&](int t) { return (fresh && t >= p0 ? kf : kd).data() + slot(t, g) * D; };
            auto val = [&](int t) { return (fresh && t >= p0 ? vf : vd).data() + slot(t, g) * D; };
            std::vector<double> sc(c);
            double mx = -1e300, sum = 0.0;
            for (int t = 0; t < c; ++t) {
              double dot = 0.0;
              for (int j = 0; j < D; ++j) dot += double(qh[j]) * key(t)[j];
              mx = std::max(mx, sc[t] = dot * scale);
            }
            for (int t = 0; t < c; ++t) sum += sc[t] = std::exp(sc[t] - mx);
            for (int j = 0; j < D; ++j) {
              double o = 0.0;
              for (int t = 0; t < c; ++t) o += sc[t] / sum * val(t)[j];
              worst = std::max(worst, std::fabs(o - step[size_t(h) * D + j]));
            }
          }
        }
      }
      const std::string what = std::string("attention ") + name + (fresh ? " + fresh rows" : "");
      check(differ == 0, what + ": " + std::to_string(differ) + " prefill queries differ from decode");
      check(worst < 1e-4, what + ": error vs float64 " + std::to_string(worst));
    }
  }
}

void check_attention() {
  const int block = 16, nkv = 2, D = 64, G = 2, ctx = 300, n_pages = (ctx + block - 1) / block;
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> k(size_t(n_pages) * block * nkv * D), v(k.size()), q(size_t(G) * D), out(size_t(G) * D);
  for (auto& e : k) e = rand_normal();
  for (auto& e : v) e = rand_normal();
  for (auto& e : q) e = rand_normal();
  std::vector<int32_t> pages(n_pages);
  for (int p = 0; p < n_pages; ++p) pages[p] = n_pages - 1 - p;  // a scrambled page table
  cpu::KvView kv{k.data(), v.data(), KvDType::F32, block, nkv, D, pages.data()};
  std::vector<float> work(cpu::attention_work_floats(G, ctx, block, D));
  const int g = 1;
  cpu::attention_query(kv, g, q.data(), G, ctx, scale, out.data(), work.data());
  double worst = 0.0;
  for (int h = 0; h < G; ++h) {
    std::vector<double> sc(ctx);
    double mx = -1e300, sum = 0.0;
    auto at = [&](const std::vector<float>& t, int tok, int i) {
      return double(t[((size_t(pages[tok / block]) * block + tok % block) * nkv + g) * D + i]);
    };
    for (int t = 0; t < ctx; ++t) {
      double dot = 0.0;
      for (int i = 0; i < D; ++i) dot += double(q[size_t(h) * D + i]) * at(k, t, i);
      sc[t] = dot * scale;
      mx = std::max(mx, sc[t]);
    }
    for (int t = 0; t < ctx; ++t) sum += sc[t] = std::exp(sc[t] - mx);
    for (int i = 0; i < D; ++i) {
      double o = 0.0;
      for (int t = 0; t < ctx; ++t) o += sc[t] / sum * at(v, t, i);
      worst = std::max(worst, std::fabs(o - out[size_t(h) * D + i]));
    }
  }
  check(worst < 2e-5, "attention_query (f32 KV, 300 tokens, 2 segments): error " + std::to_string(worst));
  check_attention_paths();
}

}  // namespace

// ============================================================================
// main
// ============================================================================
int main(int argc, char** argv) {
  std::printf("kernel_check: default ISA %s\n", kernel_isa());
  if (argc == 3 && std::strcmp(argv[1], "--expect") == 0)
    check(std::strcmp(kernel_isa(), argv[2]) == 0, std::string("default ISA is ") + kernel_isa() + ", expected " + argv[2]);
#if defined(__aarch64__)
  // neon where the CPU has the dot product (and KVDECK_ISA does not name another set).
  if (std::getenv("KVDECK_ISA") == nullptr)
    check(std::strcmp(kernel_isa(), cpu_supports("neon") ? "neon" : "scalar") == 0,
          std::string("aarch64 default ISA is ") + kernel_isa());
  check(!cpu_supports("avx2") && !set_kernel_isa("avx2"), "aarch64 claims avx2");
#endif
  check_codecs();
  check_rows();
  check_attention();
  // KVDECK_ISA=NAME (a forced set): only that set's checks run.
  const char* forced = std::getenv("KVDECK_ISA");
  if (forced && std::strcmp(forced, kernel_isa()) != 0) forced = nullptr;  // refused: all sets run
  for (const char* isa : {"scalar", "avx2", "avx512vnni", "neon"}) {
    if ((forced && std::strcmp(forced, isa) != 0) || !set_kernel_isa(isa)) continue;
    check_quantize(isa);
    for (bool exact : {true, false}) {
      check_gemm(isa, DType::F32, 0, exact);
      check_gemm(isa, DType::F16, 0, exact);
      check_gemm(isa, DType::NVFP4, 0, exact);
      for (int group : {16, 32, 96}) check_gemm(isa, DType::W4A8, group, exact);
      // GGUF Q4_1 blocks (mins; AVX2 fuses their term into the tile): GEMV, GEMM, odd block counts
      for (int M : {1, 3, 9}) check_gemm(isa, DType::W4A8, 32, exact, false, M, 7, M == 1 ? 576 : 80, 1, true);
      // The repacked NVFP4 layout: tails of 0..3 32-blocks, partial last groups, GEMV (M = 1)
      // on whole groups and on rows of a split group, GEMM tiles and their remainders.
      struct Shape { int M, N, K, n0; };
      for (const Shape& sh : {Shape{3, 7, 80, 1}, Shape{1, 13, 576, 0}, Shape{1, 13, 576, 2}, Shape{1, 8, 256, 0},
                              Shape{8, 9, 288, 1}, Shape{13, 6, 160, 0}, Shape{1, 5, 32, 0}, Shape{7, 4, 1536, 0}})
        check_gemm(isa, DType::NVFP4, 0, exact, true, sh.M, sh.N, sh.K, sh.n0);
    }
    std::printf("kernel_check: %s kernels checked\n", isa);
  }
  const int before = g_checks;
  if (!forced && check_neon_vs_scalar(check))
    std::printf("kernel_check: neon kernels against scalar: %d checks\n", g_checks - before);
  std::printf("kernel_check: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
