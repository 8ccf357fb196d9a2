// kvdeck/model.h — model configuration and the weights as the engine holds them.
//
// Owner: Engine. Weights live in memory the backend allocated (host memory for the CPU
// backend, device memory for CUDA); WeightView points into it.
#pragma once
#include <string>
#include <vector>

#include "kvdeck/kernels.h"

namespace kvdeck {

// Llama-family architecture parameters (DESIGN.md § Engine; docs/ENGINE.md config.json).
struct ModelConfig {
  int hidden = 0;         // H
  int intermediate = 0;   // F
  int n_layers = 0;       // L
  int n_heads = 0;        // query heads
  int n_kv_heads = 0;     // key/value heads (GQA: n_heads % n_kv_heads == 0)
  int head_dim = 0;       // D
  int vocab = 0;          // V
  float rms_eps = 1e-5f;
  bool attn_bias = false;  // Qwen2: q/k/v biases
  bool qk_norm = false;    // Qwen3: RMSNorm over head_dim of q and k
  std::vector<float> rope_inv_freq;  // [D/2], scaling (e.g. Llama 3) already applied
};

// One transformer block's weights (views into backend memory).
struct LayerWeights {
  const float* attn_norm = nullptr;   // [H]
  const float* mlp_norm = nullptr;    // [H]
  WeightView wq, wk, wv, wo;          // [nh*D, H], [nkv*D, H], [nkv*D, H], [H, nh*D]
  const float* bq = nullptr;          // [nh*D]  (attn_bias only)
  const float* bk = nullptr;          // [nkv*D]
  const float* bv = nullptr;          // [nkv*D]
  const float* q_norm = nullptr;      // [D]     (qk_norm only)
  const float* k_norm = nullptr;      // [D]
  WeightView w_gate, w_up, w_down;    // [F, H], [F, H], [H, F]
};

struct ModelWeights {
  WeightView embed;                   // F32, F16 or W8A8 [V, H] (row lookup)
  const float* final_norm = nullptr;  // [H]
  WeightView lm_head;                 // [V, H]; the embedding itself when tied
  std::vector<LayerWeights> layers;   // [L]
};

}  // namespace kvdeck
