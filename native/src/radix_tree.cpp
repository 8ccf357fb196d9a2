// The prefix cache's radix tree (see radix_tree.h for the contracts).
#include "kvdeck/radix_tree.h"

#include <algorithm>
#include <stdexcept>

namespace kvdeck {

const char* cache_event_name(CacheEventKind k) {
  switch (k) {
    case CacheEventKind::Hit: return "hit";
    case CacheEventKind::Insert: return "insert";
    case CacheEventKind::Evict: return "evict";
    case CacheEventKind::Pin: return "pin";
    case CacheEventKind::Unpin: return "unpin";
  }
  return "?";
}

RadixTree::RadixTree(KvPool& pool, EventRing& events)
    : pool_(pool), events_(events), root_(std::make_unique<RadixNode>()) {}

RadixTree::~RadixTree() {
  // Return the tree's page references (the pool may already be gone: Engine destroys the
  // tree first).
  visit([&](const RadixNode& n) {
    for (int p : n.pages) pool_.unref(p);
  });
}

// ============================================================================
// Matching and locking
// ============================================================================
PrefixMatch RadixTree::match(const int32_t* ids, int n, int max_tokens) {
  ++version_;
  const int B = pool_.block();
  const int limit = std::min(n, max_tokens) / B * B;
  PrefixMatch m;
  RadixNode* node = root_.get();
  ++clock_;
  node->last_access = clock_;
  int pos = 0;
  while (pos + B <= limit) {
    auto it = node->children.find(std::vector<int32_t>(ids + pos, ids + pos + B));
    if (it == node->children.end()) break;
    RadixNode* child = it->second.get();
    const int np = int(child->pages.size());
    int j = 0;  // pages of child that match
    while (j < np && pos + B <= limit &&
           std::equal(ids + pos, ids + pos + B, child->tokens.begin() + size_t(j) * B)) {
      m.pages.push_back(child->pages[j]);
      pos += B;
      ++j;
    }
    if (j < np) child = split(child, j);  // the match ends inside: make it end at a node
    child->last_access = clock_;
    node = child;
    if (j < np) break;
  }
  m.tokens = pos;
  m.node = node;
  return m;
}

void RadixTree::lock(RadixNode* node) {
  ++version_;
  for (RadixNode* n = node; n; n = n->parent) ++n->lock_ref;
}

void RadixTree::unlock(RadixNode* node) {
  ++version_;
  for (RadixNode* n = node; n; n = n->parent) {
    if (n->lock_ref <= 0) throw std::logic_error("radix: unlock of an unlocked node");
    --n->lock_ref;
  }
}

// Split node at `at` pages: a new node takes the first `at` pages and becomes node's
// parent. `node` keeps its identity (requests hold pointers to it) and its deeper span.
RadixNode* RadixTree::split(RadixNode* node, int at) {
  const int B = pool_.block();
  auto P = std::make_unique<RadixNode>();
  P->id = next_id_++;
  P->parent = node->parent;
  P->tokens.assign(node->tokens.begin(), node->tokens.begin() + size_t(at) * B);
  P->pages.assign(node->pages.begin(), node->pages.begin() + at);
  P->lock_ref = node->lock_ref;
  P->pin_ref = node->pin_ref;
  P->last_access = node->last_access;
  P->owner = node->owner;
  P->depth_tokens = node->depth_tokens;
  node->tokens.erase(node->tokens.begin(), node->tokens.begin() + size_t(at) * B);
  node->pages.erase(node->pages.begin(), node->pages.begin() + at);
  node->depth_tokens += at * B;
  RadixNode* parent = node->parent;
  std::vector<int32_t> pkey(P->tokens.begin(), P->tokens.begin() + B);
  std::unique_ptr<RadixNode> self = std::move(parent->children[pkey]);
  std::vector<int32_t> nkey(node->tokens.begin(), node->tokens.begin() + B);
  node->parent = P.get();
  P->children.emplace(std::move(nkey), std::move(self));
  RadixNode* raw = P.get();
  parent->children[pkey] = std::move(P);
  return raw;
}

// ============================================================================
// Insertion
// ============================================================================
RadixNode* RadixTree::insert(const int32_t* ids, int n_pages, const int32_t* pages, int32_t session) {
  ++version_;
  const int B = pool_.block();
  RadixNode* node = root_.get();
  ++clock_;
  node->last_access = clock_;
  int i = 0;  // pages of ids placed so far
  while (i < n_pages) {
    std::vector<int32_t> key(ids + size_t(i) * B, ids + size_t(i + 1) * B);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto c = std::make_unique<RadixNode>();
      c->id = next_id_++;
      c->parent = node;
      c->tokens.assign(ids + size_t(i) * B, ids + size_t(n_pages) * B);
      c->pages.assign(pages + i, pages + n_pages);
      for (int p : c->pages) pool_.ref(p);
      c->last_access = clock_;
      c->owner = session;
      c->depth_tokens = i * B;
      RadixNode* raw = c.get();
      node->children.emplace(std::move(key), std::move(c));
      events_.push({CacheEventKind::Insert, session, n_pages - i, (n_pages - i) * B, i * B, head_of(raw), ""});
      return raw;
    }
    RadixNode* child = it->second.get();
    const int np = int(child->pages.size());
    int j = 0;
    while (j < np && i + j < n_pages &&
           std::equal(ids + size_t(i + j) * B, ids + size_t(i + j + 1) * B, child->tokens.begin() + size_t(j) * B))
      ++j;
    // Diverges or ends inside child: split so the node touched is exactly the shared pages
    // (the LRU clock then covers only what this request used).
    if (j < np) child = split(child, j);
    child->last_access = clock_;
    node = child;
    i += j;
  }
  return node;
}

