// Directories a process keeps files in that no other user may touch: its
// own, and writable by no one else, so nobody can put, replace or remove a
// file there (heapd's runtime and state directories).
#ifndef HEAPD_UTIL_OWN_DIRECTORY_H_
#define HEAPD_UTIL_OWN_DIRECTORY_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

// Opens `path` as a directory, following no symlink in its last component,
// and checks that this process's user owns it and that neither its group
// nor others may write it. FAILED_PRECONDITION naming `what` (the flag or
// setting that chose the path), the owner and the mode otherwise.
absl::StatusOr<UniqueFd> OpenOwnDirectory(const std::string& path, absl::string_view what);

// Makes `path` with `mode` if it does not exist (its parent must), then
// OpenOwnDirectory.
absl::StatusOr<UniqueFd> MakeOwnDirectory(const std::string& path, mode_t mode,
                                          absl::string_view what);

}  // namespace heapd

#endif  // HEAPD_UTIL_OWN_DIRECTORY_H_
