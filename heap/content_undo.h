// ContentUndo: puts object contents back to the last sync
// (docs/consistency.md "Object contents").
//
// Each read-write session of a tracked heap has a journal,
// undo/session-<id>.undo; before the session's first store to a page since
// its last sync, its client appends the page as it was (a pre-image, tagged
// with the session's generation: the number of its syncs so far) and only
// then lets the store through (client/write_tracker.h). Memory handed out
// free needs no pre-image. heapd alone appends to undo/heap.undo:
//   - generation ends: a sync of the session committed its generations up
//     to G, once epoch E is committed;
//   - commit images: a page as a sync committed it, written where other
//     records of the page exist (another session wrote it too);
//   - clears: the page's older records no longer apply (it was put back, or
//     handed out free);
//   - pre-images handed over from a session that died while another live
//     session had written the same page.
//
// The rule that puts a page back (Target): of the page's valid records,
// the newest commit image or clear is its cut; the page goes back to that
// commit image, else to the oldest valid pre-image after the cut (the one
// taken first saw the committed page; later ones saw others' stores).
//
// Pages are put back:
//   - when a session dies (RollBack): each page it wrote goes back unless a
//     live session wrote it too since that session's last sync; such a
//     page is handed over, and goes back with that session's death or
//     stays with its sync ("a sync commits its pages as they are");
//   - when heapd opens the heap (Open), and when its last session is gone:
//     every page any journal names.
// While a page is put back no client may take its pre-image: a client takes
// one inside its journal's guard (undo_record.h, JournalControl), or holding
// the OFD lock on byte 0 of its journal when the guard is closed (a 0.4
// client: always); heapd takes every live journal's lock, closes every
// guard and waits for the clients inside to leave while it puts pages back
// (only a session's own writer can write its journal: read-only attachers
// cannot stall a rollback).
//
// Nothing read from a journal is trusted: records are checked (undo_record.h)
// and bounded by the data file; a journal that breaks its format or grows
// past what its session could need stops being read (that session's pages
// then stay as they are; logged and counted).
//
// Thread-safe.
#ifndef HEAPD_HEAP_CONTENT_UNDO_H_
#define HEAPD_HEAP_CONTENT_UNDO_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/lease_types.h"
#include "heap/data_file.h"
#include "heap/undo_record.h"
#include "util/unique_fd.h"

namespace heapd {

// What heapd knows of which chunks changed, for snapshot stores
// (ContentUndo::MarkChanges; docs/snapshot-store.md "Unchanged chunks").
struct ChunkChanges {
  // This ContentUndo's life (random): marks of another are not comparable.
  std::string source;
  // This mark: a chunk whose changed_at is at most an earlier mark M holds
  // what it held when M was taken (every store to it was made before M).
  uint64_t mark = 0;
  std::vector<uint64_t> changed_at;  // by 2 MiB chunk; beyond its end: 0
  uint64_t all_changed_at = 0;       // every chunk, as if in changed_at
  uint64_t ChangedAt(uint64_t chunk) const {
    return std::max(all_changed_at, chunk < changed_at.size() ? changed_at[chunk] : 0);
  }
};

struct UndoCounts {
  uint64_t pages_restored = 0;     // put back to their last commit
  uint64_t pages_handed_over = 0;  // left to a live session that also wrote them
  uint64_t bad_journals = 0;       // journals that stopped being read
};

class ContentUndo {
 public:
  // Opens `undo_dir` (made 0700 if missing) for a heap whose data file is
  // `data` (not owned; must outlive this) and whose committed epoch is
  // `epoch`. Journals found there are from sessions of an earlier heapd:
  // their pages are put back and the journals removed before this returns;
  // `recovered` says how many.
  // heap.undo is rewritten with only what still applies once it exceeds
  // `compact_at_bytes` and four times its size after the last rewrite.
  static absl::StatusOr<std::unique_ptr<ContentUndo>> Open(const std::string& undo_dir,
                                                           const DataFile* data, uint64_t epoch,
                                                           UndoCounts* recovered,
                                                           uint64_t compact_at_bytes = 16 << 20);
  // Open, for the directory `name` in the directory `parent` (made if
  // missing, never through a symlink); `path` names it in messages. With
  // !put_back the journals found are removed unread: `data` was loaded
  // from the last commit (a working image, heap/heap.h), so nothing in it
  // needs putting back.
  static absl::StatusOr<std::unique_ptr<ContentUndo>> OpenAt(int parent, const std::string& name,
                                                             const std::string& path,
                                                             const DataFile* data, uint64_t epoch,
                                                             UndoCounts* recovered,
                                                             bool put_back = true,
                                                             uint64_t compact_at_bytes = 16 << 20);
  ~ContentUndo() = default;
  ContentUndo(const ContentUndo&) = delete;
  ContentUndo& operator=(const ContentUndo&) = delete;