// ============================================================================
// Pins
// ============================================================================
RadixNode* RadixTree::pin(const int32_t* ids, int n, int32_t session, int* tokens) {
  ++version_;
  PrefixMatch m = match(ids, n, n);
  for (RadixNode* x = m.node; x; x = x->parent) ++x->pin_ref;
  *tokens = m.tokens;
  events_.push({CacheEventKind::Pin, session, m.tokens / pool_.block(), m.tokens, 0,
                std::vector<int32_t>(ids, ids + std::min(n, 8)), ""});
  return m.node;
}

void RadixTree::unpin(RadixNode* node, int32_t session) {
  ++version_;
  const int tokens = node == root_.get() ? 0 : node->depth_tokens + int(node->tokens.size());
  for (RadixNode* x = node; x; x = x->parent) {
    if (x->pin_ref <= 0) throw std::logic_error("radix: unpin of a node that is not pinned");
    --x->pin_ref;
  }
  events_.push({CacheEventKind::Unpin, session, tokens / pool_.block(), tokens, 0,
                node == root_.get() ? std::vector<int32_t>{} : head_of(node), ""});
}

// ============================================================================
// Eviction
// ============================================================================
std::vector<int32_t> RadixTree::head_of(const RadixNode* node) const {
  const RadixNode* top = node;
  while (top->parent && top->parent != root_.get()) top = top->parent;
  return std::vector<int32_t>(top->tokens.begin(), top->tokens.begin() + std::min<size_t>(8, top->tokens.size()));
}

void RadixTree::remove_leaf(RadixNode* node) {
  RadixNode* parent = node->parent;
  for (auto it = parent->children.begin(); it != parent->children.end(); ++it)
    if (it->second.get() == node) {
      parent->children.erase(it);
      return;
    }
  throw std::logic_error("radix: leaf not found under its parent");
}

int RadixTree::evict(int n_pages, const std::string& reason) {
  ++version_;
  const int B = pool_.block();
  int evicted = 0;
  while (evicted < n_pages) {
    // The least recently used evictable leaf (ties: the older node).
    RadixNode* best = nullptr;
    visit([&](const RadixNode& c) {
      if (!c.children.empty() || c.lock_ref > 0 || c.pin_ref > 0 || c.parent == nullptr) return;
      if (!best || c.last_access < best->last_access || (c.last_access == best->last_access && c.id < best->id))
        best = const_cast<RadixNode*>(&c);
    });
    if (!best) break;
    const int take = std::min<int>(n_pages - evicted, int(best->pages.size()));
    const int keep = int(best->pages.size()) - take;
    for (int k = keep; k < int(best->pages.size()); ++k) pool_.unref(best->pages[k]);
    events_.push({CacheEventKind::Evict, best->owner, take, take * B, best->depth_tokens + keep * B, head_of(best), reason});
    evicted += take;
    if (keep == 0) {
      remove_leaf(best);
    } else {
      best->pages.resize(keep);
      best->tokens.resize(size_t(keep) * B);
    }
  }
  return evicted;
}

int RadixTree::clear() {
  ++version_;
  int total = 0;
  for (;;) {
    const int n = evict(1 << 30, "clear");
    if (n == 0) break;
    total += n;
  }
  return total;
}

// ============================================================================
// Inspection
// ============================================================================
void RadixTree::visit(const std::function<void(const RadixNode&)>& f) const {
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) f(*n);
    for (auto& kv : n->children) stack.push_back(kv.second.get());
  }
}

TreeSnapshot RadixTree::snapshot() const {
  TreeSnapshot s;
  visit([&](const RadixNode& n) {
    const int np = int(n.pages.size());
    ++s.nodes;
    s.cached_pages += np;
    if (n.pin_ref > 0) s.pinned_pages += np;
    else if (n.lock_ref > 0) s.locked_pages += np;
    else s.evictable_pages += np;
  });
  return s;
}

void RadixTree::check(std::vector<int32_t>& refs) const {
  const int B = pool_.block();
  auto fail = [](const std::string& m) { throw std::logic_error("radix integrity: " + m); };
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    int child_locks = 0, child_pins = 0;
    for (auto& kv : n->children) {
      const RadixNode* c = kv.second.get();
      const std::string id = "node " + std::to_string(c->id);
      if (c->parent != n) fail(id + ": wrong parent");
      if (c->pages.empty()) fail(id + ": empty");
      if (c->tokens.size() != c->pages.size() * size_t(B)) fail(id + ": tokens are not whole pages");
      if (!std::equal(kv.first.begin(), kv.first.end(), c->tokens.begin()) || int(kv.first.size()) != B)
        fail(id + ": key is not its first page");
      const int depth = n == root_.get() ? 0 : n->depth_tokens + int(n->tokens.size());
      if (c->depth_tokens != depth) fail(id + ": depth");
      if (c->lock_ref < 0 || c->pin_ref < 0) fail(id + ": negative count");
      child_locks += c->lock_ref;
      child_pins += c->pin_ref;
      for (int p : c->pages) {
        if (p < 0 || p >= int(refs.size())) fail(id + ": page out of range");
        ++refs[p];
      }
      stack.push_back(c);
    }
    if (n != root_.get() && child_locks > n->lock_ref) fail("node " + std::to_string(n->id) + ": children hold more locks");
    if (n != root_.get() && child_pins > n->pin_ref) fail("node " + std::to_string(n->id) + ": children hold more pins");
  }
}

}  // namespace kvdeck
