// Engine: weights, sequences and the forward pass, written once against Backend.
// The prefix-cache calls and the published reads are in engine_cache.cpp.
#include "kvdeck/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace kvdeck {

// ============================================================================
// Scratch: per-chunk activations in backend memory, sized once for max_chunk rows.
// ============================================================================
struct Engine::Scratch {
  Backend& be;
  int rows;
  std::vector<void*> bufs;
  float *x, *h, *q, *k, *v, *attn, *o, *gate, *up, *act, *logits;  // see sizes below
  float* inv_freq;  // [D/2] the RoPE table, uploaded once
  int32_t *ids, *pos, *slots, *pages, *token;  // token: [1] the device argmax
  // A decode step's (M = 1) index arrays in one block, [id, pos, slot, 0, pages...] (the page
  // table 16-byte aligned, as in its own allocation), uploaded in
  // one copy from host_step (one H2D a step instead of four); KVDECK_STEP_PACK=0: the four
  // arrays above, four uploads (the A/B; NOTES.md session 8, gpuhost8).
  int32_t* step;
  std::vector<int32_t> host_step;
  bool pack = [] {
    const char* e = std::getenv("KVDECK_STEP_PACK");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  uint32_t* mask;  // [ceil(V / 32)] allowed-token bits for Backend::sample
  QuantScratch xq;
  int logit_rows, max_pages;

  Scratch(Backend& b, const ModelConfig& c, int M, int max_pages_, int act_bits)
      : be(b), rows(M), max_pages(max_pages_) {
    const size_t H = c.hidden, F = c.intermediate, QD = size_t(c.n_heads) * c.head_dim,
                 KD = size_t(c.n_kv_heads) * c.head_dim;
    logit_rows = std::min(M, 64);
    x = f(M * H);        // [M, H] residual stream
    h = f(M * H);        // [M, H] normed input of a block
    q = f(M * QD);       // [M, nh*D]
    k = f(M * KD);       // [M, nkv*D]
    v = f(M * KD);       // [M, nkv*D]
    attn = f(M * QD);    // [M, nh*D]
    o = f(M * H);        // [M, H]
    gate = f(M * F);     // [M, F]
    up = f(M * F);       // [M, F]
    act = f(M * F);      // [M, F]
    logits = f(size_t(logit_rows) * c.vocab);  // [logit_rows, V]
    ids = i(M);
    pos = i(M);
    slots = i(M);
    pages = i(max_pages);
    token = i(1);
    step = i(4 + size_t(max_pages));
    host_step.resize(4 + size_t(max_pages));
    mask = reinterpret_cast<uint32_t*>(i((size_t(c.vocab) + 31) / 32));
    inv_freq = f(c.rope_inv_freq.size());
    be.upload(inv_freq, c.rope_inv_freq.data(), sizeof(float) * c.rope_inv_freq.size());
    const int Kmax = round_up(std::max(c.hidden, std::max(c.intermediate, int(QD))), kQ8Block);
    xq.act.q = static_cast<int8_t*>(alloc(size_t(M) * Kmax));
    xq.act.d = static_cast<float*>(alloc(sizeof(float) * M * (Kmax / kQ8Block)));
    xq.act.s = static_cast<int32_t*>(alloc(sizeof(int32_t) * M * (Kmax / kQ8Block)));
    if (act_bits == 16) xq.act.q16 = static_cast<int16_t*>(alloc(sizeof(int16_t) * M * Kmax));  // a16
  }
  ~Scratch() {
    for (void* p : bufs) be.free(p);
  }
  void* alloc(size_t bytes) {
    bufs.push_back(be.alloc(bytes));
    return bufs.back();
  }
  float* f(size_t n) { return static_cast<float*>(alloc(n * sizeof(float))); }
  int32_t* i(size_t n) { return static_cast<int32_t*>(alloc(n * sizeof(int32_t))); }
};

// ============================================================================
// Construction and weights
// ============================================================================
void validate(const EngineOptions& o) {
  auto bad = [](const std::string& what, int v, const std::string& range) {
    throw std::invalid_argument("engine option " + what + " = " + std::to_string(v) + " is out of range (" + range + ")");
  };
  if (o.threads < 0 || o.threads > 1024) bad("threads", o.threads, "0 for all cores, or 1..1024");
  if (o.kv_block < 1 || o.kv_block > 256) bad("kv_block", o.kv_block, "1..256 tokens per page");
  if (o.kv_pages < 0) bad("kv_pages", o.kv_pages, "0 for max_context / kv_block, or >= 1 page");
  if (o.max_context < 1) bad("max_context", o.max_context, ">= 1 token");
  if (o.max_chunk < 1 || o.max_chunk > 16384) bad("max_chunk", o.max_chunk, "1..16384 tokens");
  if (o.act_bits != 8 && o.act_bits != 16) bad("act_bits", o.act_bits, "8 (activations a8) or 16 (a16)");
}

Engine::Engine(ModelConfig config, EngineOptions options)
    : config_(std::move(config)), options_(options) {
  validate(options_);
  const ModelConfig& c = config_;
  if (c.hidden <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.vocab <= 0 || c.intermediate <= 0)
    throw std::invalid_argument("model config: every size must be positive");
  if (c.n_heads % c.n_kv_heads != 0)
    throw std::invalid_argument("model config: num_attention_heads must be a multiple of num_key_value_heads");
  if (c.head_dim % 2 != 0 || int(c.rope_inv_freq.size()) != c.head_dim / 2)
    throw std::invalid_argument("model config: rope_inv_freq must have head_dim/2 entries");
  if (options_.act_bits == 16 && options_.backend != "cpu")  // the CUDA kernels read int8 activations only
    throw std::invalid_argument("engine option activations = \"a16\" is not supported on the " + options_.backend +
                                " backend (its kernels read 8-bit activations); use activations = \"a8\"");
  backend_ = make_backend(options_.backend, options_.threads);
  backend_name_ = backend_->name();
  threads_ = backend_->threads();
  const int B = options_.kv_block;
  int n_pages = options_.kv_pages;
  if (n_pages <= 0) n_pages = (options_.max_context + B - 1) / B;
  pool_ = std::make_unique<KvPool>(*backend_, c.n_layers, c.n_kv_heads, c.head_dim, B, n_pages,
                                   options_.kv_dtype);
  tree_ = std::make_unique<RadixTree>(*pool_, events_);
  scratch_ = std::make_unique<Scratch>(*backend_, c, options_.max_chunk, n_pages, options_.act_bits);
  publish();
}

Engine::~Engine() {
  seqs_.clear();
  pins_.clear();
  tree_.reset();
  scratch_.reset();
  pool_.reset();
  for (void* p : owned_) backend_->free(p);
}

const void* Engine::upload(const void* host, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  void* p = backend_->alloc(bytes);
  backend_->upload(p, host, bytes);
  owned_.push_back(p);
  weight_bytes_ += bytes;
  return p;
}

static void check_linear(const WeightView& w, int N, int K, const std::string& name) {
  if (!w.data) throw std::invalid_argument("weights: " + name + " is missing");
  if (w.N != N || w.K != K)
    throw std::invalid_argument("weights: " + name + " has shape [" + std::to_string(w.N) + ", " +
                                std::to_string(w.K) + "], expected [" + std::to_string(N) + ", " +
                                std::to_string(K) + "]");
  const bool q = is_integer(w.dtype);
  if (q && (!w.scales || w.Kp != round_up(K, kQuantPad)))
    throw std::invalid_argument("weights: " + name + " has bad quantisation layout");
  if (w.mins && (w.dtype != DType::W4A8 || w.group != kQ8Block))
    throw std::invalid_argument("weights: " + name + " has minimums, which need W4A8 group 32");
  if (w.dtype == DType::W8A8 && w.group != kQ8Block)
    throw std::invalid_argument("weights: " + name + " is W8A8 with group " + std::to_string(w.group) + " (must be 32)");
  if (w.dtype == DType::W4A8 && (w.group <= 0 || w.Kp % w.group != 0 || w.group % kQ8Block != 0))
    throw std::invalid_argument("weights: " + name + " has W4A8 group " + std::to_string(w.group) +
                                " (must be a multiple of 32 dividing " + std::to_string(w.Kp) + ")");
}

void Engine::set_weights(ModelWeights w) {
  std::lock_guard<std::mutex> lk(mu_);
  const ModelConfig& c = config_;
  const int H = c.hidden, F = c.intermediate, QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  if (int(w.layers.size()) != c.n_layers)
    throw std::invalid_argument("weights: " + std::to_string(w.layers.size()) + " layers, config says " +
                                std::to_string(c.n_layers));
  if (w.embed.dtype != DType::F32 && w.embed.dtype != DType::F16 && w.embed.dtype != DType::W8A8)
    throw std::invalid_argument("weights: embedding must be f32 or f16 rows, or w8a8 (int8 rows, f16 scale per 32)");
  check_linear(w.embed, c.vocab, H, "model.embed_tokens");
  check_linear(w.lm_head, c.vocab, H, "lm_head");
  if (!w.final_norm) throw std::invalid_argument("weights: model.norm is missing");
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    check_linear(L.wq, QD, H, p + "self_attn.q_proj");
    check_linear(L.wk, KD, H, p + "self_attn.k_proj");
    check_linear(L.wv, KD, H, p + "self_attn.v_proj");
    check_linear(L.wo, H, QD, p + "self_attn.o_proj");
    check_linear(L.w_gate, F, H, p + "mlp.gate_proj");
    check_linear(L.w_up, F, H, p + "mlp.up_proj");
    check_linear(L.w_down, H, F, p + "mlp.down_proj");
    if (!L.attn_norm || !L.mlp_norm) throw std::invalid_argument("weights: " + p + " norms missing");
    if (c.attn_bias && (!L.bq || !L.bk || !L.bv)) throw std::invalid_argument("weights: " + p + " biases missing");
    if (c.qk_norm && (!L.q_norm || !L.k_norm)) throw std::invalid_argument("weights: " + p + " q/k norms missing");
  }
  if (options_.act_bits == 16) {  // refuse here, not in a worker thread's gemm
    auto a16 = [](const WeightView& v, const std::string& name) {
      const bool ok = !is_integer(v.dtype) || v.dtype == DType::W8A8 || v.dtype == DType::W4A8;
      if (!ok)
        throw std::invalid_argument("weights: " + name + " is " + dtype_name(v.dtype) +
                                    ", which has no kernel for activations = \"a16\" (W4A8 / W8A8 / gguf weights "
                                    "only); use activations = \"a8\"");
    };
    a16(w.lm_head, "lm_head");
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = w.layers[l];
      const std::string p = "model.layers." + std::to_string(l) + ".";
      a16(L.wq, p + "self_attn.q_proj"), a16(L.wk, p + "self_attn.k_proj"), a16(L.wv, p + "self_attn.v_proj");
      a16(L.wo, p + "self_attn.o_proj"), a16(L.w_gate, p + "mlp.gate_proj"), a16(L.w_up, p + "mlp.up_proj");
      a16(L.w_down, p + "mlp.down_proj");
    }
  }
  // The backend's chance to repack each linear (the embedding stays a row table).
  backend_->set_activation_bits(options_.act_bits);
  backend_->prepare_weight(w.lm_head);
  for (LayerWeights& L : w.layers)
    for (WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) backend_->prepare_weight(*v);
  weights_ = std::move(w);
  weights_set_ = true;
}

