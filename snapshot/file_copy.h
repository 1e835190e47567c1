// Copying a heap's data file for a snapshot, cheapest way first:
//   reflink  FICLONE: the copy shares the source's extents (XFS with
//            reflink, Btrfs): constant time, no space until either changes;
//   sparse   only the written extents (FIEMAP, skipping holes and extents
//            reserved by fallocate but never written; else SEEK_DATA /
//            SEEK_HOLE), each with copy_file_range: holes stay holes;
//   plain    read and write everything.
#ifndef HEAPD_SNAPSHOT_FILE_COPY_H_
#define HEAPD_SNAPSHOT_FILE_COPY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace heapd {

enum class CopyMethod { kReflink, kSparse, kPlain };
const char* CopyMethodName(CopyMethod method);

struct CopyResult {
  CopyMethod method = CopyMethod::kPlain;
  uint64_t size = 0;           // of the file
  uint64_t bytes_written = 0;  // copied (0 for a reflink)
};

// Copies the first `size` bytes of `from_fd` into `to_fd`, an empty file
// opened for writing, and fsyncs it. RESOURCE_EXHAUSTED when the target
// file system is full; `what` names the copy in errors. No locks, no
// logging: it may run in a RunAs child (util/run_as.h).
absl::StatusOr<CopyResult> CopyFileContents(int from_fd, uint64_t size, int to_fd,
                                            const std::string& what);

// Reserves the first `size` bytes of `fd` on disk (fallocate), as a heap's
// data file must be: a restored heap never meets a full disk in a client's
// store.
absl::Status ReserveFile(int fd, uint64_t size, const std::string& what);

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_FILE_COPY_H_
