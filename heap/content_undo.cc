#include "heap/content_undo.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "allocator/size_class.h"
#include "util/dir_files.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

constexpr char kHeapJournal[] = "heap.undo";
constexpr char kSessionPrefix[] = "session-";
constexpr char kSuffix[] = ".undo";
constexpr char kRewriteSuffix[] = ".new";  // heap.undo being rewritten
// Most entries the undo directory is read with: heap.undo and a journal
// per session alive when heapd stopped.
constexpr size_t kMaxUndoDirEntries = size_t{1} << 22;

uint64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}

// A clear of `page`'s older records, as of now.
UndoRecordHeader ClearOf(uint64_t page) {
  UndoRecordHeader clear;
  clear.kind = static_cast<uint32_t>(UndoKind::kClear);
  clear.page = page;
  clear.time_ns = MonotonicNs();
  return clear;
}

// `session`'s generations up to `generation` end with epoch `epoch`.
UndoRecordHeader GenerationEnd(ClientId session, uint64_t generation, uint64_t epoch) {
  UndoRecordHeader end;
  end.kind = static_cast<uint32_t>(UndoKind::kGenerationEnd);
  end.session = session;
  end.generation = generation;
  end.epoch = epoch;
  end.time_ns = MonotonicNs();
  return end;
}

bool WriteAll(int fd, const std::string& bytes) {
  return write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
}

// Frees what a session's journal holds but its control page, past its end
// included (a punch on tmpfs and XFS, a truncation to its size on ext4,
// whose punch stops at the end).
void EmptyJournal(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(size),
            off_t{1} << 60);
  (void)!ftruncate(fd, static_cast<off_t>(size));
  if (size > kJournalControlBytes) {
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kJournalControlBytes,
              static_cast<off_t>(size - kJournalControlBytes));
  }
}

// A journal may hold, after its control page and unpunched, at most a few
// generations' pre-images of every page of the data file: more is not a
// client following the protocol.
uint64_t MaxJournalBytes(uint64_t data_bytes) {
  return kJournalControlBytes + 3 * (data_bytes / kUndoPageBytes + 64) * kUndoImageRecordBytes;
}

// Takes (exclusive, without waiting) or releases the OFD lock on byte 0 of
// a session's journal that its client holds while it takes a pre-image.
bool LockJournal(int fd, short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

// Sets heapd's word of a live journal's guard (JournalControl); false if
// it could not be written (a full file system).
bool SetGuardClosed(int fd, uint32_t closed) {
  return pwrite(fd, &closed, sizeof(closed), kJournalClosedAt) == sizeof(closed);
}

// Whether a journal's client is inside its guard (taking a pre-image
// without the OFD lock). A client that died there left `busy` set: its
// read lock on kJournalAliveAt, which the kernel drops with its last
// descriptor, says whether it is still there. Whatever it reads, a client
// can only stall heapd as one keeping its OFD lock can: for
// kLockAttempts * kLockRetry.
bool GuardBusy(int fd) {
  uint32_t busy = 0;
  const ssize_t read = pread(fd, &busy, sizeof(busy), kJournalBusyAt);
  if (read < 0) return true;  // unknown: as if inside
  // Shorter: its client cut its own control page off, and cannot be inside.
  if (read != sizeof(busy) || busy == 0) return false;
  struct flock alive = JournalAliveLock(F_WRLCK);
  if (fcntl(fd, F_OFD_GETLK, &alive) != 0) return true;
  return alive.l_type != F_UNLCK;  // someone holds it: the client lives
}

// Where a journal's records start: after its control page if it has one
// (made by a heapd of protocol revision 2), else at 0.
uint64_t RecordsStart(int fd) {
  uint32_t magic = 0;
  return pread(fd, &magic, sizeof(magic), 0) == sizeof(magic) && magic == kJournalControlMagic
             ? kJournalControlBytes
             : 0;
}

// Where a journal's first record is (past zeros from `from` on: holes, or
// zeroed by a punch).
uint64_t PunchedPrefix(int fd, uint64_t from) {
  const off_t data = lseek(fd, static_cast<off_t>(from), SEEK_DATA);
  if (data < 0) {  // ENXIO: holes to the end
    struct stat st;
    return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  uint64_t at = static_cast<uint64_t>(data);
  char buffer[4096];
  for (;;) {
    const ssize_t n = pread(fd, buffer, sizeof(buffer), static_cast<off_t>(at));
    if (n <= 0) return at;
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] != 0) return at + static_cast<uint64_t>(i);
    }
    at += static_cast<uint64_t>(n);
    // Over holes at once: a journal may be extended by gigabytes of them.
    const off_t next = lseek(fd, static_cast<off_t>(at), SEEK_DATA);
    if (next < 0) {
      struct stat st;
      return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : at;
    }
    at = static_cast<uint64_t>(next);
  }
}

}  // namespace

ContentUndo::ContentUndo(UniqueFd dir_fd, std::string dir, const DataFile* data)
    : dir_fd_(std::move(dir_fd)), dir_(std::move(dir)), data_(data), changes_source_([] {
        absl::BitGen random;
        return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16),
                            absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16));
      }()) {}

absl::StatusOr<std::unique_ptr<ContentUndo>> ContentUndo::Open(const std::string& undo_dir,
                                                               const DataFile* data, uint64_t epoch,
                                                               UndoCounts* recovered,
                                                               uint64_t compact_at_bytes) {
  return OpenAt(AT_FDCWD, undo_dir, undo_dir, data, epoch, recovered, /*put_back=*/true,
                compact_at_bytes);
}