// ============================================================================
// Sequences
// ============================================================================
Sequence& Engine::seq_ref(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence " + std::to_string(seq));
  return it->second;
}

int Engine::open_sequence(int32_t session) {
  std::lock_guard<std::mutex> lk(mu_);
  const int id = next_seq_++;
  Sequence s;
  s.session = session;
  seqs_.emplace(id, std::move(s));
  return id;
}

void Engine::close_sequence(int seq) {
  std::lock_guard<std::mutex> lk(mu_);
  close_locked(seq);
  publish();
}

void Engine::close_locked(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence " + std::to_string(seq));
  for (int p : it->second.pages) pool_->unref(p);
  if (it->second.locked) tree_->unlock(it->second.locked);
  seqs_.erase(it);
}

Sequence Engine::sequence(int seq) const {
  std::lock_guard<std::mutex> lk(mu_);
  return const_cast<Engine*>(this)->seq_ref(seq);
}

// Grow the page table to hold n_tokens; all-or-nothing.
bool Engine::reserve_pages(Sequence& s, int n_tokens) {
  const int B = pool_->block();
  const int need = (n_tokens + B - 1) / B - int(s.pages.size());
  if (need <= 0) return false;
  if (need > pool_->free_pages())
    tree_->evict(need - pool_->free_pages(), "pool full: " + std::to_string(need) + " pages needed");
  if (need > pool_->free_pages())
    throw KvPoolFull("kv pool full: " + std::to_string(n_tokens) + " tokens need " + std::to_string(need) +
                     " more pages of " + std::to_string(B) + ", " + std::to_string(pool_->free_pages()) +
                     " free of " + std::to_string(pool_->n_pages()));
  for (int i = 0; i < need; ++i) s.pages.push_back(pool_->alloc_page());
  return true;
}

