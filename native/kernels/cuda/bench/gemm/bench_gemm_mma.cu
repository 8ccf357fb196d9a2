// bench_gemm_mma — the prefill GEMM (gemm_mma.cu) against the batch-8 GEMV over row chunks of
// 8 (what M > 8 ran before), on Llama-3-8B shapes at M tokens: both validated against each
// other (the same integer block sums: relative difference ~1e-7 expected), then timed (CUDA
// events, median of 9 runs after a warm-up; weights are not rotated: the GEMM re-reads each
// weight tile M/64 times from L2 anyway). Build (from the repository root):
//   nvcc -O3 -std=c++17 -arch=native -Inative/include -Inative -Inative/kernels/cuda \
//     native/kernels/cuda/bench/gemm/bench_gemm_mma.cu native/kernels/cuda/gemm_mma.cu \
//     native/kernels/cuda/gemv.cu -o build/bench_gemm_mma && build/bench_gemm_mma [M]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels_cuda.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s at line %d: %s\n", cudaGetErrorString(e_), __LINE__, #x); \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

using namespace kvdeck::cuda;

template <class T>
T* up(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class F>
float time_us(F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int r = 0; r < 9; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 512;
  struct Shape { const char* name; int K, N; };
  const Shape shapes[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672},
                          {"down", 14336, 4096}, {"lm_head", 4096, 128256}};
  std::mt19937 rng(7);
  int fails = 0;
  for (int fmt = 0; fmt < 3; ++fmt) {
    for (const Shape& s : shapes) {
      if (fmt == 2 && s.N > 28672) continue;
      const int K = s.K, N = s.N, nb = K / 32;
      const size_t wb = fmt == 2 ? size_t(N) * K : size_t(N) * K / 2;
      std::vector<uint8_t> codes(wb);
      for (auto& c : codes) c = uint8_t(rng());
      std::vector<uint8_t> sc8;
      std::vector<uint16_t> sc16;
      if (fmt == 0) {
        sc8.resize(size_t(N) * K / 16);
        for (auto& c : sc8) c = uint8_t(0x28 + rng() % 24);  // E4M3 ~0.03 .. 0.5
      } else {
        sc16.resize(size_t(N) * (fmt == 1 ? 1 : nb));
        for (auto& c : sc16) c = uint16_t(0x2000 + rng() % 0x800);  // f16 ~0.008 .. 0.016
      }
      std::vector<int8_t> q(size_t(M) * K);
      for (auto& v : q) v = int8_t(int(rng() % 255) - 127);
      std::vector<float> d(size_t(M) * nb);
      std::vector<int32_t> sa(size_t(M) * nb);
      for (auto& v : d) v = 0.001f + float(rng() % 1000) * 1e-5f;
      for (int m = 0; m < M; ++m)
        for (int b = 0; b < nb; ++b) {
          int t = 0;
          for (int i = 0; i < 32; ++i) t += q[size_t(m) * K + b * 32 + i];
          sa[size_t(m) * nb + b] = t;
        }
      uint8_t* dc = up(codes);
      void* ds = fmt == 0 ? static_cast<void*>(up(sc8)) : static_cast<void*>(up(sc16));
      int8_t* dq = up(q);
      float* dd = up(d);
      int32_t* dsa = up(sa);
      float *y0 = nullptr, *y1 = nullptr;
      CK(cudaMalloc(&y0, size_t(M) * N * 4));
      CK(cudaMalloc(&y1, size_t(M) * N * 4));
      auto gemm = [&] { CK(gemm_q8_mma(fmt, dc, ds, 1.0f, K, N, K, dq, dd, M, y0, N, 0)); };
      auto gemv = [&] {
        for (int m0 = 0; m0 < M; m0 += 8) {
          const int R = std::min(8, M - m0);
          const int8_t* qq = dq + size_t(m0) * K;
          const float* dm = dd + size_t(m0) * nb;
          float* yy = y1 + size_t(m0) * N;
          if (fmt == 0)
            CK(gemv_nvfp4_dp4a(dc, static_cast<uint8_t*>(ds), 1.0f, N, K, qq, dm, R, yy, N, 0));
          else if (fmt == 1)
            CK(gemv_w4a8(dc, static_cast<uint16_t*>(ds), K, N, K, qq, dm, dsa + size_t(m0) * nb, R, yy, N, 0));
          else
            CK(gemv_w8a8(reinterpret_cast<int8_t*>(dc), static_cast<uint16_t*>(ds), N, K, qq, dm, R, yy, N, 0));
        }
      };
      CK(cudaMemset(y0, 0xFF, size_t(M) * N * 4));  // NaN poison
      gemm();
      gemv();
      CK(cudaDeviceSynchronize());
      std::vector<float> h0(size_t(M) * N), h1(size_t(M) * N);
      CK(cudaMemcpy(h0.data(), y0, h0.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h1.data(), y1, h1.size() * 4, cudaMemcpyDeviceToHost));
      double mx = 0, md = 0;
      bool finite = true;
      for (size_t i = 0; i < h0.size(); ++i) {
        finite &= std::isfinite(h0[i]);
        mx = std::max(mx, double(std::fabs(h1[i])));
        md = std::max(md, double(std::fabs(h0[i] - h1[i])));
      }
      const double rel = md / std::max(mx, 1e-30);
      const bool ok = finite && rel < 1e-5;
      fails += !ok;
      const float tg = time_us(gemm), tv = time_us(gemv);
      const double ops = 2.0 * M * N * K;
      std::printf("%-6s %-8s K=%5d N=%6d M=%d: mma %9.1f us %6.1f TOPS | gemv-chunks %9.1f us %6.1f TOPS | %5.2fx | "
                  "rel diff %.2e %s\n",
                  fmt == 0 ? "nvfp4" : fmt == 1 ? "w4a8" : "w8a8", s.name, K, N, M, tg, ops / tg * 1e-6, tv,
                  ops / tv * 1e-6, tv / tg, rel, ok ? "ok" : "FAIL");
      std::fflush(stdout);
      cudaFree(dc), cudaFree(ds), cudaFree(dq), cudaFree(dd), cudaFree(dsa), cudaFree(y0), cudaFree(y1);
    }
  }
  std::printf("%d failed\n", fails);
  return fails ? 1 : 0;
}