absl::StatusOr<std::unique_ptr<ContentUndo>> ContentUndo::OpenAt(
    int parent, const std::string& name, const std::string& undo_dir, const DataFile* data,
    uint64_t epoch, UndoCounts* recovered, bool put_back, uint64_t compact_at_bytes) {
  if (mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("create ", undo_dir));
  }
  // Its files are reached through this descriptor from here on.
  UniqueFd dir_fd(openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!dir_fd.valid() || fstat(dir_fd.get(), &st) != 0 || st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(undo_dir, " is not a directory of heapd's own"));
  }
  std::unique_ptr<ContentUndo> undo(new ContentUndo(std::move(dir_fd), undo_dir, data));
  const int dir = undo->dir_fd_.get();
  absl::MutexLock lock(&undo->mu_);
  undo->committed_epoch_ = epoch;
  undo->compact_at_bytes_ = compact_at_bytes;
  const std::string heap_path = absl::StrCat(undo_dir, "/", kHeapJournal);
  // A rewrite that a crash interrupted: heap.undo is still whole.
  unlinkat(dir, absl::StrCat(kHeapJournal, kRewriteSuffix).c_str(), 0);
  undo->heap_journal_.reset(
      openat(dir, kHeapJournal, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!undo->heap_journal_.valid()) return ErrnoStatus(errno, absl::StrCat("open ", heap_path));
  // heap.undo first: its generation ends decide which pre-images are void.
  Journal heap_journal;
  heap_journal.fd.reset(dup(undo->heap_journal_.get()));
  undo->RefreshLocked(0, heap_journal);
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir, kMaxUndoDirEntries);
  if (!names.ok()) {
    return absl::Status(names.status().code(),
                        absl::StrCat("list ", undo_dir, ": ", names.status().message()));
  }
  std::vector<ClientId> sessions;
  for (const std::string& entry : *names) {
    absl::string_view name = entry;
    uint64_t id;
    if (absl::ConsumePrefix(&name, kSessionPrefix) && absl::ConsumeSuffix(&name, kSuffix) &&
        absl::SimpleAtoi(name, &id) && id != 0) {
      sessions.push_back(id);
    }
  }
  for (ClientId id : sessions) {
    Journal journal;
    journal.fd.reset(
        openat(dir, JournalName(id).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!journal.fd.valid()) continue;
    // Its void pre-images were punched out (Committed): they read as zeros
    // up to the first record that was not, whose magic starts nonzero (or,
    // in a journal not following the protocol, some later byte: every
    // record of a session journal is a pre-image, all of one size, so the
    // records resume on a record's boundary).
    const uint64_t start = RecordsStart(journal.fd.get());
    const uint64_t zeros = PunchedPrefix(journal.fd.get(), start) - start;
    journal.read_to = journal.punched =
        start + zeros / kUndoImageRecordBytes * kUndoImageRecordBytes;
    if (put_back) undo->RefreshLocked(id, journal);
    undo->journals_.emplace(id, std::move(journal));
  }
  undo->RecoverAllLocked(put_back);
  if (recovered != nullptr) *recovered = undo->counts_;
  return undo;
}

std::string ContentUndo::JournalName(ClientId session) {
  return absl::StrCat(kSessionPrefix, session, kSuffix);
}

std::string ContentUndo::JournalPath(ClientId session) const {
  return absl::StrCat(dir_, "/", JournalName(session));
}

