// thread_stress — the engine's thread contract under ThreadSanitizer (cmake -DKVDECK_TSAN=ON
// -DKVDECK_TESTS=ON -DKVDECK_PYTHON=OFF; `make tsan-check`).
//
// A tiny random f32 Llama-shaped model on a small pool (constant eviction). Thread A runs
// calls (begin → forward prefill → forward decode steps → finish) and pins; thread B reads
// snapshot(), tree_nodes(), dropped_events() in a loop; thread C cancels some forwards
// through a CancelFlag and drains events; then check_integrity(). Exit code 0 = pass; the
// sanitizer reports races on stderr and sets a non-zero exit code itself.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "kvdeck/engine.h"

using namespace kvdeck;

namespace {

WeightView linear(Engine& e, std::mt19937& rng, int N, int K) {
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> w(size_t(N) * K);
  for (float& x : w) x = nd(rng);
  WeightView v;
  v.dtype = DType::F32;
  v.N = N;
  v.K = K;
  v.Kp = K;
  v.data = e.upload(w.data(), w.size() * sizeof(float));
  return v;
}

const float* ones(Engine& e, int n) {
  std::vector<float> w(n, 1.0f);
  return static_cast<const float*>(e.upload(w.data(), w.size() * sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
  const int n_calls = argc > 1 ? std::atoi(argv[1]) : 400;
  ModelConfig c;
  c.hidden = 64;
  c.intermediate = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab = 256;
  for (int i = 0; i < c.head_dim / 2; ++i) c.rope_inv_freq.push_back(1.0f / float(1 << i));
  EngineOptions o;
  o.threads = 2;
  o.kv_block = 4;
  o.kv_pages = 24;  // 96 tokens: calls of ~40 tokens evict all the time
  o.max_chunk = 16;
  Engine eng(c, o);
  std::mt19937 rng(1);
  ModelWeights w;
  w.embed = linear(eng, rng, c.vocab, c.hidden);
  w.lm_head = w.embed;
  w.final_norm = ones(eng, c.hidden);
  const int QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights L;
    L.attn_norm = ones(eng, c.hidden);
    L.mlp_norm = ones(eng, c.hidden);
    L.wq = linear(eng, rng, QD, c.hidden);
    L.wk = linear(eng, rng, KD, c.hidden);
    L.wv = linear(eng, rng, KD, c.hidden);
    L.wo = linear(eng, rng, c.hidden, QD);
    L.w_gate = linear(eng, rng, c.intermediate, c.hidden);
    L.w_up = linear(eng, rng, c.intermediate, c.hidden);
    L.w_down = linear(eng, rng, c.hidden, c.intermediate);
    w.layers.push_back(L);
  }
  eng.set_weights(w);

  std::atomic<bool> stop{false};
  std::atomic<long> reads{0}, cancels{0}, calls{0}, full{0};
  CancelFlag flag;
  std::thread reader([&] {
    while (!stop.load()) {
      const PoolSnapshot s = eng.snapshot();
      if (s.used_pages + s.free_pages != s.total_pages) {
        std::fprintf(stderr, "snapshot: used %d + free %d != total %d\n", s.used_pages, s.free_pages, s.total_pages);
        std::exit(2);
      }
      for (const NodeInfo& n : eng.tree_nodes())
        if (n.tokens.size() != n.pages.size() * size_t(s.block)) std::exit(3);
      (void)eng.dropped_events();
      reads.fetch_add(1);
    }
  });
  std::thread canceller([&] {
    std::mt19937 r(7);
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(500 + r() % 4000));
      if (r() % 4 == 0) flag.set.store(true);  // about one call in several is cancelled
      (void)eng.drain_events();
    }
  });
  std::mt19937 r(3);
  std::vector<float> logits(c.vocab);
  std::vector<int32_t> shared(12);
  for (auto& t : shared) t = int32_t(r() % c.vocab);
  int pin = -1;
  for (int i = 0; i < n_calls; ++i) {
    std::vector<int32_t> prompt = shared;
    for (int k = 0; k < 20 + int(r() % 20); ++k) prompt.push_back(int32_t(r() % c.vocab));
    flag.set.store(false);
    const int seq = eng.open_sequence(1 + i % 3);
    try {
      const int cached = eng.begin(seq, prompt.data(), int(prompt.size()));
      eng.forward(seq, prompt.data() + cached, int(prompt.size()) - cached, logits.data(), false, &flag);
      for (int d = 0; d < 4; ++d) {
        const int32_t tok = int32_t(r() % c.vocab);
        eng.forward(seq, &tok, 1, logits.data(), false, &flag);
      }
    } catch (const Cancelled&) {
      cancels.fetch_add(1);
    } catch (const KvPoolFull&) {
      full.fetch_add(1);
    }
    eng.finish(seq);
    if (i % 50 == 0) {
      if (pin >= 0) eng.unpin(pin);
      pin = eng.pin(1, shared.data(), int(shared.size())).first;
    }
    calls.fetch_add(1);
  }
  stop.store(true);
  reader.join();
  canceller.join();
  eng.check_integrity();
  std::printf("thread_stress: %ld calls (%ld cancelled, %ld pool full), %ld concurrent reads; integrity ok\n",
              calls.load(), cancels.load(), full.load(), reads.load());
  return 0;
}
