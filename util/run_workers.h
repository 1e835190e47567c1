// RunWorkers: a loop's work split over a few threads, for the snapshot
// store's hashing, compression and copying (2 cores per node here).
#ifndef HEAPD_UTIL_RUN_WORKERS_H_
#define HEAPD_UTIL_RUN_WORKERS_H_

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

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_WORKERS_H_
