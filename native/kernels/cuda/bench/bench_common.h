// bench_common.h — shared helpers of gpu_bench: error checks, device buffers, random data,
// event timing (median of repetitions, rotating over copies larger than L2), result records.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#define CK(call)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, \
                   __LINE__, #call);                                                   \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

namespace bench {

// Options shared by the benchmarks.
struct Options {
  bool quick = false;       // validation only, small shapes, no timing
  int reps = 20;            // timed repetitions (median reported)
  size_t rotate_bytes = size_t(256) << 20;  // copies of the inputs at least this large (> 4x L2)
  double copy_gbs = 0;      // measured device copy bandwidth (read + write), GB/s
  bool attn_decode = false; // --attn-decode: the decode attention rows only (no prefill, no kpc4)
  bool gemv1 = false;       // --gemv1: the batch-1 GEMV rows of the 8B shapes only
};

// One line of results: validation or timing.
struct Record {
  std::string kind;         // "validate" | "time"
  std::string name;         // kernel / variant
  std::string shape;        // e.g. "4096x6144 M=1"
  double us = 0, bytes = 0, gbs = 0, frac_copy = 0;
  double max_abs = 0, rel_max = 0, rel_norm = 0, bound = 0;
  bool pass = true;
};

std::vector<Record>& records();
void add_validation(const std::string& name, const std::string& shape, double max_abs,
                    double rel_max, double rel_norm, double bound);
void add_timing(const Options& o, const std::string& name, const std::string& shape, double us,
                double bytes);

// Error of out against ref (float64): max |d|, max |d| / max |ref|, ||d|| / ||ref||.
struct ErrStats {
  double max_abs = 0, rel_max = 0, rel_norm = 0;
  bool finite = true;
};
ErrStats compare(const float* out, const double* ref, size_t n);

// Deterministic pseudo-random numbers (splitmix64).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float normal() {
    const float u = std::max(uniform(), 1e-7f), v = uniform();
    return std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
  }
};

// Device buffers.
template <typename T>
T* dalloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}
template <typename T>
T* dupload(const std::vector<T>& h) {
  T* p = dalloc<T>(h.size());
  CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <typename T>
std::vector<T> ddownload(const T* p, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
// Fill n bytes with random bytes on the device; lo/span map each byte to lo + b % span.
void dfill_random(void* p, size_t n, uint64_t seed, int lo = 0, int span = 256);
// Fill n f16 values with random values in [lo, hi) on the device.
void dfill_random_f16(uint16_t* p, size_t n, uint64_t seed, float lo, float hi);

// Median time in µs of one call of `launch(i, stream)` (i cycles over copies): per_rep calls
// captured once into a CUDA graph (no host launch gaps, as a graph-replayed decode step), each
// repetition timing one replay between two events, after warm-up replays.
double time_us(const Options& o, int copies, const std::function<void(int, cudaStream_t)>& launch);

// Copies needed so that copies * bytes >= rotate_bytes.
inline int copies_for(const Options& o, double bytes) {
  return std::max(1, int(std::ceil(double(o.rotate_bytes) / std::max(bytes, 1.0))));
}

void bench_gemv(Options& o);
void bench_attention(Options& o);
void profile_attention(Options& o);  // f16 / NVFP4 at 4K and 32K, one launch of each kernel (for ncu)
void bench_prefill_attention(Options& o);  // M new queries over cached + own pages (bench_attention runs it)
void bench_attention_kpc4(Options& o);  // kpc4 decode (bench_attention_kpc4.cu; bench_attention runs it)
void bench_elementwise(Options& o);

}  // namespace bench
