#include "heap/pending_syncs.h"

#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"
#include "gtest/gtest.h"

namespace heapd {
namespace {

constexpr ClientId kAlice = 1;
constexpr ClientId kBob = 2;
const uint32_t k64 = SizeClassFor(64);

uint64_t SlotOffset(uint32_t chunk, uint32_t slot) {
  return (uint64_t{chunk} << kChunkShift) + uint64_t{slot} * ClassSize(k64);
}

// A report that marks the first `live` slots of `grant` allocated.
LeaseReport ReportWith(const LeaseGrant& grant, uint32_t live) {
  SlotBitmap bitmap = *SlotBitmap::FromWords(SlotsPerChunk(grant.size_class), grant.words);
  for (uint32_t i = 0; i < live; ++i) bitmap.AllocateLowest();
  return LeaseReport{grant.chunk, bitmap.words()};
}

TEST(PendingSyncsTest, StagedReportsWaitForTheLastPartWhichWinsForItsChunks) {
  PendingSyncs pending;
  pending.Stage(kAlice, {{3, {1}}, {4, {1}}});
  pending.Stage(kAlice, {{3, {3}}});  // chunk 3 again: replaces
  pending.Stage(kBob, {{9, {1}}});
  EXPECT_EQ(pending.StagedCount(kAlice), 2u);

  const std::vector<LeaseReport> all = pending.TakeStaged(kAlice, {{4, {7}}});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].chunk, 4u);
  EXPECT_EQ(all[0].words, std::vector<uint64_t>{7}) << "the last part reports chunk 4";
  EXPECT_EQ(all[1].chunk, 3u);
  EXPECT_EQ(all[1].words, std::vector<uint64_t>{3}) << "the later staging of chunk 3";
  EXPECT_EQ(pending.StagedCount(kAlice), 0u);
  EXPECT_EQ(pending.TakeStaged(kAlice, {}).size(), 0u) << "nothing stays staged";
  EXPECT_EQ(pending.StagedCount(kBob), 1u) << "another client's parts are its own";
}

TEST(PendingSyncsTest, DeferredFreesApplyAtTheSyncAndAreCheckedAgainThen) {
  ChunkDirectory directory(8);
  const uint64_t first = *directory.AllocateLarge(kAlice, 4 << 20);
  const uint64_t second = *directory.AllocateLarge(kAlice, 4 << 20);
  directory.Commit(kAlice);
  PendingSyncs pending;
  ASSERT_TRUE(pending.DeferFrees(directory, kBob, {{first, 0}, {second, 0}}).ok());
  EXPECT_EQ(pending.DeferFrees(directory, kBob, {{first, 0}}).code(),
            absl::StatusCode::kInvalidArgument)
      << "freed twice since the last sync";
  EXPECT_EQ(pending.DeferredCount(kBob), 2u);
  EXPECT_TRUE(directory.CheckFree(kBob, {{first, 0}}).ok()) << "not freed before the sync";

  // Alice frees `second` herself meanwhile: Bob's free of it is a double
  // free when his sync applies it; `first` still goes.
  ASSERT_TRUE(directory.Free(kAlice, {{second, 0}}).ok());
  std::vector<std::string> rejected;
  pending.ApplyFrees(directory, kBob, &rejected);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].find(std::to_string(second)), std::string::npos) << rejected[0];
  EXPECT_FALSE(directory.CheckFree(kBob, {{first, 0}}).ok()) << "first was not freed";
  EXPECT_EQ(directory.FreeChunks(), 8u);
  EXPECT_EQ(pending.DeferredCount(kBob), 0u);
}

TEST(PendingSyncsTest, FreesOfObjectsADeadLesseeNeverReportedAreDropped) {
  ChunkDirectory directory(4);
  const LeaseGrant grant = (*directory.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(directory.Report(kAlice, {ReportWith(grant, 1)}, /*release=*/false).ok());
  // Bob frees slot 0 (reported live) and slot 1 (allocated by Alice after
  // her report, as far as anyone can tell): both wait for his sync.
  PendingSyncs pending;
  const ObjectRef reported{SlotOffset(grant.chunk, 0), 0};
  const ObjectRef unreported{SlotOffset(grant.chunk, 1), 0};
  ASSERT_TRUE(directory.CheckFree(kBob, {reported, unreported}).ok());
  ASSERT_TRUE(pending.DeferFrees(directory, kBob, {reported, unreported}).ok());
  pending.Stage(kAlice, {ReportWith(grant, 2)});

  // Alice dies: her staged part goes, her chunk is back at her last report.
  pending.Drop(kAlice);
  EXPECT_EQ(pending.StagedCount(kAlice), 0u);
  directory.Reclaim(kAlice);
  pending.SettleFrees(directory, kAlice, /*lessee_died=*/true);
  EXPECT_EQ(pending.DeferredCount(kBob), 1u) << "slot 1 died with Alice; slot 0 is still freed";

  std::vector<std::string> rejected;
  pending.ApplyFrees(directory, kBob, &rejected);
  EXPECT_TRUE(rejected.empty()) << rejected[0];
  EXPECT_FALSE(directory.CheckFree(kBob, {reported}).ok()) << "slot 0 was not freed";
}

TEST(PendingSyncsTest, ADeadClientsFreesGoWithIt) {
  ChunkDirectory directory(4);
  const uint64_t object = *directory.AllocateLarge(kAlice, 2 << 20);
  directory.Commit(kAlice);
  PendingSyncs pending;
  ASSERT_TRUE(pending.DeferFrees(directory, kBob, {{object, 0}}).ok());
  pending.Drop(kBob);
  EXPECT_EQ(pending.DeferredCount(kBob), 0u);
  std::vector<std::string> rejected;
  pending.ApplyFrees(directory, kBob, &rejected);
  EXPECT_TRUE(directory.CheckFree(kAlice, {{object, 0}}).ok()) << "the object was freed";
}

}  // namespace
}  // namespace heapd
