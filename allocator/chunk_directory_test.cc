#include "allocator/chunk_directory.h"

#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace heapd {
namespace {

constexpr ClientId kAlice = 1;
constexpr ClientId kBob = 2;
constexpr ClientId kCarol = 3;
const uint32_t k64 = SizeClassFor(64);

uint64_t ChunkBase(uint32_t chunk) { return uint64_t{chunk} << kChunkShift; }

uint64_t Offset(uint32_t chunk, uint32_t slot, uint32_t size_class) {
  return (uint64_t{chunk} << kChunkShift) + uint64_t{slot} * ClassSize(size_class);
}

// A report that marks the first `live` slots of `grant` allocated.
LeaseReport ReportWith(const LeaseGrant& grant, uint32_t live) {
  SlotBitmap bitmap = *SlotBitmap::FromWords(SlotsPerChunk(grant.size_class), grant.words);
  for (uint32_t i = 0; i < live; ++i) bitmap.AllocateLowest();
  return LeaseReport{grant.chunk, bitmap.words()};
}

void ExpectCode(const absl::Status& status, absl::StatusCode code, const char* needle) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

TEST(ChunkDirectoryTest, LeaseHandsOutFreeChunksThenRunsOut) {
  ChunkDirectory dir(3);
  auto grants = dir.Lease(kAlice, k64, 2);
  ASSERT_TRUE(grants.ok());
  ASSERT_EQ(grants->size(), 2u);
  EXPECT_EQ((*grants)[0].size_class, k64);
  auto more = dir.Lease(kBob, k64, 5);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->size(), 1u);
  EXPECT_TRUE(dir.Lease(kBob, k64, 1)->empty());
  EXPECT_EQ(dir.LeaseCount(kAlice), 2u);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, ReleasedPartialChunkIsLeasedAgainWithItsBitmap) {
  ChunkDirectory dir(4);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 10)}, /*release=*/true).ok());
  EXPECT_EQ(dir.LeaseCount(kAlice), 0u);
  LeaseGrant again = (*dir.Lease(kBob, k64, 1))[0];
  EXPECT_EQ(again.chunk, grant.chunk);
  SlotBitmap bitmap = *SlotBitmap::FromWords(SlotsPerChunk(k64), again.words);
  EXPECT_EQ(bitmap.live(), 10u);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, ReleasedEmptyChunkBecomesFree) {
  ChunkDirectory dir(1);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 0)}, true).ok());
  EXPECT_EQ(dir.Stats().free_chunks, 1u);
  // A free chunk can serve another class.
  EXPECT_EQ(dir.Lease(kBob, SizeClassFor(4096), 1)->size(), 1u);
}

