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
#include "heap/data_file.h"

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

// Copies the written extents of `from` by FIEMAP, skipping holes and
// extents reserved but never written (they read as zeros; a heap's data
// file reserves its whole size with fallocate). 0 or the errno; EOPNOTSUPP
// if the file system has no FIEMAP.
int CopyWrittenExtents(int from, int to, uint64_t size, uint64_t* written) {
  constexpr uint32_t kBatch = 256;
  std::vector<char> buffer(sizeof(fiemap) + kBatch * sizeof(fiemap_extent));
  uint64_t start = 0;
  while (start < size) {
    std::fill(buffer.begin(), buffer.end(), 0);
    auto* map = reinterpret_cast<fiemap*>(buffer.data());
    map->fm_start = start;
    map->fm_length = size - start;
    map->fm_flags = FIEMAP_FLAG_SYNC;
    map->fm_extent_count = kBatch;
    if (ioctl(from, FS_IOC_FIEMAP, map) != 0) return errno == ENOTTY ? EOPNOTSUPP : errno;
    if (map->fm_mapped_extents == 0) return 0;
    for (uint32_t i = 0; i < map->fm_mapped_extents; ++i) {
      const fiemap_extent& extent = map->fm_extents[i];
      const uint64_t end = std::min<uint64_t>(size, extent.fe_logical + extent.fe_length);
      if ((extent.fe_flags & FIEMAP_EXTENT_UNWRITTEN) == 0 && end > extent.fe_logical) {
        if (const int error = CopyRange(from, to, extent.fe_logical, end - extent.fe_logical);
            error != 0) {
          return error;
        }
        *written += end - extent.fe_logical;
      }
      start = extent.fe_logical + extent.fe_length;
      if (extent.fe_flags & FIEMAP_EXTENT_LAST) return 0;
    }
  }
  return 0;
}

// Copies the data regions of `from` (size `size`); 0 or the errno. EINVAL
// if the file system cannot tell data from holes.
int CopySparse(int from, int to, uint64_t size, uint64_t* written) {
  if (const int error = CopyWrittenExtents(from, to, size, written); error != EOPNOTSUPP) {
    return error;
  }
  off_t offset = 0;
  while (static_cast<uint64_t>(offset) < size) {
    const off_t data = lseek(from, offset, SEEK_DATA);
    if (data < 0) return errno == ENXIO ? 0 : errno;  // ENXIO: only a hole remains
    const off_t hole = lseek(from, data, SEEK_HOLE);
    if (hole < 0) return errno;
    if (const int error =
            CopyRange(from, to, static_cast<uint64_t>(data), static_cast<uint64_t>(hole - data));
        error != 0) {
      return error;
    }
    *written += static_cast<uint64_t>(hole - data);
    offset = hole;
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
                                            const std::string& what) {
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
    int error = CopySparse(from_fd, to_fd, size, &result.bytes_written);
    result.method = CopyMethod::kSparse;
    if (error == EINVAL || error == EOPNOTSUPP) {
      result.method = CopyMethod::kPlain;
      result.bytes_written = size;
      error = CopyRange(from_fd, to_fd, 0, size);
    }
    if (error != 0) return ErrnoStatus(error, absl::StrCat("copy ", what));
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
