// kvdeck/sampler.h — next-token choice from logits: greedy, temperature, top-k, top-p.
// Owner: the caller (one Sampler per generation stream). sample() mutates only the RNG.
#pragma once
#include <cstdint>
#include <random>
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
  int sample(const float* logits /*[V]*/, int V, const SamplingParams& p);

 private:
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> cand_;  // scratch: (logit, id)
};

int argmax(const float* x, int n);

}  // namespace kvdeck
