// gemm_dense_avx512.cpp — F32 and F16 weights on AVX-512 F (compiled with -mavx512*; reached
// only through the AVX-512 KernelSet, dispatch.cpp): gemm_dense_avx2.cpp's tiles with 16-lane
// FMAs. The main loop over K runs unmasked 16 values at a time; the K % 16 rest is one masked
// step per tile (masking every step, as this set's first dense kernel did, cost it 0.67-0.85x
// the AVX2 kernel). Decode: kDenseGemvRows rows at once; prefill: kDenseRowsN weight rows x
// kDenseRowsM activation rows of accumulators.
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/vec_avx512.h"

// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own "undefined" vectors.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvdeck::cpu {
namespace {

// ---- tuning constants ---------------------------------------------------------------
constexpr int kDenseGemvRows = 4;  // f32/f16 GEMV rows at once
constexpr int kDenseRowsN = 4;     // f32/f16 GEMM tile: 4 weight rows x 4 x rows = 16 accs
constexpr int kDenseRowsM = 4;
constexpr int kMBlock = 64;        // activation rows per block
constexpr int kPrefetchBytes = 4096;  // GEMV software prefetch distance

template <bool kF16>
inline __m512 load_w16(const void* W, size_t i) {
  if (kF16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(W) + i)));
  return _mm512_loadu_ps(static_cast<const float*>(W) + i);
}
template <bool kF16>
inline __m512 load_w16_masked(const void* W, size_t i, __mmask16 k) {
  if (kF16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(W) + i));
  return _mm512_maskz_loadu_ps(k, static_cast<const float*>(W) + i);
}

// y[m][i] = dot(x[m], W[n + i]) for RN weight rows x RM activation rows.
template <bool kF16, int RN, int RM>
void dense_tile(const void* W, int K, int n, const float* const (&x)[RM], float* const (&y)[RM]) {
  __m512 acc[RN][RM];
  for (int i = 0; i < RN; ++i)
    for (int m = 0; m < RM; ++m) acc[i][m] = _mm512_setzero_ps();
  auto fma_step = [&](const __m512 (&wv)[RN], auto xload) {
    for (int m = 0; m < RM; ++m) {
      const __m512 xv = xload(m);
      for (int i = 0; i < RN; ++i) acc[i][m] = _mm512_fmadd_ps(wv[i], xv, acc[i][m]);
    }
  };
  const int K16 = K / 16 * 16;
  for (int k = 0; k < K16; k += 16) {
    __m512 wv[RN];
    for (int i = 0; i < RN; ++i) {
      if (RM == 1)
        _mm_prefetch(reinterpret_cast<const char*>(W) + (size_t(n + i) * K + k) * (kF16 ? 2 : 4) + kPrefetchBytes,
                     _MM_HINT_T0);
      wv[i] = load_w16<kF16>(W, size_t(n + i) * K + k);
    }
    fma_step(wv, [&](int m) { return _mm512_loadu_ps(x[m] + k); });
  }
  if (K16 < K) {
    const __mmask16 km = __mmask16((1u << (K - K16)) - 1);
    __m512 wv[RN];
    for (int i = 0; i < RN; ++i) wv[i] = load_w16_masked<kF16>(W, size_t(n + i) * K + K16, km);
    fma_step(wv, [&](int m) { return _mm512_maskz_loadu_ps(km, x[m] + K16); });
  }
  for (int i = 0; i < RN; ++i) {
    float* yp[RM];
    for (int m = 0; m < RM; ++m) yp[m] = y[m] + i;
    store_sums<RM>(acc[i], 1.0f, yp);
  }
}

template <bool kF16>
void gemm_dense(const WeightView& w, const float* x /*[M,K]*/, int M, float* y, int ldy, int n0, int n1) {
  const int K = w.K;
  if (M == 1) {
    const float* xr[1] = {x};
    int n = n0;
    for (; n + kDenseGemvRows <= n1; n += kDenseGemvRows) {
      float* const yp[1] = {y + n};
      dense_tile<kF16, kDenseGemvRows, 1>(w.data, K, n, xr, yp);
    }
    for (; n < n1; ++n) {
      float* const yp[1] = {y + n};
      dense_tile<kF16, 1, 1>(w.data, K, n, xr, yp);
    }
    return;
  }
  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int mb = std::min(kMBlock, M - m0);
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
        float* const yp[1] = {y + size_t(m) * ldy + n};
        dense_tile<kF16, RN, 1>(w.data, K, n, xr, yp);
      }
    };
    int n = n0;
    for (; n + kDenseRowsN <= n1; n += kDenseRowsN) do_rows(std::integral_constant<int, kDenseRowsN>{}, n);
    for (; n < n1; ++n) do_rows(std::integral_constant<int, 1>{}, n);
  }
}

}  // namespace

void gemm_dense_avx512(const WeightView& w, const float* x, int M, float* y, int ldy, int n0, int n1) {
  if (w.dtype == DType::F16)
    gemm_dense<true>(w, x, M, y, ldy, n0, n1);
  else
    gemm_dense<false>(w, x, M, y, ldy, n0, n1);
}

}  // namespace kvdeck::cpu
#endif  // __x86_64__
