// One heapd per directory. Two heapds on one runtime directory would take
// each other's sockets; two on one state directory would open each other's
// heaps and clear each other's half-made ones. Each heapd therefore holds
// DIR/heapd.lock in its runtime and its state directory for as long as it
// runs, taken before it touches anything else there.
//
// The lock is a POSIX record lock (fcntl F_SETLK): it ends with the process
// (a crash leaves nothing to clean up), helpers spawned for snapshot work
// do not inherit it, and F_GETLK names the process that holds it. It ends
// too if this process closes any descriptor of the file, so nothing else in
// heapd opens it. The file is mode 0600: another user cannot open it, so
// cannot hold a lock on it that keeps heapd from starting.
#ifndef HEAPD_DAEMON_INSTANCE_LOCK_H_
#define HEAPD_DAEMON_INSTANCE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

inline constexpr char kInstanceLockName[] = "heapd.lock";

class InstanceLock {
 public:
  // Takes `dir`/heapd.lock without waiting. `dir` must be a directory of
  // this user that no one else may write (OpenOwnDirectory; `what` names
  // the flag that chose it). FAILED_PRECONDITION naming the holder's pid if
  // another process holds the lock. On a file system without POSIX locks
  // (ENOLCK) the lock is not held and warning() says so.
  static absl::StatusOr<InstanceLock> Take(const std::string& dir, absl::string_view what);

  InstanceLock(InstanceLock&&) = default;
  InstanceLock& operator=(InstanceLock&&) = default;

  // Empty, or why the directory is not locked.
  const std::string& warning() const { return warning_; }

 private:
  InstanceLock(UniqueFd fd, std::string warning)
      : fd_(std::move(fd)), warning_(std::move(warning)) {}
  UniqueFd fd_;  // locked while it is open
  std::string warning_;
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_INSTANCE_LOCK_H_
