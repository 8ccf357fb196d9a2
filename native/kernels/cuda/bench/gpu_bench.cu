// gpu_bench.cu — validation and benchmark of kvdeck's CUDA kernels (native/kernels/cuda).
//
//   gpu_bench [--quick] [--attn | --attn-decode | --gemv1] [--reps N] [--json FILE] | --profile-attn
//
// Each kernel is checked against the CPU oracle (native/kernels/cpu scalar kernels and the
// format codecs of native/src/formats.cpp, or a float64 loop) and, without --quick, timed
// with CUDA events (median of repetitions over input copies larger than L2). Prints one
// line per check / timing and a PASS/FAIL summary; exit status 0 only if every check
// passed. Build: native/kernels/cuda/bench/build.sh. Driver with torch: run_bench.py.
#include <cstring>

#include <cuda_fp16.h>

#include "bench_common.h"
#include "kernels_cuda.h"

namespace bench {

// =====================================================================================
// Records
// =====================================================================================

std::vector<Record>& records() {
  static std::vector<Record> r;
  return r;
}

void add_validation(const std::string& name, const std::string& shape, double max_abs,
                    double rel_max, double rel_norm, double bound) {
  Record r;
  r.kind = "validate", r.name = name, r.shape = shape;
  r.max_abs = max_abs, r.rel_max = rel_max, r.rel_norm = rel_norm, r.bound = bound;
  r.pass = std::isfinite(rel_norm) && std::isfinite(rel_max) && rel_norm <= bound && rel_max <= 10 * bound;
  std::printf("%-5s %-26s %-28s max_abs %.3e  rel_max %.3e  rel_norm %.3e  (bound %.1e)\n",
              r.pass ? "PASS" : "FAIL", name.c_str(), shape.c_str(), max_abs, rel_max, rel_norm, bound);
  records().push_back(r);
}

void add_timing(const Options& o, const std::string& name, const std::string& shape, double us,
                double bytes) {
  Record r;
  r.kind = "time", r.name = name, r.shape = shape, r.us = us, r.bytes = bytes;
  r.gbs = bytes / (us * 1e-6) / 1e9;
  r.frac_copy = o.copy_gbs > 0 ? r.gbs / o.copy_gbs : 0;
  std::printf("TIME  %-26s %-28s %9.2f us  %8.1f GB/s  %5.3f of copy  (%.1f MB)\n", name.c_str(),
              shape.c_str(), us, r.gbs, r.frac_copy, bytes / 1e6);
  records().push_back(r);
}

ErrStats compare(const float* out, const double* ref, size_t n) {
  ErrStats e;
  double ref_max = 0, d2 = 0, r2 = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) e.finite = false;
    const double d = std::fabs(double(out[i]) - ref[i]);
    e.max_abs = std::max(e.max_abs, d);
    ref_max = std::max(ref_max, std::fabs(ref[i]));
    d2 += d * d;
    r2 += ref[i] * ref[i];
  }
  e.rel_max = ref_max > 0 ? e.max_abs / ref_max : e.max_abs;
  e.rel_norm = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  if (!e.finite) e.rel_max = e.rel_norm = INFINITY;
  return e;
}

// =====================================================================================
// Random device data and timing
// =====================================================================================

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_bytes_kernel(uint8_t* p, size_t n, uint64_t seed, int lo, int span) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(lo + int(mix64(seed + i * 0x9E3779B97F4A7C15ull) % uint64_t(span)));
}

__global__ void fill_f16_kernel(uint16_t* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(mix64(seed + i * 0x9E3779B97F4A7C15ull) >> 40) * (1.0f / 16777216.0f);
    const __half h = __float2half_rn(lo + (hi - lo) * u);
    p[i] = *reinterpret_cast<const uint16_t*>(&h);
  }
}

void dfill_random(void* p, size_t n, uint64_t seed, int lo, int span) {
  fill_bytes_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), n, seed, lo, span);
  CK(cudaGetLastError());
}

void dfill_random_f16(uint16_t* p, size_t n, uint64_t seed, float lo, float hi) {
  fill_f16_kernel<<<1024, 256>>>(p, n, seed, lo, hi);
  CK(cudaGetLastError());
}

double time_us(const Options& o, int copies, const std::function<void(int, cudaStream_t)>& launch) {
  const int per_rep = std::max(copies, 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int i = 0; i < copies; ++i) launch(i, st);  // first-use costs outside the graph
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_rep; ++i) launch(i % copies, st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));  // warm-up
  CK(cudaStreamSynchronize(st));
  std::vector<double> t;
  for (int r = 0; r < o.reps; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3 / per_rep);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device copy bandwidth, bytes read + written, 1 GiB: a 16-byte-per-thread copy kernel (the
// access pattern of the kernels measured here) and cudaMemcpyAsync; the higher one is the
// reference for "fraction of copy".
__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __ldg(src + i);
}

double measure_copy_gbs(const Options& o) {
  const size_t n = size_t(1) << 30;
  void* src = dalloc<uint8_t>(n);
  void* dst = dalloc<uint8_t>(n);
  dfill_random(src, n, 1);
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  Options oo = o;
  oo.reps = std::max(o.reps / 4, 3);
  const double us_k = time_us(oo, 1, [&](int, cudaStream_t st) {
    copy_kernel<<<p.multiProcessorCount * 8, 256, 0, st>>>(static_cast<const uint4*>(src),
                                                           static_cast<uint4*>(dst), n / 16);
  });
  // cudaMemcpyAsync outside a graph (graph memcpy nodes can take the copy engines)
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < 8; ++r) {
    CK(cudaEventRecord(a));
    CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3);
  }
  std::sort(t.begin(), t.end());
  const double us_m = t[t.size() / 2];
  CK(cudaFree(src));
  CK(cudaFree(dst));
  const double gk = 2.0 * n / (us_k * 1e-6) / 1e9, gm = 2.0 * n / (us_m * 1e-6) / 1e9;
  std::printf("COPY  1 GiB, read + write: copy kernel %.1f GB/s, cudaMemcpyAsync %.1f GB/s\n", gk, gm);
  return std::max(gk, gm);
}

