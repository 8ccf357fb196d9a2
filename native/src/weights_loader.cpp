// weights_loader.cpp — WeightsBuilder (kvdeck/weights_loader.h): per-tensor validation and
// upload, then assembly of ModelWeights from docs/ENGINE.md names.
#include "kvdeck/weights_loader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace kvdeck {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

size_t itemsize(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "f16") return 2;
  if (dtype == "u8" || dtype == "i8") return 1;
  return 0;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("weights: " + msg); }

void expect(const std::string& name, const HostTensor& t, const std::string& dtype,
            const std::vector<int64_t>& shape) {
  if (t.dtype != dtype) fail("tensor " + name + " has dtype " + t.dtype + ", expected " + dtype);
  if (t.shape != shape)
    fail("tensor " + name + " has shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
}

}  // namespace

// ---- construction: the tensor names this model's config implies ------------------------
WeightsBuilder::WeightsBuilder(Engine& engine, bool tie_embeddings) : engine_(engine), tie_(tie_embeddings) {
  const ModelConfig& c = engine.config();
  const int H = c.hidden, F = c.intermediate, QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  linears_["model.embed_tokens"] = {c.vocab, H};
  linears_["lm_head"] = {c.vocab, H};
  vectors_["model.norm.weight"] = H;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    vectors_[p + "input_layernorm.weight"] = H;
    vectors_[p + "post_attention_layernorm.weight"] = H;
    linears_[p + "self_attn.q_proj"] = {QD, H};
    linears_[p + "self_attn.k_proj"] = {KD, H};
    linears_[p + "self_attn.v_proj"] = {KD, H};
    linears_[p + "self_attn.o_proj"] = {H, QD};
    linears_[p + "mlp.gate_proj"] = {F, H};
    linears_[p + "mlp.up_proj"] = {F, H};
    linears_[p + "mlp.down_proj"] = {H, F};
    if (c.attn_bias) {
      vectors_[p + "self_attn.q_proj.bias"] = QD;
      vectors_[p + "self_attn.k_proj.bias"] = KD;
      vectors_[p + "self_attn.v_proj.bias"] = KD;
    }
    if (c.qk_norm) {
      vectors_[p + "self_attn.q_norm.weight"] = c.head_dim;
      vectors_[p + "self_attn.k_norm.weight"] = c.head_dim;
    }
  }
}

