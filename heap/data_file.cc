#include "heap/data_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

#ifndef STATX_ATTR_DAX
#define STATX_ATTR_DAX 0x00200000
#endif

namespace heapd {

const char* BackingKindName(BackingKind kind) {
  switch (kind) {
    case BackingKind::kDax:
      return "dax";
    case BackingKind::kTmpfs:
      return "tmpfs";
    case BackingKind::kFile:
      return "file";
  }
  return "file";
}

BackingKind DetectBacking(int fd) {
  struct statx stx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx) == 0 &&
      (stx.stx_attributes_mask & STATX_ATTR_DAX) && (stx.stx_attributes & STATX_ATTR_DAX)) {
    return BackingKind::kDax;
  }
  struct statfs fs;
  if (fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC) return BackingKind::kTmpfs;
  return BackingKind::kFile;
}

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::Create(const std::string& path, uint64_t size) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create data file ", path));
  std::unique_ptr<DataFile> file(new DataFile(path, fd, 0, DetectBacking(fd)));
  if (absl::Status s = file->Grow(size); !s.ok()) {
    unlink(path.c_str());  // nothing half-made stays behind
    return s;
  }
  return file;
}

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::Open(const std::string& path) {
  return OpenAt(AT_FDCWD, path, path);
}

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::OpenAt(int dir, const std::string& name,
                                                           const std::string& path) {
  const int fd = openat(dir, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open data file ", path));
  struct stat st;
  const int err = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
  if (err != 0) {
    close(fd);
    return ErrnoStatus(err, absl::StrCat("open data file ", path, " as a regular file"));
  }
  return std::unique_ptr<DataFile>(
      new DataFile(path, fd, static_cast<uint64_t>(st.st_size), DetectBacking(fd)));
}

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::Adopt(const std::string& label, int fd,
                                                          uint64_t size) {
  return std::unique_ptr<DataFile>(new DataFile(label, fd, size, DetectBacking(fd)));
}

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::CreateMemory(const std::string& label,
                                                                 uint64_t size) {
  const int fd = memfd_create("heapd-working-image", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", label));
  std::unique_ptr<DataFile> file(new DataFile(label, fd, 0, BackingKind::kTmpfs));
  // Sealed against seals, whatever the kernel's memfd defaults: no client
  // holding it can keep heapd from growing it (F_SEAL_GROW) or writing it.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, absl::StrCat("seal ", label));
  }
  // A memfd is made 0777: anyone holding a read-only descriptor could open
  // it again writable through /proc/self/fd. Only heapd's user may.
  if (fchmod(fd, 0600) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", label));
  if (absl::Status s = file->Grow(size); !s.ok()) return s;
  return file;
}

absl::StatusOr<int> DataFile::Reopen(bool writable) const {
  const std::string self = absl::StrCat("/proc/self/fd/", fd_);
  const int fd = open(self.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path_, " again"));
  return fd;
}

DataFile::~DataFile() { close(fd_); }

absl::Status DataFile::Grow(uint64_t new_size) {
  const uint64_t size = this->size();
  if (new_size <= size) return absl::OkStatus();
  if (fallocate(fd_, 0, static_cast<off_t>(size), static_cast<off_t>(new_size - size)) != 0) {
    const int err = errno;
    // A failed fallocate may leave blocks past the old end: give them back.
    if (ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno,
                         absl::StrCat("shrink data file ", path_, " back after a failed grow"));
    }
    return ErrnoStatus(err, absl::StrCat("reserve ", new_size - size, " bytes to grow data file ",
                                         path_, " to ", new_size, " bytes"));
  }
  size_.store(new_size, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<bool> DataFile::Repair() {
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat data file ", path_));
  const uint64_t size = this->size();
  const uint64_t actual = static_cast<uint64_t>(st.st_size);
  if (actual == size) return false;
  if (actual > size) {
    if (ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("cut data file ", path_, " back to ", size, " bytes"));
    }
    return true;
  }
  if (fallocate(fd_, 0, 0, static_cast<off_t>(size)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("extend data file ", path_, " back from ", actual,
                                           " to ", size, " bytes"));
  }
  return true;
}

absl::Status DataFile::Flush() {
  if (fdatasync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat("fdatasync data file ", path_));
  return absl::OkStatus();
}

}  // namespace heapd

namespace heapd {

bool ReflinkSupported(const std::string& dir) {
  const std::string source = dir + "/.reflink-probe.src";
  const std::string target = dir + "/.reflink-probe.dst";
  const int from = open(source.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int to = open(target.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool supported = false;
  if (from >= 0 && to >= 0) {
    const char block[4096] = {1};
    supported = write(from, block, sizeof(block)) == static_cast<ssize_t>(sizeof(block)) &&
                ioctl(to, FICLONE, from) == 0;
  }
  if (from >= 0) close(from);
  if (to >= 0) close(to);
  unlink(source.c_str());
  unlink(target.c_str());
  return supported;
}

}  // namespace heapd
