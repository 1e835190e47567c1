// The bytes of a heap's metadata files (docs/on-disk-format.md describes the
// layout). Two payload kinds share one frame format:
//   - a checkpoint: the whole persisted state at one epoch;
//   - an epoch record: what changed in one sync, appended to the log.
// Frame: magic u32 | format version u16 | kind u16 | payload length u32 |
//        CRC-32 u32 of (version, kind, length, payload) | payload.
// Integers are little-endian; the daemon refuses other byte orders.
#ifndef HEAPD_HEAP_METADATA_FORMAT_H_
#define HEAPD_HEAP_METADATA_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/chunk_directory.h"
#include "heap/name_table.h"

namespace heapd {

inline constexpr uint32_t kFrameMagic = 0x50414548;  // "HEAP"
// Version 1: a heap whose clients map its data file (ImageMode::kDirect).
// Version 2: checkpoints of a heap with a working image, which carry its
// image mode; a heapd that reads only version 1 refuses such a heap rather
// than open its data file without the redo log's pages. Epoch records stay
// version 1: a checkpoint is always read first.
// Version 3: checkpoints of a fixed-address heap, which carry its image
// mode and its address; a heapd that reads only versions 1 and 2 refuses
// such a heap rather than serve it to clients that map it anywhere.
inline constexpr uint16_t kFormatVersion = 1;
inline constexpr uint16_t kWorkingImageFormatVersion = 2;
inline constexpr uint16_t kFixedAddressFormatVersion = 3;
inline constexpr size_t kFrameHeaderSize = 16;

enum class FrameKind : uint16_t { kCheckpoint = 1, kEpoch = 2 };

// What clients map (docs/consistency.md "Durable images").
enum class ImageMode : uint32_t {
  // The data file itself: object contents roll back only where it is on
  // tmpfs.
  kDirect = 0,
  // A working image in memory that clients map; the data file is the
  // durable image, which only syncs write, through the redo log
  // (heap/redo_log.h).
  kWorkingImage = 1,
};
const char* ImageModeName(ImageMode mode);

// Settings fixed at creation.
struct HeapConfig {
  uint64_t max_size = 0;
  uint32_t owner_uid = 0;
  uint32_t owner_gid = 0;
  uint32_t mode = 0600;
  int64_t created_unix_ns = 0;
  ImageMode image = ImageMode::kDirect;
  // Where every process maps the heap (heap/fixed_address.h); 0: each
  // process maps it where it likes.
  uint64_t fixed_base = 0;

  bool operator==(const HeapConfig& o) const {
    return max_size == o.max_size && owner_uid == o.owner_uid && owner_gid == o.owner_gid &&
           mode == o.mode && created_unix_ns == o.created_unix_ns && image == o.image &&
           fixed_base == o.fixed_base;
  }
};

// The whole persisted state at `epoch`.
struct Checkpoint {
  HeapConfig config;
  uint64_t epoch = 0;
  uint64_t log_generation = 0;  // the log that continues this checkpoint
  uint32_t capacity_chunks = 0;
  std::vector<ChunkRecord> chunks;
  std::vector<NameEntry> names;
};

// What one sync changed.
struct EpochRecord {
  uint64_t epoch = 0;
  uint32_t capacity_chunks = 0;
  std::vector<ChunkRecord> chunks;
  NameChanges names;
};

std::string EncodeCheckpoint(const Checkpoint& checkpoint);
std::string EncodeEpochRecord(const EpochRecord& record);

// Decodes one frame from the start of `bytes`. `file` names the file in
// errors. DATA_LOSS on a bad magic, version, checksum or length.
struct DecodedFrame {
  FrameKind kind;
  uint16_t version;
  absl::string_view payload;
  size_t frame_size;  // header + payload
};
absl::StatusOr<DecodedFrame> DecodeFrame(absl::string_view bytes, absl::string_view file);

// `version`: the frame's (DecodedFrame::version).
absl::StatusOr<Checkpoint> DecodeCheckpoint(absl::string_view payload, absl::string_view file,
                                            uint16_t version = kFormatVersion);
absl::StatusOr<EpochRecord> DecodeEpochRecord(absl::string_view payload, absl::string_view file);

}  // namespace heapd

#endif  // HEAPD_HEAP_METADATA_FORMAT_H_
