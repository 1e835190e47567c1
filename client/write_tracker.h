// WriteTracker: before this process's first store to a page of a heap
// since its last sync, appends the page as it was (its pre-image) to the
// session's undo journal — so that heapd can put the page back if the
// session dies before its next sync (heap/content_undo.h,
// docs/consistency.md "Object contents").
//
// How: the heap's mapping is registered with userfaultfd in write-protect
// mode and every page that may hold live data is write-protected. A store
// to a protected page stops its thread; the tracker's thread enters the
// journal's guard (or takes its OFD lock while heapd puts pages back:
// heap/undo_record.h, JournalControl), appends the pre-image
// (journal_appender.h: one write()), leaves the guard and lifts the
// protection, which lets the store through. The tracker's thread runs on
// the CPU of a faulting thread bound to one (tracker_placement.h). Memory
// handed out free (fresh chunks, large objects) is unprotected at once: it
// needs no pre-image, so filling new memory costs nothing. At each sync,
// BeginSync protects again every page unprotected since the last one and
// starts a new generation.
//
// Without privilege (vm.unprivileged_userfaultfd = 0) the userfaultfd
// covers stores from user mode only: a system call that writes into a
// protected page (read(2) into a heap buffer) fails with EFAULT. Touch the
// buffer first (Heap::prepare_write).
//
// When the session's connection to heapd closes while the heap is mapped
// (heapd died or ended the session), the mapping is fenced at once: mapped
// again privately (copy-on-write), so that the process's stores from then
// on — which heapd no longer tracks, and would land in a heap it has
// already put back — stay in the process. Its next call to heapd fails; it
// detaches and attaches again.
//
// Thread-safe.
#ifndef HEAPD_CLIENT_WRITE_TRACKER_H_
#define HEAPD_CLIENT_WRITE_TRACKER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/journal_appender.h"
#include "client/tracker_placement.h"
#include "util/unique_fd.h"

namespace heapd {

// Keeps [at, at + length) out of forked children (MADV_DONTFORK).
// Async-signal-safe.
void KeepFromChildren(char* at, uint64_t length);
// Registers [at, at + length) with the userfaultfd `uffd` for
// write-protection, protects it and keeps it from children; false if the
// kernel refused. Async-signal-safe.
bool RegisterForWriteProtection(int uffd, char* at, uint64_t length);
// Maps [offset, offset + length) of `fd` at `at` privately (MAP_FIXED):
// reads see the file, stores stay in this process. False if that failed:
// then what was mapped there is read-only (or, if the failed map removed
// it, reserved again so that every access faults). Async-signal-safe.
bool MapPrivately(char* at, uint64_t length, int fd, uint64_t offset);

class WriteTracker {
 public:
  // Tracks stores to the heap mapped at `base`, of which `*mapped` bytes
  // are mapped (read whenever needed; all write-protected here, now).
  // `data_fd`: the heap's data file
  // (not owned); `journal`: the session's undo journal (owned);
  // `lifeline`: the session's heapd.fd.sock connection (not owned; watched
  // for its end); `heapd_revision_2`: heapd speaks protocol revision 2
  // (journal_appender.h). UNIMPLEMENTED naming why when the kernel
  // refuses.
  static absl::StatusOr<std::unique_ptr<WriteTracker>> Start(char* base,
                                                             const std::atomic<uint64_t>* mapped,
                                                             int data_fd, UniqueFd journal,
                                                             int lifeline, bool heapd_revision_2);
  ~WriteTracker();  // stops tracking; the mapping stays as it is
  WriteTracker(const WriteTracker&) = delete;
  WriteTracker& operator=(const WriteTracker&) = delete;

  // [offset, offset + length) is fresh memory: its stores need no
  // pre-image until the next sync.
  void Unprotect(uint64_t offset, uint64_t length);
  // Protects every page unprotected since the last call and starts a new
  // generation; returns the generation that ended (the sync commits it).
  uint64_t BeginSync();
  // The sync BeginSync started reached heapd (or failed). Until then the
  // pre-images of the new generation wait, and so do the stores that need
  // them: heapd reads the pages the sync commits as they are, and a store
  // of the next generation must not be among them.
  void EndSync();
  // The first error taking a pre-image (the store went through without
  // one: its page cannot be put back), or growth that could not be
  // write-protected; OK if none.
  absl::Status error() const;
  // The userfaultfd's descriptor (for the growth fault handler).
  int fd() const { return uffd_.get(); }
  // True once the session ended and the mapping was fenced: stores made
  // after this returned stay in this process.
  bool fenced() const { return fenced_.load(std::memory_order_acquire); }
  // Set when the fence starts: the growth fault handler maps privately
  // from then on.
  const std::atomic<bool>* fencing() const { return &fencing_; }
  // The heap's slot with the growth fault handler (growth_fault_handler.h):
  // the fence holds its GrowthMappingLock, so that no growth is half
  // mapped (shared, and unprotected) while it maps the heap privately.
  void set_growth_slot(int slot) { growth_slot_.store(slot, std::memory_order_release); }
  // Set by whoever maps the heap's growth when the kernel refuses to
  // write-protect it (growth_fault_handler.h).
  std::atomic<bool>* unprotected_growth() { return &unprotected_growth_; }

 private:
  WriteTracker(char* base, const std::atomic<uint64_t>* mapped, int data_fd, UniqueFd uffd,
               UniqueFd journal, bool heapd_revision_2, UniqueFd wake, int lifeline)
      : base_(base),
        mapped_(mapped),
        data_fd_(data_fd),
        uffd_(std::move(uffd)),
        wake_(std::move(wake)),
        lifeline_(lifeline),
        journal_(std::move(journal), heapd_revision_2) {}

  // How long the thread keeps reading faults after the last one before it
  // sleeps in poll again (unless it shares the faulting thread's CPU).
  static constexpr uint64_t kSpinNs = 50000;
  // The longest it handles faults before it checks the session's end.
  static constexpr uint64_t kMaxDrainNs = 2000000;

  void Run();
  // Takes the pre-images of the faults pending, and of those that follow
  // within kSpinNs; follows the faulting threads (tracker_placement.h).
  void DrainFaults(TrackerPlacement& placement);
  // Takes the pre-image of the page at `offset` and lets stores to it
  // through.
  void Capture(uint64_t offset) ABSL_LOCKS_EXCLUDED(mu_);
  // Maps everything privately: the session is over.
  void Fence();
  // Sets error_ if a range cannot be protected again.
  void Protect(uint64_t offset, uint64_t length, bool protect) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  char* const base_;
  const std::atomic<uint64_t>* const mapped_;
  const int data_fd_;
  const UniqueFd uffd_;
  const UniqueFd wake_;  // eventfd: stops Run
  const int lifeline_;
  std::thread thread_;
  std::atomic<bool> fencing_{false};  // set (release) when Fence starts
  std::atomic<bool> fenced_{false};   // set (release) once Fence has run
  std::atomic<int> growth_slot_{-1};
  std::atomic<bool> unprotected_growth_{false};

  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool syncing_ ABSL_GUARDED_BY(mu_) = false;  // between BeginSync and EndSync
  // Ranges unprotected since the last BeginSync: (offset, length).
  std::vector<std::pair<uint64_t, uint64_t>> unprotected_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  JournalAppender journal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_WRITE_TRACKER_H_