// ============================================================================
// Forward pass
// ============================================================================
void Engine::forward(int seq, const int32_t* ids, int n, float* logits, bool all_logits,
                     const CancelFlag* cancel, int32_t* argmax, const SampleRequest* sample) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!weights_set_) throw std::logic_error("engine: weights not set");
  if (n <= 0) throw std::invalid_argument("forward: no tokens");
  if (sample && !argmax) throw std::invalid_argument("forward: a sample request needs an output");
  if (sample) check_sampling(sample->params);
  Sequence& s = seq_ref(seq);
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= config_.vocab)
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(config_.vocab) + ")");
  const int p0 = int(s.tokens.size());
  // pages reserved (and maybe evicted for): readers see it during the compute; nothing to
  // publish when the sequence's pages already hold the tokens (most decode steps)
  if (reserve_pages(s, p0 + n) || !scratch_->pack) publish();
  struct ProgressGuard {  // the progress record lives exactly as long as this forward
    Engine& e;
    ~ProgressGuard() {
      std::lock_guard<std::mutex> lk(e.pub_mu_);
      e.progress_ = ForwardProgress{};
    }
  } guard{*this};
  const int V = config_.vocab;
  for (int done = 0; done < n;) {
    const int M = std::min(options_.max_chunk, n - done);
    if (n > 1) {
      std::lock_guard<std::mutex> lk(pub_mu_);
      progress_ = ForwardProgress{seq, n, done, M, 0, config_.n_layers};
    }
    const bool last = done + M == n;
    float* out = all_logits ? logits + size_t(done) * V : (last ? logits : nullptr);
    if (cancel && cancel->set.load(std::memory_order_relaxed)) throw Cancelled(done);
    try {
      forward_chunk(s, ids + done, M, p0 + done, out, all_logits, cancel, last ? argmax : nullptr, sample);
    } catch (const Cancelled&) {
      throw Cancelled(done);  // this chunk's K/V are incomplete: it is not appended
    }
    s.tokens.insert(s.tokens.end(), ids + done, ids + done + M);
    done += M;
  }
  if (pool_->dtype() == KvDType::KPC4) {  // the pages this call filled no longer need their staging
    pool_->release_retired(nullptr, 0);
    publish();
  }
}

