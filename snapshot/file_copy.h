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

// Copies all of `from_fd` into the new file `to_path` (mode 0600) and
// fsyncs it. RESOURCE_EXHAUSTED when the target file system is full; on any
// error the new file is removed.
absl::StatusOr<CopyResult> CopyFileContents(int from_fd, const std::string& to_path);

// Reserves the whole of `path` on disk (fallocate), as a heap's data file
// must be: a restored heap never meets a full disk in a client's store.
absl::Status ReserveWholeFile(const std::string& path);

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_FILE_COPY_H_
