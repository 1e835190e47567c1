// DataFile: a heap's data file. It holds only the objects: no allocator
// metadata. The file grows in whole chunks and every byte handed out is
// reserved on disk with fallocate first, so a full file system is an error
// returned by Grow, never a SIGBUS in a process that touches the heap.
#ifndef HEAPD_HEAP_DATA_FILE_H_
#define HEAPD_HEAP_DATA_FILE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace heapd {

// What stores the data file's pages.
enum class BackingKind {
  kFile,   // a block-device file system through the page cache
  kTmpfs,  // memory (tmpfs, shmem)
  kDax,    // persistent memory mapped directly (fs-dax)
};

const char* BackingKindName(BackingKind kind);

class DataFile {
 public:
  // Creates `path` (which must not exist) and reserves `size` bytes. On
  // failure no file is left at `path`.
  static absl::StatusOr<std::unique_ptr<DataFile>> Create(const std::string& path, uint64_t size);
  // Opens an existing data file for reading and writing.
  static absl::StatusOr<std::unique_ptr<DataFile>> Open(const std::string& path);
  // Opens the existing data file `name` in the directory `dir` (never
  // through a symlink); `path` names it in messages.
  static absl::StatusOr<std::unique_ptr<DataFile>> OpenAt(int dir, const std::string& name,
                                                          const std::string& path);
  // Creates a working image (heap/heap.h): `size` bytes of shared memory
  // (a memfd, tmpfs), reserved as Grow reserves; `label` names it. It lives
  // as long as a descriptor or mapping of it: a heapd that dies takes it
  // along once its clients let go.
  static absl::StatusOr<std::unique_ptr<DataFile>> CreateMemory(const std::string& label,
                                                                uint64_t size);
  // Takes `fd`, an open regular file of `size` bytes named `label` in
  // errors (a snapshot's data, read-only): no growth, no repair.
  static absl::StatusOr<std::unique_ptr<DataFile>> Adopt(const std::string& label, int fd,
                                                         uint64_t size);

  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  // Extends the file to `new_size` bytes, reserving the space. Fails with
  // RESOURCE_EXHAUSTED when the file system has no room, and leaves the size
  // unchanged. REQUIRES: new_size >= size().
  absl::Status Grow(uint64_t new_size);

  // Makes every write to the file durable (fdatasync).
  absl::Status Flush();

  // Puts the file back to size() if someone holding a writable fd (a
  // client) truncated, collapsed or extended it: cut back, or extended and
  // reserved again (what was cut off reads as zeros). Returns whether it had
  // to. Not thread-safe against Grow.
  absl::StatusOr<bool> Repair();

  // A new descriptor of the file, read-only unless `writable`, of its own
  // open file description (through /proc/self/fd: for a working image,
  // which has no name).
  absl::StatusOr<int> Reopen(bool writable) const;

  int fd() const { return fd_; }
  // The size heapd made the file (Create, Grow); thread-safe.
  uint64_t size() const { return size_.load(std::memory_order_acquire); }
  BackingKind backing() const { return backing_; }
  const std::string& path() const { return path_; }

 private:
  DataFile(std::string path, int fd, uint64_t size, BackingKind backing)
      : path_(std::move(path)), fd_(fd), size_(size), backing_(backing) {}

  std::string path_;
  int fd_;
  std::atomic<uint64_t> size_;
  BackingKind backing_;
};

// Returns the backing kind of the open file `fd`.
BackingKind DetectBacking(int fd);

// True if the file system holding directory `dir` can share extents between
// files (FICLONE: XFS with reflink, Btrfs), so a snapshot costs no copy.
// Probes with two small temporary files it removes.
bool ReflinkSupported(const std::string& dir);

}  // namespace heapd

#endif  // HEAPD_HEAP_DATA_FILE_H_
