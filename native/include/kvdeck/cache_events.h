// kvdeck/cache_events.h — what the prefix cache did, as a ring the caller drains.
//
// C++ never calls back into Python: the engine appends events here during a call and
// Python drains them after it (DESIGN.md § Engine). The ring is bounded; when it wraps,
// the oldest events are dropped and `dropped` counts them. push/drain/dropped are safe from
// any thread (drain runs on the UI's thread while a forward pushes evictions).
#pragma once
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace kvdeck {

enum class CacheEventKind : int32_t { Hit = 0, Insert = 1, Evict = 2, Pin = 3, Unpin = 4 };
const char* cache_event_name(CacheEventKind k);

struct CacheEvent {
  CacheEventKind kind;
  int32_t session = 0;             // session that caused it (Evict: the evicted prefix's owner)
  int32_t pages = 0;               // pages affected
  int32_t tokens = 0;              // tokens affected (pages * block)
  int32_t prefix_tokens = 0;       // Hit: tokens matched; Evict/Insert: where the span starts
  std::vector<int32_t> head;       // first tokens of the affected prefix (up to 8)
  std::string reason;              // Evict: why ("pool full: need N pages", "clear")
};

class EventRing {
 public:
  explicit EventRing(size_t capacity = 4096) : cap_(capacity) {}
  void push(CacheEvent e) {
    std::lock_guard<std::mutex> lk(mu_);
    if (q_.size() == cap_) {
      q_.pop_front();
      ++dropped_;
    }
    q_.push_back(std::move(e));
  }
  std::vector<CacheEvent> drain() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<CacheEvent> out(q_.begin(), q_.end());
    q_.clear();
    return out;
  }
  uint64_t dropped() const {
    std::lock_guard<std::mutex> lk(mu_);
    return dropped_;
  }
  size_t capacity() const { return cap_; }

 private:
  mutable std::mutex mu_;
  size_t cap_;
  std::deque<CacheEvent> q_;
  uint64_t dropped_ = 0;
};

}  // namespace kvdeck
