#include "heap/metadata_format.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

Checkpoint SampleCheckpoint() {
  Checkpoint cp;
  cp.config = HeapConfig{64 * kChunkSize, 1000, 100, 0640, 123456789};
  cp.epoch = 7;
  cp.log_generation = 3;
  cp.capacity_chunks = 12;
  ChunkRecord small{
      2, ChunkKind::kSmall, SizeClassFor(64), 0,
      std::vector<uint64_t>(SlotBitmap::WordCount(SlotsPerChunk(SizeClassFor(64))), 5)};
  cp.chunks = {small, ChunkRecord{4, ChunkKind::kLargeHead, 0, 3, {}},
               ChunkRecord{9, ChunkKind::kFree, 0, 0, {}}};
  cp.names = {NameEntry{"graph", 2 * kChunkSize, 48, "app::Graph", 1000, 99}};
  return cp;
}

TEST(MetadataFormatTest, CheckpointRoundTrips) {
  const Checkpoint cp = SampleCheckpoint();
  const std::string bytes = EncodeCheckpoint(cp);
  absl::StatusOr<DecodedFrame> frame = DecodeFrame(bytes, "checkpoint");
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->kind, FrameKind::kCheckpoint);
  EXPECT_EQ(frame->frame_size, bytes.size());
  absl::StatusOr<Checkpoint> decoded = DecodeCheckpoint(frame->payload, "checkpoint");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->config, cp.config);
  EXPECT_EQ(decoded->epoch, 7u);
  EXPECT_EQ(decoded->log_generation, 3u);
  EXPECT_EQ(decoded->capacity_chunks, 12u);
  ASSERT_EQ(decoded->chunks.size(), 3u);
  EXPECT_EQ(decoded->chunks[0].words, cp.chunks[0].words);
  EXPECT_EQ(decoded->chunks[0].size_class, cp.chunks[0].size_class);
  EXPECT_EQ(decoded->chunks[1].run_chunks, 3u);
  EXPECT_EQ(decoded->chunks[2].kind, ChunkKind::kFree);
  EXPECT_EQ(decoded->names, cp.names);
}

TEST(MetadataFormatTest, FixedAddressCheckpointsAreVersion3AndKeepTheirAddress) {
  for (ImageMode image : {ImageMode::kDirect, ImageMode::kWorkingImage}) {
    Checkpoint cp = SampleCheckpoint();
    cp.config.image = image;
    cp.config.fixed_base = uint64_t{0x110000200000};
    const std::string bytes = EncodeCheckpoint(cp);
    absl::StatusOr<DecodedFrame> frame = DecodeFrame(bytes, "checkpoint");
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ(frame->version, kFixedAddressFormatVersion);
    absl::StatusOr<Checkpoint> decoded =
        DecodeCheckpoint(frame->payload, "checkpoint", frame->version);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->config, cp.config);
    // Read as version 2 (what an older heapd would see if it ignored the
    // version), the address is left over: DATA_LOSS, not a heap without it.
    EXPECT_EQ(
        DecodeCheckpoint(frame->payload, "checkpoint", kWorkingImageFormatVersion).status().code(),
        absl::StatusCode::kDataLoss);
  }
  // A heap that is not fixed keeps the format an older heapd reads.
  EXPECT_EQ(DecodeFrame(EncodeCheckpoint(SampleCheckpoint()), "checkpoint")->version,
            kFormatVersion);
}

TEST(MetadataFormatTest, EpochRecordRoundTrips) {
  EpochRecord record;
  record.epoch = 8;
  record.capacity_chunks = 16;
  record.chunks = {ChunkRecord{5, ChunkKind::kLargeHead, 0, 2, {}}};
  record.names.bound = {NameEntry{"x", 5 * kChunkSize, 8, "int", 0, 1}};
  record.names.unbound = {"old", "older"};
  const std::string bytes = EncodeEpochRecord(record);
  absl::StatusOr<DecodedFrame> frame = DecodeFrame(bytes, "log.1");
  ASSERT_TRUE(frame.ok());
  absl::StatusOr<EpochRecord> decoded = DecodeEpochRecord(frame->payload, "log.1");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->epoch, 8u);
  EXPECT_EQ(decoded->names.bound, record.names.bound);
  EXPECT_EQ(decoded->names.unbound, record.names.unbound);
}

TEST(MetadataFormatTest, EveryFlippedByteIsDetected) {
  const std::string bytes = EncodeCheckpoint(SampleCheckpoint());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string corrupt = bytes;
    corrupt[i] ^= 0x40;
    absl::StatusOr<DecodedFrame> frame = DecodeFrame(corrupt, "checkpoint");
    ASSERT_FALSE(frame.ok()) << "flip at byte " << i << " not detected";
    EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(frame.status().message().find("checkpoint"), std::string::npos);
  }
}

TEST(MetadataFormatTest, TruncationAndVersionAreReported) {
  const std::string bytes = EncodeCheckpoint(SampleCheckpoint());
  for (size_t keep : {size_t{0}, size_t{10}, bytes.size() - 1}) {
    absl::StatusOr<DecodedFrame> frame = DecodeFrame(bytes.substr(0, keep), "checkpoint");
    EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss) << keep;
    EXPECT_NE(frame.status().message().find("truncated"), std::string::npos) << keep;
  }
  std::string future = bytes;
  future[4] = 9;  // format version 9
  EXPECT_NE(DecodeFrame(future, "checkpoint").status().message().find("format version 9"),
            std::string::npos);
}

TEST(MetadataFormatTest, MalformedPayloadIsDataLossNotACrash) {
  // A valid frame around a payload that lies about its contents.
  const std::string payload = EncodeCheckpoint(SampleCheckpoint()).substr(kFrameHeaderSize);
  for (size_t cut = 0; cut < payload.size(); cut += 7) {
    absl::StatusOr<Checkpoint> decoded = DecodeCheckpoint(payload.substr(0, cut), "checkpoint");
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << cut;
  }
  std::string huge_count = payload;
  // The chunk count sits after config (28 bytes), epoch, generation, capacity.
  huge_count[48] = '\xff';
  huge_count[49] = '\xff';
  huge_count[50] = '\xff';
  EXPECT_EQ(DecodeCheckpoint(huge_count, "checkpoint").status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace heapd