TEST(ChunkDirectoryTest, ReportRejectsChunksNotLeasedByCallerAndChangesNothing) {
  ChunkDirectory dir(4);
  LeaseGrant a = (*dir.Lease(kAlice, k64, 1))[0];
  LeaseGrant b = (*dir.Lease(kBob, k64, 1))[0];
  ExpectCode(dir.Report(kAlice, {ReportWith(a, 5), ReportWith(b, 5)}, false).status(),
             absl::StatusCode::kFailedPrecondition, "not leased by client 1");
  EXPECT_EQ(dir.Stats().live_objects, 0u);  // a's report was not applied
  LeaseReport wrong_size{a.chunk, {1, 2}};
  ExpectCode(dir.Report(kAlice, {wrong_size}, false).status(), absl::StatusCode::kInvalidArgument,
             "bitmap words");
  ExpectCode(dir.Report(kAlice, {ReportWith(a, 1), ReportWith(a, 2)}, false).status(),
             absl::StatusCode::kInvalidArgument, "reported twice");
  ExpectCode(dir.Report(kAlice, {LeaseReport{999, {}}}, false).status(),
             absl::StatusCode::kFailedPrecondition, "chunk 999");
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

// A large object goes with its allocating client until committed (a free
// of it by another client waits on that client, like one in its chunks).
TEST(ChunkDirectoryTest, AnUncommittedLargeObjectIsItsAllocators) {
  ChunkDirectory dir(8);
  absl::StatusOr<uint64_t> big = dir.AllocateLarge(kAlice, 2 * kChunkSize);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(dir.LesseeOf(*big), kAlice);
  EXPECT_FALSE(dir.LeasesSmall(kAlice, *big >> kChunkShift));  // not a chunk of small objects
  dir.Commit(kAlice);
  EXPECT_EQ(dir.LesseeOf(*big), 0u);
  auto small = dir.Lease(kAlice, 3, 1);
  ASSERT_TRUE(small.ok() && small->size() == 1);
  EXPECT_TRUE(dir.LeasesSmall(kAlice, (*small)[0].chunk));
  EXPECT_FALSE(dir.LeasesSmall(kBob, (*small)[0].chunk));
  EXPECT_FALSE(dir.LeasesSmall(kAlice, 1000));
}

TEST(ChunkDirectoryTest, LargeRunsAllocateFreeAndRejectBadOffsets) {
  ChunkDirectory dir(8);
  absl::StatusOr<uint64_t> big = dir.AllocateLarge(kAlice, 3 * kChunkSize - 1);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(dir.Stats().large_chunks, 3u);
  ExpectCode(dir.Free(kAlice, {{*big + 8, 0}}), absl::StatusCode::kInvalidArgument,
             "inside the large object");
  ExpectCode(dir.Free(kAlice, {{*big + kChunkSize, 0}}), absl::StatusCode::kInvalidArgument,
             "inside the large object");
  ExpectCode(dir.Free(kAlice, {{*big, kChunkSize}}), absl::StatusCode::kInvalidArgument,
             "not of 2097152 bytes");
  ASSERT_TRUE(dir.Free(kAlice, {{*big, 3 * kChunkSize}}).ok());
  ExpectCode(dir.Free(kAlice, {{*big, 0}}), absl::StatusCode::kInvalidArgument, "double free");
  ExpectCode(dir.AllocateLarge(kAlice, 9 * kChunkSize).status(),
             absl::StatusCode::kResourceExhausted, "no free run of 9 chunks");
  ExpectCode(dir.AllocateLarge(kAlice, 0).status(), absl::StatusCode::kInvalidArgument, "0 bytes");
  ExpectCode(dir.Free(kAlice, {{8 * kChunkSize, 0}}), absl::StatusCode::kInvalidArgument,
             "outside the heap");
  EXPECT_EQ(dir.Stats().free_chunks, 8u);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, FreeOfUnleasedSmallObjectsIsValidatedAndAtomic) {
  ChunkDirectory dir(4);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 3)}, true).ok());
  const uint64_t slot0 = Offset(grant.chunk, 0, k64);
  const uint64_t slot1 = Offset(grant.chunk, 1, k64);
  ExpectCode(dir.Free(kBob, {{slot0, 0}, {slot0 + 4, 0}}), absl::StatusCode::kInvalidArgument,
             "not at its start");
  ExpectCode(dir.Free(kBob, {{slot0, 0}, {slot0, 0}}), absl::StatusCode::kInvalidArgument,
             "twice in one free batch");
  ExpectCode(dir.Free(kBob, {{slot0, 200}}), absl::StatusCode::kInvalidArgument,
             "200 bytes do not fit it");
  ExpectCode(dir.Free(kBob, {{Offset(grant.chunk, 3, k64), 0}}), absl::StatusCode::kInvalidArgument,
             "not a live object");
  EXPECT_EQ(dir.Stats().live_objects, 3u);  // every failed batch changed nothing
  // 40 bytes aligned to 32 live in the 64-byte class: their size is said.
  ASSERT_TRUE(dir.Free(kBob, {{slot0, 40}, {slot1, 0}}).ok());
  EXPECT_EQ(dir.Stats().live_objects, 1u);
  ExpectCode(dir.Free(kBob, {{slot1, 0}}), absl::StatusCode::kInvalidArgument, "double free");
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, FreeInAnotherClientsLeaseIsAppliedAtItsNextReport) {
  ChunkDirectory dir(4);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 4)}, false).ok());
  const uint64_t slot2 = Offset(grant.chunk, 2, k64);
  const uint64_t slot5 = Offset(grant.chunk, 5, k64);
  // Slot 5 was allocated by Alice after her last report and handed to Bob:
  // only Alice's next report can tell, so the free waits for it.
  ASSERT_TRUE(dir.Free(kBob, {{slot5, 0}}).ok());
  ASSERT_TRUE(dir.Free(kBob, {{slot2, 0}}).ok());
  ExpectCode(dir.Free(kBob, {{slot2, 0}}), absl::StatusCode::kInvalidArgument, "double free");
  ExpectCode(dir.Free(kCarol, {{slot5, 0}}), absl::StatusCode::kInvalidArgument, "double free");
  EXPECT_EQ(dir.Stats().live_objects, 3u);  // slot 2's free counts; slot 5 is not known live
  // Alice reports 6 live slots (0..5); the daemon frees 2 and 5 in her view.
  auto result = dir.Report(kAlice, {ReportWith(grant, 6)}, false);
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->corrections.size(), 1u);
  EXPECT_EQ(result->corrections[0].freed_slots, (std::vector<uint32_t>{5, 2}));
  EXPECT_EQ(dir.Stats().live_objects, 4u);
  auto bob = dir.Report(kBob, {}, false);
  ASSERT_TRUE(bob.ok());
  EXPECT_TRUE(bob->rejected_frees.empty());  // every free of Bob's was right
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

