// Engine, the prefix-cache side: begin / finish / pin / evict over the radix tree, the reads
// published for other threads (snapshot, tree, progress) and the integrity check.
// Every public method takes mu_ (engine.h, "Thread-safe"); publish() runs under it.
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "kvdeck/engine.h"

namespace kvdeck {

// ============================================================================
// Prefix cache
// ============================================================================

int Engine::begin(int seq, const int32_t* ids, int n) {
  std::lock_guard<std::mutex> lk(mu_);
  Sequence& s = seq_ref(seq);
  if (!s.tokens.empty() || s.locked) throw std::logic_error("begin: the sequence is not empty");
  if (!options_.prefix_cache || n <= 1) return 0;
  PrefixMatch m = tree_->match(ids, n, n - 1);
  tree_->lock(m.node);
  s.locked = m.node;
  for (int p : m.pages) pool_->ref(p);
  s.pages = m.pages;
  s.tokens.assign(ids, ids + m.tokens);
  events_.push({CacheEventKind::Hit, s.session, int(m.pages.size()), m.tokens, m.tokens,
                std::vector<int32_t>(ids, ids + std::min(n, 8)), ""});
  publish();
  return m.tokens;
}

void Engine::finish(int seq) {
  std::lock_guard<std::mutex> lk(mu_);
  Sequence& s = seq_ref(seq);
  const int full = int(s.tokens.size()) / pool_->block();
  if (options_.prefix_cache && full > 0) tree_->insert(s.tokens.data(), full, s.pages.data(), s.session);
  close_locked(seq);
  publish();
}

std::pair<int, int> Engine::pin(int32_t session, const int32_t* ids, int n) {
  std::lock_guard<std::mutex> lk(mu_);
  int tokens = 0;
  RadixNode* node = tree_->pin(ids, n, session, &tokens);
  const int id = next_pin_++;
  pins_.emplace(id, PinRecord{node, session});
  publish();
  return {id, tokens};
}

void Engine::unpin(int pin_id) {
  std::lock_guard<std::mutex> lk(mu_);
  unpin_locked(pin_id);
  publish();
}

void Engine::unpin_locked(int pin_id) {
  auto it = pins_.find(pin_id);
  if (it == pins_.end()) throw std::invalid_argument("unknown pin " + std::to_string(pin_id));
  tree_->unpin(it->second.node, it->second.session);
  pins_.erase(it);
}

int Engine::release_session(int32_t session) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> ids;
  for (auto& [id, rec] : pins_)
    if (rec.session == session) ids.push_back(id);
  for (int id : ids) unpin_locked(id);
  publish();
  return int(ids.size());
}
int Engine::evict(int n_pages, const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  const int n = tree_->evict(n_pages, reason);
  publish();
  return n;
}
int Engine::clear_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  const int n = tree_->clear();
  publish();
  return n;
}

PoolSnapshot Engine::snapshot() const {
  std::lock_guard<std::mutex> lk(pub_mu_);
  return published_snap_;
}

ForwardProgress Engine::progress() const {
  std::lock_guard<std::mutex> lk(pub_mu_);
  return progress_;
}

std::vector<NodeInfo> Engine::tree_nodes() const {
  std::lock_guard<std::mutex> lk(pub_mu_);
  return published_tree_;
}

void Engine::publish() {
  const TreeSnapshot t = tree_->snapshot();
  PoolSnapshot s{};
  s.total_pages = pool_->n_pages();
  s.used_pages = pool_->used_pages();
  s.free_pages = pool_->free_pages();
  s.pinned_pages = t.pinned_pages;
  s.evictable_pages = t.evictable_pages;
  s.locked_pages = t.locked_pages;
  s.cached_pages = t.cached_pages;
  s.tree_nodes = t.nodes;
  s.block = pool_->block();
  s.bytes_per_token = pool_->bytes_per_token();
  s.staged_pages = pool_->staged_pages();
  s.staging_bytes = pool_->staging_bytes();
  const bool tree_changed = tree_->version() != published_version_;
  std::vector<NodeInfo> nodes;
  if (tree_changed) {
    tree_->visit([&](const RadixNode& n) {
      nodes.push_back(NodeInfo{n.id, n.parent ? n.parent->id : 0, n.depth_tokens, n.tokens, n.pages, n.lock_ref,
                               n.pin_ref, n.owner, n.last_access});
    });
  }
  std::lock_guard<std::mutex> lk(pub_mu_);
  published_snap_ = s;
  if (tree_changed) {
    published_tree_.swap(nodes);
    published_version_ = tree_->version();
  }
}

void Engine::check_integrity() const {
  std::lock_guard<std::mutex> lk(mu_);
  auto fail = [](const std::string& m) { throw std::logic_error("integrity: " + m); };
  std::vector<int32_t> refs(pool_->n_pages(), 0);
  tree_->check(refs);
  std::unordered_map<const RadixNode*, int> locks;
  for (auto& [id, s] : seqs_) {
    const int B = pool_->block();
    if (int(s.pages.size()) < (int(s.tokens.size()) + B - 1) / B)
      fail("sequence " + std::to_string(id) + ": page table too short");
    for (int p : s.pages) ++refs[p];
    for (const RadixNode* n = s.locked; n; n = n->parent) ++locks[n];
  }
  int zero = 0;
  for (int p = 0; p < pool_->n_pages(); ++p) {
    if (refs[p] != pool_->refcount(p))
      fail("page " + std::to_string(p) + " has refcount " + std::to_string(pool_->refcount(p)) + ", holders " +
           std::to_string(refs[p]));
    zero += refs[p] == 0;
  }
  if (zero != pool_->free_pages()) fail("free list holds " + std::to_string(pool_->free_pages()) + " pages, " + std::to_string(zero) + " are unreferenced");
  tree_->visit([&](const RadixNode& n) {
    auto it = locks.find(&n);
    const int expect = it == locks.end() ? 0 : it->second;
    if (n.lock_ref != expect)
      fail("node " + std::to_string(n.id) + " lock_ref " + std::to_string(n.lock_ref) + ", sequences " + std::to_string(expect));
  });
}

}  // namespace kvdeck
