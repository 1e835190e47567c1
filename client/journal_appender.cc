#include "client/journal_appender.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace heapd {

JournalAppender::JournalAppender(UniqueFd journal, bool heapd_revision_2)
    : journal_(std::move(journal)),
      magic_(heapd_revision_2 ? kUndoMagic : kUndoMagicCrc32),
      record_(kUndoImageRecordBytes, '\0') {
  struct stat st;
  if (!heapd_revision_2 || fstat(journal_.get(), &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < kJournalControlBytes) {
    return;
  }
  void* page =
      mmap(nullptr, kJournalControlBytes, PROT_READ | PROT_WRITE, MAP_SHARED, journal_.get(), 0);
  if (page == MAP_FAILED) return;
  madvise(page, kJournalControlBytes, MADV_DONTFORK);  // a forked child has no business in it
  const auto* control = static_cast<const JournalControl*>(page);
  struct flock alive = JournalAliveLock(F_RDLCK);
  // Without it heapd would wait out a guard this process died in.
  if (control->magic != kJournalControlMagic || control->version != 1 ||
      fcntl(journal_.get(), F_OFD_SETLK, &alive) != 0) {
    munmap(page, kJournalControlBytes);
    return;
  }
  control_ = static_cast<JournalControl*>(page);
}

JournalAppender::~JournalAppender() {
  if (control_ != nullptr) munmap(control_, kJournalControlBytes);
}

bool JournalAppender::EnterGuard() {
  if (control_ == nullptr) return false;
  // Dekker's handshake with heapd's closing of the guard: the store of
  // busy before the load of closed (an xchg on x86), each side's in the
  // same order, so that at least one of them sees the other's.
  __atomic_store_n(&control_->busy, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&control_->closed, __ATOMIC_SEQ_CST) == 0) return true;
  LeaveGuard();
  return false;
}

void JournalAppender::LeaveGuard() {
  // After the record: heapd reads busy 0, then the record.
  __atomic_store_n(&control_->busy, 0, __ATOMIC_RELEASE);
}

absl::Status JournalAppender::Append(UndoRecordHeader header, const char* image) {
  header.magic = magic_;
  const uint64_t bytes = UndoKindHasImage(header.kind) ? kUndoImageRecordBytes : kUndoHeaderBytes;
  EncodeUndoRecordInto(header, image, record_.data());
  const ssize_t written = write(journal_.get(), record_.data(), bytes);
  if (written != static_cast<ssize_t>(bytes)) {
    return absl::DataLossError(absl::StrCat("append to the undo journal: ",
                                            written < 0 ? std::strerror(errno) : "short write"));
  }
  return absl::OkStatus();
}

}  // namespace heapd
