#include "daemon/instance_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/errno_status.h"

namespace heapd {

absl::StatusOr<InstanceLock> InstanceLock::Take(const std::string& dir) {
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " must be a directory of uid ", geteuid(), " that no one else may write (it is uid ",
        st.st_uid, ", mode 0", absl::StrFormat("%o", st.st_mode & 07777), ")"));
  }
  const std::string path = absl::StrCat(dir, "/", kInstanceLockName);
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path));
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  if (fcntl(fd.get(), F_SETLK, &whole) == 0) return InstanceLock(std::move(fd));
  if (errno != EACCES && errno != EAGAIN) return ErrnoStatus(errno, absl::StrCat("lock ", path));
  struct flock holder = whole;
  const bool known = fcntl(fd.get(), F_GETLK, &holder) == 0 && holder.l_type != F_UNLCK;
  return absl::FailedPreconditionError(absl::StrCat(
      "another heapd", known ? absl::StrCat(" (pid ", holder.l_pid, ")") : std::string(),
      " runs on ", dir, " (it holds ", path,
      "): stop it first, or give this one its own --runtime_dir and --state_dir"));
}

}  // namespace heapd
