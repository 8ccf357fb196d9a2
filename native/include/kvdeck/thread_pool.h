// kvdeck/thread_pool.h — the CPU backend's worker threads: dynamic tasks, spin then sleep.
//
// Why not OpenMP: libgomp's barriers spin; when the machine is oversubscribed (a build, a
// UI thread, a telemetry sampler beside the engine) a descheduled thread stalls every barrier
// and decode collapses (measured: 0.12x idle speed with 2 busy processes on 2 cores). Here
// - tasks are claimed one at a time from an atomic counter by whichever thread is running,
//   the caller included, so a worker that is not scheduled simply does less of the work;
// - an idle worker spins for a short window (KVDECK_SPIN_US, default 50 us: longer than the
//   gap between two parallel sections of a decode step), then sleeps on a condition
//   variable and costs nothing;
// - the caller, once the counter is exhausted, waits for tasks in flight the same way.
//
// Contracts
// - run() is not reentrant and is called by one thread at a time (the engine's lock
//   guarantees it); fn must not throw (kernels do not) and must not call run().
// - fn(task, thread): task in [0, n_tasks), thread in [0, size()); thread 0 is the caller.
//   Every task runs exactly once; run() returns after all of them have finished, and their
//   writes are visible to the caller.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvdeck {

class ThreadPool {
 public:
  using Fn = std::function<void(int task, int thread)>;

  explicit ThreadPool(int threads);  // threads >= 1: threads-1 workers + the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Run fn over n_tasks tasks (at most kMaxTasks). Blocks until done. One task, or a
  // pool of one thread, runs inline on the caller.
  void run(int n_tasks, const Fn& fn);
  static constexpr int kMaxTasks = (1 << 20) - 1;

  // Cores this process may run on (sched_getaffinity), at least 1.
  static int available_cores();

 private:
  void worker(int index);
  void work(uint64_t job, int thread);  // claim and run job's tasks until none are left

  std::vector<std::thread> workers_;
  int spin_us_;
  // The claim word: job id (24 bits) | task count (20 bits) | next task (20 bits). A worker
  // claims a task with a CAS that also checks the job id, so a late worker can never take a
  // task of a later job; fn_ is read only after a successful claim (the job is live then:
  // the caller waits for that task).
  std::atomic<uint64_t> claim_{0};
  const Fn* fn_ = nullptr;
  uint64_t job_ = 0;
  std::atomic<int> done_{0};           // tasks of the current job finished
  std::atomic<bool> stop_{false};
  // Sleeping: workers wait for a new job id; the caller waits for done_ == its task count.
  std::mutex mu_;
  std::condition_variable wake_;       // workers
  std::condition_variable finished_;   // the caller
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
};

}  // namespace kvdeck
