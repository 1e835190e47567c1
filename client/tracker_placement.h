// TrackerPlacement: keeps the write tracker's thread (write_tracker.h) on
// the CPU of a thread whose stores it serves, when that thread is bound to
// one CPU.
//
// A store to a protected page waits in the kernel until the tracker has
// taken the page's pre-image. When the tracker runs on the faulting
// thread's CPU, the kernel switches from one to the other and back (about
// 7.5 us per first store on this machine kind); on another CPU each of
// them must be woken there, across CPUs (about 23 us: docs/performance.md,
// B8). A
// thread bound to one CPU (srun --cpu-bind, mpirun --bind-to core,
// OMP_PROC_BIND) never moves, so the tracker moves to it. A thread free to
// run anywhere is not followed: the scheduler would move it away from the
// tracker at its next wake-up. Nor is a real-time thread (the tracker
// would wait behind it), nor a thread of another process (the kernel
// storing for it: process_vm_writev). A thread that keeps the CPU it is
// bound to busy (polling) shares it with the tracker as the scheduler
// decides.
//
// Used by the tracker's thread only.
#ifndef HEAPD_CLIENT_TRACKER_PLACEMENT_H_
#define HEAPD_CLIENT_TRACKER_PLACEMENT_H_

#include <sched.h>
#include <sys/types.h>

#include <cstdint>

namespace heapd {

class TrackerPlacement {
 public:
  // Remembers the calling thread's CPUs: where the tracker goes back to
  // when it follows no thread.
  TrackerPlacement();

  // A store of thread `tid` (0: unknown) faulted at `now_ns`
  // (CLOCK_MONOTONIC). Once `tid` faulted twice in a row (threads bound to
  // different CPUs faulting in turn do not make the tracker move at every
  // fault), moves the calling thread to `tid`'s CPU if `tid` is followed
  // and bound to one, back to its own CPUs if not. A thread's binding is
  // read again after kRecheckNs.
  void Follow(pid_t tid, uint64_t now_ns);
  // True while the tracker shares the CPU of the last thread it followed:
  // it must then sleep between faults, not spin (it would keep that
  // thread from running).
  bool colocated() const { return pinned_cpu_ >= 0; }

 private:
  static constexpr uint64_t kRecheckNs = 100000000;  // 100 ms

  // The only CPU `tid` may run on if it is followed (above), or -1.
  static int BoundCpu(pid_t tid);

  bool own_cpus_known_ = false;
  cpu_set_t own_cpus_;
  pid_t last_tid_ = 0;
  int faults_in_a_row_ = 0;  // of last_tid_
  int last_tid_cpu_ = -1;
  uint64_t checked_ns_ = 0;
  int pinned_cpu_ = -1;  // the CPU the tracker is bound to, or -1: its own CPUs
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_TRACKER_PLACEMENT_H_
