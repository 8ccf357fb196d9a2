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
// The checks are split by concern (kernel_check.h lists the files); this one holds the report,
// the codecs, activation quantisation and main().
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

#include "kernel_check.h"
#include "kvdeck/formats.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

using namespace kvdeck;

bool check_neon_vs_scalar(void (*check)(bool, const std::string&));  // kernel_check_neon.cpp

namespace kc {

// ---- reporting -----------------------------------------------------------------------
int g_failures = 0, g_checks = 0;
std::mt19937 rng(12345);

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok && ++g_failures <= 20) std::printf("FAIL %s\n", what.c_str());
}

namespace {

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

}  // namespace
}  // namespace kc

using namespace kc;

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
    check_gemm_formats(isa);
    std::printf("kernel_check: %s kernels checked\n", isa);
  }
  const int before = g_checks;
  if (!forced && check_neon_vs_scalar(check))
    std::printf("kernel_check: neon kernels against scalar: %d checks\n", g_checks - before);
  std::printf("kernel_check: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
