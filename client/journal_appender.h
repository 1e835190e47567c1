// JournalAppender: a session's undo journal (heap/undo_record.h), as its
// client's write tracker (write_tracker.h) appends to it. One writer: the
// tracker's thread.
//
// Each record goes in with one write() (the journal is opened O_APPEND):
// checked with XXH3 for a heapd of protocol revision 2, with CRC-32 for
// one of revision 1 (0.4.0), what each reads. (Storing records through a
// mapping of the file was tried and measured no faster: what a record
// costs is tmpfs allocating and clearing its page, docs/performance.md.)
//
// The journal's guard (JournalControl, in its first page, mapped here)
// keeps heapd from putting pages back while a pre-image is taken, without
// a system call: EnterGuard, Append, LeaveGuard. When heapd is putting
// pages back, or the journal has no control page (a revision 1 heapd's),
// EnterGuard says so and the caller takes the journal's OFD lock instead.
// While the guard is mapped this process holds a read lock on the
// journal's kJournalAliveAt byte: heapd does not wait on a guard its
// client died in.
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
  // `heapd_revision_2`: heapd speaks protocol revision 2 or later.
  JournalAppender(UniqueFd journal, bool heapd_revision_2);
  ~JournalAppender();
  JournalAppender(const JournalAppender&) = delete;
  JournalAppender& operator=(const JournalAppender&) = delete;

  // Appends the record of `header` with the page image at `image` (read
  // while it is copied: stores to it must be held back until this
  // returns). Once this returns OK, heapd reads the record.
  absl::Status Append(UndoRecordHeader header, const char* image);

  // True: inside the guard, heapd puts no page back until LeaveGuard.
  // False: take the OFD lock instead.
  bool EnterGuard();
  void LeaveGuard();

  int fd() const { return journal_.get(); }
  bool guarded() const { return control_ != nullptr; }

 private:
  const UniqueFd journal_;
  const uint32_t magic_;               // of the records written
  JournalControl* control_ = nullptr;  // mapped, if the journal has one
  std::string record_;                 // the record being written
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_JOURNAL_APPENDER_H_
