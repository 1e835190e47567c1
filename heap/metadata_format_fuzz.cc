// Fuzzes the decoders of a heap's metadata files (heap/metadata_format.h):
// they will read the files of untrusted snapshots.
//
// Each input is read three ways: as a metadata file (frames one after
// another, as a checkpoint file or a log is read), and as a bare checkpoint
// payload and a bare epoch-record payload, so that mutations reach the
// payload decoders without having to forge a CRC.
//
// Beyond not crashing, checked on every input:
//   - a failure is DATA_LOSS and names the file (the documented contract);
//   - what decodes re-encodes to exactly the bytes it came from, frame header
//     and CRC included (the format has one encoding per value), and that
//     frame decodes back to the same payload.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "allocator/chunk_directory.h"
#include "heap/metadata_format.h"
#include "heap/name_table.h"
#include "tools/fuzz/fuzz_seeds.h"

namespace heapd {
namespace {

constexpr absl::string_view kFile = "fuzz-input";

// abort() rather than a return code: libFuzzer saves the input as a crash.
void Check(bool ok, const char* property) {
  if (ok) return;
  std::fprintf(stderr, "metadata_format_fuzz: property violated: %s\n", property);
  std::abort();
}

void CheckFailure(const absl::Status& status) {
  Check(status.code() == absl::StatusCode::kDataLoss, "a decoder failed without DATA_LOSS");
  Check(absl::string_view(status.message()).find(kFile) != absl::string_view::npos,
        "a decoder's error does not name the file");
}

// Decodes `payload` as `kind` and returns it encoded again as a whole
// frame, or nullopt when it does not decode.
std::optional<std::string> DecodeAndEncode(FrameKind kind, absl::string_view payload) {
  if (kind == FrameKind::kCheckpoint) {
    absl::StatusOr<Checkpoint> checkpoint = DecodeCheckpoint(payload, kFile);
    if (!checkpoint.ok()) {
      CheckFailure(checkpoint.status());
      return std::nullopt;
    }
    return EncodeCheckpoint(*checkpoint);
  }
  absl::StatusOr<EpochRecord> record = DecodeEpochRecord(payload, kFile);
  if (!record.ok()) {
    CheckFailure(record.status());
    return std::nullopt;
  }
  return EncodeEpochRecord(*record);
}

void FuzzPayload(FrameKind kind, absl::string_view payload) {
  const std::optional<std::string> frame = DecodeAndEncode(kind, payload);
  if (!frame) return;
  Check(frame->size() == kFrameHeaderSize + payload.size() &&
            absl::string_view(*frame).substr(kFrameHeaderSize) == payload,
        "a decoded payload re-encodes to other bytes");
  absl::StatusOr<DecodedFrame> decoded = DecodeFrame(*frame, kFile);
  Check(decoded.ok() && decoded->kind == kind && decoded->frame_size == frame->size() &&
            decoded->payload == payload,
        "an encoded frame does not decode to its payload");
}

// The input as a metadata file, walked frame by frame as MetadataStore
// replays a log.
void FuzzFrames(absl::string_view bytes) {
  while (!bytes.empty()) {
    absl::StatusOr<DecodedFrame> frame = DecodeFrame(bytes, kFile);
    if (!frame.ok()) {
      CheckFailure(frame.status());
      return;
    }
    Check(frame->frame_size >= kFrameHeaderSize && frame->frame_size <= bytes.size(),
          "a frame's size exceeds the input");
    Check(frame->payload.data() == bytes.data() + kFrameHeaderSize &&
              frame->payload.size() == frame->frame_size - kFrameHeaderSize,
          "a frame's payload is not the rest of the frame");
    if (const std::optional<std::string> again = DecodeAndEncode(frame->kind, frame->payload)) {
      Check(*again == bytes.substr(0, frame->frame_size),
            "a decoded frame re-encodes to other bytes");
    }
    bytes.remove_prefix(frame->frame_size);
  }
}

ChunkRecord Small(uint32_t chunk, uint32_t size_class, uint64_t fill) {
  std::vector<uint64_t> words(SlotBitmap::WordCount(SlotsPerChunk(size_class)), fill);
  return ChunkRecord{chunk, ChunkKind::kSmall, size_class, 0, std::move(words)};
}

Checkpoint SampleCheckpoint() {
  Checkpoint cp;
  cp.config = HeapConfig{64 * kChunkSize, 1000, 100, 0640, 1700000000000000000};
  cp.epoch = 41;
  cp.log_generation = 3;
  cp.capacity_chunks = 12;
  cp.chunks = {Small(0, 40, 0x5), Small(1, kNumSizeClasses - 1, ~uint64_t{0}),
               ChunkRecord{4, ChunkKind::kLargeHead, 0, 3, {}},
               ChunkRecord{9, ChunkKind::kFree, 0, 0, {}}};
  cp.names = {NameEntry{"graph", 4 * kChunkSize, 5 << 20, "app::Graph", 1000, 7},
              NameEntry{"index", 0, ClassSize(40), "std::uint64_t", 0, 8}};
  return cp;
}

EpochRecord SampleEpoch(uint64_t epoch) {
  EpochRecord record;
  record.epoch = epoch;
  record.capacity_chunks = 16;
  record.chunks = {Small(2, 20, 0x8000000000000001), ChunkRecord{4, ChunkKind::kFree, 0, 0, {}},
                   ChunkRecord{5, ChunkKind::kLargeHead, 0, 11, {}}};
  record.names.bound = {
      NameEntry{std::string(kMaxNameLength, 'n'), 5 * kChunkSize, 1, "int", 4242, -1}};
  record.names.unbound = {"graph", "old"};
  return record;
}

}  // namespace

namespace fuzz {

Seeds MakeSeeds() {
  const std::string checkpoint = EncodeCheckpoint(SampleCheckpoint());
  const std::string epoch = EncodeEpochRecord(SampleEpoch(42));
  return {
      {"checkpoint_empty", EncodeCheckpoint(Checkpoint{})},
      {"checkpoint", checkpoint},
      {"checkpoint_payload", checkpoint.substr(kFrameHeaderSize)},
      {"epoch_empty", EncodeEpochRecord(EpochRecord{})},
      {"epoch_payload", epoch.substr(kFrameHeaderSize)},
      {"log_two_records", epoch + EncodeEpochRecord(SampleEpoch(43))},
      {"log_torn", epoch + EncodeEpochRecord(SampleEpoch(43)).substr(0, 30)},
  };
}

}  // namespace fuzz
}  // namespace heapd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  heapd::FuzzFrames(bytes);
  heapd::FuzzPayload(heapd::FrameKind::kCheckpoint, bytes);
  heapd::FuzzPayload(heapd::FrameKind::kEpoch, bytes);
  return 0;
}
