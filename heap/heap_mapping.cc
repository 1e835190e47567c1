#include "heap/heap_mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "heap/data_file.h"
#include "util/errno_status.h"

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace heapd {
namespace {

// What this process has mapped in [begin, end), from /proc/self/maps: the
// first mapping there, "0x...-0x... PATH".
std::string MappedWithin(uint64_t begin, uint64_t end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t from = 0, to = 0;
    char path[512] = "";
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %*s %*s %*s %*s %511[^\n]", &from, &to,
                    path) < 2) {
      continue;
    }
    if (from < end && begin < to) {
      return absl::StrCat("0x", absl::Hex(from), "-0x", absl::Hex(to), " ",
                          path[0] == '\0' ? "(anonymous)" : path);
    }
  }
  return "a mapping /proc/self/maps does not show";
}

// Reserves `length` bytes at exactly `at`, or says what is in the way.
absl::StatusOr<void*> ReserveAt(uint64_t at, uint64_t length) {
  void* wanted = reinterpret_cast<void*>(at);
  void* got = mmap(wanted, length, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (got == wanted) return got;
  const int error = errno;
  const std::string range = absl::StrCat("0x", absl::Hex(at), "-0x", absl::Hex(at + length));
  if (got != MAP_FAILED) {  // a kernel before 4.17 took the flag for a hint
    munmap(got, length);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map at the fixed address range ", range,
                     ": the kernel placed the mapping elsewhere (MAP_FIXED_NOREPLACE needs Linux "
                     "4.17 or later)"));
  }
  if (error == EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat("the fixed address range ", range,
                                                      " is taken in this process by ",
                                                      MappedWithin(at, at + length)));
  }
  return ErrnoStatus(error, absl::StrCat("reserve the fixed address range ", range));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HeapMapping>> HeapMapping::Map(int fd, uint64_t max_size,
                                                              uint64_t size, bool writable,
                                                              uint64_t prefix_bytes,
                                                              uint64_t fixed_base) {
  if (size > max_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", size, " bytes in a ", max_size, "-byte reservation"));
  }
  void* reserved;
  if (fixed_base != 0) {
    absl::StatusOr<void*> at = ReserveAt(fixed_base - prefix_bytes, prefix_bytes + max_size);
    if (!at.ok()) return at.status();
    reserved = *at;
  } else {
    reserved = mmap(nullptr, prefix_bytes + max_size, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED) {
      return ErrnoStatus(
          errno, absl::StrCat("reserve ", prefix_bytes + max_size, " bytes of address space"));
    }
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

HeapMapping::~HeapMapping() { Unmap(); }

void HeapMapping::Unmap() {
  if (unmapped_.exchange(true)) return;
  munmap(base_ - prefix_bytes_, prefix_bytes_ + max_size_);
}

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
  if (unmapped_.load()) return absl::FailedPreconditionError("the heap's mapping is gone");
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
  if (size == 0 || !writable_ || unmapped_) return absl::OkStatus();
  if (msync(base_, size, MS_SYNC) != 0) return ErrnoStatus(errno, "msync heap mapping");
  return absl::OkStatus();
}

}  // namespace heapd
