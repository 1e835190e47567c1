#include "util/dir_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// Deep enough for any snapshot heapd writes (a directory of files).
constexpr int kMaxRemoveDepth = 8;

absl::Status RemoveTreeAtDepth(int dir, const std::string& name, int depth) {
  if (unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
  if (errno != EISDIR && errno != EPERM) return ErrnoStatus(errno, absl::StrCat("remove ", name));
  if (depth >= kMaxRemoveDepth) {
    return absl::FailedPreconditionError(absl::StrCat("remove ", name, ": nested too deep"));
  }
  absl::StatusOr<UniqueFd> inner = OpenDirectoryAt(dir, name);
  if (!inner.ok()) return inner.status();
  absl::StatusOr<std::vector<std::string>> entries = ListDirectory(inner->get(), 1 << 16);
  if (!entries.ok()) return entries.status();
  for (const std::string& entry : *entries) {
    if (absl::Status s = RemoveTreeAtDepth(inner->get(), entry, depth + 1); !s.ok()) return s;
  }
  if (unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove directory ", name));
  }
  return absl::OkStatus();
}

}  // namespace

bool ReadAllAt(int fd, char* out, size_t length, uint64_t at) {
  while (length > 0) {
    const ssize_t n = pread(fd, out, length, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;  // the file ends first
    if (n <= 0) return false;
    out += n;
    length -= static_cast<size_t>(n);
    at += static_cast<uint64_t>(n);
  }
  return true;
}

bool WriteAllAt(int fd, absl::string_view bytes, uint64_t at) {
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  return true;
}

absl::StatusOr<UniqueFd> OpenDirectoryAt(int dir, const std::string& name) {
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open directory ", name));
  return fd;
}

absl::StatusOr<UniqueFd> OpenRegularFileAt(int dir, const std::string& name, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", name));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", name));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(name, " is not a regular file"));
  }
  // Reads from a regular file never block; clear the flag for copy_file_range.
  if (fcntl(fd.get(), F_SETFL, 0) != 0) return ErrnoStatus(errno, absl::StrCat("fcntl ", name));
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadFileAt(int dir, const std::string& name, uint64_t max_bytes) {
  uint64_t size = 0;
  absl::StatusOr<UniqueFd> fd = OpenRegularFileAt(dir, name, &size);
  if (!fd.ok()) return fd.status();
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, " has ", size, " bytes; at most ", max_bytes, " are read"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = read(fd->get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", name));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);  // it shrank while read: what is there
  return bytes;
}

absl::Status WriteNewFileAt(int dir, const std::string& name, absl::string_view bytes) {
  UniqueFd fd(
      openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", name));
  while (!bytes.empty()) {
    const ssize_t n = write(fd.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("write ", name));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (fsync(fd.get()) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", name));
  return absl::OkStatus();
}

absl::Status RemoveTreeAt(int dir, const std::string& name) {
  return RemoveTreeAtDepth(dir, name, 0);
}

absl::StatusOr<std::vector<std::string>> ListDirectory(int dir, size_t max_entries) {
  const int copy = fcntl(dir, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) return ErrnoStatus(errno, "duplicate a directory fd");
  DIR* stream = fdopendir(copy);
  if (stream == nullptr) {
    close(copy);
    return ErrnoStatus(errno, "read a directory");
  }
  rewinddir(stream);
  std::vector<std::string> names;
  absl::Status status;
  errno = 0;
  while (dirent* entry = readdir(stream)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    if (names.size() == max_entries) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("a directory of more than ", max_entries, " entries"));
      break;
    }
    names.push_back(name);
  }
  if (status.ok() && errno != 0) status = ErrnoStatus(errno, "read a directory");
  closedir(stream);
  if (!status.ok()) return status;
  return names;
}

bool IsWithinDirectory(int dir, dev_t device, ino_t inode) {
  UniqueFd current(fcntl(dir, F_DUPFD_CLOEXEC, 3));
  for (int depth = 0; current.valid() && depth < 256; ++depth) {
    struct stat st;
    if (fstat(current.get(), &st) != 0) return false;
    if (st.st_dev == device && st.st_ino == inode) return true;
    UniqueFd parent(openat(current.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    struct stat up;
    if (!parent.valid() || fstat(parent.get(), &up) != 0) return false;
    if (up.st_dev == st.st_dev && up.st_ino == st.st_ino) return false;  // the root
    current = std::move(parent);
  }
  return false;
}

}  // namespace heapd
