// kvdeck/engine.h — the engine: model weights, KV pool and sequences on one backend.
//
// Contracts
// - The engine owns the backend, every weight byte (uploaded once at load), the KV pool
//   and the sequences. Python drives it with forward() calls; C++ never calls Python.
// - A sequence is a token history whose K/V live in pool pages (its page table). forward()
//   appends tokens to a sequence, computing only those tokens (prefill when n > 1, decode
//   when n == 1); it mutates the sequence and the pool.
// - Thread-safe: every public method may be called from any thread. One mutex (mu_) owns
//   the native state (sequences, pool, tree, backend scratch): mutating calls and forward()
//   hold it for their whole duration. Why one lock and not an engine thread with a queue:
//   the Python handle already runs generation in the caller's thread with the GIL released,
//   calls are coarse (a chunk of a prefill, one decode step), and a lock keeps exceptions and
//   results on the calling thread with no marshalling.
// - Reads for a UI (snapshot(), tree_nodes(), dropped_events(), drain_events()) never wait
//   for a running forward(): they copy state that every mutating call publishes under a
//   second, short-held mutex (pub_mu_) before it returns (and forward() right after it has
//   reserved — possibly evicted — its pages).
// - Cancellation: forward() takes an optional CancelFlag, checked between layers and between
//   prefill chunks. On cancel it throws Cancelled; the chunks already completed stay in the
//   sequence (valid K/V, insertable into the cache by finish()).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvdeck/backend.h"
#include "kvdeck/kv_pool.h"
#include "kvdeck/model.h"
#include "kvdeck/radix_tree.h"

namespace kvdeck {

struct EngineOptions {
  std::string backend = "cpu";
  int threads = 0;                 // 0: all cores; 0..1024
  KvDType kv_dtype = KvDType::F32;
  int kv_block = 16;               // tokens per page; 1..256 (attention keeps a page on the stack)
  int kv_pages = 0;                // pool size in pages; 0: enough for max_context tokens
  int max_context = 4096;          // default pool sizing only; >= 1
  int max_chunk = 512;             // prefill rows per forward chunk (bounds scratch memory); 1..16384
  bool prefix_cache = true;        // radix-tree prefix reuse across calls
  int act_bits = 8;                // 8 | 16: activations of the integer matmuls ("a8" / "a16",
                                   // kernels.h ActQ8); 16 needs the CPU backend and W4A8 / W8A8 weights
};
// Throws std::invalid_argument naming the first option out of range.
void validate(const EngineOptions& o);

// forward()'s on-backend sampling: params, the Sampler's draw u (sampler.h uniform(); unused
// when greedy) and the allowed tokens (host u32 bits [ceil(vocab / 32)], Backend::sample's
// layout; null: all).
struct SampleRequest {
  SamplingParams params;
  double u = 0.0;
  const uint32_t* mask = nullptr;
};

// Set from any thread to stop a forward() between layers.
struct CancelFlag {
  std::atomic<bool> set{false};
};
// Thrown by forward() when its CancelFlag was set; `computed` tokens were appended.
struct Cancelled : std::runtime_error {
  int computed;
  Cancelled(int computed_tokens)
      : std::runtime_error("cancelled"), computed(computed_tokens) {}
};

// The forward() in flight, for a progress bar: chunks of `chunk` tokens, layer by layer.
struct ForwardProgress {
  int seq = 0;          // 0: no forward running
  int total = 0;        // tokens in this forward call
  int done = 0;         // tokens of completed chunks
  int chunk = 0;        // tokens in the chunk being computed
  int layer = 0;        // layers of that chunk completed
  int layers = 0;
};

// One radix-tree node as the cache inspector sees it (a copy).
struct NodeInfo {
  int32_t id, parent, start;       // start: tokens from the root to this node
  std::vector<int32_t> tokens;     // [pages * block]
  std::vector<int32_t> pages;
  int32_t lock_ref, pin_ref, owner;
  uint64_t last_access;
};

struct Sequence {
  std::vector<int32_t> tokens;     // [n] every token whose K/V is stored
  std::vector<int32_t> pages;      // [ceil(n / block)] page table; one pool ref each
  RadixNode* locked = nullptr;     // the cached path this sequence reads (locked)
  int32_t session = 0;             // owner, for cache events
};

struct PoolSnapshot {
  int32_t total_pages, used_pages, free_pages, pinned_pages, evictable_pages, locked_pages,
      cached_pages, tree_nodes, block;
  size_t bytes_per_token;
  int32_t staged_pages;  // kpc4 KV: pages whose rows are held in f32 staging (kv_pool.h)
  size_t staging_bytes;  // their bytes, beside the pool's
};

class Engine {
 public:
  Engine(ModelConfig config, EngineOptions options);
  ~Engine();

