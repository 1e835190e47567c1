#include "client/tracker_placement.h"

#include <sys/syscall.h>
#include <unistd.h>

namespace heapd {

TrackerPlacement::TrackerPlacement() {
  CPU_ZERO(&own_cpus_);
  own_cpus_known_ = sched_getaffinity(0, sizeof(own_cpus_), &own_cpus_) == 0;
}

int TrackerPlacement::BoundCpu(pid_t tid) {
  // A thread of this process (signal 0: only asks), not real-time.
  if (syscall(SYS_tgkill, getpid(), tid, 0) != 0) return -1;
  const int policy = sched_getscheduler(tid);
  if (policy != SCHED_OTHER && policy != SCHED_BATCH && policy != SCHED_IDLE) return -1;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  // Fails on nodes with more CPUs than a cpu_set_t holds: not followed.
  if (sched_getaffinity(tid, sizeof(cpus), &cpus) != 0 || CPU_COUNT(&cpus) != 1) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &cpus)) return cpu;
  }
  return -1;
}

void TrackerPlacement::Follow(pid_t tid, uint64_t now_ns) {
  if (tid <= 0 || !own_cpus_known_) return;
  if (tid != last_tid_) {
    last_tid_ = tid;
    faults_in_a_row_ = 1;
    return;
  }
  if (++faults_in_a_row_ == 2 || now_ns - checked_ns_ >= kRecheckNs) {
    last_tid_cpu_ = BoundCpu(tid);
    checked_ns_ = now_ns;
  }
  if (faults_in_a_row_ < 2 || last_tid_cpu_ == pinned_cpu_) return;
  if (last_tid_cpu_ >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last_tid_cpu_, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) pinned_cpu_ = last_tid_cpu_;
    return;
  }
  if (sched_setaffinity(0, sizeof(own_cpus_), &own_cpus_) == 0) pinned_cpu_ = -1;
}

}  // namespace heapd
