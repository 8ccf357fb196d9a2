#include "kvdeck/weights_loader.h"

#include <stdexcept>

namespace kvdeck {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

struct Loader {
  Engine& eng;
  const NamedTensors& t;

  const HostTensor* find(const std::string& name) const {
    auto it = t.find(name);
    return it == t.end() ? nullptr : &it->second;
  }
  const HostTensor& get(const std::string& name, const std::string& dtype,
                        const std::vector<int64_t>& shape) const {
    const HostTensor* h = find(name);
    if (!h) throw std::invalid_argument("weights: tensor " + name + " is missing");
    if (h->dtype != dtype)
      throw std::invalid_argument("weights: tensor " + name + " has dtype " + h->dtype + ", expected " + dtype);
    if (h->shape != shape)
      throw std::invalid_argument("weights: tensor " + name + " has shape " + shape_str(h->shape) +
                                  ", expected " + shape_str(shape));
    return *h;
  }
  const void* up(const HostTensor& h) const { return eng.upload(h.data, h.nbytes); }

  const float* vec(const std::string& name, int n) const {
    return static_cast<const float*>(up(get(name, "f32", {n})));
  }

  // A linear weight [N, K] in whichever format the file holds (docs/ENGINE.md).
  WeightView linear(const std::string& p, int N, int K) const {
    WeightView w;
    w.N = N;
    w.K = K;
    if (const HostTensor* h = find(p + ".weight")) {
      if (h->dtype != "f32" && h->dtype != "f16")
        throw std::invalid_argument("weights: tensor " + p + ".weight has dtype " + h->dtype);
      w.dtype = h->dtype == "f32" ? DType::F32 : DType::F16;
      w.Kp = K;
      w.data = up(get(p + ".weight", h->dtype, {N, K}));
      return w;
    }
    const int Kp = round_up(K, kQuantPad);
    w.Kp = Kp;
    if (!find(p + ".weight.codes"))
      throw std::invalid_argument("weights: tensor " + p + ".weight (or .weight.codes) is missing");
    w.data = up(get(p + ".weight.codes", "u8", {N, Kp / 2}));
    if (find(p + ".weight.tscale")) {
      w.dtype = DType::NVFP4;
      w.group = kNvfp4Block;
      w.scales = up(get(p + ".weight.scales", "u8", {N, Kp / kNvfp4Block}));
      w.tscale = *static_cast<const float*>(get(p + ".weight.tscale", "f32", {1}).data);
    } else {
      w.dtype = DType::W4A8;
      const HostTensor* s = find(p + ".weight.scales");
      if (!s || s->shape.size() != 2 || s->shape[1] <= 0 || Kp % s->shape[1] != 0)
        throw std::invalid_argument("weights: tensor " + p + ".weight.scales is missing or misshapen");
      w.group = Kp / int(s->shape[1]);
      w.scales = up(get(p + ".weight.scales", "f16", {N, s->shape[1]}));
    }
    return w;
  }
};

}  // namespace

void load_weights(Engine& engine, const NamedTensors& tensors, bool tie_embeddings) {
  const ModelConfig& c = engine.config();
  const Loader ld{engine, tensors};
  const int H = c.hidden, F = c.intermediate, QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  ModelWeights w;
  w.embed = ld.linear("model.embed_tokens", c.vocab, H);
  if (w.embed.dtype != DType::F32 && w.embed.dtype != DType::F16)
    throw std::invalid_argument("weights: model.embed_tokens.weight must be f32 or f16");
  w.final_norm = ld.vec("model.norm.weight", H);
  const bool has_head = ld.find("lm_head.weight") || ld.find("lm_head.weight.codes");
  if (has_head)
    w.lm_head = ld.linear("lm_head", c.vocab, H);
  else if (tie_embeddings)
    w.lm_head = w.embed;
  else
    throw std::invalid_argument("weights: tensor lm_head.weight is missing and embeddings are not tied");
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = ld.vec(p + "input_layernorm.weight", H);
    L.mlp_norm = ld.vec(p + "post_attention_layernorm.weight", H);
    L.wq = ld.linear(p + "self_attn.q_proj", QD, H);
    L.wk = ld.linear(p + "self_attn.k_proj", KD, H);
    L.wv = ld.linear(p + "self_attn.v_proj", KD, H);
    L.wo = ld.linear(p + "self_attn.o_proj", H, QD);
    if (c.attn_bias) {
      L.bq = ld.vec(p + "self_attn.q_proj.bias", QD);
      L.bk = ld.vec(p + "self_attn.k_proj.bias", KD);
      L.bv = ld.vec(p + "self_attn.v_proj.bias", KD);
    }
    if (c.qk_norm) {
      L.q_norm = ld.vec(p + "self_attn.q_norm.weight", c.head_dim);
      L.k_norm = ld.vec(p + "self_attn.k_norm.weight", c.head_dim);
    }
    L.w_gate = ld.linear(p + "mlp.gate_proj", F, H);
    L.w_up = ld.linear(p + "mlp.up_proj", F, H);
    L.w_down = ld.linear(p + "mlp.down_proj", H, F);
    w.layers.push_back(L);
  }
  engine.set_weights(std::move(w));
}

}  // namespace kvdeck