// A free of a slot the lessee's report shows free is given one more report
// (the object may have been allocated after the report was taken), then
// rejected and told to the client that made it.
TEST(ChunkDirectoryTest, AFreeTheLesseeNeverHadIsRejectedToItsFreer) {
  ChunkDirectory dir(4);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 4)}, false).ok());
  const uint64_t slot7 = Offset(grant.chunk, 7, k64);
  const uint64_t slot8 = Offset(grant.chunk, 8, k64);
  ASSERT_TRUE(dir.Free(kBob, {{slot7, 0}, {slot8, 0}}).ok());
  // Report 1: neither is live; both wait one more report.
  auto first = dir.Report(kAlice, {ReportWith(grant, 4)}, false);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->corrections.empty());
  EXPECT_TRUE(dir.Report(kBob, {}, false)->rejected_frees.empty());
  // Report 2: slot 8 was allocated after report 1 was taken (a race the
  // second chance covers); slot 7 never was: a double free.
  std::vector<uint64_t> words = ReportWith(grant, 4).words;
  words[0] |= uint64_t{1} << 8;
  auto second = dir.Report(kAlice, {LeaseReport{grant.chunk, words}}, false);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->corrections.size(), 1u);
  EXPECT_EQ(second->corrections[0].freed_slots, std::vector<uint32_t>{8});
  auto bob = dir.Report(kBob, {}, false);
  ASSERT_TRUE(bob.ok());
  ASSERT_EQ(bob->rejected_frees.size(), 1u);
  EXPECT_NE(bob->rejected_frees[0].find(std::to_string(slot7)), std::string::npos)
      << bob->rejected_frees[0];
  EXPECT_EQ(dir.Stats().live_objects, 4u);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

// When the lessee's session ends, queued frees are resolved exactly: on a
// detach against its final report; on a death against its last report,
// where a slot not live was allocated after it and died with the session.
TEST(ChunkDirectoryTest, FreesQueuedForAnEndingLesseeAreResolvedExactly) {
  for (const bool died : {false, true}) {
    SCOPED_TRACE(died ? "the lessee died" : "the lessee detached");
    ChunkDirectory dir(4);
    LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
    ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 4)}, false).ok());
    ASSERT_TRUE(
        dir.Free(kBob, {{Offset(grant.chunk, 1, k64), 0}, {Offset(grant.chunk, 6, k64), 0}}).ok());
    if (died) {
      const ReclaimResult reclaimed = dir.Reclaim(kAlice);
      EXPECT_EQ(reclaimed.leases, 1u);
      EXPECT_TRUE(dir.Report(kBob, {}, false)->rejected_frees.empty());
    } else {
      ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 4)}, /*release=*/true).ok());
      EXPECT_EQ(dir.Report(kBob, {}, false)->rejected_frees.size(), 1u);  // slot 6
    }
    EXPECT_EQ(dir.Stats().live_objects, 3u);  // slots 0, 2, 3
    EXPECT_EQ(dir.Stats().leased_chunks, 0u);
    EXPECT_TRUE(dir.CheckInvariants().ok());
  }
}

