// TrackerPlacement with real threads and CPU affinity: the calling thread
// (the tracker) moves to the CPU of a thread bound to one, and back.
#include "client/tracker_placement.h"

#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace heapd {
namespace {

pid_t Tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// The calling thread's only CPU, or -1.
int OnlyCpu() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0 || CPU_COUNT(&cpus) != 1) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &cpus)) return cpu;
  }
  return -1;
}

// A thread that stays alive (bound to `cpu`, or not when -1) until told.
class Faulter {
 public:
  explicit Faulter(int cpu) {
    thread_ = std::thread([this, cpu] {
      if (cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        sched_setaffinity(0, sizeof(one), &one);
      }
      tid_.store(Tid());
      while (!stop_.load()) std::this_thread::yield();
    });
    while (tid_.load() == 0) std::this_thread::yield();
  }
  ~Faulter() {
    stop_.store(true);
    thread_.join();
  }
  pid_t tid() const { return tid_.load(); }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(TrackerPlacementTest, FollowsAThreadBoundToOneCpuAndComesBack) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "needs 2 CPUs";
  int last = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) last = cpu;
  }
  Faulter bound(last);
  Faulter free_to_move(-1);
  std::thread tracker([&] {
    TrackerPlacement placement;
    EXPECT_FALSE(placement.colocated());
    placement.Follow(bound.tid(), 1);
    EXPECT_FALSE(placement.colocated()) << "followed at its first fault";
    placement.Follow(bound.tid(), 2);
    EXPECT_TRUE(placement.colocated());
    EXPECT_EQ(OnlyCpu(), last);
    // Another thread's fault, then the bound one's: not followed away.
    placement.Follow(free_to_move.tid(), 3);
    placement.Follow(bound.tid(), 4);
    EXPECT_EQ(OnlyCpu(), last);
    placement.Follow(free_to_move.tid(), 5);
    placement.Follow(free_to_move.tid(), 6);
    EXPECT_FALSE(placement.colocated());
    cpu_set_t now;
    ASSERT_EQ(sched_getaffinity(0, sizeof(now), &now), 0);
    EXPECT_TRUE(CPU_EQUAL(&now, &all));
  });
  tracker.join();
}

// A task of another process (the kernel storing for it) is not followed,
// though bound to one CPU.
TEST(TrackerPlacementTest, ATaskOfAnotherProcessIsNotFollowed) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    sched_setaffinity(0, sizeof(one), &one);
    char byte = 1;
    (void)!write(pipe_fds[1], &byte, 1);
    pause();
    _exit(0);
  }
  char byte = 0;
  ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);  // bound by now
  std::thread tracker([child] {
    TrackerPlacement placement;
    placement.Follow(child, 1);
    placement.Follow(child, 2);
    EXPECT_FALSE(placement.colocated());
  });
  tracker.join();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

}  // namespace
}  // namespace heapd