// ---- add: one tensor ---------------------------------------------------------------------
void WeightsBuilder::check_spec(const std::string& name, const HostTensor& t) const {
  if (done_) fail("tensor " + name + " added after finish()");
  if (got_.count(name)) fail("tensor " + name + " given twice");
  const size_t isz = itemsize(t.dtype);
  if (isz == 0) fail("tensor " + name + " has dtype " + t.dtype + " (f32, f16, u8 or i8 expected)");
  size_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<size_t>::max() / isz / size_t(d)))
      fail("tensor " + name + " has an invalid shape " + shape_str(t.shape));
    n *= size_t(d);
  }
  if (n * isz != t.nbytes)
    fail("tensor " + name + " has " + std::to_string(t.nbytes) + " bytes; shape " + shape_str(t.shape) + " " +
         t.dtype + " needs " + std::to_string(n * isz));
  if (t.nbytes && !t.data) fail("tensor " + name + " has no data");

  if (auto v = vectors_.find(name); v != vectors_.end()) return expect(name, t, "f32", {v->second});
  static const char* const kSuffixes[] = {".weight", ".weight.codes", ".weight.scales", ".weight.tscale",
                                          ".weight.mins"};
  for (const char* suffix : kSuffixes) {
    if (!ends_with(name, suffix)) continue;
    const auto it = linears_.find(name.substr(0, name.size() - std::strlen(suffix)));
    if (it == linears_.end()) break;
    const int N = it->second.N, K = it->second.K, Kp = round_up(K, kQuantPad);
    const std::string sfx = suffix;
    // The embedding: f32 / f16 rows, or int8 rows with f16 scales per 32 (w8a8, GGUF Q8_0).
    if (it->first == "model.embed_tokens" && sfx != ".weight" &&
        !(sfx == ".weight.codes" && t.dtype == "i8") && !(sfx == ".weight.scales" && t.dtype == "f16"))
      fail("tensor " + name + ": model.embed_tokens must be f32 or f16 rows, or int8 codes with f16 scales");
    if (it->first == "model.embed_tokens" && sfx == ".weight.scales") return expect(name, t, "f16", {N, Kp / kQ8Block});
    if (sfx == ".weight") {
      if (t.dtype != "f32" && t.dtype != "f16")
        fail("tensor " + name + " has dtype " + t.dtype + ", expected f32 or f16");
      return expect(name, t, t.dtype, {N, K});
    }
    if (sfx == ".weight.codes" && t.dtype == "i8") return expect(name, t, "i8", {N, Kp});  // w8a8
    if (sfx == ".weight.codes") return expect(name, t, "u8", {N, Kp / 2});
    if (sfx == ".weight.mins") return expect(name, t, "f16", {N, Kp / kQ8Block});  // w4a8 + GGUF Q4_1 mins
    if (sfx == ".weight.tscale") return expect(name, t, "f32", {1});
    if (t.dtype == "u8") return expect(name, t, "u8", {N, Kp / kNvfp4Block});  // nvfp4 E4M3 scales
    if (t.shape.size() != 2 || t.shape[1] <= 0 || Kp % t.shape[1] != 0)
      fail("tensor " + name + " has shape " + shape_str(t.shape) + ", expected [" + std::to_string(N) +
           ", Kp/group] with Kp = " + std::to_string(Kp));
    return expect(name, t, "f16", {N, t.shape[1]});  // w4a8 scales
  }
  const ModelConfig& c = engine_.config();
  fail("unexpected tensor " + name + " (not a tensor of this model: " + std::to_string(c.n_layers) +
       " layers, attn_bias " + (c.attn_bias ? "on" : "off") + ", qk_norm " + (c.qk_norm ? "on" : "off") + ")");
}

void WeightsBuilder::add(const std::string& name, const HostTensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  check_spec(name, t);
  Entry e;
  e.dtype = t.dtype;
  e.shape = t.shape;
  if (ends_with(name, ".weight.tscale")) {
    std::memcpy(&e.scalar, t.data, sizeof(float));  // WeightView::tscale: a host scalar, never uploaded
  } else {
    e.device = engine_.upload(t.data, t.nbytes);
    bytes_ += t.nbytes;
  }
  got_.emplace(name, std::move(e));
}

int WeightsBuilder::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(got_.size());
}

size_t WeightsBuilder::uploaded_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

// ---- finish: assemble and install ---------------------------------------------------------
WeightsBuilder::Entry* WeightsBuilder::find(const std::string& name) {
  auto it = got_.find(name);
  return it == got_.end() ? nullptr : &it->second;
}

const float* WeightsBuilder::vec(const std::string& name) {
  Entry* e = find(name);
  if (!e) fail("tensor " + name + " is missing");
  e->used = true;
  return static_cast<const float*>(e->device);
}