  // ---- weights (load time) -----------------------------------------------------------
  // Copy host bytes into backend memory the engine owns; returns the backend pointer.
  const void* upload(const void* host, size_t bytes);
  // Install the model's views (pointers from upload()). Validates every shape.
  void set_weights(ModelWeights weights);
  size_t weight_bytes() const { return weight_bytes_; }

  // ---- sequences (mutating) -----------------------------------------------------------
  int open_sequence(int32_t session = 0);
  void close_sequence(int seq);     // releases its page references and its lock
  Sequence sequence(int seq) const;  // a copy

  // ---- prefix cache (mutating) --------------------------------------------------------
  // Attach the longest cached prefix of ids [n] to an empty sequence (whole pages, at most
  // n-1 tokens so the last token is always computed). Locks the path. Returns cached tokens.
  int begin(int seq, const int32_t* ids, int n);
  // Insert the sequence's whole pages (prompt and generated tokens) into the tree, then
  // close it.
  void finish(int seq);
  // Pin the cached whole-page prefix of ids for a session; returns {pin id, tokens pinned}.
  std::pair<int, int> pin(int32_t session, const int32_t* ids, int n);
  void unpin(int pin_id);
  int release_session(int32_t session);                    // unpin all its pins; returns count
  int evict(int n_pages, const std::string& reason);       // returns pages evicted
  int clear_cache();

  // ---- reads (any thread, never wait for forward(); copies of the last published state) --
  PoolSnapshot snapshot() const;
  std::vector<NodeInfo> tree_nodes() const;
  std::vector<CacheEvent> drain_events() { return events_.drain(); }
  uint64_t dropped_events() const { return events_.dropped(); }
  ForwardProgress progress() const;
  // Throws std::logic_error naming the first broken invariant of pool, tree and sequences.
  void check_integrity() const;

  // Append ids [n] to the sequence and run the model over them. Writes logits f32 [V] of
  // the last token, or [n, V] for every token when all_logits. Throws KvPoolFull (the
  // sequence is left as it was) when the pool cannot hold the new tokens, and Cancelled
  // when cancel was set (the completed chunks stay appended). argmax (host [1], optional):
  // the last token's greedy choice, reduced on the backend (logits may then be null: no [V]
  // download). Decode steps (n == 1) may run as a backend recording (CUDA graph).
  // sample (optional, with argmax as its output): argmax receives the id Backend::sample
  // chooses instead (temperature / top-k / top-p with the draw u, under the allowed-token
  // mask), computed where the logits are.
  void forward(int seq, const int32_t* ids, int n, float* logits, bool all_logits,
               const CancelFlag* cancel = nullptr, int32_t* argmax = nullptr,
               const SampleRequest* sample = nullptr);

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  const std::string& backend_name() const { return backend_name_; }
  int threads() const { return threads_; }
  int kv_block() const { return options_.kv_block; }
  KvDType kv_dtype() const { return options_.kv_dtype; }
  int act_bits() const { return options_.act_bits; }

 private:
  struct Scratch;
  void forward_chunk(Sequence& s, const int32_t* ids, int M, int p0, float* logits, bool all_logits,
                     const CancelFlag* cancel, int32_t* argmax, const SampleRequest* sample);
  bool reserve_pages(Sequence& s, int n_tokens);  // true: pages were added
  Sequence& seq_ref(int seq);       // std::invalid_argument for an unknown id; holds mu_
  void close_locked(int seq);
  void unpin_locked(int pin_id);
  void publish();                   // copy snapshot (and the tree if it changed) for readers; holds mu_

  mutable std::mutex mu_;           // the native state below
  mutable std::mutex pub_mu_;       // published_*
  PoolSnapshot published_snap_{};
  std::vector<NodeInfo> published_tree_;
  uint64_t published_version_ = ~uint64_t(0);
  ForwardProgress progress_;        // under pub_mu_
  std::string backend_name_;
  int threads_ = 0;

  ModelConfig config_;
  EngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvPool> pool_;
  EventRing events_;
  std::unique_ptr<RadixTree> tree_;
  std::unique_ptr<Scratch> scratch_;
  ModelWeights weights_;
  bool weights_set_ = false;
  std::vector<void*> owned_;        // backend allocations for weights
  size_t weight_bytes_ = 0;
  std::unordered_map<int, Sequence> seqs_;
  int next_seq_ = 1;
  struct PinRecord {
    RadixNode* node;
    int32_t session;
  };
  std::unordered_map<int, PinRecord> pins_;
  int next_pin_ = 1;
};

}  // namespace kvdeck
