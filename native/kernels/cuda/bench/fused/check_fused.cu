// check_fused.cu — validation and timing of fused.cu's add_rmsnorm_q8 and silu_mul_q8 on the GPU:
// h against a float64 reference (x + y itself bit-exact), y = silu(a) * b bit-exact against
// elementwise.cu's silu_mul, and every q8 output (q, d, s) bit-exact against quantize_act_q8 of
// the kernel's own f32 output (the CPU's quantiser, kernels_cuda.h). Shapes: the decode steps of
// Llama-3-8B (4096, 14336) and SmolLM2-135M (576, 1536), a prefill-like M > 1, the P = 2 / 4
// register passes, the q8 padding (Kp > n), h == x, and rows that take the one-value-a-lane
// kernels (n % 4 != 0). Then µs per launch of the two decode shapes, 200 launches replayed in
// a CUDA graph (launch gaps included, as in the engine's step). Exit status 1 on a mismatch.
//   check_fused          (KVDECK_CUDA_NORM_SERIAL=1: the same against the one-value-a-lane kernels)
// Built on the device against the module build's objects (device_session.sh `fused`); kept out of
// bench/ so build.sh's gpu_bench (which globs bench/*.cu) does not link a second main.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels_cuda.h"

namespace kc = kvdeck::cuda;

namespace {

int g_fail = 0;
uint64_t g_rng = 7;

float rnd() {  // splitmix64 -> N(0, 1) by Box-Muller
  auto u = [] {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return ((z ^ (z >> 31)) >> 11) * 0x1.0p-53 + 1e-300;
  };
  return float(std::sqrt(-2.0 * std::log(u())) * std::cos(6.283185307179586 * u()));
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                            \
    }                                                                          \
  } while (0)

template <typename T>
T* up(const std::vector<T>& v) {
  T* p;
  CK(cudaMalloc(&p, v.size() * sizeof(T) + 16));
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> down(const T* p, size_t n) {
  std::vector<T> v(n);
  CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
template <typename T>
T* zeros(size_t n) {
  T* p;
  CK(cudaMalloc(&p, n * sizeof(T) + 16));
  CK(cudaMemset(p, 0xAB, n * sizeof(T)));
  return p;
}

void report(const char* what, const char* shape, bool ok, const char* detail) {
  std::printf("  %-4s %-34s %-22s %s\n", ok ? "ok" : "FAIL", what, shape, detail);
  g_fail += !ok;
}

// q, d, s of the kernel against quantize_act_q8 of the kernel's own f32 output f [M, n].
void check_q8(const char* what, const char* shape, const float* f, int M, int n, int Kp, const int8_t* q,
              const float* d, const int32_t* s) {
  int8_t* rq = zeros<int8_t>(size_t(M) * Kp);
  float* rd = zeros<float>(size_t(M) * Kp / 32);
  int32_t* rs = zeros<int32_t>(size_t(M) * Kp / 32);
  CK(kc::quantize_act_q8(f, M, n, Kp, rq, rd, rs, 0));
  const size_t nb = size_t(M) * Kp / 32;
  const bool ok = down(q, size_t(M) * Kp) == down(rq, size_t(M) * Kp) &&
                  !std::memcmp(down(d, nb).data(), down(rd, nb).data(), nb * 4) && down(s, nb) == down(rs, nb);
  report(what, shape, ok, "q, d, s bit-exact vs quantize_act_q8");
  CK(cudaFree(rq));
  CK(cudaFree(rd));
  CK(cudaFree(rs));
}

void check_norm(int M, int n, bool add, bool quant, bool in_place) {
  const int Kp = quant ? (n + 31) / 32 * 32 : 0;
  char shape[64];
  std::snprintf(shape, sizeof shape, "%dx%d%s%s%s", M, n, add ? " +y" : "", quant ? " q8" : "", in_place ? " h=x" : "");
  std::vector<float> x(size_t(M) * n), y(x.size()), w(n);
  for (auto& v : x) v = 3.0f * rnd();
  for (auto& v : y) v = rnd();
  for (auto& v : w) v = 1.0f + 0.2f * rnd();
  float *dx = up(x), *dy = up(y), *dw = up(w), *dh = in_place ? dx : zeros<float>(x.size());
  int8_t* q = quant ? zeros<int8_t>(size_t(M) * Kp) : nullptr;
  float* d = quant ? zeros<float>(size_t(M) * Kp / 32) : nullptr;
  int32_t* s = quant ? zeros<int32_t>(size_t(M) * Kp / 32) : nullptr;
  CK(kc::add_rmsnorm_q8(dx, add ? dy : nullptr, dw, M, n, 1e-5f, dh, Kp, q, d, s, 0));
  CK(cudaDeviceSynchronize());
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = add ? x[i] + y[i] : x[i];
  if (!in_place) report("add_rmsnorm_q8 x += y", shape, down(dx, x.size()) == sum, "bit-exact");
  const auto h = down(dh, x.size());
  double err = 0, mx = 0;
  for (int r = 0; r < M; ++r) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(sum[size_t(r) * n + i]) * sum[size_t(r) * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; ++i) {
      const double ref = sum[size_t(r) * n + i] * inv * w[i];
      err = std::fmax(err, std::fabs(h[size_t(r) * n + i] - ref));
      mx = std::fmax(mx, std::fabs(ref));
    }
  }
  char det[64];
  std::snprintf(det, sizeof det, "h vs f64: %.2e of max (<= 1e-6)", err / mx);
  report("add_rmsnorm_q8 h", shape, err / mx <= 1e-6, det);
  if (quant) check_q8("add_rmsnorm_q8 q8(h)", shape, dh, M, n, Kp, q, d, s);
  for (void* p : {(void*)dx, (void*)dy, (void*)dw, (void*)q, (void*)d, (void*)s}) CK(cudaFree(p));
  if (!in_place) CK(cudaFree(dh));
}

void check_silu(int M, int n) {
  const int Kp = (n + 31) / 32 * 32;
  char shape[32];
  std::snprintf(shape, sizeof shape, "%dx%d", M, n);
  std::vector<float> a(size_t(M) * n), b(a.size());
  for (auto& v : a) v = 4.0f * rnd();
  for (auto& v : b) v = rnd();
  a[0] = 0.0f, b[0] = 0.0f;  // a zero product
  float *da = up(a), *db = up(b), *dy = zeros<float>(a.size()), *ry = zeros<float>(a.size());
  int8_t* q = zeros<int8_t>(size_t(M) * Kp);
  float* d = zeros<float>(size_t(M) * Kp / 32);
  int32_t* s = zeros<int32_t>(size_t(M) * Kp / 32);
  CK(kc::silu_mul_q8(da, db, M, n, Kp, dy, q, d, s, 0));
  CK(kc::silu_mul(da, db, M, n, n, ry, 0));
  CK(cudaDeviceSynchronize());
  const auto y = down(dy, a.size()), r = down(ry, a.size());
  report("silu_mul_q8 y", shape, !std::memcmp(y.data(), r.data(), y.size() * 4), "bit-exact vs silu_mul");
  check_q8("silu_mul_q8 q8(y)", shape, dy, M, n, Kp, q, d, s);
  for (void* p : {(void*)da, (void*)db, (void*)dy, (void*)ry, (void*)q, (void*)d, (void*)s}) CK(cudaFree(p));
}

// µs per launch: 200 launches captured in one graph, replayed 20 times (best replay).
template <typename F>
double time_graph(F&& launch) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 200; ++i) CK(launch(st));
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int rep = 0; rep < 20; ++rep) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::fmin(best, ms);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return best * 1e3 / 200;
}

