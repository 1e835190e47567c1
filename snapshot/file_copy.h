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
#include <vector>

#include "absl/status/statusor.h"

namespace heapd {

enum class CopyMethod { kReflink, kSparse, kPlain };
const char* CopyMethodName(CopyMethod method);

struct CopyResult {
  CopyMethod method = CopyMethod::kPlain;
  uint64_t size = 0;           // of the file
  uint64_t bytes_written = 0;  // copied (0 for a reflink)
};

// [begin, end) of a file.
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Copies the first `size` bytes of `from_fd` into `to_fd`, an empty file
// opened for writing, and fsyncs it. `needed` (null: everything): the only
// ranges whose contents matter, sorted and disjoint; the rest of the copy
// reads as zeros (a reflink clones everything: that costs nothing).
// RESOURCE_EXHAUSTED when the target file system is full; `what` names the
// copy in errors.
absl::StatusOr<CopyResult> CopyFileContents(int from_fd, uint64_t size, int to_fd,
                                            const std::string& what,
                                            const std::vector<ByteRange>* needed = nullptr);

// Reserves the first `size` bytes of `fd` on disk (fallocate), as a heap's
// data file must be: a restored heap never meets a full disk in a client's
// store.
absl::Status ReserveFile(int fd, uint64_t size, const std::string& what);

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_FILE_COPY_H_
