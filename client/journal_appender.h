// JournalAppender: appends undo records (heap/undo_record.h) to a session's
// journal for its client's write tracker (write_tracker.h). One writer: the
// tracker's thread.
//
// Mapped (heapd reads such journals: protocol revision 2): the file is
// extended a window at a time, the window mapped shared and populated
// writable (its space taken before any record needs it: no store into the
// mapping faults for want of space), and each record is encoded straight
// into it: no system call per record. heapd reads the
// file as before; a record is there once its magic, stored last, is.
// The journal's guard (heap/undo_record.h, JournalControl) keeps heapd
// from putting pages back while a pre-image is taken, without a system
// call: EnterGuard, append, LeaveGuard. When heapd is putting pages back
// (or the journal has no control page), EnterGuard says so and the caller
// takes the journal's OFD lock instead.
//
// On other file systems than tmpfs, ext4 and XFS (a copy-on-write one
// needs space at stores into written pages), or if the file cannot be
// mapped: one write() per record (the journal is opened O_APPEND). For a heapd of revision 1
// (0.4.0): one write() per record checked with CRC-32, what it reads.
#ifndef HEAPD_CLIENT_JOURNAL_APPENDER_H_
#define HEAPD_CLIENT_JOURNAL_APPENDER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "heap/undo_record.h"
#include "util/unique_fd.h"

namespace heapd {

class JournalAppender {
 public:
  // `heapd_reads_mapped`: heapd speaks protocol revision 2 or later.
  JournalAppender(UniqueFd journal, bool heapd_reads_mapped);
  ~JournalAppender();
  JournalAppender(const JournalAppender&) = delete;
  JournalAppender& operator=(const JournalAppender&) = delete;

  // Appends the record of `header` with the page image at `image` (read
  // while it is copied: stores to it must be held back until this
  // returns). Once this returns OK, heapd reads the record.
  absl::Status Append(UndoRecordHeader header, const char* image);

  // Maps the next window now if the next record of `bytes` needs it:
  // before EnterGuard, so that heapd, waiting on the guard, does not wait
  // for a window's allocation. Append does it too.
  absl::Status MakeRoom(uint64_t bytes);

  // True: inside the guard, heapd puts no page back until LeaveGuard.
  // False: take the OFD lock instead.
  bool EnterGuard();
  void LeaveGuard();

  int fd() const { return journal_.get(); }
  bool mapped() const { return mapped_; }

 private:
  // Maps the window that holds the next record (at tail_).
  absl::Status NextWindow();
  // From now on, one write() per record (the file ends at tail_ again).
  void StopMapping();

  const UniqueFd journal_;
  const uint32_t magic_;  // of the records written
  bool mapped_;
  uint64_t tail_ = 0;                  // where the next record goes (mapped)
  JournalControl* control_ = nullptr;  // mapped, if the journal has one
  char* window_ = nullptr;
  uint64_t window_at_ = 0;  // file offset of window_[0]
  std::string record_;      // the record being written (write())
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_JOURNAL_APPENDER_H_
