// RunWorkers: a loop's work split over a few threads, for the snapshot
// store's hashing, compression and copying (2 cores per node here).
#ifndef HEAPD_UTIL_RUN_WORKERS_H_
#define HEAPD_UTIL_RUN_WORKERS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

namespace heapd {

// Runs work(0) .. work(count - 1), work(0) on this thread and the others
// on threads of their own; returns when all are done. A thread that cannot
// be started (the process is at its task limit) does not fail the work: its
// share runs on this thread afterwards.
inline void RunWorkers(int count, const std::function<void(int worker)>& work) {
  std::vector<std::thread> threads;
  std::vector<int> here;
  for (int worker = 1; worker < count; ++worker) {
    try {
      threads.emplace_back(work, worker);
    } catch (const std::system_error&) {
      here.push_back(worker);
    }
  }
  work(0);
  for (int worker : here) work(worker);
  for (std::thread& thread : threads) thread.join();
}

// The indexes 0 .. size - 1 handed to workers, each the next not taken:
// items of uneven cost spread evenly over them (split as i % workers, one
// worker of a store create got every chunk's dense first half and the
// other waited for it).
class NextIndex {
 public:
  explicit NextIndex(uint64_t size) : size_(size) {}
  // The next index not taken; false when none is left.
  bool Take(uint64_t* index) {
    *index = next_.fetch_add(1, std::memory_order_relaxed);
    return *index < size_;
  }

 private:
  const uint64_t size_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_WORKERS_H_
