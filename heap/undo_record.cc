#include "heap/undo_record.h"

#include <zlib.h>

#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

// XXH3 inlined from the header: no library to load at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace heapd {
namespace {

// The check of a record whose header is `header` (by its magic), over the
// header with crc 0 and the image.
uint32_t Checksum(const UndoRecordHeader& header, const char* image, uint64_t image_bytes) {
  UndoRecordHeader zeroed = header;
  zeroed.crc = 0;
  if (header.magic == kUndoMagicCrc32) {
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(&zeroed), sizeof(zeroed));
    if (image_bytes != 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(image), image_bytes);
    return static_cast<uint32_t>(crc);
  }
  // XXH3 runs at memory speed: copying and checking a page takes 0.67 us,
  // 1.39 with CRC-32 (docs/performance.md, B8).
  uint64_t check = XXH3_64bits(&zeroed, sizeof(zeroed));
  if (image_bytes != 0) check = XXH3_64bits_withSeed(image, image_bytes, check);
  return static_cast<uint32_t>(check);
}

}  // namespace

bool UndoKindHasImage(uint32_t kind) {
  return kind == static_cast<uint32_t>(UndoKind::kPreImage) ||
         kind == static_cast<uint32_t>(UndoKind::kCommitImage);
}

void EncodeUndoRecordInto(UndoRecordHeader header, const char* image, char* out) {
  if (header.magic != kUndoMagicCrc32) header.magic = kUndoMagic;
  header.image_bytes = UndoKindHasImage(header.kind) ? kUndoPageBytes : 0;
  // The image first, and the checksum over that copy: the source may be a
  // page other processes are storing into meanwhile.
  if (header.image_bytes != 0) std::memcpy(out + sizeof(header), image, header.image_bytes);
  header.crc = Checksum(header, out + sizeof(header), header.image_bytes);
  std::memcpy(out, &header, sizeof(header));
}

std::string EncodeUndoRecord(UndoRecordHeader header, absl::string_view image) {
  const bool has_image = UndoKindHasImage(header.kind);
  std::string out(has_image ? kUndoImageRecordBytes : kUndoHeaderBytes, '\0');
  EncodeUndoRecordInto(header, has_image ? image.data() : nullptr, out.data());
  return out;
}

struct flock JournalAliveLock(short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = kJournalAliveAt;
  lock.l_len = 1;
  return lock;
}

std::string EncodeJournalControl() {
  std::string page(kJournalControlBytes, '\0');
  const JournalControl control{kJournalControlMagic, 1, 0, 0};
  std::memcpy(page.data(), &control, sizeof(control));
  return page;
}

absl::StatusOr<std::optional<DecodedUndoRecord>> DecodeUndoRecord(absl::string_view bytes,
                                                                  uint64_t at) {
  if (bytes.size() < kUndoHeaderBytes) return std::nullopt;
  DecodedUndoRecord record;
  std::memcpy(&record.header, bytes.data(), sizeof(record.header));
  const UndoRecordHeader& h = record.header;
  auto bad = [at](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("undo record at byte ", at, ": ", what));
  };
  if (h.magic == 0) return std::nullopt;  // zeros: nothing there (yet)
  if (h.magic != kUndoMagic && h.magic != kUndoMagicCrc32) return bad("bad magic");
  if (h.kind < static_cast<uint32_t>(UndoKind::kPreImage) ||
      h.kind > static_cast<uint32_t>(UndoKind::kGenerationEnd)) {
    return bad(absl::StrCat("unknown kind ", h.kind));
  }
  const uint64_t image_bytes = UndoKindHasImage(h.kind) ? kUndoPageBytes : 0;
  if (h.image_bytes != image_bytes) return bad(absl::StrCat("image of ", h.image_bytes, " bytes"));
  if (h.page % kUndoPageBytes != 0) return bad(absl::StrCat("page ", h.page, " not aligned"));
  record.size = kUndoHeaderBytes + image_bytes;
  if (bytes.size() < record.size) return std::nullopt;
  if (Checksum(h, bytes.data() + kUndoHeaderBytes, image_bytes) != h.crc) {
    return bad("checksum mismatch");
  }
  record.image_at = at + kUndoHeaderBytes;
  return record;
}

}  // namespace heapd
