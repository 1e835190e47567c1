#include "client/write_tracker.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "client/growth_fault_handler.h"
#include "heap/fault_point.h"
#include "heap/undo_record.h"

#if defined(__SANITIZE_THREAD__)
#define HEAPD_WRITE_TRACKER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HEAPD_WRITE_TRACKER_TSAN 1
#endif
#endif

#if defined(HEAPD_WRITE_TRACKER_TSAN)
// ThreadSanitizer's dynamic annotations (its runtime defines them).
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace heapd {
namespace {

// Appends the page that a store is waiting on. ThreadSanitizer records that
// store before it runs, but it lands only after this copy (the kernel holds
// it until the protection is lifted): the copy races with nothing, and is
// hidden from TSan, which cannot see the fault's ordering.
absl::Status AppendPreImage(JournalAppender& journal, const UndoRecordHeader& header,
                            const char* page) {
#if defined(HEAPD_WRITE_TRACKER_TSAN)
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  absl::Status appended = journal.Append(header, page);
#if defined(HEAPD_WRITE_TRACKER_TSAN)
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  return appended;
}

absl::Status Errno(int err, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(what, ": ", std::strerror(err)));
}

uint64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}

// Takes (waiting) or releases the lock on byte 0 of the session's journal
// that keeps heapd from putting pages back while a pre-image is taken.
bool LockJournal(int fd, short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_len = 1;
  while (fcntl(fd, F_OFD_SETLKW, &lock) != 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WriteTracker>> WriteTracker::Start(
    char* base, const std::atomic<uint64_t>* mapped, int data_fd, UniqueFd journal, int lifeline,
    bool heapd_revision_2) {
  // Privileged (or vm.unprivileged_userfaultfd = 1): stores from system
  // calls are caught too. Otherwise user-mode stores only.
  UniqueFd uffd(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)));
  if (!uffd.valid() && errno == EPERM) {
    uffd.reset(
        static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)));
  }
  if (!uffd.valid()) return Errno(errno, "userfaultfd");
  uffdio_api api{};
  api.api = UFFD_API;
  // THREAD_ID (Linux 4.14) is older than write-protection of shared
  // memory (5.19): any kernel that has the one has the other.
  api.features =
      UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_THREAD_ID;
  if (ioctl(uffd.get(), UFFDIO_API, &api) != 0) {
    return Errno(errno, "userfaultfd write-protection of shared memory (UFFDIO_API)");
  }
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Errno(errno, "eventfd");
  std::unique_ptr<WriteTracker> tracker(new WriteTracker(base, mapped, data_fd, std::move(uffd),
                                                         std::move(journal), heapd_revision_2,
                                                         std::move(wake), lifeline));
  const uint64_t size = mapped->load(std::memory_order_acquire);
  if (size != 0) {
    uffdio_register reg{};
    reg.range = {reinterpret_cast<uint64_t>(base), size};
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (ioctl(tracker->uffd_.get(), UFFDIO_REGISTER, &reg) != 0) {
      return Errno(errno, "register the heap's mapping for write-protection (UFFDIO_REGISTER)");
    }
    uffdio_writeprotect wp{};
    wp.range = reg.range;
    wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
    if (ioctl(tracker->uffd_.get(), UFFDIO_WRITEPROTECT, &wp) != 0) {
      return Errno(errno, "write-protect the heap's mapping (UFFDIO_WRITEPROTECT)");
    }
    KeepFromChildren(base, size);
  }
  tracker->thread_ = std::thread([t = tracker.get()] { t->Run(); });
  return tracker;
}

