// kvdeck/sampler.h — next-token choice from logits: greedy, temperature, top-k, top-p.
// Owner: the caller (one Sampler per generation stream). sample() mutates only the RNG.
// The choice is split in two so a backend can make it where the logits are (Backend::sample,
// the CUDA kernels in native/kernels/cuda/sampling.cu): the RNG stays here and hands out one
// uniform draw u per sampled token (uniform()), and sample_with_uniform() is the arithmetic.
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kvdeck {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // nucleus mass in (0, 1]
};

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  // argmax for temperature <= 0 (no draw); else sample_with_uniform(uniform()).
  int sample(const float* logits /*[V]*/, int V, const SamplingParams& p);
  // The draw sample() makes for a token (temperature > 0): U[0, 1) from the generator.
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

 private:
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> cand_;  // scratch: (logit, id)
};

int argmax(const float* x, int n);
// std::invalid_argument unless top_p is in (0, 1] (checked only when temperature > 0).
void check_sampling(const SamplingParams& p);
// The sampled id for temperature > 0 given the draw u in [0, 1): candidates sorted by logit
// (descending, lower id first on ties), the top_k of them (all without top_k), then the
// smallest prefix holding top_p of the softmax mass (relative to the top_k candidates, or to
// the whole vocabulary without top_k); weights exp((l - max) / T) in double; the id where the
// running sum of weights first reaches u * (the prefix's sum).
int sample_with_uniform(const float* logits, int V, const SamplingParams& p, double u,
                        std::vector<std::pair<float, int>>& scratch);

}  // namespace kvdeck
