// StartRunningThread: a std::thread whose body has begun by the time it
// is returned.
//
// heapd starts its threads this way: the long-lived ones before it says it
// serves (its "heapd serving" log line, systemd's READY=1). Under the sanitizers,
// a thread's first step checks its own dynamic type with a memory probe
// that needs a free descriptor; a thread that first ran after a flood of
// connections had taken every descriptor was reported as a type error
// (tests/hostile_user_test OutOfDescriptorsIsNoBusyLoop).
#ifndef HEAPD_UTIL_RUNNING_THREAD_H_
#define HEAPD_UTIL_RUNNING_THREAD_H_

#include <future>
#include <thread>
#include <utility>

namespace heapd {

template <typename Body>
std::thread StartRunningThread(Body body) {
  std::promise<void> running;
  std::future<void> begun = running.get_future();
  // The promise lives in the thread: nothing of this frame is touched once
  // the wait below ends.
  std::thread thread([running = std::move(running), body = std::move(body)]() mutable {
    running.set_value();
    body();
  });
  begun.wait();
  return thread;
}

}  // namespace heapd

#endif  // HEAPD_UTIL_RUNNING_THREAD_H_
