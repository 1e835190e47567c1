// The records of a heap's content undo journals (heap/content_undo.h,
// docs/on-disk-format.md "undo/"): what a page held before a session first
// wrote it since its last sync, and what heapd knows of those pages.
//
// A record is a fixed header, followed by one page image for the kinds
// that carry one. Journals are appended whole records at a time (O_APPEND,
// one write each); a reader stops at the first record that is short or
// whose magic is 0 (not there yet) and flags one that fails its check.
//
// Everything here is pure: no I/O.
#ifndef HEAPD_HEAP_UNDO_RECORD_H_
#define HEAPD_HEAP_UNDO_RECORD_H_

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heapd {

inline constexpr uint64_t kUndoPageBytes = 4096;
// Records checked with XXH3 (the low 32 bits of XXH3-64 of the header,
// check 0, seeding XXH3-64 of the image): what this version writes.
inline constexpr uint32_t kUndoMagic = 0x32524448;  // "HDR2"
// Records checked with zlib's CRC-32 of the header (check 0) and the
// image, written by heapd 0.4.0 and its clients: still read.
inline constexpr uint32_t kUndoMagicCrc32 = 0x31524448;  // "HDR1"

enum class UndoKind : uint32_t {
  // The page before the session's first store to it in `generation`
  // (written by the session's client). Void once a generation end of its
  // session at or above `generation` applies.
  kPreImage = 1,
  // The page as a sync committed it, written by heapd where other records
  // of the page exist. Applies once the heap's committed epoch reaches
  // `epoch` and, unless `session` is 0, the generation end of `session`,
  // `generation` and `epoch` that the sync writes after its commit images
  // exists; records of the page older than it are void from then on.
  kCommitImage = 2,
  // The page's records older than this one are void (its memory was put
  // back, or handed out free) once `epoch` is committed (0: at once).
  kClear = 3,
  // The session's generations up to `generation` are committed once the
  // heap's committed epoch reaches `epoch`.
  kGenerationEnd = 4,
};

struct UndoRecordHeader {
  uint32_t magic = kUndoMagic;
  uint32_t kind = 0;
  uint64_t page = 0;     // offset of the page in the data file
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC when taken: orders a page's records
  uint64_t session = 0;  // pre-image, generation end: whose
  uint64_t generation = 0;
  uint64_t epoch = 0;
  uint32_t image_bytes = 0;  // kUndoPageBytes for images, else 0
  uint32_t crc = 0;          // the check of the header (crc 0) and the image (see the magics)
};
static_assert(sizeof(UndoRecordHeader) == 56, "on-disk layout");

inline constexpr uint64_t kUndoHeaderBytes = sizeof(UndoRecordHeader);
// The first page of a session journal that a heapd of protocol revision 2
// makes (records follow it): its guard. A client takes a pre-image without
// a system call unless heapd is putting pages back (docs/consistency.md,
// "Object contents"): it sets `busy` (sequentially consistent), then reads
// `closed`; if `closed` is set it clears `busy` and takes the journal's
// OFD lock instead, as a revision 1 client does for every pre-image.
// heapd, to put pages back, takes every live journal's OFD lock, sets
// `closed`, then waits until `busy` reads 0 (or its client is gone: see
// kJournalAliveAt): a pre-image taken meanwhile is whole in the journal,
// and any later one waits for heapd. heapd reads and writes the page with
// pread and pwrite (a client may truncate its file: heapd never maps it).
struct JournalControl {
  uint32_t magic = 0;    // kJournalControlMagic
  uint32_t version = 0;  // 1
  uint32_t busy = 0;     // the client's
  uint32_t closed = 0;   // heapd's
};
inline constexpr uint32_t kJournalControlMagic = 0x434a4448;  // "HDJC"
inline constexpr uint64_t kJournalControlBytes = 4096;
inline constexpr uint64_t kJournalBusyAt = offsetof(JournalControl, busy);
inline constexpr uint64_t kJournalClosedAt = offsetof(JournalControl, closed);
// The byte whose OFD read lock the client holds while it lives (the kernel
// drops it with the client's last descriptor of the journal): a `busy` left
// set by a client that died inside its guard is not waited for.
inline constexpr uint64_t kJournalAliveAt = 1;
// The OFD lock request of `type` (F_RDLCK, F_WRLCK, F_UNLCK) on that byte.
struct flock JournalAliveLock(short type);

// The control page of a new session journal.
std::string EncodeJournalControl();

inline constexpr uint64_t kUndoImageRecordBytes = kUndoHeaderBytes + kUndoPageBytes;

// True for the kinds that carry a page image.
bool UndoKindHasImage(uint32_t kind);

// A whole record: `header` with its crc and image_bytes filled in (its
// magic kUndoMagic unless it asks for kUndoMagicCrc32), then
// `image` (kUndoPageBytes bytes, or empty for kinds without one).
// REQUIRES: image.size() == (UndoKindHasImage(header.kind) ? kUndoPageBytes : 0).
std::string EncodeUndoRecord(UndoRecordHeader header, absl::string_view image);

// The same, written into `out` (kUndoImageRecordBytes or kUndoHeaderBytes
// bytes): the client's fault handler encodes without allocating.
void EncodeUndoRecordInto(UndoRecordHeader header, const char* image, char* out);

struct DecodedUndoRecord {
  UndoRecordHeader header;
  uint64_t image_at = 0;  // offset of the image in the journal (if any)
  uint64_t size = 0;      // bytes the record takes
};

// The record at offset `at` of a journal whose bytes from `at` on are
// `bytes`: nullopt when `bytes` ends before the record does or its magic
// is 0 (a torn or unfinished tail); DATA_LOSS when it is not a valid record
// (bad magic, kind, sizes, check, or a page not aligned). A valid record
// may still name any page: callers bound it by the data file.
absl::StatusOr<std::optional<DecodedUndoRecord>> DecodeUndoRecord(absl::string_view bytes,
                                                                  uint64_t at);

}  // namespace heapd

#endif  // HEAPD_HEAP_UNDO_RECORD_H_