WriteTracker::~WriteTracker() {
  EndSync();  // a Capture waiting for it would keep the thread from ending
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void WriteTracker::Protect(uint64_t offset, uint64_t length, bool protect) {
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uint64_t>(base_ + offset), length};
  wp.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
  // EAGAIN: the address space was changing (a concurrent mmap); try again.
  int attempts = 0;
  while (ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp) != 0) {
    if ((errno == EAGAIN || errno == EINTR) && ++attempts < 1000) continue;
    // The range is no longer registered (fenced): a thread stopped there
    // still needs waking.
    if (!protect) ioctl(uffd_.get(), UFFDIO_WAKE, &wp.range);
    if (protect && error_.ok()) {
      error_ = absl::InternalError(absl::StrCat(
          "write-protect heap bytes ", offset, "..", offset + length, ": ", std::strerror(errno),
          "; stores there take no pre-images and cannot be put back if this process dies"));
    }
    return;
  }
}

void KeepFromChildren(char* at, uint64_t length) {
  // A forked child keeps no userfaultfd registration: its stores would take
  // no pre-images. It gets no mapping instead, and must attach the heap.
  madvise(at, length, MADV_DONTFORK);
}

bool RegisterForWriteProtection(int uffd, char* at, uint64_t length) {
  KeepFromChildren(at, length);
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uint64_t>(at), length};
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) return false;
  uffdio_writeprotect wp{};
  wp.range = reg.range;
  wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
  // EAGAIN: the address space was changing; try again.
  for (int attempts = 0; ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) != 0; ++attempts) {
    if ((errno != EAGAIN && errno != EINTR) || attempts == 1000) return false;
  }
  return true;
}

void WriteTracker::Unprotect(uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  Protect(offset, length, false);
  unprotected_.emplace_back(offset, length);
}

void WriteTracker::EndSync() {
  absl::MutexLock lock(&mu_);
  syncing_ = false;
}

uint64_t WriteTracker::BeginSync() {
  absl::MutexLock lock(&mu_);
  syncing_ = true;
  std::sort(unprotected_.begin(), unprotected_.end());
  // Adjacent and overlapping ranges in one call each.
  uint64_t begin = 0, end = 0;
  for (const auto& [offset, length] : unprotected_) {
    if (end != 0 && offset <= end) {
      end = std::max(end, offset + length);
      continue;
    }
    if (end != 0) Protect(begin, end - begin, true);
    begin = offset;
    end = offset + length;
  }
  if (end != 0) Protect(begin, end - begin, true);
  unprotected_.clear();
  return generation_++;
}

absl::Status WriteTracker::error() const {
  absl::MutexLock lock(&mu_);
  if (error_.ok() && unprotected_growth_.load(std::memory_order_acquire)) {
    return absl::InternalError(
        "the kernel refused to write-protect part of the heap's growth; stores there take no "
        "pre-images and cannot be put back if this process dies");
  }
  return error_;
}

void WriteTracker::Capture(uint64_t offset) {
  absl::MutexLock lock(&mu_, absl::Condition(
                                 +[](bool* syncing) { return !*syncing; }, &syncing_));
  absl::Status failed;
  const bool guarded = journal_.EnterGuard();  // else the OFD lock
  if (!guarded && !LockJournal(journal_.fd(), F_WRLCK)) {
    failed = absl::InternalError(
        absl::StrCat("lock the undo journal for page ", offset, ": ", std::strerror(errno)));
  } else {
    if (guarded) FaultPoint("client.tracker.in_guard");
    UndoRecordHeader header;
    header.kind = static_cast<uint32_t>(UndoKind::kPreImage);
    header.page = offset;
    header.time_ns = MonotonicNs();
    header.generation = generation_;
    if (absl::Status appended = AppendPreImage(journal_, header, base_ + offset); !appended.ok()) {
      failed = absl::Status(
          appended.code(),
          absl::StrCat("pre-image of page ", offset, ": ", appended.message(),
                       "; that page cannot be put back if this process dies before its next sync"));
    }
    if (guarded) {
      journal_.LeaveGuard();
    } else {
      LockJournal(journal_.fd(), F_UNLCK);
    }
  }
  if (!failed.ok() && error_.ok()) error_ = failed;
  // Lift the protection even on failure: the store must go on.
  Protect(offset, kUndoPageBytes, false);
  unprotected_.emplace_back(offset, kUndoPageBytes);
}

