// kvdeck/weights_loader.h — map named host tensors (docs/ENGINE.md names) onto the engine.
// Uploads every tensor the model uses into engine-owned backend memory and installs the
// views. Throws std::invalid_argument naming the tensor on any missing or misshapen entry.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvdeck/engine.h"

namespace kvdeck {

struct HostTensor {
  const void* data = nullptr;
  std::string dtype;             // "f32" | "f16" | "u8"
  std::vector<int64_t> shape;
  size_t nbytes = 0;
};

using NamedTensors = std::unordered_map<std::string, HostTensor>;

// tie_embeddings: use the embedding as lm_head when "lm_head.*" is absent.
void load_weights(Engine& engine, const NamedTensors& tensors, bool tie_embeddings);

}  // namespace kvdeck
