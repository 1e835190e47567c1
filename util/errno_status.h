// The status of a failed system call, with the code its errno means.
#ifndef HEAPD_UTIL_ERRNO_STATUS_H_
#define HEAPD_UTIL_ERRNO_STATUS_H_

#include <string>

#include "absl/status/status.h"

namespace heapd {

// `what` and strerror(err), as RESOURCE_EXHAUSTED (ENOSPC, EDQUOT, EFBIG,
// ENOMEM), NOT_FOUND (ENOENT), ALREADY_EXISTS (EEXIST), PERMISSION_DENIED
// (EACCES, EPERM, EROFS) or INTERNAL (anything else).
absl::Status ErrnoStatus(int err, const std::string& what);

}  // namespace heapd

#endif  // HEAPD_UTIL_ERRNO_STATUS_H_