void write_json(const Options& o, const char* path) {
  FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path);
    std::exit(2);
  }
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  std::fprintf(f, "{\"device\": \"%s\", \"sm\": %d, \"l2_bytes\": %d, \"copy_gbs\": %.3f, \"records\": [\n",
               p.name, p.major * 10 + p.minor, p.l2CacheSize, o.copy_gbs);
  const auto& rs = records();
  for (size_t i = 0; i < rs.size(); ++i) {
    const Record& r = rs[i];
    std::fprintf(f,
                 "  {\"kind\": \"%s\", \"name\": \"%s\", \"shape\": \"%s\", \"us\": %.4f, \"bytes\": %.0f, "
                 "\"gbs\": %.3f, \"frac_copy\": %.5f, \"max_abs\": %.4e, \"rel_max\": %.4e, "
                 "\"rel_norm\": %.4e, \"bound\": %.1e, \"pass\": %s}%s\n",
                 r.kind.c_str(), r.name.c_str(), r.shape.c_str(), r.us, r.bytes, r.gbs, r.frac_copy,
                 r.max_abs, r.rel_max, r.rel_norm, r.bound, r.pass ? "true" : "false",
                 i + 1 < rs.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

// Launchers refuse shapes outside their contracts before enqueueing anything.
void check_contracts() {
  namespace kc = kvdeck::cuda;
  int bad = 0, total = 0;
  auto expect_invalid = [&](cudaError_t e) {
    ++total;
    bad += e != cudaErrorInvalidValue;
    cudaGetLastError();
  };
  expect_invalid(kc::gemv_w4a8(nullptr, nullptr, 16, 64, 64, nullptr, nullptr, nullptr, 1, nullptr, 64, 0));
  expect_invalid(kc::gemv_w4a8(nullptr, nullptr, 96, 64, 64, nullptr, nullptr, nullptr, 1, nullptr, 64, 0));
  expect_invalid(kc::gemv_nvfp4_dp4a(nullptr, nullptr, 1.f, 64, 64, nullptr, nullptr, 9, nullptr, 64, 0));
  expect_invalid(kc::gemv_nvfp4_dp4a(nullptr, nullptr, 1.f, 64, 48, nullptr, nullptr, 1, nullptr, 64, 0));
  expect_invalid(kc::gemv_nvfp4_f16(nullptr, nullptr, 1.f, 64, 64, nullptr, 1, nullptr, 32, 0));
  expect_invalid(kc::quantize_act_q8(nullptr, 1, 100, 96, nullptr, nullptr, nullptr, 0));
  kc::PagedKv kv;
  kv.D = 96;
  expect_invalid(kc::attention_decode(kv, nullptr, 32, nullptr, 16, 1.f, nullptr, nullptr, 0));
  kv.D = 128, kv.n_kv = 8;
  expect_invalid(kc::attention_decode(kv, nullptr, 36, nullptr, 16, 1.f, nullptr, nullptr, 0));
  expect_invalid(kc::attention_decode(kv, nullptr, 128, nullptr, 16, 1.f, nullptr, nullptr, 0));
  expect_invalid(kc::rope(nullptr, 1, 32, 128, 100, nullptr, nullptr, 0));
  expect_invalid(kc::gemv_w4a8_q8fused(nullptr, nullptr, 32, 64, 20000, 20000, nullptr, nullptr, 0));
  expect_invalid(kc::gemv_nvfp4_q8fused(nullptr, nullptr, 1.f, 64, 100, 96, nullptr, nullptr, 0));
  add_validation("contracts (not refused)", std::to_string(total) + " bad calls", bad, bad, bad, 0.0);
}

}  // namespace bench

int main(int argc, char** argv) {
  bench::Options o;
  const char* json = nullptr;
  bool attn_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) o.quick = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!std::strcmp(argv[i], "--attn")) attn_only = true;  // the attention rows only
    else if (!std::strcmp(argv[i], "--gemv1")) o.gemv1 = true;  // batch-1 GEMV rows of the 8B shapes only
    else if (!std::strcmp(argv[i], "--attn-decode")) attn_only = o.attn_decode = true;  // decode rows only
    else if (!std::strcmp(argv[i], "--profile-attn")) {
      bench::profile_attention(o);
      return 0;
    }
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--attn | --attn-decode | --gemv1] [--reps N] [--json FILE] | --profile-attn\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("device %s sm_%d%d, %d SMs, L2 %d MB\n", p.name, p.major, p.minor, p.multiProcessorCount,
              p.l2CacheSize >> 20);
  o.rotate_bytes = std::max<size_t>(o.rotate_bytes, size_t(p.l2CacheSize) * 4);
  if (!o.quick) o.copy_gbs = bench::measure_copy_gbs(o);
  if (o.gemv1) {
    bench::bench_gemv(o);
  } else if (!attn_only) {
    bench::check_contracts();
    bench::bench_elementwise(o);
    bench::bench_gemv(o);
  }
  if (!o.gemv1) bench::bench_attention(o);
  if (json) bench::write_json(o, json);
  int fails = 0, checks = 0;
  for (const auto& r : bench::records())
    if (r.kind == "validate") ++checks, fails += !r.pass;
  std::printf("%s: %d of %d checks passed\n", fails ? "FAIL" : "PASS", checks - fails, checks);
  return fails ? 1 : 0;
}