  // Creates the journal of a new read-write session; the caller owns the
  // descriptor (opened for appending), which goes to the client.
  absl::StatusOr<UniqueFd> OpenJournal(ClientId session);

  // The pages a sync commits (a redo log writes them; heap/redo_log.h).
  struct CommitPages {
    std::vector<uint64_t> pages;  // page offsets, ascending, each once
    // Memory handed to the session free, still open to its stores without
    // pre-images or just closed to them: (offset, length). Only its live
    // objects need logging.
    std::vector<std::pair<uint64_t, uint64_t>> fresh;
    // The session stored without pre-images (StoresUnseen): which pages it
    // wrote is not known, so every page is committed.
    bool all = false;
  };
  // Before epoch `epoch` is persisted by a sync of `session` that commits
  // its generations up to `generation` (the heap's persist lock held):
  // writes commit images of its pages that other records also name, then
  // the generation end. With `committed`, says which pages the sync
  // commits: those the session took pre-images of in those generations,
  // those handed over to it, and the memory handed to it free that it may
  // have written without pre-images (each of those pages that another
  // record names gets a commit image too).
  absl::Status PrepareCommit(ClientId session, uint64_t generation, uint64_t epoch,
                             CommitPages* committed = nullptr);
  // A PrepareCommit with `committed` opens the sync's commit window: its
  // pages are read from the data file (a working image) and logged after
  // its commit point, while other sessions, and its own client's other
  // threads, may already store into them. Until EndCommit, AsOfCommit
  // puts back, in `data` (`count` pages just read at `offsets`), each page
  // that may have changed since the commit point, as it was then: what a
  // dead session's rollback put it back to meanwhile (the working image
  // holds that), else the commit image PrepareCommit wrote, else the
  // oldest pre-image any session took since (the first store after the
  // commit point saw the committed page). The journals are read first: a
  // store seen in `data` was preceded by its pre-image's append. A record
  // that cannot be read back leaves the page as read.
  absl::Status AsOfCommit(const uint64_t* offsets, size_t count, char* data);
  // The sync's pages are logged, or it failed: its commit window closes.
  void EndCommit();

  // After epoch `epoch` was persisted: drops what it made void.
  void Committed(uint64_t epoch);

  // `session` ended after committing all it wrote (a detach): its journal
  // goes.
  void EndSession(ClientId session);
  // `session` died: its pages go back to their last commit, except those a
  // live session wrote too (handed over); its journal goes.
  UndoCounts RollBack(ClientId session);

  // [offset, offset + length) is handed out free (a fresh chunk or large
  // run) to `session`: records of its pages no longer apply, so nothing
  // puts back what the session writes there without pre-images until its
  // client protects the range again (at its next sync but one, counted
  // from the grant); meanwhile a dead session's pre-image of one of those
  // pages is handed over to it, never restored over its stores.
  absl::Status Forget(ClientId session, uint64_t offset, uint64_t length);

  UndoCounts counts() const;