absl::StatusOr<UniqueFd> ContentUndo::OpenJournal(ClientId session) {
  // Without mu_: the fd server calls this at attach, and syncs and
  // rollbacks hold mu_ across I/O. The journal joins journals_ at the next
  // call that takes mu_ (AdoptNewJournalsLocked); its client cannot have
  // written to it before it has the descriptor returned here.
  const std::string name = JournalName(session);
  UniqueFd fd(openat(dir_fd_.get(), name.c_str(),
                     O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", JournalPath(session)));
  Journal journal;
  journal.fd.reset(openat(dir_fd_.get(), name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  const std::string control = EncodeJournalControl();
  if (!journal.fd.valid() || pwrite(journal.fd.get(), control.data(), control.size(), 0) !=
                                 static_cast<ssize_t>(control.size())) {
    const int err = errno;
    unlinkat(dir_fd_.get(), name.c_str(), 0);
    return ErrnoStatus(err, absl::StrCat("make ", JournalPath(session)));
  }
  journal.read_to = journal.punched = kJournalControlBytes;
  absl::MutexLock lock(&new_journals_mu_);
  new_journals_.emplace(session, std::move(journal));
  return fd;
}

void ContentUndo::RefreshLocked(ClientId session, Journal& journal) {
  if (journal.broken) {
    // A journal cut off for its size stays empty but for its control page:
    // what its client appends is dropped at every check.
    if (journal.oversized) EmptyJournal(journal.fd.get());
    return;
  }
  const uint64_t data_bytes = data_->size();
  struct stat st;
  if (fstat(journal.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // Space taken counts too (fallocate can take it past the file's end),
  // with room for how file systems round it (huge pages on tmpfs, XFS's
  // preallocation past the end of a growing file).
  const uint64_t taken = static_cast<uint64_t>(st.st_blocks) * 512;
  auto stop = [&](const std::string& why)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { StopReadingLocked(session, journal, why); };
  const uint64_t most = MaxJournalBytes(data_bytes);
  const uint64_t held = size > journal.punched ? size - journal.punched : 0;
  if (session != 0 && (held > most || taken > 2 * most + (uint64_t{64} << 20))) {
    stop(absl::StrCat("it holds ", held, " bytes (", taken, " taken), more than a session needs"));
    journal.oversized = true;
    for (const Journal::Written& w : journal.written) {
      UnindexLocked(w.page, session, w.end - kUndoPageBytes);
    }
    journal.written.clear();
    EmptyJournal(journal.fd.get());
    return;
  }
  // Every sync looks at every live journal: most have nothing new.
  if (journal.read_to + kUndoHeaderBytes > size) return;
  std::string record(kUndoImageRecordBytes, '\0');
  while (journal.read_to + kUndoHeaderBytes <= size) {
    const ssize_t n = pread(journal.fd.get(), record.data(), record.size(), journal.read_to);
    if (n <= 0) return;
    absl::StatusOr<std::optional<DecodedUndoRecord>> decoded =
        DecodeUndoRecord(absl::string_view(record.data(), static_cast<size_t>(n)), journal.read_to);
    if (!decoded.ok()) return stop(std::string(decoded.status().message()));
    if (!decoded->has_value()) return;  // the tail is still being written
    const DecodedUndoRecord& r = **decoded;
    const UndoRecordHeader& h = r.header;
    const UndoKind kind = static_cast<UndoKind>(h.kind);
    if (session != 0 && kind != UndoKind::kPreImage) {
      return stop(absl::StrCat("a client wrote a record of kind ", h.kind));
    }
    if (kind == UndoKind::kGenerationEnd) {
      ends_[h.session].emplace_back(h.generation, h.epoch);
    } else if (h.page >= data_bytes || data_bytes - h.page < kUndoPageBytes) {
      return stop(absl::StrCat("record at byte ", journal.read_to, " names page ", h.page,
                               " beyond the data file's ", data_bytes, " bytes"));
    } else {
      Entry entry{kind,    h.time_ns, session == 0 ? h.session : session, h.generation, h.epoch,
                  session, r.image_at};
      AddLocked(h.page, entry);
      if (session != 0) {
        journal.written.push_back({h.page, h.generation, r.image_at - kUndoHeaderBytes + r.size});
        if (window_.has_value()) {
          // Taken after the open sync's commit point: keep the oldest.
          auto [late, added] = window_->late.try_emplace(h.page, entry);
          if (!added && h.time_ns < late->second.time_ns) late->second = entry;
        }
        ChangedLocked(h.page, kUndoPageBytes, marks_ + 1);
      }
    }
    journal.read_to += r.size;
  }
}

void ContentUndo::StopReadingLocked(ClientId session, Journal& journal, const std::string& why) {
  journal.broken = true;
  all_changed_at_ = std::max(all_changed_at_, marks_ + 1);  // its later stores are not seen
  ++counts_.bad_journals;
  std::fprintf(stderr, "heapd: undo journal %s stops being read: %s\n",
               session == 0 ? kHeapJournal : JournalPath(session).c_str(), why.c_str());
}

void ContentUndo::RefreshAllLocked() {
  for (auto& [session, journal] : journals_) RefreshLocked(session, journal);
}

void ContentUndo::AddLocked(uint64_t page, const Entry& entry) { index_[page].push_back(entry); }

void ContentUndo::UnindexLocked(uint64_t page, ClientId file, uint64_t image_at) {
  auto it = index_.find(page);
  if (it == index_.end()) return;
  std::vector<Entry>& entries = it->second;
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [&](const Entry& e) {
                                 return e.file == file &&
                                        (image_at == UINT64_MAX || e.image_at == image_at);
                               }),
                entries.end());
  if (entries.empty()) index_.erase(it);
}

uint64_t ContentUndo::EndedGenerationLocked(ClientId session) const {
  uint64_t ended = 0;
  auto it = ends_.find(session);
  if (it == ends_.end()) return 0;
  for (const auto& [generation, epoch] : it->second) {
    if (epoch <= committed_epoch_) ended = std::max(ended, generation);
  }
  return ended;
}

bool ContentUndo::ValidLocked(const Entry& entry) const {
  if (entry.kind == UndoKind::kPreImage) {
    return entry.generation > EndedGenerationLocked(entry.session);
  }
  if (entry.epoch > committed_epoch_) return false;
  if (entry.kind != UndoKind::kCommitImage || entry.session == 0) return true;
  // A sync's commit images apply with its generation end, written after
  // them: those of a sync that failed before it never do.
  auto ends = ends_.find(entry.session);
  if (ends == ends_.end()) return false;
  return std::find(ends->second.begin(), ends->second.end(),
                   std::make_pair(entry.generation, entry.epoch)) != ends->second.end();
}

const ContentUndo::Entry* ContentUndo::CutLocked(const std::vector<Entry>& entries) const {
  const Entry* cut = nullptr;
  for (const Entry& e : entries) {
    if (e.kind != UndoKind::kCommitImage && e.kind != UndoKind::kClear) continue;
    if (!ValidLocked(e)) continue;
    if (cut == nullptr || e.time_ns > cut->time_ns) cut = &e;
  }
  return cut;
}

const ContentUndo::Entry* ContentUndo::TargetLocked(const std::vector<Entry>& entries) const {
  const Entry* cut = CutLocked(entries);
  if (cut != nullptr && cut->kind == UndoKind::kCommitImage) return cut;
  const Entry* target = nullptr;
  for (const Entry& e : entries) {
    if (e.kind != UndoKind::kPreImage || !ValidLocked(e)) continue;
    if (cut != nullptr && e.time_ns <= cut->time_ns) continue;
    if (target == nullptr || e.time_ns < target->time_ns) target = &e;
  }
  return target;
}

absl::Status ContentUndo::AppendLocked(const UndoRecordHeader& header, const std::string& image) {
  if (!heap_journal_error_.ok()) return heap_journal_error_;
  struct stat st;
  if (fstat(heap_journal_.get(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat ", dir_, "/", kHeapJournal));
  }
  const std::string record = EncodeUndoRecord(header, image);
  if (!WriteAll(heap_journal_.get(), record)) {
    const absl::Status failed =
        ErrnoStatus(errno, absl::StrCat("append to ", dir_, "/", kHeapJournal));
    // A torn record would hide every later one from the next start: cut
    // it off, or append nothing more.
    if (ftruncate(heap_journal_.get(), st.st_size) != 0) {
      heap_journal_error_ = ErrnoStatus(
          errno, absl::StrCat("cut a torn record off ", dir_, "/", kHeapJournal, " at byte ",
                              st.st_size, " (after: ", failed.message(), ")"));
      return heap_journal_error_;
    }
    return failed;
  }
  const UndoKind kind = static_cast<UndoKind>(header.kind);
  if (kind == UndoKind::kGenerationEnd) {
    ends_[header.session].emplace_back(header.generation, header.epoch);
  } else {
    AddLocked(header.page,
              Entry{kind, header.time_ns, header.session, header.generation, header.epoch, 0,
                    static_cast<uint64_t>(st.st_size) + kUndoHeaderBytes});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ContentUndo::ReadImageLocked(const Entry& entry) {
  int fd = -1;
  if (entry.file == 0) {
    fd = heap_journal_.get();
  } else if (auto journal = journals_.find(entry.file); journal != journals_.end()) {
    fd = journal->second.fd.get();
  } else if (window_.has_value()) {
    if (auto ended = window_->ended_journals.find(entry.file);
        ended != window_->ended_journals.end()) {
      fd = ended->second.get();
    }
  }
  // The whole record again, checked again: a client can still change its
  // journal's bytes (truncate it and append others) after heapd read them.
  std::string record(kUndoImageRecordBytes, '\0');
  const uint64_t at = entry.image_at - kUndoHeaderBytes;
  const bool read =
      pread(fd, record.data(), record.size(), at) == static_cast<ssize_t>(record.size());
  absl::StatusOr<std::optional<DecodedUndoRecord>> decoded =
      read ? DecodeUndoRecord(record, at)
           : absl::StatusOr<std::optional<DecodedUndoRecord>>(std::nullopt);
  if (!decoded.ok() || !decoded->has_value() || (*decoded)->header.time_ns != entry.time_ns ||
      (*decoded)->header.kind != static_cast<uint32_t>(entry.kind)) {
    return absl::DataLossError(absl::StrCat(
        "undo record at byte ", at, " of ",
        entry.file == 0 ? kHeapJournal : JournalPath(entry.file), " cannot be read back whole"));
  }
  return record.substr(kUndoHeaderBytes);
}

absl::Status ContentUndo::RestoreLocked(uint64_t page, const Entry& target) {
  absl::StatusOr<std::string> image = ReadImageLocked(target);
  if (!image.ok()) return image.status();
  if (page + kUndoPageBytes > data_->size()) return absl::OkStatus();  // beyond the file now
  ChangedLocked(page, kUndoPageBytes, marks_ + 1);
  if (pwrite(data_->fd(), image->data(), image->size(), page) !=
      static_cast<ssize_t>(image->size())) {
    return ErrnoStatus(errno, absl::StrCat("put back page ", page, " of ", data_->path()));
  }
  ++counts_.pages_restored;
  // An open sync that logs the page logs it as put back, as clients see it.
  if (window_.has_value()) window_->restored[page] = target;
  return AppendLocked(ClearOf(page), "");
}

absl::Status ContentUndo::PrepareCommit(ClientId session, uint64_t generation, uint64_t epoch,
                                        CommitPages* committed) {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  auto journal = journals_.find(session);
  // Not a session that writes (heapd's own syncs, client 0).
  if (journal == journals_.end()) return absl::OkStatus();
  if (committed != nullptr) committed->all = journal->second.unseen || journal->second.broken;
  // A sync's earlier parts carry no generation: contents commit with its
  // last part only. A last part without one commits none of the session's
  // stores; where a log must carry what the sync commits, that is refused
  // (the session's own client always sends one).
  if (generation == 0) {
    if (committed == nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", session, " synced without a content generation; its client tracks stores"));
  }
  RefreshAllLocked();
  std::vector<uint64_t> pages;
  for (const Journal::Written& w : journal->second.written) {
    if (w.generation <= generation) pages.push_back(w.page);
  }
  pages.insert(pages.end(), journal->second.adopted.begin(), journal->second.adopted.end());
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  if (committed != nullptr) {
    committed->all = committed->all || journal->second.broken;  // the refresh may break it
    committed->pages = pages;
    committed->fresh.clear();
    std::vector<Journal::Fresh> ranges = journal->second.fresh;
    ranges.insert(ranges.end(), journal->second.expired.begin(), journal->second.expired.end());
    for (const Journal::Fresh& f : ranges) {
      committed->fresh.emplace_back(f.offset, f.length);
      // Pages that may be logged get commit images where others hold
      // records of them, so that a rollback puts them back to what the log
      // holds, not to older bytes.
      for (auto it = index_.lower_bound(f.offset);
           it != index_.end() && it->first < f.offset + f.length; ++it) {
        pages.push_back(it->first);
      }
    }
    if (committed->all) {
      pages.clear();
      for (const auto& [page, entries] : index_) pages.push_back(page);
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  }
  std::map<uint64_t, Entry> imaged;  // the commit images written
  for (uint64_t page : pages) {
    auto it = index_.find(page);
    if (it == index_.end()) continue;
    const Entry* cut = CutLocked(it->second);
    // An earlier commit image is the page's cut: without a newer one it
    // would put the page back to what this sync supersedes.
    bool others = cut != nullptr && cut->kind == UndoKind::kCommitImage;
    for (const Entry& e : it->second) {
      if (e.file == session || !ValidLocked(e)) continue;
      if (cut != nullptr && e.time_ns <= cut->time_ns) continue;
      others = true;
    }
    if (!others) continue;
    // Another session (live, or dead and handed over) has the page's
    // earlier state: from this commit on, the page goes back to what it is
    // now, not to that.
    std::string image(kUndoPageBytes, '\0');
    if (pread(data_->fd(), image.data(), image.size(), page) !=
        static_cast<ssize_t>(image.size())) {
      return ErrnoStatus(errno, absl::StrCat("read page ", page, " of ", data_->path()));
    }
    UndoRecordHeader commit;
    commit.kind = static_cast<uint32_t>(UndoKind::kCommitImage);
    commit.page = page;
    commit.time_ns = MonotonicNs();
    commit.session = session;
    commit.generation = generation;
    commit.epoch = epoch;
    if (absl::Status s = AppendLocked(commit, image); !s.ok()) return s;
    if (committed != nullptr) imaged.emplace(page, index_[page].back());  // just indexed
  }
  if (absl::Status s = AppendLocked(GenerationEnd(session, generation, epoch), ""); !s.ok()) {
    return s;
  }
  // The adopted pages have commit images now. Fresh memory handed out
  // before the sync before this one was protected again by this sync's
  // client (a grant can cross one sync, never two).
  Journal& j = journal->second;
  j.adopted.clear();
  ++j.commits;
  const auto closed =
      std::stable_partition(j.fresh.begin(), j.fresh.end(),
                            [&](const Journal::Fresh& f) { return j.commits < f.commits + 2; });
  j.expired.assign(closed, j.fresh.end());
  j.fresh.erase(closed, j.fresh.end());
  if (committed != nullptr) {
    window_.emplace();
    window_->imaged = std::move(imaged);
  }
  return absl::OkStatus();
}

absl::Status ContentUndo::AsOfCommit(const uint64_t* offsets, size_t count, char* data) {
  static_assert(kUndoPageBytes == 4096, "logged pages are undo pages");
  absl::MutexLock lock(&mu_);
  if (!window_.has_value()) return absl::OkStatus();
  AdoptNewJournalsLocked();
  // The pages were read before the journals: a store seen there was
  // preceded by its record's append.
  std::atomic_thread_fence(std::memory_order_acquire);
  RefreshAllLocked();
  const CommitWindow& w = *window_;
  if (w.imaged.empty() && w.late.empty() && w.restored.empty()) return absl::OkStatus();
  for (size_t i = 0; i < count; ++i) {
    const Entry* source = nullptr;
    for (const std::map<uint64_t, Entry>* records : {&w.restored, &w.imaged, &w.late}) {
      if (auto it = records->find(offsets[i]); it != records->end()) {
        source = &it->second;
        break;
      }
    }
    if (source == nullptr) continue;
    absl::StatusOr<std::string> image = ReadImageLocked(*source);
    if (!image.ok()) {
      // Logged as read, and said (ReadImageLocked names the record).
      std::fprintf(stderr, "heapd: page %llu is logged as read, not as at its sync's commit: %s\n",
                   static_cast<unsigned long long>(offsets[i]),
                   std::string(image.status().message()).c_str());
      continue;
    }
    std::memcpy(data + i * kUndoPageBytes, image->data(), kUndoPageBytes);
  }
  return absl::OkStatus();
}

void ContentUndo::EndCommit() {
  absl::MutexLock lock(&mu_);
  window_.reset();
}

void ContentUndo::Committed(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  committed_epoch_ = std::max(committed_epoch_, epoch);
  // Drop the pre-images that commit made void, and punch them out of their
  // journals (their memory, on tmpfs).
  for (auto& [session, journal] : journals_) {
    const uint64_t ended = EndedGenerationLocked(session);
    uint64_t void_to = journal.punched;
    while (!journal.written.empty() && journal.written.front().generation <= ended) {
      const Journal::Written& w = journal.written.front();
      UnindexLocked(w.page, session, w.end - kUndoPageBytes);
      void_to = w.end;
      journal.written.pop_front();
    }
    if (void_to > journal.punched) {
      fallocate(journal.fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(journal.punched), static_cast<off_t>(void_to - journal.punched));
      journal.punched = void_to;
    }
  }
  struct stat st;
  if (fstat(heap_journal_.get(), &st) == 0 &&
      static_cast<uint64_t>(st.st_size) > std::max(compact_at_bytes_, 4 * compacted_bytes_)) {
    if (absl::Status s = CompactLocked(); !s.ok()) {
      std::fprintf(stderr, "heapd: %s\n", std::string(s.message()).c_str());
    }
  }
}

absl::Status ContentUndo::CompactLocked() {
  const std::string path = absl::StrCat(dir_, "/", kHeapJournal);
  const std::string rewrite = absl::StrCat(kHeapJournal, kRewriteSuffix);
  UniqueFd out(openat(dir_fd_.get(), rewrite.c_str(),
                      O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out.valid()) return ErrnoStatus(errno, absl::StrCat("rewrite ", path));
  auto failed = [&](const std::string& what) {
    const int err = errno;
    unlinkat(dir_fd_.get(), rewrite.c_str(), 0);
    return ErrnoStatus(err, absl::StrCat(what, " ", dir_, "/", rewrite));
  };
  // Records kept, with where their images are in the new file.
  std::map<uint64_t, std::vector<Entry>> kept;
  std::set<ClientId> named;  // sessions whose pre-images are kept
  uint64_t size = 0;
  for (const auto& [page, entries] : index_) {
    const Entry* cut = CutLocked(entries);
    for (const Entry& e : entries) {
      if (e.file != 0) continue;
      const bool image = UndoKindHasImage(static_cast<uint32_t>(e.kind));
      const bool keep = &e == cut ||
                        (e.kind == UndoKind::kCommitImage && e.epoch > committed_epoch_) ||
                        (e.kind == UndoKind::kPreImage && ValidLocked(e) &&
                         (cut == nullptr || e.time_ns > cut->time_ns));
      if (!keep) continue;
      UndoRecordHeader h;
      h.kind = static_cast<uint32_t>(e.kind);
      h.page = page;
      h.time_ns = e.time_ns;
      h.session = e.session;
      h.generation = e.generation;
      h.epoch = e.epoch;
      // A commit image that applies does for good: it needs its generation
      // end no longer.
      if (e.kind == UndoKind::kCommitImage && ValidLocked(e)) h.session = h.generation = 0;
      std::string bytes;
      if (image) {
        absl::StatusOr<std::string> read = ReadImageLocked(e);
        if (!read.ok()) {
          unlinkat(dir_fd_.get(), rewrite.c_str(), 0);
          return read.status();
        }
        bytes = *std::move(read);
      }
      if (!WriteAll(out.get(), EncodeUndoRecord(h, bytes))) return failed("write");
      Entry moved = e;
      moved.session = h.session;
      moved.generation = h.generation;
      moved.image_at = size + kUndoHeaderBytes;
      kept[page].push_back(moved);
      size += image ? kUndoImageRecordBytes : kUndoHeaderBytes;
      if (h.session != 0) named.insert(h.session);
    }
  }
  for (const auto& [session, journal] : journals_) named.insert(session);
  std::map<ClientId, std::vector<std::pair<uint64_t, uint64_t>>> ends;
  for (const auto& [session, list] : ends_) {
    if (named.count(session) == 0) continue;
    const uint64_t ended = EndedGenerationLocked(session);
    for (const auto& [generation, epoch] : list) {
      if (epoch > committed_epoch_ || (generation == ended && ended != 0)) {
        ends[session].emplace_back(generation, epoch);
      }
    }
  }
  for (const auto& [session, list] : ends) {
    for (const auto& [generation, epoch] : list) {
      if (!WriteAll(out.get(), EncodeUndoRecord(GenerationEnd(session, generation, epoch), ""))) {
        return failed("write");
      }
      size += kUndoHeaderBytes;
    }
  }
  if (renameat(dir_fd_.get(), rewrite.c_str(), dir_fd_.get(), kHeapJournal) != 0) {
    return failed("rename");
  }
  // From here on the new file is heap.undo: the index and ends_ follow it.
  heap_journal_ = std::move(out);
  for (auto it = index_.begin(); it != index_.end();) {
    std::vector<Entry>& entries = it->second;
    entries.erase(
        std::remove_if(entries.begin(), entries.end(), [](const Entry& e) { return e.file == 0; }),
        entries.end());
    auto moved = kept.find(it->first);
    if (moved != kept.end())
      entries.insert(entries.end(), moved->second.begin(), moved->second.end());
    it = entries.empty() ? index_.erase(it) : std::next(it);
  }
  ends_ = std::move(ends);
  compacted_bytes_ = size;
  return absl::OkStatus();
}

void ContentUndo::RemoveJournalLocked(ClientId session) {
  if (window_.has_value()) {
    // An open sync may still read its records (AsOfCommit).
    if (auto journal = journals_.find(session); journal != journals_.end()) {
      window_->ended_journals[session] = std::move(journal->second.fd);
    }
  }
  for (auto it = index_.begin(); it != index_.end();) {
    std::vector<Entry>& entries = it->second;
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const Entry& e) { return e.file == session; }),
                  entries.end());
    it = entries.empty() ? index_.erase(it) : std::next(it);
  }
  journals_.erase(session);
  unlinkat(dir_fd_.get(), JournalName(session).c_str(), 0);
  // A session attaching meanwhile gets its journal only once this is done.
  absl::MutexLock new_lock(&new_journals_mu_);
  if (journals_.empty() && new_journals_.empty()) RecoverAllLocked();
}

void ContentUndo::EndSession(ClientId session) {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  pending_fresh_.erase(session);
  if (journals_.count(session) == 0) return;
  RemoveJournalLocked(session);
}

UndoCounts ContentUndo::RollBack(ClientId session) {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  pending_fresh_.erase(session);
  const UndoCounts before = counts_;
  auto journal = journals_.find(session);
  if (journal == journals_.end()) return {};
  // Keep clients from taking pre-images while pages go back: each live
  // session's client holds its journal's lock while it takes one. One
  // stopped in the middle (or hostile: only a session's own writer can hold
  // it) makes heapd hand the pages over instead of waiting on it.
  RefreshLocked(session, journal->second);
  const bool nothing_written = journal->second.written.empty() && journal->second.adopted.empty();
  const bool locked = !nothing_written && LockLiveJournalsLocked(session);
  RefreshAllLocked();
  std::vector<uint64_t> pages;
  for (const Journal::Written& w : journal->second.written) pages.push_back(w.page);
  pages.insert(pages.end(), journal->second.adopted.begin(), journal->second.adopted.end());
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  for (uint64_t page : pages) {
    auto it = index_.find(page);
    if (it == index_.end()) continue;
    const Entry* target = TargetLocked(it->second);
    if (target == nullptr) continue;  // its stores were committed
    // A live session wrote the page since its last sync: with a pre-image
    // (even one before the cut: later stores of that generation took
    // none), or into memory it was handed free (no pre-images at all).
    bool live_writer = WrittenFreshLocked(page, session) != 0;
    for (const Entry& e : it->second) {
      if (e.kind != UndoKind::kPreImage || e.file == 0 || e.file == session) continue;
      if (ValidLocked(e)) live_writer = true;
    }
    absl::Status status;
    if (live_writer || !locked) {
      ++counts_.pages_handed_over;
      if (target->file == session) {
        absl::StatusOr<std::string> image = ReadImageLocked(*target);
        UndoRecordHeader handed;
        handed.kind = static_cast<uint32_t>(UndoKind::kPreImage);
        handed.page = page;
        handed.time_ns = target->time_ns;
        handed.session = session;
        handed.generation = target->generation;
        status = image.ok() ? AppendLocked(handed, *image) : image.status();
      }
      // A live session that wrote it as fresh memory takes it on: its next
      // sync commits the page, its death puts the page back.
      if (const ClientId taker = WrittenFreshLocked(page, session); taker != 0) {
        journals_[taker].adopted.insert(page);
      }
    } else {
      const Entry chosen = *target;  // RestoreLocked adds to the index
      status = RestoreLocked(page, chosen);
    }
    if (!status.ok()) {
      std::fprintf(stderr, "heapd: rolling back session %llu: %s\n",
                   static_cast<unsigned long long>(session), std::string(status.message()).c_str());
    }
  }
  if (locked) UnlockLiveJournalsLocked(session);
  RemoveJournalLocked(session);
  return UndoCounts{counts_.pages_restored - before.pages_restored,
                    counts_.pages_handed_over - before.pages_handed_over,
                    counts_.bad_journals - before.bad_journals};
}

void ContentUndo::AdoptNewJournalsLocked() {
  absl::MutexLock lock(&new_journals_mu_);
  for (auto& [session, journal] : new_journals_) {
    if (auto pending = pending_fresh_.find(session); pending != pending_fresh_.end()) {
      journal.fresh = std::move(pending->second);
      pending_fresh_.erase(pending);
    }
    journals_.emplace(session, std::move(journal));
  }
  new_journals_.clear();
}

ClientId ContentUndo::WrittenFreshLocked(uint64_t page, ClientId except) const {
  for (const auto& [session, journal] : journals_) {
    if (session == except || journal.broken) continue;
    for (const Journal::Fresh& f : journal.fresh) {
      if (page >= f.offset && page - f.offset < f.length) return session;
    }
  }
  return 0;
}

bool ContentUndo::LockLiveJournalsLocked(ClientId except) {
  const auto deadline = std::chrono::steady_clock::now() + kLockAttempts * kLockRetry;
  for (;;) {
    bool all = true;
    for (auto& [session, journal] : journals_) {
      if (session != except && !LockJournal(journal.fd.get(), F_WRLCK)) all = false;
    }
    if (all) {
      // Revision 2 clients take pre-images without the lock, inside their
      // guard (undo_record.h, JournalControl): close every guard; from then
      // on a client waits for the lock held here, so wait (no longer than
      // the deadline) for those already inside to leave.
      for (auto& [session, journal] : journals_) {
        // One not closed would let its client in while pages go back.
        if (session != except && !SetGuardClosed(journal.fd.get(), 1)) all = false;
      }
      std::atomic_thread_fence(std::memory_order_seq_cst);  // the closes before the reads
      while (all) {
        bool inside = false;
        for (auto& [session, journal] : journals_) {
          if (session != except && GuardBusy(journal.fd.get())) inside = true;
        }
        if (!inside) {
          // What they appended, read after their busy 0.
          std::atomic_thread_fence(std::memory_order_acquire);
          return true;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(kGuardPoll);
      }
    }
    UnlockLiveJournalsLocked(except);
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kLockRetry);
  }
}

void ContentUndo::UnlockLiveJournalsLocked(ClientId except) {
  for (auto& [session, journal] : journals_) {
    if (session == except) continue;
    // Left closed if this fails: its client takes the lock at every
    // pre-image, as a 0.4 client does.
    (void)SetGuardClosed(journal.fd.get(), 0);
    LockJournal(journal.fd.get(), F_UNLCK);
  }
}

void ContentUndo::RecoverAllLocked(bool put_back) {
  if (!put_back) index_.clear();  // nothing is read: the journals only go
  for (const auto& [page, entries] : index_) {
    const Entry* target = TargetLocked(entries);
    if (target == nullptr) continue;
    absl::StatusOr<std::string> image = ReadImageLocked(*target);
    if (!image.ok() || page + kUndoPageBytes > data_->size()) continue;
    ChangedLocked(page, kUndoPageBytes, marks_ + 1);
    if (pwrite(data_->fd(), image->data(), image->size(), page) ==
        static_cast<ssize_t>(image->size())) {
      ++counts_.pages_restored;
    }
  }
  // Every page is at its last commit: nothing here is needed any more.
  // (A crash before this point runs it all again: putting back is
  // idempotent.)
  index_.clear();
  ends_.clear();
  for (const auto& [session, journal] : journals_) {
    unlinkat(dir_fd_.get(), JournalName(session).c_str(), 0);
  }
  journals_.clear();
  if (ftruncate(heap_journal_.get(), 0) != 0) {
    std::fprintf(stderr, "heapd: cannot empty %s/%s\n", dir_.c_str(), kHeapJournal);
  }
}

absl::Status ContentUndo::Forget(ClientId session, uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  // The range is `session`'s alone now: every other entry (this session's
  // earlier one too) is cut out of it. A session that gave the memory back
  // no longer writes it, and its syncs must not take another's stores there
  // for its own (a redo log logs fresh memory whole). Entries never overlap,
  // so they stay within the heap's chunks.
  const uint64_t end = offset + length;
  auto cut = [&](std::vector<Journal::Fresh>& ranges) {
    std::vector<Journal::Fresh> kept;
    for (const Journal::Fresh& f : ranges) {
      const uint64_t f_end = f.offset + f.length;
      if (f_end <= offset || f.offset >= end) {
        kept.push_back(f);
        continue;
      }
      if (f.offset < offset) kept.push_back(Journal::Fresh{f.offset, offset - f.offset, f.commits});
      if (f_end > end) kept.push_back(Journal::Fresh{end, f_end - end, f.commits});
    }
    ranges = std::move(kept);
  };
  for (auto& [id, journal] : journals_) {
    cut(journal.fresh);
    cut(journal.expired);
  }
  for (auto& [id, ranges] : pending_fresh_) cut(ranges);
  if (auto journal = journals_.find(session); journal != journals_.end()) {
    journal->second.fresh.push_back(Journal::Fresh{offset, length, journal->second.commits});
  } else {
    // Leased in the attach call, before the session's journal was made.
    pending_fresh_[session].push_back(Journal::Fresh{offset, length, 0});
  }
  ChangedLocked(offset, length, marks_ + 1);
  RefreshAllLocked();
  std::vector<uint64_t> pages;
  for (auto it = index_.lower_bound(offset); it != index_.end() && it->first < offset + length;
       ++it) {
    if (TargetLocked(it->second) != nullptr) pages.push_back(it->first);
  }
  for (uint64_t page : pages) {
    if (absl::Status s = AppendLocked(ClearOf(page), ""); !s.ok()) return s;
  }
  return absl::OkStatus();
}

UndoCounts ContentUndo::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

ChunkChanges ContentUndo::MarkChanges() {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  RefreshAllLocked();
  // What stays open to stores no later record will show changes after
  // this mark too.
  const uint64_t next = marks_ + 2;
  for (const auto& [session, journal] : journals_) {
    if (journal.broken || journal.unseen) all_changed_at_ = next;
    for (const Journal::Written& w : journal.written) ChangedLocked(w.page, kUndoPageBytes, next);
    for (uint64_t page : journal.adopted) ChangedLocked(page, kUndoPageBytes, next);
    for (const Journal::Fresh& f : journal.fresh) ChangedLocked(f.offset, f.length, next);
  }
  ++marks_;
  return ChunkChanges{changes_source_, marks_, changed_at_, all_changed_at_};
}

void ContentUndo::StoresUnseen(ClientId session) {
  absl::MutexLock lock(&mu_);
  AdoptNewJournalsLocked();
  if (auto journal = journals_.find(session); journal != journals_.end()) {
    journal->second.unseen = true;
  }
  all_changed_at_ = std::max(all_changed_at_, marks_ + 1);
}

void ContentUndo::ChangedLocked(uint64_t offset, uint64_t length, uint64_t stamp) {
  if (length == 0) return;
  const uint64_t last = (offset + length - 1) / kChunkSize;
  if (changed_at_.size() <= last) changed_at_.resize(last + 1, 0);
  for (uint64_t chunk = offset / kChunkSize; chunk <= last; ++chunk) {
    changed_at_[chunk] = std::max(changed_at_[chunk], stamp);
  }
}

}  // namespace heapd
