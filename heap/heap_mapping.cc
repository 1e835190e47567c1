#include "heap/heap_mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "heap/data_file.h"
#include "util/errno_status.h"

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

namespace heapd {

absl::StatusOr<std::unique_ptr<HeapMapping>> HeapMapping::Map(int fd, uint64_t max_size,
                                                              uint64_t size, bool writable,
                                                              uint64_t prefix_bytes) {
  if (size > max_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", size, " bytes in a ", max_size, "-byte reservation"));
  }
  void* reserved = mmap(nullptr, prefix_bytes + max_size, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) {
    return ErrnoStatus(
        errno, absl::StrCat("reserve ", prefix_bytes + max_size, " bytes of address space"));
  }
  if (prefix_bytes != 0 && mmap(reserved, prefix_bytes, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    const int error = errno;
    munmap(reserved, prefix_bytes + max_size);
    return ErrnoStatus(error, "map the heap's per-process header");
  }
  std::unique_ptr<HeapMapping> mapping(new HeapMapping(
      fd, static_cast<char*>(reserved) + prefix_bytes, max_size, prefix_bytes, writable));
  if (absl::Status s = mapping->Extend(size); !s.ok()) return s;
  return mapping;
}

HeapMapping::~HeapMapping() { munmap(base_ - prefix_bytes_, prefix_bytes_ + max_size_); }

bool FileTakesMapSync(int fd) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
  if (probe == MAP_FAILED) return false;
  munmap(probe, page);
  return true;
}

int MapFileAt(char* at, uint64_t length, bool writable, bool map_sync, int fd, uint64_t offset) {
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  const int flags = (map_sync ? MAP_SHARED_VALIDATE | MAP_SYNC : MAP_SHARED) | MAP_FIXED;
  if (mmap(at, length, prot, flags, fd, static_cast<off_t>(offset)) != MAP_FAILED) return 0;
  const int error = errno;
  mmap(at, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return error;
}

absl::Status HeapMapping::MapRange(uint64_t begin, uint64_t end) {
  if (const int error = MapFileAt(base_ + begin, end - begin, writable_, map_sync_, fd_, begin);
      error != 0) {
    return ErrnoStatus(error, absl::StrCat("map heap bytes ", begin, "..", end));
  }
  return absl::OkStatus();
}

absl::Status HeapMapping::Extend(uint64_t new_size) {
  const uint64_t size = size_.load(std::memory_order_relaxed);
  if (new_size <= size) return absl::OkStatus();
  if (new_size > max_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", new_size, " bytes in a ", max_size_, "-byte reservation"));
  }
  if (absl::Status s = MapRange(size, new_size); !s.ok()) return s;
  size_.store(new_size, std::memory_order_release);
  return absl::OkStatus();
}

void HeapMapping::Adopt(uint64_t size) {
  if (size > size_.load(std::memory_order_relaxed) && size <= max_size_) {
    size_.store(size, std::memory_order_release);
  }
}

absl::Status HeapMapping::Flush() {
  const uint64_t size = size_.load(std::memory_order_acquire);
  if (size == 0 || !writable_) return absl::OkStatus();
  if (msync(base_, size, MS_SYNC) != 0) return ErrnoStatus(errno, "msync heap mapping");
  return absl::OkStatus();
}

}  // namespace heapd