void time_shapes() {
  for (int n : {4096, 576}) {
    float *x = zeros<float>(n), *y = zeros<float>(n), *w = zeros<float>(n), *h = zeros<float>(n);
    CK(cudaMemset(x, 0, n * 4));
    CK(cudaMemset(y, 0, n * 4));
    int8_t* q = zeros<int8_t>(n);
    float* d = zeros<float>(n / 32);
    int32_t* s = zeros<int32_t>(n / 32);
    const double us = time_graph([&](cudaStream_t st) { return kc::add_rmsnorm_q8(x, y, w, 1, n, 1e-5f, h, n, q, d, s, st); });
    std::printf("  time add_rmsnorm_q8 1x%-6d %6.2f us/launch (graph of 200)\n", n, us);
    for (void* p : {(void*)x, (void*)y, (void*)w, (void*)h, (void*)q, (void*)d, (void*)s}) CK(cudaFree(p));
  }
  for (int n : {14336, 1536}) {
    float *a = zeros<float>(2 * n), *y = zeros<float>(n);
    CK(cudaMemset(a, 0, 2 * n * 4));
    int8_t* q = zeros<int8_t>(n);
    float* d = zeros<float>(n / 32);
    int32_t* s = zeros<int32_t>(n / 32);
    const double us = time_graph([&](cudaStream_t st) { return kc::silu_mul_q8(a, a + n, 1, n, n, y, q, d, s, st); });
    std::printf("  time silu_mul_q8    1x%-6d %6.2f us/launch (graph of 200)\n", n, us);
    for (void* p : {(void*)a, (void*)y, (void*)q, (void*)d, (void*)s}) CK(cudaFree(p));
  }
}

}  // namespace

int main() {
  const char* e = std::getenv("KVDECK_CUDA_NORM_SERIAL");
  std::printf("check_fused (%s kernels)\n", e && e[0] == '1' ? "one-value-a-lane" : "default");
  check_norm(1, 4096, true, true, false);   // Llama-3-8B decode
  check_norm(1, 576, true, true, false);    // SmolLM2 decode
  check_norm(5, 576, true, true, false);    // prefill rows
  check_norm(3, 576, false, false, false);  // plain rmsnorm (the final norm)
  check_norm(1, 4096, false, false, true);  // h == x
  check_norm(1, 8192, true, true, false);   // two register passes
  check_norm(2, 16000, true, true, false);  // four passes
  check_norm(2, 100, true, true, false);    // Kp > n (q8 padding)
  check_norm(2, 98, true, true, false);     // n % 4 != 0: the one-value-a-lane kernel
  check_norm(1, 20000, true, true, false);  // wider than the register kernel
  check_silu(1, 14336);
  check_silu(1, 1536);
  check_silu(6, 1536);
  check_silu(3, 100);  // Kp > n
  check_silu(2, 98);   // n % 4 != 0
  time_shapes();
  std::printf("check_fused: %s (%d failed)\n", g_fail ? "FAILED" : "all ok", g_fail);
  return g_fail ? 1 : 0;
}
