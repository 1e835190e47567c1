#include "daemon/instance_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"
#include "util/own_directory.h"

namespace heapd {

absl::StatusOr<InstanceLock> InstanceLock::Take(const std::string& dir, absl::string_view what) {
  absl::StatusOr<UniqueFd> dir_fd = OpenOwnDirectory(dir, what);
  if (!dir_fd.ok()) return dir_fd.status();
  const std::string path = absl::StrCat(dir, "/", kInstanceLockName);
  UniqueFd fd(
      openat(dir_fd->get(), kInstanceLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file of uid ", geteuid()));
  }
  // A file an older heapd left readable to all is closed to them now.
  if ((st.st_mode & 07777) != 0600 && fchmod(fd.get(), 0600) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chmod 0600 ", path));
  }
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  // Twice: a holder may let go between our attempt and our question.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (fcntl(fd.get(), F_SETLK, &whole) == 0) return InstanceLock(std::move(fd), "");
    if (errno == ENOLCK) {
      return InstanceLock(UniqueFd(), absl::StrCat(path,
                                                   " cannot be locked on this file system: "
                                                   "nothing stops a second heapd on ",
                                                   dir));
    }
    if (errno != EACCES && errno != EAGAIN) {
      return ErrnoStatus(errno, absl::StrCat("lock ", path));
    }
    struct flock holder = whole;
    if (fcntl(fd.get(), F_GETLK, &holder) != 0) {
      return ErrnoStatus(errno, absl::StrCat("ask who locks ", path));
    }
    if (holder.l_type == F_UNLCK) continue;
    if (holder.l_type == F_RDLCK || holder.l_pid <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a process", holder.l_pid > 0 ? absl::StrCat(" (pid ", holder.l_pid, ")") : "",
          " that is not heapd holds a lock on ", path, " (", what, " ", dir,
          "); heapd takes a write lock there only"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "another heapd (pid ", holder.l_pid, ") runs on ", dir, " (", what, "; it holds ", path,
        "): stop it first, or give this one its own --runtime_dir and "
        "--state_dir"));
  }
  return absl::UnavailableError(absl::StrCat(path, " is locked and let go, again and again"));
}

}  // namespace heapd
