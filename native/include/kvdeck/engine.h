// kvdeck/engine.h — the engine: model weights, KV pool and sequences on one backend.
//
// Contracts
// - The engine owns the backend, every weight byte (uploaded once at load), the KV pool
//   and the sequences. Python drives it with forward() calls; C++ never calls Python.
// - A sequence is a token history whose K/V live in pool pages (its page table). forward()
//   appends tokens to a sequence, computing only those tokens (prefill when n > 1, decode
//   when n == 1); it mutates the sequence and the pool.
// - Not thread-safe: one caller at a time (the Python handle serialises calls).
#pragma once
#include <cstdint>
#include <memory>
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
  int threads = 0;                 // 0: all cores
  KvDType kv_dtype = KvDType::F32;
  int kv_block = 16;               // tokens per page
  int kv_pages = 0;                // pool size in pages; 0: enough for max_context tokens
  int max_context = 4096;          // default pool sizing only
  int max_chunk = 512;             // prefill rows per forward chunk (bounds scratch memory)
  bool prefix_cache = true;        // radix-tree prefix reuse across calls
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
  const Sequence& sequence(int seq) const;

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
  PoolSnapshot snapshot() const;
  const RadixTree* tree() const { return tree_.get(); }
  std::vector<CacheEvent> drain_events() { return events_.drain(); }
  // Throws std::logic_error naming the first broken invariant of pool, tree and sequences.
  void check_integrity() const;

  // Append ids [n] to the sequence and run the model over them. Writes logits f32 [V] of
  // the last token, or [n, V] for every token when all_logits. Throws KvPoolFull (the
  // sequence is left as it was) when the pool cannot hold the new tokens.
  void forward(int seq, const int32_t* ids, int n, float* logits, bool all_logits);

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  Backend& backend() { return *backend_; }
  KvPool& pool() { return *pool_; }

 private:
  struct Scratch;
  void forward_chunk(Sequence& s, const int32_t* ids, int M, int p0, float* logits, bool all_logits);
  void reserve_pages(Sequence& s, int n_tokens);

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