// A client batches frees of objects in a chunk it does not lease, then
// leases that very chunk (partly used, released by another client) before
// the batch reaches the daemon: the frees arrive from the chunk's own
// lessee, whose grant showed the objects live. They are queued for its next
// report like any free in a leased chunk; the chunk stays leased to it
// alone (neither freed nor leasable while leased).
TEST(ChunkDirectoryTest, FreesFromTheLesseeOfObjectsInItsChunkWaitForItsReport) {
  ChunkDirectory dir(4);
  LeaseGrant alices = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(alices, 2)}, /*release=*/true).ok());
  LeaseGrant bobs = (*dir.Lease(kBob, k64, 1))[0];
  ASSERT_EQ(bobs.chunk, alices.chunk);
  ASSERT_TRUE(
      dir.Free(kBob, {{Offset(bobs.chunk, 0, k64), 64}, {Offset(bobs.chunk, 1, k64), 64}}).ok());
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
  EXPECT_EQ(dir.Stats().leased_chunks, 1u);
  // Nobody else gets the chunk Bob leases.
  auto carols = dir.Lease(kCarol, k64, 1);
  ASSERT_TRUE(carols.ok());
  ASSERT_EQ(carols->size(), 1u);
  EXPECT_NE((*carols)[0].chunk, bobs.chunk);
  // Bob allocated slot 2 since; his report shows 0..2 live; the daemon frees
  // 0 and 1 in his view and tells him.
  auto result = dir.Report(kBob, {ReportWith(bobs, 1)}, false);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->corrections.size(), 1u);
  EXPECT_EQ(result->corrections[0].freed_slots, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(result->rejected_frees.empty());
  EXPECT_EQ(dir.Stats().live_objects, 1u);
  // His pool applied the correction: slot 2 alone is live when he detaches.
  std::vector<uint64_t> words = ReportWith(bobs, 0).words;
  words[0] = uint64_t{1} << 2;
  ASSERT_TRUE(dir.Report(kBob, {LeaseReport{bobs.chunk, words}}, /*release=*/true).ok());
  EXPECT_EQ(dir.Stats().live_objects, 1u);
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
}

// A large object is known from its allocation: another client may free it
// before its allocator syncs.
TEST(ChunkDirectoryTest, AnotherClientFreesAnUncommittedLargeObject) {
  ChunkDirectory dir(8);
  absl::StatusOr<uint64_t> run = dir.AllocateLarge(kAlice, 3 * kChunkSize);
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(dir.Free(kBob, {{*run, 3 * kChunkSize}}).ok());
  ExpectCode(dir.Free(kBob, {{*run, 0}}), absl::StatusCode::kInvalidArgument, "double free");
  dir.Commit(kAlice);  // nothing left to commit
  EXPECT_EQ(dir.Stats().free_chunks, 8u);
  EXPECT_EQ(dir.Reclaim(kAlice).large_runs, 0u);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, PinnedObjectsCannotBeFreedAndSurviveReports) {
  ChunkDirectory dir(4);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  const uint64_t slot0 = Offset(grant.chunk, 0, k64);
  // Alice allocated slot 0 locally and binds it before reporting.
  ASSERT_TRUE(dir.Pin(kAlice, {slot0, 64}).ok());
  ExpectCode(dir.Pin(kBob, {Offset(grant.chunk, 1, k64), 8}), absl::StatusCode::kFailedPrecondition,
             "not a live object");
  ExpectCode(dir.Pin(kAlice, {slot0 + 8, 8}), absl::StatusCode::kInvalidArgument, "not the start");
  ExpectCode(dir.Pin(kAlice, {slot0, 65}), absl::StatusCode::kInvalidArgument, "less than 65");
  ExpectCode(dir.Free(kBob, {{slot0, 0}}), absl::StatusCode::kFailedPrecondition,
             "bound to a name");
  // Alice frees it locally anyway: the daemon keeps it and says so.
  auto result = dir.Report(kAlice, {ReportWith(grant, 0)}, true);
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->corrections.size(), 1u);
  EXPECT_EQ(result->corrections[0].kept_slots, std::vector<uint32_t>{0});
  EXPECT_EQ(dir.Stats().live_objects, 1u);
  dir.Unpin(slot0);
  ASSERT_TRUE(dir.Free(kBob, {{slot0, 0}}).ok());
  EXPECT_EQ(dir.Stats().free_chunks, 4u);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, ReclaimReturnsLeasesAtLastReportAndFreesUncommittedRuns) {
  ChunkDirectory dir(8);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 7)}, false).ok());
  ASSERT_TRUE(dir.AllocateLarge(kAlice, kChunkSize).ok());
  absl::StatusOr<uint64_t> kept = dir.AllocateLarge(kAlice, kChunkSize);
  dir.Commit(kAlice);
  ASSERT_TRUE(dir.AllocateLarge(kAlice, 2 * kChunkSize).ok());  // never committed
  ReclaimResult result = dir.Reclaim(kAlice);
  EXPECT_EQ(result.leases, 1u);
  EXPECT_EQ(result.large_runs, 1u);
  DirectoryStats stats = dir.Stats();
  EXPECT_EQ(stats.live_objects, 7u + 2u);
  EXPECT_EQ(stats.leased_chunks, 0u);
  EXPECT_EQ(stats.free_chunks, 8u - 1u - 2u);
  ASSERT_TRUE(dir.Free(kBob, {{*kept, 0}}).ok());
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(ChunkDirectoryTest, PlacedObjectsOfAReserveCommitAndTheRestIsFreedAtTheEnd) {
  ChunkDirectory dir(16);
  absl::StatusOr<LargePlacement> run = dir.Reserve(kAlice, 8, 8);
  ASSERT_TRUE(run.ok()) << run.status();
  const uint32_t* first = &run->chunk;
  EXPECT_EQ(dir.Stats().large_reserve_chunks, 8u);
  EXPECT_EQ(dir.LesseeOf(ChunkBase(*first + 3)), kAlice);
  EXPECT_TRUE(dir.TakeDirtyRecords().empty());  // reserved chunks persist as free
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{*first, 1}, {*first + 2, 3}}, {}}).ok());
  dir.Commit(kAlice);
  DirectoryStats stats = dir.Stats();
  EXPECT_EQ(stats.large_objects, 2u);
  EXPECT_EQ(stats.large_chunks, 4u);
  EXPECT_EQ(stats.large_reserve_chunks, 4u);  // still reserved: chunks 1, 5, 6, 7
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
  auto rebuilt = ChunkDirectory::FromRecords(16, dir.TakeDirtyRecords());
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ((*rebuilt)->Stats().large_objects, 2u);
  EXPECT_EQ((*rebuilt)->Stats().free_chunks, 12u);
  dir.Release(kAlice);
  stats = dir.Stats();
  EXPECT_EQ(stats.large_reserve_chunks, 0u);
  EXPECT_EQ(stats.free_chunks, 12u);
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
  ASSERT_TRUE(dir.Free(kBob, {{ChunkBase(*first + 2), 3 * kChunkSize}}).ok());
  EXPECT_EQ(dir.Stats().free_chunks, 15u);
}