  // Takes a mark (the heap's files at rest, as a snapshot is taken; the
  // data is read after it). Stores heapd learns of (pre-images in the
  // journals, memory handed out free, pages put back) stamp their chunk
  // with the next mark; so do, at each mark, the pages and free memory
  // still open to stores without a new pre-image (written since their
  // session's last sync, or granted fresh), and every chunk while a live
  // session's journal is not read. This knows only what the clients'
  // write trackers tell: a writer that stores without taking pre-images is
  // not seen (as its stores are not rolled back).
  ChunkChanges MarkChanges() ABSL_LOCKS_EXCLUDED(mu_);
  // `session`'s client let stores through without pre-images (its journal
  // could not take them): every chunk counts as changed while it lives.
  void StoresUnseen(ClientId session) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One record known to be in a journal.
  struct Entry {
    UndoKind kind;
    uint64_t time_ns;
    ClientId session;  // pre-image: whose
    uint64_t generation;
    uint64_t epoch;
    ClientId file;  // 0: heap.undo; else the journal of that session
    uint64_t image_at;
  };
  struct Journal {
    UniqueFd fd;
    uint64_t read_to = 0;    // bytes parsed
    uint64_t punched = 0;    // bytes before this are void and punched out
    bool broken = false;     // stopped being read
    bool oversized = false;  // and emptied at each check: it grew too big
    bool unseen = false;     // its client stored without pre-images (StoresUnseen)
    // Its pre-images in journal order (generations only grow along it).
    struct Written {
      uint64_t page;
      uint64_t generation;
      uint64_t end;  // of the record in the journal
    };
    std::deque<Written> written;
    uint64_t commits = 0;  // syncs of the session so far
    // Memory handed to it free, written without pre-images: (offset,
    // length, commits when handed out).
    struct Fresh {
      uint64_t offset;
      uint64_t length;
      uint64_t commits;
    };
    std::vector<Fresh> fresh;
    // Fresh memory whose window closed at the last sync: objects the
    // client allocated there just before that sync are reported only with
    // the next one (it takes its reports before it protects), so that sync
    // still logs its live pages (CommitPages::fresh).
    std::vector<Fresh> expired;
    // Pages a dead session handed over to it because it wrote them fresh:
    // its next sync writes their commit images; its death puts them back.
    std::set<uint64_t> adopted;
  };

  // See AsOfCommit: where each page's bytes as of the commit point are.
  // Only records are kept, never their bytes: they are read when the page
  // is logged (heap.undo is not rewritten while the window is open).
  struct CommitWindow {
    std::map<uint64_t, Entry> imaged;    // commit images PrepareCommit wrote
    std::map<uint64_t, Entry> late;      // the oldest pre-image taken since
    std::map<uint64_t, Entry> restored;  // what a page was put back to since
    // Journals of sessions that ended meanwhile, still read from.
    std::map<ClientId, UniqueFd> ended_journals;
  };

  // A client holds its journal's lock, or stays inside its guard, for
  // microseconds; one that keeps either costs a rollback at most 10 ms (the
  // reapers are heapd's threads).
  static constexpr int kLockAttempts = 20;  // the deadline: kLockAttempts * kLockRetry
  static constexpr std::chrono::microseconds kLockRetry{500};
  // How often a client inside its guard is looked at again: it is there
  // for microseconds.
  static constexpr std::chrono::microseconds kGuardPoll{20};

  ContentUndo(UniqueFd dir_fd, std::string dir, const DataFile* data);