// One chunk of M tokens at positions p0.. of sequence s (its pages already reserved).
// logits: host f32 [V] (last row) or [M, V] (all rows), or null for none; argmax: host [1],
// the last row's argmax computed on the backend, or null.
void Engine::forward_chunk(Sequence& s, const int32_t* ids, int M, int p0, float* logits,
                           bool all_logits, const CancelFlag* cancel, int32_t* argmax,
                           const SampleRequest* sample) {
  Backend& be = *backend_;
  Scratch& S = *scratch_;
  const ModelConfig& c = config_;
  const int H = c.hidden, F = c.intermediate, D = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads;
  const int QD = nh * D, KD = nkv * D, B = pool_->block();
  // With an nvfp4 / nvfp4r / k8v4 pool a chunk's queries read the chunk's own tokens from the
  // f32 K/V just computed (attention_fresh) and the earlier tokens from the quantised pages;
  // KVDECK_KV_FRESH=0 reads every token from the pages (A/B measurements).
  const char* fresh_env = std::getenv("KVDECK_KV_FRESH");
  const KvDType kvt = pool_->dtype();  // the 4- and 8-bit pools (f16 rounding is negligible)
  const bool fresh_kv = (kvt == KvDType::NVFP4 || kvt == KvDType::NVFP4R || kvt == KvDType::K8V4) &&
                        !(fresh_env && std::strcmp(fresh_env, "0") == 0);

  // ---- per-chunk index arrays: ids, positions, KV slots, page table ----
  const int n_pages = (p0 + M + B - 1) / B;
  int32_t *d_ids = S.ids, *d_pos = S.pos, *d_slots = S.slots, *d_pages = S.pages;
  if (M == 1 && S.pack) {  // one upload: [id, pos, slot, 0, pages...] (Scratch::step)
    int32_t* h = S.host_step.data();
    h[0] = ids[0], h[1] = p0, h[2] = s.pages[p0 / B] * B + p0 % B, h[3] = 0;
    std::memcpy(h + 4, s.pages.data(), sizeof(int32_t) * n_pages);
    d_ids = S.step, d_pos = S.step + 1, d_slots = S.step + 2, d_pages = S.step + 4;
    be.upload(S.step, h, sizeof(int32_t) * (4 + size_t(n_pages)));
  } else {
    std::vector<int32_t> pos(M), slots(M);
    for (int m = 0; m < M; ++m) {
      pos[m] = p0 + m;
      slots[m] = s.pages[pos[m] / B] * B + pos[m] % B;
    }
    be.upload(S.ids, ids, sizeof(int32_t) * M);
    be.upload(S.pos, pos.data(), sizeof(int32_t) * M);
    be.upload(S.slots, slots.data(), sizeof(int32_t) * M);
    be.upload(S.pages, s.pages.data(), sizeof(int32_t) * n_pages);
  }
  if (argmax && sample && sample->mask)
    be.upload(S.mask, sample->mask, sizeof(uint32_t) * ((size_t(c.vocab) + 31) / 32));

  // A decode step (M = 1) runs the same ops every step: the backend may replay a recording
  // of it (CUDA graph) instead of the ops up to the head's download (backend.h step_begin).
  // (a sampled step's recording ends at the logits: the sampling runs after it, unrecorded)
  // bits 8 and up: the step's context bucket (backend.h step_begin)
  uint64_t ctx_bucket = 256;
  while (ctx_bucket < uint64_t(p0) + M) ctx_bucket *= 2;
  const uint64_t step_key = (argmax ? (sample ? 3 : 2) : logits ? 1 : 0) | ctx_bucket << 8;
  struct StepGuard {  // closes the step on every exit; ok only when the ops all ran
    Backend& be;
    uint64_t key;
    bool open, ok = false;
    void end() {
      if (open) be.step_end(key, ok = true), open = false;
    }
    ~StepGuard() {
      if (open) be.step_end(key, false);
    }
  } step{be, step_key, false};
  const bool replayed = M == 1 && be.step_begin(step_key);
  step.open = M == 1 && !replayed;

  if (!replayed) be.embed(weights_.embed, d_ids, M, S.x);  // x: [M, H]
  for (int l = 0; l < c.n_layers && !replayed; ++l) {
    if (cancel && l > 0 && cancel->set.load(std::memory_order_relaxed)) throw Cancelled(0);
    if (M > 1 && l > 0) {
      std::lock_guard<std::mutex> lk(pub_mu_);
      progress_.layer = l;
    }
    const LayerWeights& L = weights_.layers[l];
    // ---- attention block ----
    be.rmsnorm(S.x, L.attn_norm, M, H, c.rms_eps, S.h);
    S.xq.valid = false;
    if (is_integer(L.wq.dtype)) be.quantize_input(S.h, M, H, S.xq);
    const Backend::MatmulOut qkv[3] = {{&L.wq, S.q, QD},   // q: [M, nh*D]
                                       {&L.wk, S.k, KD},   // k: [M, nkv*D]
                                       {&L.wv, S.v, KD}};  // v: [M, nkv*D]
    be.matmul_many(qkv, 3, S.h, S.xq, M);
    if (c.attn_bias) {
      be.add_bias(S.q, L.bq, M, QD, QD);
      be.add_bias(S.k, L.bk, M, KD, KD);
      be.add_bias(S.v, L.bv, M, KD, KD);
    }
    if (c.qk_norm) {  // RMSNorm over each head's D values
      be.rmsnorm(S.q, L.q_norm, M * nh, D, c.rms_eps, S.q);
      be.rmsnorm(S.k, L.k_norm, M * nkv, D, c.rms_eps, S.k);
    }
    be.rope(S.q, M, nh, D, QD, d_pos, S.inv_freq);
    be.rope(S.k, M, nkv, D, KD, d_pos, S.inv_freq);
    be.kv_write(*pool_, l, S.k, S.v, KD, d_slots, M);
    if (fresh_kv)  // the chunk's own K/V unrounded (S.k, S.v), the prefix from the pool
      be.attention_fresh(*pool_, l, S.q, QD, M, d_pos, d_pages, nh, nkv, D, S.k, S.v, KD, S.attn);
    else
      be.attention(*pool_, l, S.q, QD, M, d_pos, d_pages, nh, nkv, D, S.attn);  // attn: [M, nh*D]
    if (cancel && M > 1 && cancel->set.load(std::memory_order_relaxed)) throw Cancelled(0);
    S.xq.valid = false;
    if (is_integer(L.wo.dtype)) be.quantize_input(S.attn, M, QD, S.xq);
    be.matmul(L.wo, S.attn, S.xq, M, S.o, H);
    be.add(S.x, S.o, size_t(M) * H);
    // ---- MLP block ----
    if (cancel && M > 1 && cancel->set.load(std::memory_order_relaxed)) throw Cancelled(0);
    be.rmsnorm(S.x, L.mlp_norm, M, H, c.rms_eps, S.h);
    S.xq.valid = false;
    if (is_integer(L.w_gate.dtype)) be.quantize_input(S.h, M, H, S.xq);
    const Backend::MatmulOut gate_up[2] = {{&L.w_gate, S.gate, F}, {&L.w_up, S.up, F}};  // [M, F] each
    be.matmul_many(gate_up, 2, S.h, S.xq, M);
    be.silu_mul(S.gate, S.up, M, F, S.act);
    S.xq.valid = false;
    if (is_integer(L.w_down.dtype)) be.quantize_input(S.act, M, F, S.xq);
    be.matmul(L.w_down, S.act, S.xq, M, S.o, H);
    be.add(S.x, S.o, size_t(M) * H);
  }
  if (!logits && !argmax) return step.end();

  // ---- head: final norm + lm_head, over the last row or all rows in sub-chunks ----
  const int V = c.vocab;
  const WeightView& head = weights_.lm_head;
  const bool integer = is_integer(head.dtype);
  const int first = all_logits ? 0 : M - 1;
  for (int r0 = first; r0 < M; r0 += S.logit_rows) {
    const int R = std::min(S.logit_rows, M - r0);
    if (!replayed) {
      be.rmsnorm(S.x + size_t(r0) * H, weights_.final_norm, R, H, c.rms_eps, S.h);
      S.xq.valid = false;
      if (integer) be.quantize_input(S.h, R, H, S.xq);
      be.matmul(head, S.h, S.xq, R, S.logits, V);
      if (argmax && !sample && r0 + R == M) be.argmax(S.logits + size_t(R - 1) * V, V, S.token);
    }
    step.end();  // a decode step's recording ends before the downloads
    if (argmax && sample && r0 + R == M)
      be.sample(S.logits + size_t(R - 1) * V, V, sample->params, sample->u, sample->mask ? S.mask : nullptr, S.token);
    if (!logits) continue;
    be.sync();
    be.download(logits + size_t(r0 - first) * V, S.logits, sizeof(float) * R * V);
  }
  if (argmax) be.download(argmax, S.token, sizeof(int32_t));
}

}  // namespace kvdeck