// A linear weight [N, K] in whichever format was added (docs/ENGINE.md).
WeightView WeightsBuilder::linear(const std::string& p) {
  const Shape2 s = linears_.at(p);
  WeightView w;
  w.N = s.N;
  w.K = s.K;
  if (Entry* e = find(p + ".weight")) {
    e->used = true;
    w.dtype = e->dtype == "f32" ? DType::F32 : DType::F16;
    w.Kp = s.K;
    w.data = e->device;
    return w;
  }
  w.Kp = round_up(s.K, kQuantPad);
  Entry* codes = find(p + ".weight.codes");
  if (!codes) fail("tensor " + p + ".weight (or .weight.codes) is missing");
  Entry* scales = find(p + ".weight.scales");
  if (!scales) fail("tensor " + p + ".weight.scales is missing");
  codes->used = scales->used = true;
  w.data = codes->device;
  w.scales = scales->device;
  Entry* mins = find(p + ".weight.mins");
  if (codes->dtype == "i8") {  // w8a8 (GGUF Q8_0 blocks)
    if (scales->dtype != "f16" || scales->shape[1] != w.Kp / kQ8Block)
      fail("tensor " + p + ".weight.scales must be f16 [N, Kp/32] for int8 codes");
    if (mins || find(p + ".weight.tscale")) fail("tensor " + p + ": int8 codes take no mins or tscale");
    w.dtype = DType::W8A8;
    w.group = kQ8Block;
    return w;
  }
  if (mins) {
    if (scales->dtype != "f16" || scales->shape[1] != w.Kp / kQ8Block)
      fail("tensor " + p + ".weight.mins needs f16 scales of group 32");
    mins->used = true;
    w.mins = mins->device;
  }
  if (Entry* t = find(p + ".weight.tscale")) {
    if (mins) fail("tensor " + p + ".weight.mins belongs to w4a8, but .weight.tscale (nvfp4) is present");
    if (scales->dtype != "u8")
      fail("tensor " + p + ".weight.scales is f16 (w4a8) but " + p + ".weight.tscale (nvfp4) is present");
    t->used = true;
    w.dtype = DType::NVFP4;
    w.group = kNvfp4Block;
    w.tscale = t->scalar;
  } else {
    if (scales->dtype != "f16") fail("tensor " + p + ".weight.tscale is missing (u8 scales are nvfp4)");
    w.dtype = DType::W4A8;
    w.group = w.Kp / int(scales->shape[1]);
  }
  return w;
}

void WeightsBuilder::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) fail("finish() called twice");
  done_ = true;
  const ModelConfig& c = engine_.config();
  ModelWeights w;
  w.embed = linear("model.embed_tokens");
  w.final_norm = vec("model.norm.weight");
  const bool has_head = find("lm_head.weight") || find("lm_head.weight.codes") || find("lm_head.weight.scales");
  if (has_head)
    w.lm_head = linear("lm_head");
  else if (tie_)
    w.lm_head = w.embed;
  else
    fail("tensor lm_head.weight is missing and embeddings are not tied");
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = vec(p + "input_layernorm.weight");
    L.mlp_norm = vec(p + "post_attention_layernorm.weight");
    L.wq = linear(p + "self_attn.q_proj");
    L.wk = linear(p + "self_attn.k_proj");
    L.wv = linear(p + "self_attn.v_proj");
    L.wo = linear(p + "self_attn.o_proj");
    if (c.attn_bias) {
      L.bq = vec(p + "self_attn.q_proj.bias");
      L.bk = vec(p + "self_attn.k_proj.bias");
      L.bv = vec(p + "self_attn.v_proj.bias");
    }
    if (c.qk_norm) {
      L.q_norm = vec(p + "self_attn.q_norm.weight");
      L.k_norm = vec(p + "self_attn.k_norm.weight");
    }
    L.w_gate = linear(p + "mlp.gate_proj");
    L.w_up = linear(p + "mlp.up_proj");
    L.w_down = linear(p + "mlp.down_proj");
    w.layers.push_back(L);
  }
  std::vector<std::string> unused;
  for (const auto& [name, e] : got_)
    if (!e.used) unused.push_back(name);
  if (!unused.empty()) {
    std::sort(unused.begin(), unused.end());
    fail("tensor " + unused.front() + " is not used by the format of its layer (" + std::to_string(unused.size()) +
         " unused; mixed forms such as X.weight beside X.weight.codes?)");
  }
  engine_.set_weights(std::move(w));
}

}  // namespace kvdeck
