#include "heap/metadata_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

EpochRecord Record(uint64_t epoch, uint32_t chunk) {
  EpochRecord record;
  record.epoch = epoch;
  record.capacity_chunks = 64;
  record.chunks = {ChunkRecord{chunk, ChunkKind::kLargeHead, 0, 1, {}}};
  record.names.bound = {
      NameEntry{"n" + std::to_string(epoch), uint64_t{chunk} << kChunkShift, 8, "t", 0, 0}};
  return record;
}

Checkpoint Initial() {
  Checkpoint cp;
  cp.config.max_size = 64 * kChunkSize;
  cp.capacity_chunks = 64;
  return cp;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

TEST(MetadataStoreTest, ReplaysAppendedEpochs) {
  TestDir dir;
  {
    auto store = MetadataStore::Create(dir.path(), Initial());
    ASSERT_TRUE(store.ok()) << store.status();
    for (uint64_t e = 1; e <= 5; ++e) ASSERT_TRUE((*store)->Append(Record(e, e)).ok());
  }
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(recovered.state.epoch, 5u);
  EXPECT_EQ(recovered.log_records, 5u);
  EXPECT_EQ(recovered.state.chunks.size(), 5u);
  EXPECT_EQ(recovered.state.names.size(), 5u);
  EXPECT_EQ(recovered.torn_bytes, 0u);
  // Appending continues after the recovered end.
  ASSERT_TRUE((*store)->Append(Record(6, 6)).ok());
  store->reset();
  ASSERT_TRUE(MetadataStore::Open(dir.path(), &recovered).ok());
  EXPECT_EQ(recovered.state.epoch, 6u);
}

TEST(MetadataStoreTest, TornFinalRecordIsCutOff) {
  TestDir dir;
  {
    auto store = MetadataStore::Create(dir.path(), Initial());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Append(Record(1, 1)).ok());
    ASSERT_TRUE((*store)->Append(Record(2, 2)).ok());
  }
  const std::string log = dir.Sub("log.1");
  const uint64_t full = FileSize(log);
  ASSERT_EQ(truncate(log.c_str(), static_cast<off_t>(full - 5)), 0);
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(recovered.state.epoch, 1u);
  EXPECT_GT(recovered.torn_bytes, 0u);
  EXPECT_LT(FileSize(log), full - 5);  // the torn bytes are gone from disk
  ASSERT_TRUE((*store)->Append(Record(2, 3)).ok());
  store->reset();
  ASSERT_TRUE(MetadataStore::Open(dir.path(), &recovered).ok());
  EXPECT_EQ(recovered.state.epoch, 2u);
  EXPECT_EQ(recovered.state.chunks.back().chunk, 3u);
}

// Writes epochs 1..3 to a new store in `dir`, sets byte `offset` of its
// log to `byte`, and returns the log's path.
std::string LogWithCorruptByte(const TestDir& dir, std::streamoff offset, char byte) {
  {
    auto store = MetadataStore::Create(dir.path(), Initial());
    EXPECT_TRUE(store.ok());
    for (uint64_t e = 1; e <= 3; ++e) EXPECT_TRUE((*store)->Append(Record(e, e)).ok());
  }
  const std::string log = dir.Sub("log.1");
  std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.put(byte);
  return log;
}

TEST(MetadataStoreTest, CorruptionBeforeTheEndIsDataLossNamingTheFile) {
  TestDir dir;
  const std::string log = LogWithCorruptByte(dir, 30, '\x5a');
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find(log), std::string::npos) << store.status();
}

TEST(MetadataStoreTest, CorruptLengthBeforeGoodRecordsIsDataLossNotATornTail) {
  TestDir dir;
  // Record 1's length field now claims more bytes than the file holds, so
  // it looks like a torn write; records 2 and 3 after it prove otherwise.
  const std::string log = LogWithCorruptByte(dir, 10, '\x7f');
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(store.status().message().find(log), std::string::npos) << store.status();
}

TEST(MetadataStoreTest, CorruptOrMissingCheckpointIsReported) {
  TestDir dir;
  ASSERT_TRUE(MetadataStore::Create(dir.path(), Initial()).ok());
  const std::string checkpoint = dir.Sub("checkpoint");
  ASSERT_EQ(truncate(checkpoint.c_str(), 20), 0);
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find(checkpoint), std::string::npos);
  unlink(checkpoint.c_str());
  store = MetadataStore::Open(dir.path(), &recovered);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(store.status().message().find(checkpoint), std::string::npos);
}

TEST(MetadataStoreTest, CheckpointStartsANewLogAndRemovesTheOld) {
  TestDir dir;
  auto store = MetadataStore::Create(dir.path(), Initial());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Append(Record(1, 1)).ok());
  Checkpoint cp = Initial();
  cp.epoch = 1;
  cp.chunks = Record(1, 1).chunks;
  ASSERT_TRUE((*store)->WriteCheckpoint(cp).ok());
  EXPECT_EQ(access(dir.Sub("log.1").c_str(), F_OK), -1);
  EXPECT_EQ(FileSize(dir.Sub("log.2")), 0u);
  ASSERT_TRUE((*store)->Append(Record(2, 2)).ok());
  store->reset();
  RecoveredMetadata recovered;
  ASSERT_TRUE(MetadataStore::Open(dir.path(), &recovered).ok());
  EXPECT_EQ(recovered.state.epoch, 2u);
  EXPECT_EQ(recovered.state.chunks.size(), 2u);
}

TEST(MetadataStoreTest, MissingLogAfterCheckpointIsEmptyAndStaleFilesGo) {
  TestDir dir;
  ASSERT_TRUE(MetadataStore::Create(dir.path(), Initial()).ok());
  ASSERT_EQ(unlink(dir.Sub("log.1").c_str()), 0);
  std::ofstream(dir.Sub("log.0")) << "stale";
  std::ofstream(dir.Sub("checkpoint.tmp")) << "half";
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(recovered.state.epoch, 0u);
  EXPECT_EQ(access(dir.Sub("log.0").c_str(), F_OK), -1);
  EXPECT_EQ(access(dir.Sub("checkpoint.tmp").c_str(), F_OK), -1);
  EXPECT_TRUE((*store)->Append(Record(1, 1)).ok());
}

TEST(MetadataStoreTest, OutOfOrderEpochIsDataLoss) {
  TestDir dir;
  {
    auto store = MetadataStore::Create(dir.path(), Initial());
    ASSERT_TRUE((*store)->Append(Record(1, 1)).ok());
    ASSERT_TRUE((*store)->Append(Record(3, 3)).ok());
  }
  RecoveredMetadata recovered;
  auto store = MetadataStore::Open(dir.path(), &recovered);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find("epoch 3 follows epoch 1"), std::string::npos);
}

}  // namespace
}  // namespace heapd
