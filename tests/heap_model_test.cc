// A million random operations from two sessions of the real client on one
// heap (in process: testing/in_process.h), every result checked against a
// reference model, every invariant checked at intervals.
#include <unistd.h>

#include "gtest/gtest.h"
#include "heap/heap.h"
#include "heap/test_dir.h"
#include "tests/random_workload.h"

namespace heapd {
namespace {

std::string ScratchParent() { return access("/dev/shm", W_OK) == 0 ? "/dev/shm" : ""; }

// The model is of allocations, frees and names, call by call; content
// rollback defers frees of other sessions' objects to the freer's sync,
// which this model does not follow, so it is off here (object contents
// are checked by tests/crash_test, tests/data_crash_test and
// tests/content_rollback_test).
HeapOptions Options() {
  HeapOptions options;
  options.track_contents = false;
  return options;
}

TEST(HeapModelTest, MillionRandomOperationsMatchTheModel) {
  TestDir dir(ScratchParent());
  HeapConfig config;
  config.max_size = 4096 * kChunkSize;
  auto heap = PersistentHeap::Create(dir.Sub("h"), config, Options());
  ASSERT_TRUE(heap.ok()) << heap.status();
  auto workload = RandomWorkload::Start(heap->get(), /*seed=*/20261122, /*sessions=*/2,
                                        /*live_target=*/3000);
  ASSERT_TRUE(workload.ok());
  for (int i = 0; i < 1000000; ++i) {
    absl::Status status = (*workload)->Step();
    ASSERT_TRUE(status.ok()) << status;
  }
  absl::Status final_check = (*workload)->SyncAll(/*deep=*/true);
  ASSERT_TRUE(final_check.ok()) << final_check;
  EXPECT_GT((*workload)->syncs(), 1000u);
  EXPECT_GT((*workload)->names().size(), 10u);
  // Everything survives a reopen.
  const HeapStats before = (*heap)->Stats();
  const std::vector<NameEntry> names = (*heap)->ListNames("");
  workload->reset();
  heap->reset();
  auto reopened = PersistentHeap::Open(dir.Sub("h"), Options());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->Stats().directory.live_objects, before.directory.live_objects);
  EXPECT_EQ((*reopened)->ListNames(""), names);
  EXPECT_TRUE((*reopened)->CheckInvariants().ok());
}

}  // namespace
}  // namespace heapd
