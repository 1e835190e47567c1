#include "heap/heap_session.h"

#include <cstring>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

HeapConfig Config(uint64_t chunks) {
  HeapConfig config;
  config.max_size = chunks * kChunkSize;
  return config;
}

TEST(HeapSessionTest, TwoSessionsShareObjectsThroughTheHeap) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(64));
  ASSERT_TRUE(heap.ok());
  auto writer = HeapSession::Start(heap->get(), 1);
  auto reader = HeapSession::Start(heap->get(), 2);
  ASSERT_TRUE(writer.ok() && reader.ok());
  const uint64_t small = *(*writer)->Allocate(24);
  const uint64_t large = *(*writer)->Allocate(3 * kChunkSize);
  std::strcpy((*writer)->At<char>(small), "small");
  std::strcpy((*writer)->At<char>(large + 2 * kChunkSize), "large");
  ASSERT_TRUE((*writer)->Sync().ok());
  ASSERT_TRUE((*heap)->Bind(1, NameEntry{"s", small, 24, "char", 0, 0}).ok());
  // The reader mapped the heap before it grew: it maps the growth on use.
  ASSERT_TRUE((*reader)->Allocate(8).ok());
  EXPECT_STREQ((*reader)->At<char>((*heap)->Lookup("s")->offset), "small");
  EXPECT_STREQ((*reader)->At<char>(large + 2 * kChunkSize), "large");
  ASSERT_TRUE((*heap)->Unbind("s").ok());
  // The reader frees the writer's objects: through the daemon.
  EXPECT_TRUE((*reader)->Deallocate(small).ok());
  EXPECT_TRUE((*reader)->Deallocate(large).ok());
  EXPECT_EQ((*reader)->Deallocate(large).code(), absl::StatusCode::kInvalidArgument);
  // The writer learns of the free at its next sync.
  ASSERT_TRUE((*writer)->Sync().ok());
  EXPECT_EQ((*writer)->Deallocate(small).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*writer)->Detach().ok());
  ASSERT_TRUE((*reader)->Detach().ok());
  HeapStats stats = (*heap)->Stats();
  EXPECT_EQ(stats.directory.live_objects, 1u);  // the reader's 8 bytes
  EXPECT_EQ(stats.directory.leased_chunks, 0u);
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
}

TEST(HeapSessionTest, BadFreesAreRejected) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(8));
  auto session = HeapSession::Start(heap->get(), 1);
  const uint64_t a = *(*session)->Allocate(64);
  EXPECT_EQ((*session)->Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status interior = (*session)->Deallocate(a + 8);
  EXPECT_EQ(interior.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(interior.message().find("inside an object"), std::string::npos);
  ASSERT_TRUE((*session)->Deallocate(a).ok());
  absl::Status twice = (*session)->Deallocate(a);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("double free"), std::string::npos);
  EXPECT_EQ((*session)->Deallocate(100 * kChunkSize).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HeapSession::Start(heap->get(), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace heapd
