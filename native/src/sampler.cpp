#include "kvdeck/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvdeck {

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

void check_sampling(const SamplingParams& p) {
  if (p.temperature > 0.0f && !(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw std::invalid_argument("top_p must be in (0, 1]");
}

int Sampler::sample(const float* logits, int V, const SamplingParams& p) {
  if (p.temperature <= 0.0f) return argmax(logits, V);
  check_sampling(p);
  return sample_with_uniform(logits, V, p, uniform(), cand_);
}

// Candidates are the top_k logits (or, without top_k, the smallest prefix of the sorted
// logits that holds top_p of the mass: tried with 256 first, the full vocabulary if not).
// r = u * z is what std::uniform_real_distribution<double>(0, z) returns for the same draw.
int sample_with_uniform(const float* logits, int V, const SamplingParams& p, double u,
                        std::vector<std::pair<float, int>>& cand_) {
  check_sampling(p);
  const float inv_t = 1.0f / p.temperature;
  const float mx = logits[argmax(logits, V)];
  double total = 0.0;  // softmax denominator over the whole vocabulary
  for (int i = 0; i < V; ++i) total += std::exp(double((logits[i] - mx) * inv_t));

  int k = p.top_k > 0 ? std::min(p.top_k, V) : std::min(256, V);
  for (;;) {
    cand_.resize(V);
    for (int i = 0; i < V; ++i) cand_[i] = {logits[i], i};
    auto by_logit = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
    cand_.resize(k);
    // Mass held by these k (relative to the full vocabulary unless top_k restricts it).
    double mass = 0.0;
    for (auto& c : cand_) mass += std::exp(double((c.first - mx) * inv_t));
    const double denom = p.top_k > 0 ? mass : total;
    if (p.top_k > 0 || mass / denom >= p.top_p || k == V) {
      // Keep the nucleus: the smallest prefix whose mass reaches top_p.
      double acc = 0.0;
      size_t keep = cand_.size();
      for (size_t i = 0; i < cand_.size(); ++i) {
        acc += std::exp(double((cand_[i].first - mx) * inv_t)) / denom;
        if (acc >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
      cand_.resize(keep);
      double z = 0.0;
      for (auto& c : cand_) z += std::exp(double((c.first - mx) * inv_t));
      double r = u * z;
      for (auto& c : cand_) {
        r -= std::exp(double((c.first - mx) * inv_t));
        if (r <= 0.0) return c.second;
      }
      return cand_.back().second;
    }
    k = V;  // the top 256 did not hold top_p of the mass: use everything
  }
}

}  // namespace kvdeck
