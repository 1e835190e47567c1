// RedoLog: the pages a sync changed, made durable before the sync's epoch
// commits, so that a heap whose durable image is on a block device or
// fs-dax (NVMe, persistent memory) reads as its last acknowledged sync
// after any crash (issue 21; docs/consistency.md).
//
// The protocol it serves, per sync of epoch E:
//   1. Append(E, pages): the pages as the working image holds them, written
//      to the log and made durable (fdatasync) before Append returns;
//   2. the epoch record commits E (heap/metadata_store.h);
//   3. later, the pages are written in place into the durable image, which
//      is made durable; then Reset() empties the log.
// After a crash, Replay(committed epoch) hands back, oldest first, every
// page of the records whose epoch is committed; writing them in place (the
// last one of a page wins) brings the durable image to that epoch whatever
// step the crash cut. Replay also takes back the records after them (a
// sync that never committed), and a sync that failed after Append and
// before its commit is taken back with RewindTo: no later epoch of the
// same number can pick up their pages. Epochs only go forward in a pass.
//
// The file ("redo" or "redo.b" in the heap directory, docs/on-disk-format.md) is
// preallocated and written through once with zeros at Create, so a sync's
// fdatasync flushes data only, never extent metadata. Written with
// O_DIRECT where the file system allows it (aligned as statx's
// STATX_DIOALIGN says), so the log's pages do not sit in the page cache a
// second time; O_DIRECT alone is not durability: Append still ends with
// fdatasync. Layout, in blocks of kRedoBlockBytes:
//   block 0        two header slots (magic, format, size, the pass and its
//                  generation); Reset writes the slot not in use, so a torn
//                  header write leaves the other one
//   then records   one header block (magic, pass, the id of the Append that
//                  wrote it, epoch, the previous record's hash, page
//                  count, hashes, offsets) followed by its pages
// Records form a chain: each names the hash (XXH3, 64 bits) of the one
// before it (the first, its pass's). A reader follows the chain from block 1 and stops at
// the first record that does not continue it: torn, of another pass, or
// written after a different record than the one now before it (what a
// rewind or a crash left behind). Each Append draws a random id, so no
// two Appends write the same record, even of the same epoch and pages.
//
// Not thread-safe: one sync at a time (the heap's persist lock).
#ifndef HEAPD_HEAP_REDO_LOG_H_
#define HEAPD_HEAP_REDO_LOG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

inline constexpr uint64_t kRedoBlockBytes = 4096;  // a page, and the log's block
inline constexpr char kRedoLogFileName[] = "redo";

// Replaces, in `data` (`count` pages just read at `offsets`), pages whose
// bytes the log must take from elsewhere (ContentUndo::AsOfCommit).
using PagePatch = std::function<absl::Status(const uint64_t* offsets, size_t count, char* data)>;

class RedoLog {
 public:
  // Where the next record goes: what RewindTo takes back to.
  struct Position {
    uint64_t pass = 0;
    uint64_t block = 1;       // the next record's first block
    uint64_t last_epoch = 0;  // of the record before it (0: none)
    uint64_t last_hash = 0;   // its header's hash (the chain's link)
  };

  // Creates the log `name` in `dir` (which must not exist) with room for
  // `capacity` bytes of records (rounded up to whole blocks), written
  // through with zeros under a temporary name, made durable and renamed into
  // place (`dir` fsynced). `path` names it in errors. `applied_epoch`:
  // the epoch the heap's image holds already (a log made for a heap
  // restored from a snapshot).
  static absl::StatusOr<std::unique_ptr<RedoLog>> Create(int dir, const std::string& name,
                                                         uint64_t capacity, const std::string& path,
                                                         uint64_t applied_epoch = 0);
  // Opens an existing log and finds the end of its current pass. Replay
  // comes next: Append refuses until it succeeded. DATA_LOSS if neither
  // header slot is a redo log's.
  static absl::StatusOr<std::unique_ptr<RedoLog>> Open(int dir, const std::string& name,
                                                       const std::string& path);

  ~RedoLog();
  RedoLog(const RedoLog&) = delete;
  RedoLog& operator=(const RedoLog&) = delete;

  // Appends `offsets` (page-aligned offsets in the heap's data, each once)
  // as `epoch`'s, their bytes read from `source` (the working image) at the
  // same offsets, then given to `patch` (if set) a record at a time before
  // they are hashed and written, and makes them durable. Every epoch the heap commits is
  // appended, even one without pages (a record of its header alone): it
  // overwrites whatever a taken-back Append left after the end. Returns
  // where the records start (for RewindTo). RESOURCE_EXHAUSTED if they do
  // not fit in what is left (nothing is written then: apply and Reset
  // first); INVALID_ARGUMENT for an offset that is not page-aligned or an
  // epoch not after both the last one appended and the last one Replay or
  // ApplyTo was told is committed; FAILED_PRECONDITION before Replay or
  // after a failed Reset. On any error the log reads as before.
  absl::StatusOr<Position> Append(uint64_t epoch, const std::vector<uint64_t>& offsets, int source,
                                  const PagePatch& patch = nullptr);

