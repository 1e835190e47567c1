#include "snapshot/file_copy.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// Copies [offset, offset + length) with copy_file_range, falling back to
// pread/pwrite where the kernel cannot (e.g. across file system types).
// Returns 0 or the errno.
int CopyRange(int from, int to, uint64_t offset, uint64_t length) {
  loff_t in = static_cast<loff_t>(offset);
  loff_t out = static_cast<loff_t>(offset);
  while (length > 0) {
    const ssize_t n = copy_file_range(from, &in, to, &out, length, 0);
    if (n > 0) {
      length -= static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) return EIO;  // the source shrank under us
    if (errno == EINTR) continue;
    if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP) return errno;
    std::vector<char> buffer(1 << 20);
    while (length > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(length, buffer.size()));
      const ssize_t got = pread(from, buffer.data(), want, in);
      if (got <= 0) return got == 0 ? EIO : errno;
      for (ssize_t done = 0; done < got;) {
        const ssize_t put =
            pwrite(to, buffer.data() + done, static_cast<size_t>(got - done), out + done);
        if (put < 0) return errno;
        done += put;
      }
      in += got;
      out += got;
      length -= static_cast<uint64_t>(got);
    }
  }
  return 0;
}

// Copies the written extents of `from` in [begin, end) by FIEMAP,
// skipping holes and extents reserved but never written (they read as
// zeros; a heap's data file reserves its whole size with fallocate). 0 or
// the errno; EOPNOTSUPP if the file system has no FIEMAP. The first call
// (`*synced` false) writes the file's dirty pages back first, so that
// extents written in the page cache only are not taken for unwritten.
int CopyWrittenExtents(int from, int to, uint64_t begin, uint64_t end, uint64_t* written,
                       bool* synced) {
  constexpr uint32_t kBatch = 256;
  std::vector<char> buffer(sizeof(fiemap) + kBatch * sizeof(fiemap_extent));
  uint64_t start = begin;
  while (start < end) {
    std::fill(buffer.begin(), buffer.end(), 0);
    auto* map = reinterpret_cast<fiemap*>(buffer.data());
    map->fm_start = start;
    map->fm_length = end - start;
    map->fm_flags = *synced ? 0 : FIEMAP_FLAG_SYNC;  // the whole file, once
    map->fm_extent_count = kBatch;
    if (ioctl(from, FS_IOC_FIEMAP, map) != 0) return errno == ENOTTY ? EOPNOTSUPP : errno;
    *synced = true;
    if (map->fm_mapped_extents == 0) return 0;
    for (uint32_t i = 0; i < map->fm_mapped_extents; ++i) {
      const fiemap_extent& extent = map->fm_extents[i];
      const uint64_t from_byte = std::max<uint64_t>(begin, extent.fe_logical);
      const uint64_t to_byte = std::min<uint64_t>(end, extent.fe_logical + extent.fe_length);
      if ((extent.fe_flags & FIEMAP_EXTENT_UNWRITTEN) == 0 && to_byte > from_byte) {
        if (const int error = CopyRange(from, to, from_byte, to_byte - from_byte); error != 0) {
          return error;
        }
        *written += to_byte - from_byte;
      }
      start = extent.fe_logical + extent.fe_length;
      if (extent.fe_flags & FIEMAP_EXTENT_LAST) return 0;
    }
  }
  return 0;
}

// Copies the data regions of `from` in [begin, end); 0 or the errno.
// EINVAL if the file system cannot tell data from holes.
int CopySparse(int from, int to, uint64_t begin, uint64_t end, uint64_t* written, bool* synced) {
  if (const int error = CopyWrittenExtents(from, to, begin, end, written, synced);
      error != EOPNOTSUPP) {
    return error;
  }
  uint64_t offset = begin;
  while (offset < end) {
    const off_t data = lseek(from, static_cast<off_t>(offset), SEEK_DATA);
    if (data < 0) return errno == ENXIO ? 0 : errno;  // ENXIO: only a hole remains
    if (static_cast<uint64_t>(data) >= end) return 0;
    const off_t hole = lseek(from, data, SEEK_HOLE);
    if (hole < 0) return errno;
    const uint64_t stop = std::min<uint64_t>(end, static_cast<uint64_t>(hole));
    if (const int error =
            CopyRange(from, to, static_cast<uint64_t>(data), stop - static_cast<uint64_t>(data));
        error != 0) {
      return error;
    }
    *written += stop - static_cast<uint64_t>(data);
    offset = stop;
  }
  return 0;
}

}  // namespace

const char* CopyMethodName(CopyMethod method) {
  switch (method) {
    case CopyMethod::kReflink:
      return "reflink";
    case CopyMethod::kSparse:
      return "sparse";
    case CopyMethod::kPlain:
      return "plain";
  }
  return "unknown";
}

absl::StatusOr<CopyResult> CopyFileContents(int from_fd, uint64_t size, int to_fd,
                                            const std::string& what,
                                            const std::vector<ByteRange>* needed) {
  CopyResult result;
  result.size = size;
  const file_clone_range whole{from_fd, 0, size, 0};
  if (size > 0 && ioctl(to_fd, FICLONERANGE, &whole) == 0) {
    result.method = CopyMethod::kReflink;
  } else {
    // Not a clone (other file system, or none that clones): copy, keeping
    // holes when the file system can show them. The target is cut to size
    // first so that trailing holes stay holes.
    if (ftruncate(to_fd, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("size ", what));
    }
    const std::vector<ByteRange> everything{{0, size}};
    if (needed == nullptr) needed = &everything;
    result.method = CopyMethod::kSparse;
    int error = 0;
    bool synced = false;
    for (const ByteRange& range : *needed) {
      const uint64_t end = std::min(range.end, size);
      if (range.begin >= end) continue;
      if (result.method == CopyMethod::kSparse) {
        error = CopySparse(from_fd, to_fd, range.begin, end, &result.bytes_written, &synced);
        if (error == EINVAL || error == EOPNOTSUPP) result.method = CopyMethod::kPlain;
      }
      if (result.method == CopyMethod::kPlain) {
        error = CopyRange(from_fd, to_fd, range.begin, end - range.begin);
        result.bytes_written += end - range.begin;
      }
      if (error != 0) return ErrnoStatus(error, absl::StrCat("copy ", what));
    }
  }
  // Cut short meanwhile (by a client that can write it), the source's end
  // read as a hole: the copy is not what it claims to be.
  struct stat st;
  if (fstat(from_fd, &st) != 0)
    return ErrnoStatus(errno, absl::StrCat("stat the source of ", what));
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::AbortedError(absl::StrCat("copy ", what, ": its source was cut from ", size,
                                           " to ", st.st_size, " bytes while it was copied"));
  }
  if (fsync(to_fd) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", what));
  return result;
}

absl::Status ReserveFile(int fd, uint64_t size, const std::string& what) {
  if (size > 0 && fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("reserve ", size, " bytes for ", what));
  }
  if (fsync(fd) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", what));
  return absl::OkStatus();
}

}  // namespace heapd
