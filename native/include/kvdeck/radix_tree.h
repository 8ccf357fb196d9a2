// kvdeck/radix_tree.h — the prefix cache: a radix tree over token ids at page granularity.
//
// Each node holds a span of whole pages: tokens [n*block] and the pool pages [n] that hold
// their K/V. Children are keyed by their first page of tokens, so siblings never share a
// first page. The tree holds one pool reference per page it contains (KvPool stays the one
// owner of the counts); a matched request takes its own references and locks the path.
//
// Contracts
// - Every public method except the const ones mutates: match() updates access times and
//   may split a node at the matched page boundary (a split changes structure but not the
//   set of cached pages or their references); lock()/unlock() mutate lock counts only;
//   insert(), evict() and clear() mutate structure and page references. version() counts
//   the calls that mutated, so a reader can tell whether a copy of the tree is stale.
// - Not thread-safe on its own: the Engine's lock serialises every call.
// - Locked nodes and pinned nodes (and so their ancestors) are never evicted.
// - Pages in the tree are full and never written again (a sequence appends into pages of
//   its own), so sharing them needs no copy.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvdeck/cache_events.h"
#include "kvdeck/kv_pool.h"

namespace kvdeck {

struct RadixNode {
  int32_t id = 0;
  RadixNode* parent = nullptr;
  std::vector<int32_t> tokens;   // [n_pages * block]
  std::vector<int32_t> pages;    // [n_pages]
  std::map<std::vector<int32_t>, std::unique_ptr<RadixNode>> children;  // key: first page's tokens
  int32_t lock_ref = 0;          // requests using this node now
  int32_t pin_ref = 0;           // pins holding it
  uint64_t last_access = 0;      // logical clock
  int32_t owner = 0;             // session that inserted it
  int32_t depth_tokens = 0;      // tokens from the root to the start of this node
};

// The result of a match: the pages of the longest cached prefix and the deepest node.
struct PrefixMatch {
  std::vector<int32_t> pages;    // [matched_tokens / block]
  int32_t tokens = 0;
  RadixNode* node = nullptr;     // deepest node touched (lock this path); root if none
};

struct TreeSnapshot {
  int32_t nodes = 0, cached_pages = 0, pinned_pages = 0, locked_pages = 0, evictable_pages = 0;
};

class RadixTree {
 public:
  RadixTree(KvPool& pool, EventRing& events);
  ~RadixTree();

  // Longest cached prefix of ids[0, n), whole pages only, at most max_tokens.
  PrefixMatch match(const int32_t* ids, int n, int max_tokens);
  void lock(RadixNode* node);      // +1 lock on node and its ancestors
  void unlock(RadixNode* node);
  // Insert full pages of ids (pages[i] holds ids[i*B, (i+1)*B)); the tree takes a pool
  // reference for each page it did not already have. Returns the deepest node of the path.
  RadixNode* insert(const int32_t* ids, int n_pages, const int32_t* pages, int32_t session);
  // Pin the cached whole-page prefix of ids: +1 pin on its deepest node and ancestors.
  // Returns that node (the pin's handle: node identity survives splits, and pinned nodes
  // are never evicted) and sets *tokens to the tokens pinned.
  RadixNode* pin(const int32_t* ids, int n, int32_t session, int* tokens);
  void unpin(RadixNode* node, int32_t session);
  // Evict up to n_pages from least-recently-used unlocked, unpinned leaves. Returns pages
  // removed from the tree (their memory is freed unless a live sequence still holds them).
  int evict(int n_pages, const std::string& reason);
  // Drop every unlocked, unpinned page (all of them when nothing is locked or pinned).
  int clear();

  TreeSnapshot snapshot() const;
  void visit(const std::function<void(const RadixNode&)>& f) const;
  // Throws std::logic_error describing the first broken invariant.
  void check(std::vector<int32_t>& tree_refs_per_page) const;
  const RadixNode& root() const { return *root_; }
  uint64_t version() const { return version_; }

 private:
  RadixNode* split(RadixNode* node, int at_pages);
  void remove_leaf(RadixNode* node);
  std::vector<int32_t> head_of(const RadixNode* node) const;

  KvPool& pool_;
  EventRing& events_;
  std::unique_ptr<RadixNode> root_;
  uint64_t clock_ = 0;
  uint64_t version_ = 0;
  int32_t next_id_ = 1;
};

}  // namespace kvdeck
