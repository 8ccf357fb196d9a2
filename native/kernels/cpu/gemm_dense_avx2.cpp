// gemm_dense_avx2.cpp — F32 and F16 weights on AVX2 + FMA + F16C (compiled with -mavx2
// -mfma -mf16c; reached only through the AVX2 KernelSet): FMA over K, register-tiled like the
// quantised kernels (decode: kDenseGemvRows rows at once; prefill: kDenseRowsN weight rows x
// kDenseRowsM activation rows of accumulators).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx2.h"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kDenseGemvRows = 4;  // f32/f16 GEMV rows at once
constexpr int kDenseRowsN = 3;     // f32/f16 GEMM tile: 3 weight rows x 4 x rows = 12 accs
constexpr int kDenseRowsM = 4;
constexpr int kMBlock = 64;        // activation rows per block
constexpr int kPrefetchBytes = 4096;  // GEMV software prefetch distance

template <bool kF16>
inline __m256 load_w8(const void* W, size_t i) {
  if (kF16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(W) + i)));
  return _mm256_loadu_ps(static_cast<const float*>(W) + i);
}
template <bool kF16>
inline float load_w1(const void* W, size_t i) {
  if (kF16) return _cvtsh_ss(static_cast<const uint16_t*>(W)[i]);
  return static_cast<const float*>(W)[i];
}

// y[m][n] = dot(x[m], W[n]) for RN weight rows starting at n x RM activation rows.
template <bool kF16, int RN, int RM>
void dense_tile(const void* W, int K, int n, const float* const (&x)[RM], float* const (&y)[RM]) {
  __m256 acc[RN][RM];
  for (int i = 0; i < RN; ++i)
    for (int m = 0; m < RM; ++m) acc[i][m] = _mm256_setzero_ps();
  const int K8 = K / 8 * 8;
  for (int k = 0; k < K8; k += 8) {
    __m256 wv[RN];
    for (int i = 0; i < RN; ++i) {
      if (RM == 1)
        _mm_prefetch(reinterpret_cast<const char*>(W) + (size_t(n + i) * K + k) * (kF16 ? 2 : 4) + kPrefetchBytes,
                     _MM_HINT_T0);
      wv[i] = load_w8<kF16>(W, size_t(n + i) * K + k);
    }
    for (int m = 0; m < RM; ++m) {
      const __m256 xv = _mm256_loadu_ps(x[m] + k);
      for (int i = 0; i < RN; ++i) acc[i][m] = _mm256_fmadd_ps(wv[i], xv, acc[i][m]);
    }
  }
  for (int i = 0; i < RN; ++i)
    for (int m = 0; m < RM; ++m) {
      float s = hsum(acc[i][m]);
      for (int k = K8; k < K; ++k) s += x[m][k] * load_w1<kF16>(W, size_t(n + i) * K + k);
      y[m][i] = s;
    }
}

template <bool kF16>
void gemm_dense(const WeightView& w, const float* x /*[M,K]*/, int M, float* y, int ldy, int n0, int n1) {
  const int K = w.K;
  if (M == 1) {
    const float* xr[1] = {x};
    int n = n0;
    for (; n + kDenseGemvRows <= n1; n += kDenseGemvRows) {
      float* yp[1] = {y + n};
      dense_tile<kF16, kDenseGemvRows, 1>(w.data, K, n, xr, yp);
    }
    for (; n < n1; ++n) {
      float* yp[1] = {y + n};
      dense_tile<kF16, 1, 1>(w.data, K, n, xr, yp);
    }
    return;
  }
  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int mb = std::min(kMBlock, M - m0);
    int n = n0;
    auto do_rows = [&](auto rn_tag, int n) {
      constexpr int RN = decltype(rn_tag)::value;
      int m = m0;
      for (; m + kDenseRowsM <= m0 + mb; m += kDenseRowsM) {
        const float* xr[kDenseRowsM];
        float* yp[kDenseRowsM];
        for (int i = 0; i < kDenseRowsM; ++i) xr[i] = x + size_t(m + i) * K, yp[i] = y + size_t(m + i) * ldy + n;
        dense_tile<kF16, RN, kDenseRowsM>(w.data, K, n, xr, yp);
      }
      for (; m < m0 + mb; ++m) {
        const float* xr[1] = {x + size_t(m) * K};
        float* yp[1] = {y + size_t(m) * ldy + n};
        dense_tile<kF16, RN, 1>(w.data, K, n, xr, yp);
      }
    };
    for (; n + kDenseRowsN <= n1; n += kDenseRowsN) do_rows(std::integral_constant<int, kDenseRowsN>{}, n);
    for (; n < n1; ++n) do_rows(std::integral_constant<int, 1>{}, n);
  }
}

}  // namespace

void gemm_dense_avx2(const WeightView& w, const float* x, int M, float* y, int ldy, int n0, int n1) {
  if (w.dtype == DType::F16)
    gemm_dense<true>(w, x, M, y, ldy, n0, n1);
  else
    gemm_dense<false>(w, x, M, y, ldy, n0, n1);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
