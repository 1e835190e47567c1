// One heapd per directory. Two heapds on one runtime directory would take
// each other's sockets; two on one state directory would open each other's
// heaps and clear each other's half-made ones. Each heapd therefore holds
// DIR/heapd.lock in its runtime and its state directory for as long as it
// runs, taken before it touches anything else there.
//
// The lock is a POSIX record lock (fcntl F_SETLK): it ends with the process
// (a crash leaves nothing to clean up), children forked for snapshot work
// do not inherit it, and F_GETLK names the process that holds it. It ends
// too if this process closes any descriptor of the file, so nothing else in
// heapd opens it.
#ifndef HEAPD_DAEMON_INSTANCE_LOCK_H_
#define HEAPD_DAEMON_INSTANCE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "util/unique_fd.h"

namespace heapd {

inline constexpr char kInstanceLockName[] = "heapd.lock";

class InstanceLock {
 public:
  // Takes `dir`/heapd.lock without waiting. `dir` must exist and be a
  // directory of this user that no one else may write (FAILED_PRECONDITION
  // otherwise). FAILED_PRECONDITION naming the holder's pid if another
  // process holds it.
  static absl::StatusOr<InstanceLock> Take(const std::string& dir);

  InstanceLock(InstanceLock&&) = default;
  InstanceLock& operator=(InstanceLock&&) = default;

 private:
  explicit InstanceLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;  // locked while it is open
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_INSTANCE_LOCK_H_
