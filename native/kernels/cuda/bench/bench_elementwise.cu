// bench_elementwise.cu — RMSNorm, RoPE and SiLU-mul against float64 loops (validation only:
// these kernels move a few KB per decode step; their cost is the launch).
#include "bench_common.h"
#include "kernels_cuda.h"

namespace bench {

namespace kc = kvdeck::cuda;

void bench_elementwise(Options& o) {
  (void)o;
  Rng rng(5);
  // ---- RMSNorm: 8 rows of 4096 (Llama-3-8B hidden) and 3 rows of 576 (SmolLM2) ----------
  for (int n : {4096, 576}) {
    const int rows = n == 4096 ? 8 : 3;
    std::vector<float> x(size_t(rows) * n), w(n);
    for (auto& v : x) v = 3.0f * rng.normal();
    for (auto& v : w) v = 1.0f + 0.2f * rng.normal();
    std::vector<double> ref(x.size());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += double(x[size_t(r) * n + i]) * x[size_t(r) * n + i];
      const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int i = 0; i < n; ++i) ref[size_t(r) * n + i] = x[size_t(r) * n + i] * inv * w[i];
    }
    float *dx = dupload(x), *dw = dupload(w), *dy = dalloc<float>(x.size());
    CK(cudaMemset(dy, 0xFF, x.size() * 4));
    CK(kc::rmsnorm(dx, dw, rows, n, 1e-5f, dy, 0));
    const auto y = ddownload(dy, x.size());
    const ErrStats e = compare(y.data(), ref.data(), y.size());
    add_validation("rmsnorm vs f64", std::to_string(rows) + "x" + std::to_string(n), e.max_abs, e.rel_max,
                   e.rel_norm, 1e-5);
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(dy));
  }
  // ---- RoPE: 5 rows of 32 heads x 128 inside a wider row (q|k|v), positions up to 32K -----
  {
    const int rows = 5, nh = 32, D = 128, ld = 48 * 128;
    std::vector<float> x(size_t(rows) * ld), inv(D / 2);
    for (auto& v : x) v = rng.normal();
    for (int i = 0; i < D / 2; ++i) inv[i] = float(std::pow(500000.0, -2.0 * i / D));
    std::vector<int32_t> pos = {0, 1, 77, 4095, 32767};
    std::vector<double> ref(x.begin(), x.end());
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < nh; ++h)
        for (int i = 0; i < D / 2; ++i) {
          const float a = float(pos[r]) * inv[i];  // f32 angle, as the CPU backend
          const double c = std::cos(double(a)), s = std::sin(double(a));
          const size_t j = size_t(r) * ld + size_t(h) * D + i;
          ref[j] = x[j] * c - x[j + D / 2] * s;
          ref[j + D / 2] = x[j + D / 2] * c + x[j] * s;
        }
    float *dx = dupload(x), *dinv = dupload(inv);
    int32_t* dpos = dupload(pos);
    CK(kc::rope(dx, rows, nh, D, ld, dpos, dinv, 0));
    const auto y = ddownload(dx, x.size());
    const ErrStats e = compare(y.data(), ref.data(), y.size());
    add_validation("rope vs f64", "5x32x128 ld=6144", e.max_abs, e.rel_max, e.rel_norm, 1e-5);
    CK(cudaFree(dx));
    CK(cudaFree(dinv));
    CK(cudaFree(dpos));
  }
  // ---- SiLU(gate) * up from a fused gate|up output: 4 rows of 2 x 14336 ------------------
  {
    const int rows = 4, n = 14336;
    std::vector<float> gu(size_t(rows) * 2 * n);
    for (auto& v : gu) v = 4.0f * rng.normal();
    std::vector<double> ref(size_t(rows) * n);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < n; ++i) {
        const double g = gu[size_t(r) * 2 * n + i], u = gu[size_t(r) * 2 * n + n + i];
        ref[size_t(r) * n + i] = g / (1.0 + std::exp(-g)) * u;
      }
    float *dgu = dupload(gu), *dy = dalloc<float>(ref.size());
    CK(cudaMemset(dy, 0xFF, ref.size() * 4));
    CK(kc::silu_mul(dgu, dgu + n, rows, n, 2 * n, dy, 0));
    const auto y = ddownload(dy, ref.size());
    const ErrStats e = compare(y.data(), ref.data(), y.size());
    add_validation("silu_mul vs f64", "4x14336 ld=28672", e.max_abs, e.rel_max, e.rel_norm, 1e-5);
    CK(cudaFree(dgu));
    CK(cudaFree(dy));
  }
}

}  // namespace bench
