#include "util/own_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/errno_status.h"

namespace heapd {

absl::StatusOr<UniqueFd> OpenOwnDirectory(const std::string& path, absl::string_view what) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    return ErrnoStatus(errno, absl::StrCat("open ", what, " ", path, " as a directory"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path, " must be a directory of uid ", geteuid(),
                     " that no one else may write (it is uid ", st.st_uid, ", mode 0",
                     absl::StrFormat("%o", st.st_mode & 07777), ")"));
  }
  return fd;
}

absl::StatusOr<UniqueFd> MakeOwnDirectory(const std::string& path, mode_t mode,
                                          absl::string_view what) {
  if (mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("create ", what, " ", path));
  }
  return OpenOwnDirectory(path, what);
}

}  // namespace heapd