// A reserve takes the longest free run up to its maximum, so free chunks
// are used before the heap grows; below its minimum there is none.
TEST(ChunkDirectoryTest, AReserveTakesTheLongestFreeRunUpToItsMaximum) {
  ChunkDirectory dir(16);
  ASSERT_TRUE(dir.AllocateLarge(kBob, 3 * kChunkSize).ok());  // 0..2
  ASSERT_TRUE(dir.AllocateLarge(kBob, kChunkSize).ok());      // 3
  ASSERT_TRUE(dir.Free(kBob, {{0, 0}}).ok());                 // 0..2 free, 4..15 free
  absl::StatusOr<LargePlacement> run = dir.Reserve(kAlice, 2, 8);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->chunks, 8u);
  run = dir.Reserve(kAlice, 2, 8);  // 0..2 and 12..15 left: the longest
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->chunk, 12u);
  EXPECT_EQ(run->chunks, 4u);
  run = dir.Reserve(kAlice, 3, 8);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->chunks, 3u);
  ExpectCode(dir.Reserve(kAlice, 1, 8).status(), absl::StatusCode::kResourceExhausted,
             "no free run of 1");
  ExpectCode(dir.Reserve(kAlice, 3, 2).status(), absl::StatusCode::kInvalidArgument, "3 to 2");
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
}

TEST(ChunkDirectoryTest, PlacementsOutsideTheReserveOrOverlappingChangeNothing) {
  ChunkDirectory dir(16);
  const uint32_t alice = dir.Reserve(kAlice, 4, 4)->chunk;
  const uint32_t bob = dir.Reserve(kBob, 4, 4)->chunk;
  ExpectCode(dir.TellReserve(kAlice, {{{alice, 1}, {bob, 1}}, {}}),
             absl::StatusCode::kInvalidArgument, "not reserved for client 1");
  ExpectCode(dir.TellReserve(kAlice, {{{alice, 2}, {alice + 1, 1}}, {}}),
             absl::StatusCode::kInvalidArgument, "overlaps");
  ExpectCode(dir.TellReserve(kAlice, {{{alice + 2, 3}}, {}}), absl::StatusCode::kInvalidArgument,
             "not reserved");
  ExpectCode(dir.TellReserve(kAlice, {{{alice, 0}}, {}}), absl::StatusCode::kInvalidArgument,
             "0 chunks");
  ExpectCode(dir.TellReserve(kAlice, {{{4294967295u, 2}}, {}}), absl::StatusCode::kInvalidArgument,
             "does not fit");
  EXPECT_EQ(dir.Stats().large_objects, 0u);
  EXPECT_EQ(dir.Stats().large_reserve_chunks, 8u);
  // A placed object is no longer reserved: placed a second time, refused;
  // sent again (after a sync whose answer was lost), skipped, even once it
  // was freed, and never taking another client's chunks.
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{alice, 2}}, {}}).ok());
  ExpectCode(dir.TellReserve(kAlice, {{{alice, 2}}, {}}), absl::StatusCode::kInvalidArgument,
             "not reserved");
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{alice, 2, /*again=*/true}}, {}}).ok());
  EXPECT_EQ(dir.Stats().large_objects, 1u);
  ASSERT_TRUE(dir.Free(kBob, {{ChunkBase(alice), 0}}).ok());
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{alice, 2, true}, {bob, 1, true}}, {}}).ok());
  EXPECT_EQ(dir.Stats().large_objects, 0u);
  EXPECT_EQ(dir.Stats().large_reserve_chunks, 2u + 4u);
  // Sent again while still reserved (the first sync never reached heapd):
  // placed.
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{alice + 2, 2, true}}, {}}).ok());
  EXPECT_EQ(dir.Stats().large_objects, 1u);
  ExpectCode(dir.TellReserve(kBob, {{{alice, 3}}, {}}), absl::StatusCode::kInvalidArgument,
             "not reserved");
  // Nor pinned before it is placed.
  ExpectCode(dir.Pin(kBob, {ChunkBase(bob), 1}), absl::StatusCode::kFailedPrecondition,
             "not the start of a live object");
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
}

