#include "client/journal_appender.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

// MADV_POPULATE_WRITE, which Debian 12's headers lack.
constexpr int kMadvisePopulateWrite = 23;

// Whether stores into a populated window of `fd`'s file never need space:
// tmpfs, and ext4 and XFS, which overwrite a written block in place. A
// copy-on-write file system (btrfs) allocates at every store after
// write-back, and a full one would answer with a SIGBUS.
bool MapsSafely(int fd) {
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC;
}

}  // namespace

JournalAppender::JournalAppender(UniqueFd journal, bool heapd_reads_mapped)
    : journal_(std::move(journal)),
      magic_(heapd_reads_mapped ? kUndoMagic : kUndoMagicCrc32),
      mapped_(heapd_reads_mapped),
      record_(kUndoImageRecordBytes, '\0') {
  struct stat st;
  if (mapped_ && MapsSafely(journal_.get()) && fstat(journal_.get(), &st) == 0) {
    tail_ = static_cast<uint64_t>(st.st_size);
  } else {
    mapped_ = false;
  }
  if (mapped_ && tail_ >= kJournalControlBytes) {
    void* page =
        mmap(nullptr, kJournalControlBytes, PROT_READ | PROT_WRITE, MAP_SHARED, journal_.get(), 0);
    if (page != MAP_FAILED) {
      madvise(page, kJournalControlBytes, MADV_DONTFORK);
      control_ = static_cast<JournalControl*>(page);
      struct flock alive {};
      alive.l_type = F_RDLCK;
      alive.l_whence = SEEK_SET;
      alive.l_start = kJournalAliveAt;
      alive.l_len = 1;
      // Without it heapd would wait out a guard this process died in.
      if (control_->magic != kJournalControlMagic || control_->version != 1 ||
          fcntl(journal_.get(), F_OFD_SETLK, &alive) != 0) {
        munmap(page, kJournalControlBytes);
        control_ = nullptr;
      }
    }
  }
}

JournalAppender::~JournalAppender() {
  if (window_ != nullptr) munmap(window_, kUndoJournalWindowBytes);
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
  // After the record (its magic included): heapd reads busy 0, then the
  // record.
  __atomic_store_n(&control_->busy, 0, __ATOMIC_RELEASE);
}

void JournalAppender::StopMapping() {
  if (window_ != nullptr) munmap(window_, kUndoJournalWindowBytes);
  window_ = nullptr;
  // Zeros past the last record would hide every record written after them.
  (void)!ftruncate(journal_.get(), static_cast<off_t>(tail_));
  mapped_ = false;
}

absl::Status JournalAppender::NextWindow() {
  const uint64_t at = tail_ & ~(kUndoPageBytes - 1);
  const uint64_t end = at + kUndoJournalWindowBytes;
  struct stat st;
  if (fstat(journal_.get(), &st) != 0 ||
      (static_cast<uint64_t>(st.st_size) < end && ftruncate(journal_.get(), end) != 0)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("extend the undo journal to ", end, " bytes: ", std::strerror(errno)));
  }
  void* window = mmap(nullptr, kUndoJournalWindowBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      journal_.get(), static_cast<off_t>(at));
  if (window == MAP_FAILED) {
    StopMapping();
    return absl::OkStatus();
  }
  // The window's pages allocated and mapped writable in one pass (Linux
  // 5.14): no fault at each record's first store, and a file system found
  // full is an error here, not a SIGBUS at a store into a hole.
  if (madvise(window, kUndoJournalWindowBytes, kMadvisePopulateWrite) != 0) {
    const int err = errno;
    munmap(window, kUndoJournalWindowBytes);
    return absl::ResourceExhaustedError(absl::StrCat("allocate the undo journal's bytes ", at, "..",
                                                     end, ": ", std::strerror(err)));
  }
  // A forked child has no business in it.
  madvise(window, kUndoJournalWindowBytes, MADV_DONTFORK);
  if (window_ != nullptr) munmap(window_, kUndoJournalWindowBytes);
  window_ = static_cast<char*>(window);
  window_at_ = at;
  return absl::OkStatus();
}

absl::Status JournalAppender::MakeRoom(uint64_t bytes) {
  if (mapped_ && (window_ == nullptr || tail_ + bytes > window_at_ + kUndoJournalWindowBytes)) {
    return NextWindow();
  }
  return absl::OkStatus();
}

absl::Status JournalAppender::Append(UndoRecordHeader header, const char* image) {
  header.magic = magic_;
  const uint64_t bytes = UndoKindHasImage(header.kind) ? kUndoImageRecordBytes : kUndoHeaderBytes;
  if (absl::Status s = MakeRoom(bytes); !s.ok()) return s;
  if (mapped_) {
    EncodeUndoRecordInto(header, image, window_ + (tail_ - window_at_));
    tail_ += bytes;
    return absl::OkStatus();
  }
  EncodeUndoRecordInto(header, image, record_.data());
  const ssize_t written = write(journal_.get(), record_.data(), bytes);
  if (written != static_cast<ssize_t>(bytes)) {
    return absl::DataLossError(absl::StrCat("append to the undo journal: ",
                                            written < 0 ? std::strerror(errno) : "short write"));
  }
  return absl::OkStatus();
}

}  // namespace heapd