  // `session`'s journal: its name in the directory, its path for messages.
  static std::string JournalName(ClientId session);
  std::string JournalPath(ClientId session) const;
  // Reads what was appended to `session`'s journal since the last read.
  // The data file bounds the pages it may name and its size.
  void RefreshLocked(ClientId session, Journal& journal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the journal broken (counted and logged, saying `why`).
  void StopReadingLocked(ClientId session, Journal& journal, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops index entries of `session`'s file, or of heap.undo (0).
  void UnindexLocked(uint64_t page, ClientId file, uint64_t image_at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddLocked(uint64_t page, const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ValidLocked(const Entry& entry) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The valid commit image or clear that cuts the page's history, or null.
  const Entry* CutLocked(const std::vector<Entry>& entries) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The record the page goes back to, or null (nothing to put back).
  const Entry* TargetLocked(const std::vector<Entry>& entries) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Appends a record to heap.undo and indexes it.
  absl::Status AppendLocked(const UndoRecordHeader& header, const std::string& image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> ReadImageLocked(const Entry& entry) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Puts `page` back from `target` and clears its records.
  absl::Status RestoreLocked(uint64_t page, const Entry& target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves new_journals_ into journals_.
  void AdoptNewJournalsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A live session other than `except` that wrote `page` as fresh memory
  // since its last sync (see Forget), or 0.
  ClientId WrittenFreshLocked(uint64_t page, ClientId except) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes every live journal's lock but `except`'s, closes their guards
  // and waits for the clients inside them to leave (a client takes a
  // pre-image inside its guard, or under its lock once the guard is
  // closed), for up to kLockAttempts * kLockRetry in all; false, with
  // nothing held, if some client kept its lock or stayed inside.
  bool LockLiveJournalsLocked(ClientId except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlockLiveJournalsLocked(ClientId except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites heap.undo with only the records that still apply: per page,
  // its cut, the commit images of epochs not yet committed and the valid
  // pre-images after the cut; per session still named, its newest
  // committed generation end and those not yet committed.
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts every page back (unless !put_back) and starts empty: no session
  // is alive.
  void RecoverAllLocked(bool put_back = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveJournalLocked(ClientId session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stamps the chunks of [offset, offset + length) with mark `stamp`
  // (the next one for what was learned now), keeping a later stamp.
  void ChangedLocked(uint64_t offset, uint64_t length, uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The generation up to which `session`'s pre-images are committed.
  uint64_t EndedGenerationLocked(ClientId session) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // The undo directory, opened once: every file in it is reached through
  // this descriptor; `dir_` names it in messages.
  const UniqueFd dir_fd_;
  const std::string dir_;
  const DataFile* const data_;
  mutable absl::Mutex mu_;
  uint64_t committed_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  UniqueFd heap_journal_ ABSL_GUARDED_BY(mu_);
  // Set when a torn record could not be cut off heap.undo: nothing more is
  // appended (syncs fail) until heapd restarts.
  absl::Status heap_journal_error_ ABSL_GUARDED_BY(mu_);
  uint64_t compact_at_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t compacted_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // heap.undo's size after the last rewrite
  std::map<ClientId, Journal> journals_ ABSL_GUARDED_BY(mu_);  // live sessions'
  // Memory handed out free to sessions whose journal is not made yet (chunks
  // leased in the attach call itself): theirs once it is adopted.
  std::map<ClientId, std::vector<Journal::Fresh>> pending_fresh_ ABSL_GUARDED_BY(mu_);
  // Journals OpenJournal made, until the next call holding mu_ adopts them.
  // Taken under mu_, never the other way round.
  absl::Mutex new_journals_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<ClientId, Journal> new_journals_ ABSL_GUARDED_BY(new_journals_mu_);
  // Open between a working-image sync's PrepareCommit and EndCommit.
  std::optional<CommitWindow> window_ ABSL_GUARDED_BY(mu_);
  // Generation ends, per session: (generation, epoch).
  std::map<ClientId, std::vector<std::pair<uint64_t, uint64_t>>> ends_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<Entry>> index_ ABSL_GUARDED_BY(mu_);  // by page
  UndoCounts counts_ ABSL_GUARDED_BY(mu_);
  // See MarkChanges: marks taken so far, and each chunk's stamp.
  const std::string changes_source_;
  uint64_t marks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> changed_at_ ABSL_GUARDED_BY(mu_);
  uint64_t all_changed_at_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_CONTENT_UNDO_H_