TEST(ChunkDirectoryTest, ReleasedRunsAreFreeAgain) {
  ChunkDirectory dir(16);
  const uint32_t first = dir.Reserve(kAlice, 6, 6)->chunk;
  const uint32_t bob = dir.Reserve(kBob, 2, 2)->chunk;
  ASSERT_TRUE(dir.Free(kBob, {{ChunkBase(first + 3), 0}}).ok());  // never carved
  ExpectCode(dir.TellReserve(kAlice, {{{first, 2}}, {{first + 1, 2}}}),
             absl::StatusCode::kInvalidArgument, "overlaps");
  ExpectCode(dir.TellReserve(kAlice, {{}, {{bob, 1}}}), absl::StatusCode::kInvalidArgument,
             "not reserved for client 1");
  EXPECT_EQ(dir.Stats().large_reserve_chunks, 8u);
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{first, 2}}, {{first + 2, 4}}}).ok());
  EXPECT_EQ(dir.Stats().large_reserve_chunks, 2u);  // Bob's
  EXPECT_EQ(dir.Stats().free_chunks, 16u - 2u - 2u);
  ASSERT_EQ(dir.Report(kBob, {}, false)->rejected_frees.size(), 1u);  // released unused
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
  // Only the placed object is written: reserved chunks were free on disk
  // all along, released or freed with their session.
  dir.Commit(kAlice);
  std::vector<ChunkRecord> records = dir.TakeDirtyRecords();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].chunk, first);
  dir.Reclaim(kBob);
  EXPECT_TRUE(dir.TakeDirtyRecords().empty());
}

// Another client may free an object its allocator carved and has not
// placed yet (a pointer it read from the heap): the free waits for the
// placement, and one that names no object is rejected after one more
// report, or dropped when the allocator dies (the object died with it).
TEST(ChunkDirectoryTest, FreesOfReservedChunksWaitForTheirPlacement) {
  ChunkDirectory dir(16);
  const uint32_t first = dir.Reserve(kAlice, 6, 6)->chunk;
  ExpectCode(dir.Free(kBob, {{ChunkBase(first) + 64, 0}}), absl::StatusCode::kInvalidArgument,
             "not the start of an object");
  ExpectCode(dir.Free(kBob, {{ChunkBase(first), 64}}), absl::StatusCode::kInvalidArgument,
             "not the start of an object");
  ASSERT_TRUE(dir.Free(kBob, {{ChunkBase(first), 2 * kChunkSize}}).ok());
  ExpectCode(dir.Free(kCarol, {{ChunkBase(first), 0}}), absl::StatusCode::kInvalidArgument,
             "double free");
  ASSERT_TRUE(dir.Free(kBob, {{ChunkBase(first + 3), 0}}).ok());             // never carved
  ASSERT_TRUE(dir.Free(kCarol, {{ChunkBase(first + 5), kChunkSize}}).ok());  // inside
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
  ASSERT_TRUE(dir.TellReserve(kAlice, {{{first, 2}, {first + 4, 2}}, {}}).ok());
  EXPECT_EQ(dir.Stats().large_objects, 1u);  // the first was freed on placement
  EXPECT_EQ(dir.Stats().free_chunks, 10u + 2u);
  dir.SettleReservedFrees(kAlice);  // first + 3: one more report
  ASSERT_TRUE(dir.Report(kBob, {}, false)->rejected_frees.empty());
  absl::StatusOr<ReportResult> carol = dir.Report(kCarol, {}, false);  // told at its report
  ASSERT_EQ(carol->rejected_frees.size(), 1u);
  EXPECT_NE(carol->rejected_frees[0].find("inside the large object"), std::string::npos);
  dir.SettleReservedFrees(kAlice);
  ReclaimResult bob = dir.Reclaim(kBob);
  ASSERT_EQ(bob.rejected_frees.size(), 1u);
  EXPECT_NE(bob.rejected_frees[0].find("placed no large object"), std::string::npos);
  // Queued for a client that dies: dropped, and its reserve is free again.
  const uint32_t again = dir.Reserve(kBob, 2, 2)->chunk;
  ASSERT_TRUE(dir.Free(kCarol, {{ChunkBase(again), 0}}).ok());
  EXPECT_EQ(dir.Reclaim(kBob).large_runs, 0u);
  EXPECT_TRUE(dir.Reclaim(kCarol).rejected_frees.empty());
  EXPECT_EQ(dir.Stats().large_objects, 1u);
  EXPECT_EQ(dir.Stats().large_reserve_chunks, 2u);  // Alice's first + 2 and first + 3 still
  EXPECT_TRUE(dir.CheckInvariants().ok()) << dir.CheckInvariants();
}

