// Fuzzes what heapd reads of a snapshot (snapshot/snapshot_format.h):
// ParseManifest and VerifySnapshotFiles get a manifest, a checkpoint, a log
// and a data file size that a hostile user may have written.
//
// Input layout (see Decode): u8 flags | u64 claimed data bytes |
// u32 length + manifest.json | u32 length + checkpoint | u32 length + log |
// the log's file name (the rest; empty: no log file). Flags:
//   bit 0  leave the checkpoint file out;
//   bit 1  add a stray metadata file (a copy of the log as log.999999);
//   bit 2  rewrite the manifest's CRCs to those of the files, so that
//          mutated metadata gets past the checksums to the decoders and to
//          PersistentHeap::ValidateState;
//   bit 3  claim the data size the manifest records (within the cap);
//   bit 4  the checkpoint is a bare checkpoint payload and the log a list
//          of u32 length + epoch record payload: each is framed with its
//          CRC here (by decoding and re-encoding it, which
//          metadata_format_fuzz shows gives the same bytes), and the
//          manifest's epoch becomes the last record's. Mutations then reach
//          ReplayLog's and ValidateState's checks instead of a frame CRC.
// The claimed data size is capped at kMaxClaimedDataBytes: nothing is
// allocated per byte, but ValidateState builds a ChunkDirectory of one
// entry (~64 B) per chunk of the data file.
//
// Beyond not crashing, checked on every input:
//   - every failure is DATA_LOSS and names the snapshot;
//   - ParseManifest accepts only what its contract says: valid snapshot and
//     heap names, labels within bounds, a data size up to kMaxHeapBytes, one
//     or two metadata files with valid names; and what it accepts prints
//     (ManifestToJson) and parses back to the same manifest;
//   - when VerifySnapshotFiles succeeds: its manifest is ParseManifest's;
//     the files are exactly those it lists, with their CRCs, the checkpoint
//     and at most the log that continues it; the state is at the manifest's
//     epoch, with nothing torn, the same state RecoverMetadata gives; the
//     data size is the manifest's; ValidateState accepts the state; and the
//     snapshot verifies again from its re-printed manifest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "allocator/chunk_directory.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "heap/heap.h"
#include "heap/heap_dir.h"
#include "heap/heap_name.h"
#include "heap/metadata_format.h"
#include "heap/metadata_store.h"
#include "heap/name_table.h"
#include "proto/heapd.pb.h"
#include "snapshot/snapshot_format.h"
#include "tools/fuzz/fuzz_seeds.h"

namespace heapd {
namespace {

constexpr absl::string_view kWhere = "fuzz-snapshot";
constexpr uint64_t kMaxClaimedDataBytes = uint64_t{1} << 36;  // 2^15 chunks
constexpr char kStrayFile[] = "log.999999";

enum Flags : uint8_t {
  kNoCheckpoint = 1 << 0,
  kStrayLog = 1 << 1,
  kFixCrcs = 1 << 2,
  kClaimManifestSize = 1 << 3,
  kBarePayloads = 1 << 4,
};

void Check(bool ok, const char* property) {
  if (ok) return;
  std::fprintf(stderr, "snapshot_format_fuzz: property violated: %s\n", property);
  std::abort();
}

void CheckFailure(const absl::Status& status) {
  Check(status.code() == absl::StatusCode::kDataLoss, "a snapshot check failed without DATA_LOSS");
  Check(absl::string_view(status.message()).find(kWhere) != absl::string_view::npos,
        "a snapshot check's error does not name the snapshot");
}

bool SameManifest(const v1::SnapshotManifest& a, const v1::SnapshotManifest& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

struct Input {
  uint8_t flags = 0;
  uint64_t data_bytes = 0;
  std::string manifest;
  std::string checkpoint;
  std::string log;
  std::string log_name;
  std::optional<uint64_t> epoch;  // the manifest's epoch, with kBarePayloads
};

// Little-endian fields; lengths are cut to what is left.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t Get(int size) {
    uint64_t value = 0;
    for (int i = 0; i < size && !bytes_.empty(); ++i) {
      value |= uint64_t{static_cast<uint8_t>(bytes_[0])} << (8 * i);
      bytes_.remove_prefix(1);
    }
    return value;
  }
  std::string Segment() {
    const uint64_t claimed = Get(4);  // before size(): it consumes the length
    const uint64_t length = std::min<uint64_t>(claimed, bytes_.size());
    std::string out(bytes_.substr(0, length));
    bytes_.remove_prefix(length);
    return out;
  }
  std::string Rest() { return std::string(bytes_); }

