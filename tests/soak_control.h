// The soak test's control block: a small file outside the heap that the
// harness (tests/soak_test.cc) writes and every soak_worker maps. It tells the
// workers when to drain and when heapd is being restarted, so that a worker
// accepts a session-ending error only while heapd really restarts.
#ifndef HEAPD_TESTS_SOAK_CONTROL_H_
#define HEAPD_TESTS_SOAK_CONTROL_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace heapd {

struct SoakControl {
  static constexpr uint64_t kMagic = 0x4b414f53434f4e31;  // "SOAKCON1"
  static constexpr uint64_t kRun = 0;
  static constexpr uint64_t kDrain = 1;

  uint64_t magic;
  std::atomic<uint64_t> phase;  // kRun, then kDrain
  // Even while heapd serves; the harness makes it odd before it SIGTERMs
  // heapd and even again once the new heapd answers.
  std::atomic<uint64_t> daemon_generation;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the control block is shared memory");

// Maps the control block in `path`, creating it (zeroed, phase kRun) if
// `create`. Returns null on failure.
inline SoakControl* MapSoakControl(const std::string& path, bool create) {
  const int fd = open(path.c_str(),
                      create ? O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  if (create && ftruncate(fd, 4096) != 0) {
    close(fd);
    return nullptr;
  }
  void* memory = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED) return nullptr;
  auto* control = static_cast<SoakControl*>(memory);
  if (create) {
    control->magic = SoakControl::kMagic;
  } else if (control->magic != SoakControl::kMagic) {
    munmap(memory, 4096);
    return nullptr;
  }
  return control;
}

}  // namespace heapd

#endif  // HEAPD_TESTS_SOAK_CONTROL_H_