TEST(ChunkDirectoryTest, RecordsRebuildTheSameHeap) {
  ChunkDirectory dir(16);
  LeaseGrant grant = (*dir.Lease(kAlice, k64, 1))[0];
  ASSERT_TRUE(dir.Report(kAlice, {ReportWith(grant, 9)}, false).ok());
  ASSERT_TRUE(dir.AllocateLarge(kAlice, 3 * kChunkSize).ok());
  ASSERT_TRUE(dir.AllocateLarge(kBob, kChunkSize).ok());  // uncommitted: not persisted
  dir.Commit(kAlice);
  std::vector<ChunkRecord> log = dir.TakeDirtyRecords();
  EXPECT_TRUE(dir.TakeDirtyRecords().empty());
  auto rebuilt = ChunkDirectory::FromRecords(16, log);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  DirectoryStats stats = (*rebuilt)->Stats();
  EXPECT_EQ(stats.live_objects, 10u);
  EXPECT_EQ(stats.large_chunks, 3u);
  EXPECT_EQ(stats.leased_chunks, 0u);
  EXPECT_EQ(stats.free_chunks, 16u - 1u - 3u);
  EXPECT_TRUE((*rebuilt)->CheckInvariants().ok());
  auto from_checkpoint = ChunkDirectory::FromRecords(16, dir.AllRecords());
  ASSERT_TRUE(from_checkpoint.ok());
  EXPECT_EQ((*from_checkpoint)->Stats().live_objects, 10u);
}