 private:
  absl::string_view bytes_;
};

Input Decode(absl::string_view bytes) {
  Reader r(bytes);
  Input in;
  in.flags = static_cast<uint8_t>(r.Get(1));
  in.data_bytes = r.Get(8) % (kMaxClaimedDataBytes + 1);
  in.manifest = r.Segment();
  in.checkpoint = r.Segment();
  in.log = r.Segment();
  in.log_name = r.Rest();
  return in;
}

std::string Encode(const Input& in) {
  std::string out(1, static_cast<char>(in.flags));
  auto put = [&out](uint64_t value, int size) {
    for (int i = 0; i < size; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
  };
  put(in.data_bytes, 8);
  for (const std::string* segment : {&in.manifest, &in.checkpoint, &in.log}) {
    put(segment->size(), 4);
    out += *segment;
  }
  return out + in.log_name;
}

// With kBarePayloads: frames the payloads, as the daemon would have
// written them, and notes the epoch they end at. A payload that does not
// decode is kept as it is (and fails verification).
void FramePayloads(Input& in) {
  if (!(in.flags & kBarePayloads)) return;
  if (absl::StatusOr<Checkpoint> cp = DecodeCheckpoint(in.checkpoint, kWhere); cp.ok()) {
    in.checkpoint = EncodeCheckpoint(*cp);
    in.epoch = cp->epoch;
  }
  Reader r(in.log);
  std::string log;
  for (std::string payload = r.Segment(); !payload.empty(); payload = r.Segment()) {
    absl::StatusOr<EpochRecord> record = DecodeEpochRecord(payload, kWhere);
    if (!record.ok()) {
      log += payload;
      continue;
    }
    log += EncodeEpochRecord(*record);
    in.epoch = record->epoch;
  }
  in.log = std::move(log);
}

std::map<std::string, std::string> FilesOf(const Input& in) {
  std::map<std::string, std::string> files;
  if (!(in.flags & kNoCheckpoint)) files["checkpoint"] = in.checkpoint;
  if (!in.log_name.empty()) files[in.log_name] = in.log;
  if (in.flags & kStrayLog) files[kStrayFile] = in.log;
  return files;
}

// Applies the fix-up flags to the manifest: its CRCs become the files', its
// data size (if asked) the claim's. Only a manifest that parses as JSON can
// be fixed; others are left as they are.
void FixUp(const std::map<std::string, std::string>& files, Input& in) {
  if (!(in.flags & (kFixCrcs | kClaimManifestSize)) && !in.epoch) return;
  v1::SnapshotManifest manifest;
  if (!google::protobuf::util::JsonStringToMessage(in.manifest, &manifest).ok()) return;
  if (in.flags & kFixCrcs) {
    manifest.clear_metadata_crc32();
    for (const auto& [name, bytes] : files) {
      // Other names fail anyway, and might not be UTF-8, which JSON needs.
      if (IsMetadataFileName(name))
        (*manifest.mutable_metadata_crc32())[name] = MetadataCrc32(bytes);
    }
  }
  if (in.flags & kClaimManifestSize) {
    in.data_bytes = std::min(manifest.data_bytes(), kMaxClaimedDataBytes);
  }
  if (in.epoch) manifest.set_epoch(*in.epoch);
  in.manifest = ManifestToJson(manifest);
}

// ParseManifest's contract, checked from the outside.
void CheckAcceptedManifest(const v1::SnapshotManifest& manifest) {
  Check(ValidateHeapName(manifest.name(), "snapshot").ok(), "a manifest's snapshot name is bad");
  Check(ValidateHeapName(manifest.heap()).ok(), "a manifest's heap name is bad");
  Check(manifest.labels().size() <= kMaxLabels, "a manifest has too many labels");
  for (const auto& [key, value] : manifest.labels()) {
    Check(!key.empty() && key.size() <= kMaxLabelBytes && value.size() <= kMaxLabelBytes,
          "a manifest's label is empty or too long");
  }
  Check(manifest.data_bytes() <= kMaxHeapBytes, "a manifest's data size is above the maximum");
  Check(!manifest.metadata_crc32().empty() && manifest.metadata_crc32().size() <= 2,
        "a manifest lists no or too many metadata files");
  for (const auto& [name, crc] : manifest.metadata_crc32()) {
    Check(IsMetadataFileName(name), "a manifest lists a file that is not metadata");
  }
  absl::StatusOr<v1::SnapshotManifest> again = ParseManifest(ManifestToJson(manifest), kWhere);
  Check(again.ok() && SameManifest(*again, manifest),
        "an accepted manifest does not parse back from its JSON");
}

void CheckVerified(const Input& in, const std::map<std::string, std::string>& files,
                   const VerifiedSnapshot& verified) {
  const v1::SnapshotManifest& manifest = verified.manifest;
  const Checkpoint& state = verified.metadata.state;
  absl::StatusOr<v1::SnapshotManifest> parsed = ParseManifest(in.manifest, kWhere);
  Check(parsed.ok() && SameManifest(*parsed, manifest),
        "the verified manifest is not the parsed one");

  Check(files.size() == static_cast<size_t>(manifest.metadata_crc32().size()),
        "verified with files the manifest does not list");
  for (const auto& [name, crc] : manifest.metadata_crc32()) {
    auto file = files.find(name);
    Check(file != files.end() && MetadataCrc32(file->second) == crc,
          "verified with a file missing or not matching its CRC");
  }
  const std::string log_name = absl::StrCat("log.", state.log_generation);
  for (const auto& [name, bytes] : files) {
    Check(name == "checkpoint" || name == log_name,
          "verified with a file that is neither the checkpoint nor its log");
  }
  Check(files.count("checkpoint") == 1, "verified without a checkpoint");

  Check(state.epoch == manifest.epoch(), "the verified state is not at the manifest's epoch");
  Check(in.data_bytes == manifest.data_bytes(), "verified with another data size");
  Check(verified.metadata.torn_bytes == 0, "a verified snapshot has a torn log");

  auto log = files.find(log_name);
  absl::StatusOr<RecoveredMetadata> recovered =
      RecoverMetadata(files.at("checkpoint"), log == files.end() ? "" : log->second, "checkpoint",
                      log_name, TornTail::kCutOff);
  Check(recovered.ok() && recovered->torn_bytes == 0 &&
            recovered->log_records == verified.metadata.log_records &&
            EncodeCheckpoint(recovered->state) == EncodeCheckpoint(state),
        "the verified state is not what recovery gives");

  Check(ValidateHeapConfig(state.config).ok(), "a verified heap has a bad config");
  Check(uint64_t{state.capacity_chunks} * kChunkSize <= in.data_bytes &&
            uint64_t{state.capacity_chunks} * kChunkSize <= state.config.max_size,
        "a verified heap's capacity exceeds its data file or maximum size");
  std::set<std::string> names;
  for (const NameEntry& entry : state.names) {
    Check(ValidateName(entry.name).ok() && names.insert(entry.name).second,
          "a verified heap has a bad or repeated name");
  }
  Check(PersistentHeap::ValidateState(std::string(kWhere), state, in.data_bytes).ok(),
        "ValidateState rejects a verified state");

  absl::StatusOr<VerifiedSnapshot> again =
      VerifySnapshotFiles(kWhere, ManifestToJson(manifest), files, in.data_bytes);
  Check(again.ok() && SameManifest(again->manifest, manifest) &&
            EncodeCheckpoint(again->metadata.state) == EncodeCheckpoint(state),
        "a verified snapshot does not verify again from its re-printed manifest");
}

// The input as the snapshot it stands for: its files, its manifest fixed up.
std::map<std::string, std::string> Prepare(Input& in) {
  FramePayloads(in);
  std::map<std::string, std::string> files = FilesOf(in);
  FixUp(files, in);
  return files;
}

void FuzzOne(Input in) {
  const std::map<std::string, std::string> files = Prepare(in);

  absl::StatusOr<v1::SnapshotManifest> manifest = ParseManifest(in.manifest, kWhere);
  if (manifest.ok()) {
    CheckAcceptedManifest(*manifest);
  } else {
    CheckFailure(manifest.status());
  }

  absl::StatusOr<VerifiedSnapshot> verified =
      VerifySnapshotFiles(kWhere, in.manifest, files, in.data_bytes);
  if (!verified.ok()) {
    CheckFailure(verified.status());
    return;
  }
  Check(manifest.ok(), "verified a snapshot whose manifest does not parse");
  CheckVerified(in, files, *verified);
}

// Seeds: a heap's state built by hand the way the daemon persists it: a
// checkpoint at epoch 41 naming log generation 3, and two epoch records.
constexpr uint32_t kSeedClass = 40;  // 20 KiB slots: a two-word bitmap
constexpr uint32_t kSeedCapacity = 8;

ChunkRecord SmallChunk(uint32_t chunk, uint64_t live_slots) {
  std::vector<uint64_t> words(SlotBitmap::WordCount(SlotsPerChunk(kSeedClass)), 0);
  words[0] = live_slots;
  return ChunkRecord{chunk, ChunkKind::kSmall, kSeedClass, 0, std::move(words)};
}

Checkpoint SeedCheckpoint() {
  Checkpoint cp;
  cp.config = HeapConfig{2 * kSeedCapacity * kChunkSize, 1000, 100, 0640, 1700000000000000000};
  cp.epoch = 41;
  cp.log_generation = 3;
  cp.capacity_chunks = kSeedCapacity;
  cp.chunks = {SmallChunk(0, 0x3), ChunkRecord{2, ChunkKind::kLargeHead, 0, 3, {}}};
  cp.names = {NameEntry{"graph", 2 * kChunkSize, 5 << 20, "app::Graph", 1000, 7},
              NameEntry{"index", 0, ClassSize(kSeedClass), "std::uint64_t", 1000, 8}};
  return cp;
}

std::string SeedLog() {
  EpochRecord grow;
  grow.epoch = 42;
  grow.capacity_chunks = kSeedCapacity;
  grow.chunks = {SmallChunk(1, 0x1)};
  grow.names.bound = {NameEntry{"leaf", kChunkSize, 100, "app::Leaf", 1001, 9}};
  EpochRecord shrink;
  shrink.epoch = 43;
  shrink.capacity_chunks = kSeedCapacity;
  shrink.chunks = {ChunkRecord{0, ChunkKind::kFree, 0, 0, {}}};
  shrink.names.unbound = {"index"};
  return EncodeEpochRecord(grow) + EncodeEpochRecord(shrink);
}

v1::SnapshotManifest SeedManifest(uint64_t epoch, const std::map<std::string, std::string>& files) {
  v1::SnapshotManifest m;
  m.set_name("nightly.1");
  m.set_heap("graph-heap");
  m.set_epoch(epoch);
  m.set_created_unix_ns(1700000000000000000);
  m.set_data_bytes(kSeedCapacity * kChunkSize);
  (*m.mutable_labels())["slurm_job_id"] = "4242";
  for (const auto& [name, bytes] : files)
    (*m.mutable_metadata_crc32())[name] = MetadataCrc32(bytes);
  v1::HeapInfo* source = m.mutable_source();
  source->set_name("graph-heap");
  source->set_max_size(2 * kSeedCapacity * kChunkSize);
  source->set_owner_uid(1000);
  source->set_owner_gid(100);
  source->set_mode(0640);
  m.set_created_by_uid(1000);
  return m;
}

Input SeedInput(bool with_log) {
  Input in;
  in.data_bytes = kSeedCapacity * kChunkSize;
  in.checkpoint = EncodeCheckpoint(SeedCheckpoint());
  std::map<std::string, std::string> files{{"checkpoint", in.checkpoint}};
  if (with_log) {
    in.log = SeedLog();
    in.log_name = "log.3";
    files[in.log_name] = in.log;
  }
  in.manifest = ManifestToJson(SeedManifest(with_log ? 43 : 41, files));
  return in;
}

}  // namespace

namespace fuzz {

Seeds MakeSeeds() {
  const Input good = SeedInput(/*with_log=*/true);
  Input torn = good;
  torn.log.resize(torn.log.size() - 5);
  torn.flags = kFixCrcs;  // past the checksum, to the torn record
  Input stray = good;
  stray.flags = kStrayLog | kFixCrcs;
  Input resized = good;
  resized.data_bytes = kSeedCapacity * kChunkSize - 1;
  resized.flags = kClaimManifestSize;
  // The same snapshot as bare payloads.
  Input payloads = good;
  payloads.flags = kBarePayloads | kFixCrcs;
  payloads.checkpoint = payloads.checkpoint.substr(kFrameHeaderSize);
  payloads.log.clear();
  for (absl::string_view log = good.log; !log.empty();) {
    absl::StatusOr<DecodedFrame> frame = DecodeFrame(log, kWhere);
    Check(frame.ok(), "the seed log does not decode");
    const uint32_t length = static_cast<uint32_t>(frame->payload.size());
    payloads.log.append(reinterpret_cast<const char*>(&length), 4);
    payloads.log.append(frame->payload.data(), frame->payload.size());
    log.remove_prefix(frame->frame_size);
  }
  // The seeds are worth something only if the good ones verify.
  for (Input in : {good, SeedInput(false), resized, payloads}) {
    const std::map<std::string, std::string> files = Prepare(in);
    Check(VerifySnapshotFiles(kWhere, in.manifest, files, in.data_bytes).ok(),
          "a seed snapshot does not verify");
  }
  Input no_checkpoint = good;
  no_checkpoint.flags = kNoCheckpoint | kFixCrcs;
  return {{"snapshot", Encode(good)},
          {"snapshot_checkpoint_only", Encode(SeedInput(false))},
          {"snapshot_torn_log", Encode(torn)},
          {"snapshot_stray_file", Encode(stray)},
          {"snapshot_claims_manifest_size", Encode(resized)},
          {"snapshot_no_checkpoint", Encode(no_checkpoint)},
          {"snapshot_payloads", Encode(payloads)},
          {"empty", ""}};
}

}  // namespace fuzz
}  // namespace heapd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  heapd::FuzzOne(heapd::Decode(absl::string_view(reinterpret_cast<const char*>(data), size)));
  return 0;
}
