// ThreadPool: dynamic task claiming, bounded spinning, condition-variable sleep.
//
// Lost-wakeup argument (both sides use seq_cst atomics): a worker going to sleep first
// increments sleepers_, then re-reads claim_ under mu_; the caller first publishes claim_,
// then reads sleepers_ and, when non-zero, takes mu_ before notifying. Either the worker sees
// the new job, or the caller sees the sleeper and its notify comes after the worker waits.
// The caller's own sleep on done_ mirrors this with caller_sleeping_.
#include "kvdeck/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KVDECK_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define KVDECK_PAUSE() asm volatile("yield" ::: "memory")
#else
#define KVDECK_PAUSE() ((void)0)
#endif

namespace kvdeck {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kTaskMask = (1u << 20) - 1;
constexpr uint64_t kJobMask = (1u << 24) - 1;

uint64_t job_of(uint64_t w) { return w >> 40; }
int count_of(uint64_t w) { return int((w >> 20) & kTaskMask); }
int next_of(uint64_t w) { return int(w & kTaskMask); }

// Spin until pred() or spin_us elapse; true when pred() held.
template <typename Pred>
bool spin_until(Pred pred, int spin_us) {
  if (pred()) return true;
  const auto until = Clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 1;; ++i) {
    KVDECK_PAUSE();
    if (pred()) return true;
    if ((i & 63) == 0 && Clock::now() >= until) return false;
  }
}

int spin_from_env() {
  const char* s = std::getenv("KVDECK_SPIN_US");
  if (!s || !*s) return 50;
  return std::clamp(std::atoi(s), 0, 100000);
}

}  // namespace

int ThreadPool::available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int threads) : spin_us_(spin_from_env()) {
  threads = std::max(1, threads);
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work(uint64_t job, int thread) {
  uint64_t w = claim_.load();
  for (;;) {
    if (job_of(w) != job || next_of(w) >= count_of(w)) return;
    if (!claim_.compare_exchange_weak(w, w + 1)) continue;  // w reloaded
    const int n = count_of(w);
    (*fn_)(next_of(w), thread);
    if (done_.fetch_add(1) + 1 == n && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      finished_.notify_one();
    }
    w = claim_.load();
  }
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  auto fresh = [&] { return job_of(claim_.load(std::memory_order_acquire)) != seen || stop_.load(); };
  for (;;) {
    if (!spin_until(fresh, spin_us_)) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      wake_.wait(lk, fresh);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = job_of(claim_.load());
    work(seen, index);
  }
}

void ThreadPool::run(int n_tasks, const Fn& fn) {
  if (n_tasks <= 0) return;
  if (n_tasks > kMaxTasks) throw std::invalid_argument("thread pool: too many tasks");
  if (n_tasks == 1 || workers_.empty()) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  fn_ = &fn;
  done_.store(0);
  job_ = (job_ + 1) & kJobMask;
  if (job_ == 0) job_ = 1;  // 0 is the workers' initial "seen"
  claim_.store((job_ << 40) | (uint64_t(n_tasks) << 20));  // publishes fn_ (seq_cst)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    wake_.notify_all();
  }
  work(job_, 0);
  auto all_done = [&] { return done_.load(std::memory_order_acquire) == n_tasks; };
  if (!spin_until(all_done, spin_us_)) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeping_.store(true);
    finished_.wait(lk, all_done);
    caller_sleeping_.store(false);
  }
}

}  // namespace kvdeck