bool MapPrivately(char* at, uint64_t length, int fd, uint64_t offset) {
  const bool mapped = mmap(at, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd,
                           static_cast<off_t>(offset)) != MAP_FAILED;
  if (!mapped && mprotect(at, length, PROT_READ) != 0) {  // then a store faults instead
    // The failed mmap unmapped the range already (see FileTakesMapSync):
    // reserve it again, every access faults.
    mmap(at, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  }
  KeepFromChildren(at, length);
  return mapped;
}

void WriteTracker::Fence() {
  // The same file, privately: reads see the heap, stores stay in this
  // process (copy-on-write) and never reach the heap again. Under the
  // growth mapping lock: growth being mapped now is mapped completely
  // (and is remapped here), growth mapped later sees fencing_ and is
  // mapped privately by its mapper; no range is mapped privately twice
  // (that would drop the stores made into the first private copy).
  GrowthMappingLock growth(growth_slot_.load(std::memory_order_acquire));
  fencing_.store(true, std::memory_order_seq_cst);  // see MapGrowthLocked
  uint64_t done = 0;
  for (uint64_t size; (size = mapped_->load(std::memory_order_seq_cst)) > done; done = size) {
    MapPrivately(base_ + done, size - done, data_fd_, done);
  }
  // Threads stopped on a store before the remap would wait for a wake-up
  // that no longer comes (the remapped range is not registered): their
  // stores retry and land in the private mapping.
  uffdio_range all{reinterpret_cast<uint64_t>(base_), done};
  if (done != 0) ioctl(uffd_.get(), UFFDIO_WAKE, &all);
  fenced_.store(true, std::memory_order_release);
}

void WriteTracker::Run() {
  TrackerPlacement placement;  // this thread's CPUs, as inherited
  bool fenced = false;
  for (;;) {
    pollfd polled[3] = {{wake_.get(), POLLIN, 0},
                        {uffd_.get(), POLLIN, 0},
                        {fenced ? -1 : lifeline_, POLLRDHUP, 0}};
    if (poll(polled, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (polled[0].revents != 0) return;
    if (!fenced && (polled[2].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      Fence();
      fenced = true;
    }
    if ((polled[1].revents & POLLIN) != 0) DrainFaults(placement);
  }
}

void WriteTracker::DrainFaults(TrackerPlacement& placement) {
  // Keeps reading for a short while after the last fault: a program
  // updating many pages faults again within microseconds, and a thread
  // that is awake answers far sooner than one woken from poll — unless it
  // shares the faulting thread's CPU: then it sleeps, and the kernel
  // switches to it at the next fault.
  const uint64_t started_ns = MonotonicNs();
  uint64_t last_fault_ns = started_ns;
  for (;;) {
    uffd_msg messages[16];
    const ssize_t n = read(uffd_.get(), messages, sizeof(messages));
    if (n <= 0) {
      if (placement.colocated() || MonotonicNs() - last_fault_ns > kSpinNs) return;
      continue;
    }
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(uffd_msg); ++i) {
      const uffd_msg& m = messages[i];
      if (m.event != UFFD_EVENT_PAGEFAULT ||
          (m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) == 0) {
        continue;
      }
      const uint64_t address = m.arg.pagefault.address;
      const uint64_t offset = (address - reinterpret_cast<uint64_t>(base_)) & ~(kUndoPageBytes - 1);
      Capture(offset);
      last_fault_ns = MonotonicNs();
      placement.Follow(static_cast<pid_t>(m.arg.pagefault.feat.ptid), last_fault_ns);
    }
    // Back to poll now and then, whatever the stream of faults: the end of
    // the session (the fence) and the stop request wait there.
    if (last_fault_ns - started_ns > kMaxDrainNs) return;
  }
}

}  // namespace heapd