TEST(ChunkDirectoryTest, ContradictoryRecordsAreDataLoss) {
  ChunkRecord run{2, ChunkKind::kLargeHead, 0, 3, {}};
  ChunkRecord small{3, ChunkKind::kSmall, k64, 0,
                    std::vector<uint64_t>(SlotBitmap::WordCount(SlotsPerChunk(k64)), 1)};
  EXPECT_EQ(ChunkDirectory::FromRecords(8, {run, small}).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ChunkDirectory::FromRecords(4, {run}).status().code(), absl::StatusCode::kDataLoss);
  ChunkRecord beyond{9, ChunkKind::kFree, 0, 0, {}};
  EXPECT_EQ(ChunkDirectory::FromRecords(8, {beyond}).status().code(), absl::StatusCode::kDataLoss);
  ChunkRecord bad_words{1, ChunkKind::kSmall, k64, 0, {1}};
  EXPECT_EQ(ChunkDirectory::FromRecords(8, {bad_words}).status().code(),
            absl::StatusCode::kDataLoss);
  ChunkRecord bad_class{1, ChunkKind::kSmall, 99, 0, {}};
  EXPECT_EQ(ChunkDirectory::FromRecords(8, {bad_class}).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ChunkDirectoryTest, BadArgumentsAreRejected) {
  ChunkDirectory dir(2);
  ExpectCode(dir.Lease(kAlice, kNumSizeClasses, 1).status(), absl::StatusCode::kInvalidArgument,
             "size class 64");
  ExpectCode(dir.Lease(0, 0, 1).status(), absl::StatusCode::kInvalidArgument, "reserved");
  ExpectCode(dir.Pin(kAlice, {5 * kChunkSize, 0}), absl::StatusCode::kInvalidArgument,
             "outside the heap");
  ExpectCode(dir.Pin(kAlice, {0, 0}), absl::StatusCode::kFailedPrecondition,
             "not the start of a live object");
}

// Random traffic of three clients around reserves (reserve, place, send
// again, release, free, sync, allocate, lease, pin, end): the invariants
// hold after every step, and the records written replay to the persisted
// view (a crash of heapd at any point recovers what was committed).
TEST(ChunkDirectoryTest, RandomReserveTrafficKeepsTheInvariantsAndTheRecords) {
  for (uint32_t seed = 1; seed <= 500; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
    constexpr uint32_t kCap = 24;
    ChunkDirectory dir(kCap);
    std::vector<ChunkRecord> log;
    std::vector<uint64_t> pinned;
    std::map<ClientId, std::vector<uint32_t>> near_here;  // reserves handed out
    for (int step = 0; step < 300; ++step) {
      const ClientId c = 1 + pick(3);
      auto near = [&](ClientId owner) {
        std::vector<uint32_t>& hints = near_here[owner];
        if (hints.empty() || pick(5) == 0) return pick(kCap);
        return std::min(kCap - 1, hints[pick(static_cast<uint32_t>(hints.size()))] + pick(4));
      };
      const uint32_t op = pick(11);
      if (op == 0) {
        const uint32_t least = 1 + pick(3);
        absl::StatusOr<LargePlacement> run = dir.Reserve(c, least, least + pick(4));
        if (run.ok()) near_here[c].push_back(run->chunk);
      } else if (op <= 2) {
        ReserveReport report;
        for (uint32_t n = pick(3); n > 0; --n) {
          report.placed.push_back({near(c), 1 + pick(3), pick(3) == 0});
        }
        for (uint32_t n = pick(2); n > 0; --n) report.released.push_back({near(c), 1 + pick(2)});
        (void)dir.TellReserve(c, report);
      } else if (op <= 4) {
        const uint32_t chunks = pick(4);
        (void)dir.Free(c, {{ChunkBase(near(1 + pick(3))), chunks * kChunkSize}});
      } else if (op == 5) {
        (void)dir.Report(c, {}, false);
        dir.SettleReservedFrees(c);
        dir.Commit(c);
      } else if (op == 6) {
        (void)dir.AllocateLarge(c, (1 + pick(3)) * kChunkSize);
      } else if (op == 7) {
        if (pick(2) == 0) {
          dir.Reclaim(c);
        } else {
          dir.Release(c);
        }
      } else if (op == 8) {
        const uint64_t offset = ChunkBase(pick(kCap));
        if (dir.Pin(c, {offset, 0}).ok()) pinned.push_back(offset);
      } else if (op == 9) {
        if (!pinned.empty()) {
          const size_t i = pick(static_cast<uint32_t>(pinned.size()));
          dir.Unpin(pinned[i]);
          pinned.erase(pinned.begin() + static_cast<std::ptrdiff_t>(i));
        }
      } else {
        (void)dir.Lease(c, k64, 1);
      }
      const absl::Status invariants = dir.CheckInvariants();
      ASSERT_TRUE(invariants.ok()) << "seed " << seed << " step " << step << ": " << invariants;
      if (step % 7 != 0) continue;
      std::vector<ChunkRecord> dirty = dir.TakeDirtyRecords();
      log.insert(log.end(), dirty.begin(), dirty.end());
      auto rebuilt = ChunkDirectory::FromRecords(kCap, log);
      ASSERT_TRUE(rebuilt.ok()) << "seed " << seed << " step " << step << ": " << rebuilt.status();
      std::vector<ChunkRecord> want;
      for (ChunkRecord& record : dir.AllRecords()) {
        bool empty = record.kind == ChunkKind::kSmall;
        for (uint64_t word : record.words) empty = empty && word == 0;
        if (!empty) want.push_back(std::move(record));
      }
      const std::vector<ChunkRecord> got = (*rebuilt)->AllRecords();
      ASSERT_EQ(want.size(), got.size()) << "seed " << seed << " step " << step;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(want[i].chunk, got[i].chunk) << "seed " << seed << " step " << step;
        ASSERT_EQ(want[i].kind, got[i].kind) << "seed " << seed << " step " << step;
        ASSERT_EQ(want[i].run_chunks, got[i].run_chunks) << "seed " << seed << " step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace heapd