  // Takes back the last successful Append, which returned `start` (its
  // sync's commit failed, and is known not to be durable), once.
  // FAILED_PRECONDITION for any other position.
  absl::Status RewindTo(const Position& start);

  // Calls `apply(offset, page)` for every page of the records whose epoch
  // is at most `committed_epoch`, oldest first (a later record of the same
  // page comes later), then takes back the records after them: the next
  // Append goes there. Stops at the first error `apply` returns (Append
  // still refuses then). DATA_LOSS if the records do not reach
  // `committed_epoch` (every committed epoch wrote one, or was applied
  // before the last Reset).
  absl::Status Replay(
      uint64_t committed_epoch,
      const std::function<absl::Status(uint64_t offset, absl::string_view page)>& apply);

  // Writes into `image` (the heap's durable image) the pages of the
  // records Replay would give for `committed_epoch`, each page once (its
  // last copy), then makes `image` durable (fdatasync). Takes back the
  // records after them, as Replay. Returns how many pages it wrote. Reset
  // may follow.
  absl::StatusOr<uint64_t> ApplyTo(int image, uint64_t committed_epoch);

  // Empties the log: a new pass in the header slot not in use, made
  // durable. FAILED_PRECONDITION unless ApplyTo wrote every record it holds
  // into the heap's image. If it fails, Append refuses until a Reset
  // succeeds.
  absl::Status Reset();
  // Empties a log whose records are all applied (FAILED_PRECONDITION
  // otherwise) into a new pass that starts at `applied_epoch`: the heap's
  // image holds that epoch, or will once another log's records up to it
  // are applied, which a reader after a crash does first (its applied
  // epoch is lower). Append then takes only later epochs.
  absl::Status RestartAt(uint64_t applied_epoch);
  // The epoch the image held when this pass began, and that of its last
  // record (0: none).
  uint64_t applied_epoch() const { return applied_epoch_; }
  uint64_t last_epoch() const { return next_.last_epoch; }

  // Bytes of records written in this pass, and room for records in all.
  uint64_t used_bytes() const { return (next_.block - 1) * kRedoBlockBytes; }
  uint64_t capacity() const { return (blocks_ - 1) * kRedoBlockBytes; }
  // Pages one record holds (each record costs one more block).
  static uint64_t PagesPerRecord();
  // Bytes of log `pages` pages take, headers included.
  static uint64_t BytesFor(uint64_t pages);
  // Whether the log is written with O_DIRECT.
  bool direct() const { return direct_; }

 private:
  RedoLog(UniqueFd fd, std::string path, uint64_t blocks, bool direct);

  // Walks the records of epochs up to `committed_epoch` (to the first of a
  // later one), calling `page` for each of their pages (empty bytes
  // without `with_pages`: headers only, for records read whole once
  // already); returns where they end.
  absl::StatusOr<Position> WalkCommitted(
      uint64_t committed_epoch, bool with_pages,
      const std::function<absl::Status(uint64_t offset, absl::string_view page)>& page) const;
  absl::Status ReadHeader();
  absl::Status WriteHeader();
  // Finds the end of the current pass: next_.
  absl::Status Scan();
  // Reads `pages` pages at `offsets` from `source` into a record's buffer
  // (kRedoBlockBytes-aligned, 1 + pages blocks) behind its header, patched
  // by `patch` if set.
  absl::Status FillRecord(uint64_t epoch, uint64_t append_id, uint64_t previous_hash,
                          const uint64_t* offsets, size_t pages, int source, const PagePatch& patch,
                          char* buffer) const;
  absl::Status WriteBlocks(uint64_t block, const char* bytes, uint64_t count) const;
  absl::Status ReadBlocks(uint64_t block, char* bytes, uint64_t count) const;

  const UniqueFd fd_;
  const std::string path_;
  const uint64_t blocks_;  // in the file, block 0 included
  const bool direct_;
  uint64_t generation_ = 0;     // of the header slot in use: generation_ % 2
  uint64_t applied_epoch_ = 0;  // its applied epoch (docs/on-disk-format.md)
  Position next_;
  bool replayed_ = false;  // Append is allowed
  absl::Status broken_;    // a Reset failed: the header may name either pass
  // The highest epoch Replay or ApplyTo was told is committed: Append
  // takes only later ones.
  uint64_t committed_epoch_ = 0;
  // The end of what ApplyTo wrote into the image (0: nothing known):
  // Reset only when it is the end of the log.
  uint64_t applied_block_ = 0;
  // Where the last successful Append started: what RewindTo takes back.
  std::optional<Position> last_append_;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_REDO_LOG_H_
