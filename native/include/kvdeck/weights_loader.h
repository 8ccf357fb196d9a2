// kvdeck/weights_loader.h — named host tensors (docs/ENGINE.md names) onto the engine,
// one tensor at a time.
//
// Contracts
// - WeightsBuilder::add() checks one tensor's name, dtype and shape against the engine's
//   ModelConfig, then copies its bytes into engine-owned backend memory (Engine::upload)
//   before it returns: the caller may drop or reuse its host buffer right after, so a
//   loader never needs more than one tensor in host memory besides the engine's copy.
// - finish() assembles ModelWeights from what was added (the linear format of each layer
//   is inferred from which names exist) and installs it (Engine::set_weights). After
//   finish() — successful or not — the builder refuses further calls.
// - Every problem is a std::invalid_argument naming the tensor: an unknown name, a name
//   given twice, a wrong dtype or shape, a missing tensor, a tensor the chosen format does
//   not use (e.g. both X.weight and X.weight.codes).
// - On error the bytes already uploaded stay owned by the engine (freed with it); an
//   engine whose load failed should be discarded.
// - Thread-safe: add() and finish() may be called from any thread (one internal mutex;
//   uploads of different tensors are serialised).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvdeck/engine.h"

namespace kvdeck {

// A caller-owned host tensor (row-major, contiguous).
struct HostTensor {
  const void* data = nullptr;
  std::string dtype;             // "f32" | "f16" | "u8"
  std::vector<int64_t> shape;
  size_t nbytes = 0;             // must equal prod(shape) * itemsize(dtype)
};

class WeightsBuilder {
 public:
  // tie_embeddings: use the embedding as lm_head when no "lm_head.*" tensor is added.
  WeightsBuilder(Engine& engine, bool tie_embeddings);

  // Validate and upload one tensor (see contracts). Mutates the engine (weight memory).
  void add(const std::string& name, const HostTensor& t);
  // Install the weights; throws naming the first missing or unused tensor.
  void finish();

  int count() const;                 // tensors added so far
  size_t uploaded_bytes() const;     // bytes copied into the engine so far

 private:
  struct Shape2 {
    int N = 0, K = 0;
  };
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    const void* device = nullptr;    // from Engine::upload (null for host-only scalars)
    float scalar = 0.0f;             // X.weight.tscale, kept on the host
    bool used = false;
  };
  void check_spec(const std::string& name, const HostTensor& t) const;
  Entry* find(const std::string& name);
  const float* vec(const std::string& name);
  WeightView linear(const std::string& prefix);

  Engine& engine_;
  const bool tie_;
  std::unordered_map<std::string, Shape2> linears_;   // "model.layers.3.self_attn.q_proj" -> [N, K]
  std::unordered_map<std::string, int> vectors_;      // "model.norm.weight" -> n
  std::unordered_map<std::string, Entry> got_;
  size_t bytes_ = 0;
  bool done_ = false;
  mutable std::mutex mu_;
};


}  // namespace kvdeck
