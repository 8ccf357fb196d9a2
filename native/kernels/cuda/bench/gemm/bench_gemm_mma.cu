// bench_gemm_mma — the prefill GEMM (gemm_mma.cu) on Llama-3-8B shapes at M tokens, q/k/v and
// gate/up as one grouped launch (as the engine's matmul_many runs them): validated against the
// batch-8 GEMV over row chunks of 8 (what M > 8 ran before; the same integer block sums:
// relative difference ~1e-7 expected), outputs NaN-poisoned, in every tile configuration; then
// timed (CUDA events, median of 9 runs after a warm-up; weights are not rotated: the GEMM
// re-reads each weight tile M/BM times from L2 anyway); NVFP4 on the f16 mma (kernel format 3,
// the engine's default) against NVFP4 on the int8 mma (format 0, KVDECK_CUDA_GEMM_NVFP4=i8) in
// the same run. (The session-3 kernel, gemm_mma_v1.cu, was deleted in session 6 after its last
// A/B: NOTES.md.) `sweep`: every tile configuration timed, not only the one the engine picks;
// `chunks`: the GEMV chunks timed too. Build (from the repository root):
//   nvcc -O3 -std=c++17 -arch=native -Inative/include -Inative -Inative/kernels/cuda \
//     native/kernels/cuda/bench/gemm/bench_gemm_mma.cu native/kernels/cuda/gemm_mma*.cu \
//     native/kernels/cuda/gemv.cu native/kernels/cuda/gemv_dense.cu -o build/bench_gemm_mma
//   build/bench_gemm_mma [M] [sweep] [chunks] [nv] [nohead] [prof FMT CFG SHAPE]
// nv: the NVFP4 kernels only (formats 3 and 0); nohead: no lm_head; prof: only SHAPE in kernel
// format FMT, tile CFG, launched 3 times without validation or timing (for ncu --launch-skip 2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  bool sweep = false, chunks = false, nvonly = false, nohead = false;
  int pfmt = -1, pcfg = -1;
  const char* pshape = "";
  for (int i = 2; i < argc; ++i) {
    sweep |= !std::strcmp(argv[i], "sweep"), chunks |= !std::strcmp(argv[i], "chunks");
    nvonly |= !std::strcmp(argv[i], "nv"), nohead |= !std::strcmp(argv[i], "nohead");
    if (!std::strcmp(argv[i], "prof") && i + 3 < argc)
      pfmt = std::atoi(argv[i + 1]), pcfg = std::atoi(argv[i + 2]), pshape = argv[i + 3], i += 3;
  }
  struct Shape { const char* name; int K; int n; int N[3]; };
  const Shape shapes[] = {{"qkv", 4096, 3, {4096, 1024, 1024}}, {"o", 4096, 1, {4096}},
                          {"gate_up", 4096, 2, {14336, 14336}}, {"down", 14336, 1, {4096}},
                          {"lm_head", 4096, 1, {128256}}};
  const char* cfg_name[5] = {"128x128", "64x128", "128x64", "32x128", "128x128/1"};
  std::mt19937 rng(7);
  int fails = 0;
  double sum_new[4] = {0, 0, 0, 0}, sum_peer[4] = {0, 0, 0, 0};  // the layer shapes' µs (no lm_head)
  const char* fnames[4] = {"nvfp4/i8", "w4a8", "w8a8", "nvfp4/f16"};
  for (int fmt : {3, 0, 1, 2}) {  // kernel formats: 3 and 0 are both NVFP4 (f16 / int8 mma)
    if ((nvonly && fmt != 0 && fmt != 3) || (pfmt >= 0 && fmt != pfmt)) continue;
    const bool nv = fmt == 0 || fmt == 3;
    const int wf = nv ? 0 : fmt;  // the weight format
    for (const Shape& s : shapes) {
      if ((wf == 2 || nohead) && s.N[0] > 28672) continue;
      if (pfmt >= 0 && std::strcmp(s.name, pshape)) continue;
      int N = 0;
      for (int i = 0; i < s.n; ++i) N += s.N[i];
      const int K = s.K, nb = K / 32;
      const size_t row = wf == 2 ? size_t(K) : size_t(K) / 2;
      std::vector<uint8_t> codes(size_t(N) * row);
      for (auto& c : codes) c = uint8_t(rng());
      std::vector<uint8_t> sc8;
      std::vector<uint16_t> sc16;
      if (nv) {
        sc8.resize(size_t(N) * K / 16);
        for (auto& c : sc8) c = uint8_t(0x28 + rng() % 24);  // E4M3 ~0.03 .. 0.5
      } else {
        sc16.resize(size_t(N) * (wf == 1 ? 1 : nb));
        for (auto& c : sc16) c = uint16_t(0x2000 + rng() % 0x800);  // f16 ~0.008 .. 0.016
      }
      const size_t srow = nv ? size_t(K) / 16 : wf == 1 ? 1 : size_t(nb);  // scales per weight row
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
      uint8_t* ds = nv ? up(sc8) : reinterpret_cast<uint8_t*>(up(sc16));
      const size_t sbytes = nv ? 1 : 2;
      int8_t* dq = up(q);
      float* dd = up(d);
      int32_t* dsa = up(sa);
      float *y0 = nullptr, *y1 = nullptr;
      CK(cudaMalloc(&y0, size_t(M) * N * 4));
      CK(cudaMalloc(&y1, size_t(M) * N * 4));
      GemmQ8Weight w[3];
      for (int i = 0, off = 0; i < s.n; off += s.N[i], ++i)  // slices of one [N, K] weight, outputs side by side
        w[i] = {dc + size_t(off) * row, ds + size_t(off) * srow * sbytes, 1.0f, s.N[i], y0 + off, N};
      auto gemm = [&](int cfg) { CK(detail::gemm_q8_mma_config(cfg, fmt, w, s.n, K, K, dq, dd, M, 0)); };
      const int peer = fmt == 3 ? 0 : fmt == 0 ? 3 : -1;  // the other NVFP4 kernel (engine's pick of tile)
      auto other = [&] { CK(detail::gemm_q8_mma_config(-1, peer, w, s.n, K, K, dq, dd, M, 0)); };
      auto gemv = [&] {
        for (int m0 = 0; m0 < M; m0 += 8) {
          const int R = std::min(8, M - m0);
          const int8_t* qq = dq + size_t(m0) * K;
          const float* dm = dd + size_t(m0) * nb;
          float* yy = y1 + size_t(m0) * N;
          if (nv)
            CK(gemv_nvfp4_dp4a(dc, ds, 1.0f, N, K, qq, dm, R, yy, N, 0));
          else if (wf == 1)
            CK(gemv_w4a8(dc, reinterpret_cast<uint16_t*>(ds), K, N, K, qq, dm, dsa + size_t(m0) * nb, R, yy, N, 0));
          else
            CK(gemv_w8a8(reinterpret_cast<int8_t*>(dc), reinterpret_cast<uint16_t*>(ds), N, K, qq, dm, R, yy, N, 0));
        }
      };
      gemv();
      CK(cudaDeviceSynchronize());
      std::vector<float> h0(size_t(M) * N), h1(size_t(M) * N);
      CK(cudaMemcpy(h1.data(), y1, h1.size() * 4, cudaMemcpyDeviceToHost));
      auto check = [&](const char* what) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h0.data(), y0, h0.size() * 4, cudaMemcpyDeviceToHost));
        double mx = 0, md = 0;
        bool finite = true;
        for (size_t i = 0; i < h0.size(); ++i) {
          finite &= std::isfinite(h0[i]);
          mx = std::max(mx, double(std::fabs(h1[i])));
          md = std::max(md, double(std::fabs(h0[i] - h1[i])));
        }
        const double rel = md / std::max(mx, 1e-30);
        const bool ok = finite && rel < 1e-5;
        if (!ok) std::printf("  FAIL %s: rel diff %.2e%s\n", what, rel, finite ? "" : " (not finite)");
        fails += !ok;
        return rel;
      };
      const char* fname = fnames[fmt];
      if (pfmt >= 0) {  // for ncu: three launches of one configuration
        for (int r = 0; r < 3; ++r) gemm(pcfg);
        CK(cudaDeviceSynchronize());
        std::printf("prof %s %s cfg %s: 3 launches\n", fname, s.name, cfg_name[pcfg]);
        cudaFree(dc), cudaFree(ds), cudaFree(dq), cudaFree(dd), cudaFree(dsa), cudaFree(y0), cudaFree(y1);
        continue;
      }
      const double ops = 2.0 * M * N * K;
      double rel = 0;
      for (int cfg = 0; cfg < 5; ++cfg) {  // every configuration validated
        CK(cudaMemset(y0, 0xFF, size_t(M) * N * 4));  // NaN poison
        gemm(cfg);
        rel = std::max(rel, check(cfg_name[cfg]));
      }
      const float tn = time_us([&] { gemm(-1); }), to = peer >= 0 ? time_us(other) : 0.0f;
      const float tv = chunks ? time_us(gemv) : 0.0f;
      std::printf("%-9s %-8s K=%5d N=%6d M=%d: mma %9.1f us %6.1f TOPS", fname, s.name, K, N, M, tn, ops / tn * 1e-6);
      if (peer >= 0)
        std::printf(" | %s %9.1f us %6.1f TOPS | %5.2fx", fnames[peer], to, ops / to * 1e-6, to / tn);
      if (chunks) std::printf(" | gemv-chunks %9.1f us (%5.2fx)", tv, tv / tn);
      std::printf(" | rel diff %.2e\n", rel);
      if (s.N[0] != 128256) sum_new[fmt] += tn, sum_peer[fmt] += to;
      if (sweep) {
        std::printf("    sweep:");
        for (int cfg = 0; cfg < 5; ++cfg) {
          const float tc = time_us([&] { gemm(cfg); });
          std::printf(" %s %.1f us (%.0f TOPS)", cfg_name[cfg], tc, ops / tc * 1e-6);
        }
        std::printf("\n");
      }
      std::fflush(stdout);
      cudaFree(dc), cudaFree(ds), cudaFree(dq), cudaFree(dd), cudaFree(dsa), cudaFree(y0), cudaFree(y1);
    }
    std::printf("%s one layer's GEMMs at M=%d: %.1f us", fnames[fmt], M, sum_new[fmt]);
    if (sum_peer[fmt] > 0)
      std::printf(" (the other NVFP4 kernel %.1f us, %.2fx)", sum_peer[fmt], sum_peer[fmt] / std::max(sum_new[fmt], 1e-9));
    std::printf("\n");
  }
  std::printf("%d failed\n", fails);
  return fails ? 1 : 0;
}
