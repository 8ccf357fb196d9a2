// Row kernels of the CPU backend: RMSNorm, RoPE, SiLU·mul, 8-bit rows to f32 (f16 rows: f16_rows.cpp).
// Plain loops written for the auto-vectoriser; on x86 each hot one is cloned for AVX-512
// and AVX2 and the loader picks a clone at run time (no -march flags anywhere).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvdeck/formats.h"
#include "kernels/cpu/kernels_impl.h"
#include "kvdeck/kernels.h"
#include "kvdeck/ops_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
// (No clones under ThreadSanitizer: their ifunc resolvers run before its runtime starts.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define KV_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KV_CLONES
#endif

namespace kvdeck::cpu {

KV_CLONES void rmsnorm_row(const float* x, const float* w, int n, float eps, float* y) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

void rope_row(float* x, int n_heads, int D, const float* cs, const float* sn) {
  const int half = D / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * D;
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

KV_CLONES static void silu_mul_row_loop(const float* a, const float* b, int n, float* y) {
  for (int i = 0; i < n; ++i) {
    const float x = a[i];
    y[i] = x / (1.0f + std::exp(-x)) * b[i];
  }
}

void silu_mul_row(const float* a, const float* b, int n, float* y) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_supports("avx2");
  if (avx2) return silu_mul_row_avx2(a, b, n, y);
#endif
#if defined(__aarch64__)
  if (neon_active()) return silu_mul_row_neon(a, b, n, y);
#endif
  silu_mul_row_loop(a, b, n, y);
}

void w8a8_row_to_f32(const int8_t* q, const uint16_t* d, float* f, int n) {
  for (int b = 0; b * 32 < n; ++b) {
    const float s = f16_to_f32(d[b]);
    for (int j = b * 32, e = std::min(n, j + 32); j < e; ++j) f[j] = s * static_cast<float>(q[j]);
  }
}

}  // namespace kvdeck::cpu
