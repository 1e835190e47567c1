// Test helpers that act on a heap's files behind its back: a client's
// pre-image record, and descriptors that stop writing.
#ifndef HEAPD_HEAP_TEST_FILES_H_
#define HEAPD_HEAP_TEST_FILES_H_

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "heap/undo_record.h"

namespace heapd {

// The record a client appends to its journal before its first store to
// `page` in `generation`: the page as it was (`image`), stamped now.
inline std::string PreImageRecord(uint64_t page, uint64_t generation, const std::string& image) {
  UndoRecordHeader pre;
  pre.kind = static_cast<uint32_t>(UndoKind::kPreImage);
  pre.page = page;
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  pre.time_ns =
      static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
  pre.generation = generation;
  return EncodeUndoRecord(pre, image);
}

// Makes every descriptor of this process whose target `matches` refer to
// /dev/null, read-only: writes through it fail from now on.
inline void BreakDescriptors(const std::function<bool(const std::string& target)>& matches) {
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(fd.path(), error).string();
    if (error || !matches(target)) continue;
    const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    dup2(null, std::stoi(fd.path().filename().string()));
    close(null);
  }
}

}  // namespace heapd

#endif  // HEAPD_HEAP_TEST_FILES_H_
