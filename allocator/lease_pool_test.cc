#include "allocator/lease_pool.h"

#include <map>
#include <random>

#include "allocator/chunk_directory.h"
#include "gtest/gtest.h"

namespace heapd {
namespace {

// Leases chunks from a real ChunkDirectory, as the daemon would.
class DirectorySource : public LeaseSource {
 public:
  DirectorySource(ChunkDirectory* dir, ClientId client) : dir_(dir), client_(client) {}
  absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(uint32_t size_class, uint32_t count,
                                                      absl::Span<const uint32_t> reuse) override {
    ++calls;
    asked.push_back(count);
    offered.insert(offered.end(), reuse.begin(), reuse.end());
    auto grants = dir_->Lease(client_, size_class, count, reuse);
    if (fail_after_lease) return absl::UnavailableError("the answer was lost");
    if (grants.ok() && grants->empty()) return absl::ResourceExhaustedError("heap full");
    return grants;
  }
  int calls = 0;
  std::vector<uint32_t> asked;    // count of each call
  std::vector<uint32_t> offered;  // chunks offered for reuse, every call
  bool fail_after_lease = false;  // the directory leases, the caller hears an error

 private:
  ChunkDirectory* dir_;
  ClientId client_;
};

TEST(LeasePoolTest, AllocatesDistinctAlignedObjectsAndLeasesInDoublingBatches) {
  ChunkDirectory dir(64);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 64, 4);
  const uint32_t c = SizeClassFor(100);
  std::set<uint64_t> seen;
  for (uint32_t i = 0; i < 10 * SlotsPerChunk(c); ++i) {
    absl::StatusOr<uint64_t> offset = pool.Allocate(c);
    ASSERT_TRUE(offset.ok());
    ASSERT_EQ(*offset % 8, 0u);
    ASSERT_TRUE(seen.insert(*offset).second);
  }
  // 1 chunk, then 2, then the batch of 4 (7 chunks), then 4 more.
  EXPECT_EQ(source.asked, (std::vector<uint32_t>{1, 2, 4, 4}));
  EXPECT_EQ(pool.leased_chunks(), 11u);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(LeasePoolTest, ALightlyUsedClassHoldsOneChunk) {
  ChunkDirectory dir(64);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 64, 16);
  for (uint32_t c = 0; c < 10; ++c) ASSERT_TRUE(pool.Allocate(c).ok());
  EXPECT_EQ(pool.leased_chunks(), 10u);
  EXPECT_EQ(dir.Stats().free_chunks, 54u);
}

// Objects that move on to larger classes (a growing vector's buffers)
// leave their chunks empty: the next lease for another class takes them
// back, instead of new chunks.
TEST(LeasePoolTest, ChunksAClassEmptiedServeTheNextClass) {
  ChunkDirectory dir(64);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 64, 1);
  uint32_t size = 64;
  for (int step = 0; step < 12; ++step, size *= 2) {
    const uint32_t c = SizeClassFor(size);
    // Fill two chunks of the class, then free every object of it.
    std::vector<uint64_t> objects;
    for (uint32_t i = 0; i < SlotsPerChunk(c) + 1; ++i) {
      absl::StatusOr<uint64_t> offset = pool.Allocate(c);
      ASSERT_TRUE(offset.ok()) << offset.status() << " at step " << step;
      objects.push_back(*offset);
    }
    for (uint64_t offset : objects) ASSERT_EQ(pool.Free(offset), LocalFree::kFreed);
    ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  }
  // Each class keeps its current chunk; the other one moved on each time.
  EXPECT_EQ(pool.leased_chunks(), 13u);
  EXPECT_EQ(dir.Stats().free_chunks, 64u - 13u);
  EXPECT_FALSE(source.offered.empty());
  EXPECT_TRUE(dir.CheckInvariants().ok());
  // A chunk that holds an object the directory knows of stays its class.
  ChunkDirectory other(8);
  const uint32_t small = SizeClassFor(64);
  auto leased = other.Lease(1, small, 1);
  ASSERT_TRUE(leased.ok() && leased->size() == 1);
  LeaseReport report{(*leased)[0].chunk, (*leased)[0].words};
  report.words[0] |= 1;
  ASSERT_TRUE(other.Report(1, {report}, /*release=*/false).ok());
  EXPECT_FALSE(other.Reclass(1, report.chunk, SizeClassFor(4096)));
  EXPECT_FALSE(other.Reclass(2, report.chunk, SizeClassFor(4096)));  // not its lease
  report.words[0] &= ~uint64_t{1};
  ASSERT_TRUE(other.Report(1, {report}, /*release=*/false).ok());
  EXPECT_TRUE(other.Reclass(1, report.chunk, SizeClassFor(4096)));
  EXPECT_TRUE(other.CheckInvariants().ok());
}

// A chunk is offered only while the daemon is known to hold it empty and
// no report of it is in flight: a report of the old class must never land
// after the chunk changed class.
TEST(LeasePoolTest, AChunkWhoseReportIsInFlightOrNotEmptyIsNotOffered) {
  ChunkDirectory dir(16);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 16, 1);
  const uint32_t a = SizeClassFor(65536);  // 32 slots a chunk
  std::vector<uint64_t> objects;
  for (uint32_t i = 0; i < SlotsPerChunk(a) + 1; ++i) objects.push_back(*pool.Allocate(a));
  const uint32_t first = static_cast<uint32_t>(objects.front() >> kChunkShift);
  // A sync takes the reports (the first chunk full) ...
  const std::vector<LeaseReport> reports = pool.TakeDirtyReports();
  // ... and the objects go before it is answered.
  for (uint64_t offset : objects) ASSERT_EQ(pool.Free(offset), LocalFree::kFreed);
  ASSERT_TRUE(pool.Allocate(SizeClassFor(100)).ok());
  EXPECT_TRUE(source.offered.empty()) << "offered with its report in flight";
  ASSERT_TRUE(dir.Report(1, reports, /*release=*/false).ok());
  pool.ReportsApplied(reports);
  ASSERT_TRUE(pool.Allocate(SizeClassFor(200)).ok());
  EXPECT_TRUE(source.offered.empty()) << "offered while the daemon holds its objects";
  // Reported empty and answered: offered, and taken back.
  const std::vector<LeaseReport> empty = pool.TakeDirtyReports();
  ASSERT_TRUE(dir.Report(1, empty, /*release=*/false).ok());
  pool.ReportsApplied(empty);
  const uint32_t c = SizeClassFor(300);
  absl::StatusOr<uint64_t> reused = pool.Allocate(c);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(source.offered, std::vector<uint32_t>{first});
  EXPECT_EQ(*reused >> kChunkShift, first);
  EXPECT_EQ(pool.SizeClassAt(*reused), static_cast<int>(c));
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

// A lease that offered chunks and failed: the daemon may have taken them
// back as the new class before the failure. They are in doubt (never
// allocated from) until the next lease grants them, as they are if the
// daemon holds them so already.
TEST(LeasePoolTest, ChunksOfferedToALeaseThatFailedAreInDoubtUntilGranted) {
  ChunkDirectory dir(16);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 16, 1);
  const uint32_t a = SizeClassFor(65536);
  std::vector<uint64_t> objects;
  for (uint32_t i = 0; i < SlotsPerChunk(a) + 1; ++i) objects.push_back(*pool.Allocate(a));
  for (uint64_t offset : objects) ASSERT_EQ(pool.Free(offset), LocalFree::kFreed);
  const uint32_t first = static_cast<uint32_t>(objects.front() >> kChunkShift);
  const uint32_t b = SizeClassFor(100);
  source.fail_after_lease = true;  // the daemon took it back as b; the answer is lost
  EXPECT_FALSE(pool.Allocate(b).ok());
  EXPECT_EQ(source.offered, std::vector<uint32_t>{first});
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  // Its reports say class a: the daemon, which holds it as b, skips them.
  const std::vector<LeaseReport> reports = pool.TakeDirtyReports();
  ASSERT_TRUE(dir.Report(1, reports, /*release=*/false).ok());
  pool.ReportsApplied(reports);
  // Never allocated from while in doubt: class a gets the other chunk.
  absl::StatusOr<uint64_t> in_a = pool.Allocate(a);
  ASSERT_TRUE(in_a.ok());
  EXPECT_NE(*in_a >> kChunkShift, first);
  // The next lease, of any class, offers it first and gets it back.
  source.fail_after_lease = false;
  const uint32_t c = SizeClassFor(3000);
  absl::StatusOr<uint64_t> in_c = pool.Allocate(c);
  ASSERT_TRUE(in_c.ok()) << in_c.status();
  EXPECT_EQ(source.offered, (std::vector<uint32_t>{first, first}));
  EXPECT_EQ(*in_c >> kChunkShift, first);
  EXPECT_EQ(pool.SizeClassAt(*in_c), static_cast<int>(c));
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

// A report that says another class than its chunk's was taken before the
// chunk changed class: skipped, whatever its words.
TEST(LeasePoolTest, AReportOfTheOldClassIsSkipped) {
  ChunkDirectory dir(8);
  auto leased = dir.Lease(1, SizeClassFor(64), 1);
  ASSERT_TRUE(leased.ok() && leased->size() == 1);
  const uint32_t chunk = (*leased)[0].chunk;
  LeaseReport old{chunk, (*leased)[0].words, static_cast<int32_t>(SizeClassFor(64))};
  old.words[0] |= 1;  // an object of the old class
  ASSERT_TRUE(dir.Reclass(1, chunk, SizeClassFor(4096)));
  ASSERT_TRUE(dir.CheckReport(1, {old}).ok());
  ASSERT_TRUE(dir.Report(1, {old}, /*release=*/false).ok());
  EXPECT_EQ(dir.Stats().live_objects, 0u);
  // Skipped, but never larger than the class it names: a hostile client
  // cannot stage big reports by naming a wrong class.
  LeaseReport huge{chunk, std::vector<uint64_t>(100000, 0), static_cast<int32_t>(SizeClassFor(64))};
  EXPECT_EQ(dir.CheckReport(1, {huge}).code(), absl::StatusCode::kInvalidArgument);
  huge.size_class = static_cast<int32_t>(kNumSizeClasses);
  EXPECT_EQ(dir.CheckReport(1, {huge}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(LeasePoolTest, FreeValidatesLocally) {
  ChunkDirectory dir(8);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 8, 1);
  const uint32_t c = SizeClassFor(64);
  uint64_t a = *pool.Allocate(c);
  EXPECT_EQ(pool.Free(a + 8), LocalFree::kNotLive);
  EXPECT_NE(pool.DescribeNotLive(a + 8).find("inside an object of 64 bytes"), std::string::npos);
  EXPECT_EQ(pool.Free(a), LocalFree::kFreed);
  EXPECT_EQ(pool.Free(a), LocalFree::kNotLive);
  EXPECT_NE(pool.DescribeNotLive(a).find("double free"), std::string::npos);
  EXPECT_EQ(pool.Free(a + 5 * kChunkSize), LocalFree::kNotLeased);
  EXPECT_EQ(pool.Free(uint64_t{1} << 50), LocalFree::kNotLeased);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(LeasePoolTest, RunsOutWithTheSourcesError) {
  ChunkDirectory dir(1);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 1, 1);
  const uint32_t c = SizeClassFor(kMaxSmallSize);
  ASSERT_TRUE(pool.Allocate(c).ok());
  ASSERT_TRUE(pool.Allocate(c).ok());
  EXPECT_EQ(pool.Allocate(c).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(LeasePoolTest, ReportsOnlyDirtyChunksAndAppliesCorrections) {
  ChunkDirectory dir(8);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 8, 2);
  const uint32_t c = SizeClassFor(64);
  uint64_t a = *pool.Allocate(c);
  uint64_t b = *pool.Allocate(c);
  std::vector<LeaseReport> reports = pool.TakeDirtyReports();
  ASSERT_EQ(reports.size(), 1u);  // two chunks leased, one touched
  EXPECT_TRUE(pool.TakeDirtyReports().empty());
  ASSERT_TRUE(dir.Report(1, reports, false).ok());
  // Another client frees b through the daemon.
  ASSERT_TRUE(dir.Free(2, {{b, 0}}).ok());
  ASSERT_EQ(pool.Free(a), LocalFree::kFreed);
  auto corrections = dir.Report(1, pool.TakeDirtyReports(), false);
  ASSERT_TRUE(corrections.ok());
  pool.ApplyCorrections(corrections->corrections);
  EXPECT_EQ(pool.Free(b), LocalFree::kNotLive);  // already freed remotely
  EXPECT_EQ(dir.Stats().live_objects, 0u);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(LeasePoolTest, RedirtiedChunksAreReportedAgain) {
  ChunkDirectory dir(8);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 8, 2);
  ASSERT_TRUE(pool.Allocate(SizeClassFor(64)).ok());
  std::vector<LeaseReport> reports = pool.TakeDirtyReports();
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_TRUE(pool.TakeDirtyReports().empty());
  pool.Redirty(reports);
  std::vector<LeaseReport> again = pool.TakeDirtyReports();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].chunk, reports[0].chunk);
  EXPECT_EQ(again[0].words, reports[0].words);
}

TEST(LeasePoolTest, ReleaseAllReturnsEveryChunk) {
  ChunkDirectory dir(8);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 8, 2);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(pool.Allocate(SizeClassFor(32)).ok());
  ASSERT_TRUE(dir.Report(1, pool.ReleaseAll(), true).ok());
  EXPECT_EQ(pool.leased_chunks(), 0u);
  EXPECT_EQ(dir.LeaseCount(1), 0u);
  EXPECT_EQ(dir.Stats().live_objects, 10u);
  EXPECT_EQ(dir.Stats().free_chunks, 7u);  // the untouched second chunk came back free
  EXPECT_TRUE(dir.CheckInvariants().ok());
}

TEST(LeasePoolTest, RandomAllocateFreeKeepsObjectsDisjoint) {
  ChunkDirectory dir(256);
  DirectorySource source(&dir, 1);
  LeasePool pool(&source, 256, 2);
  std::mt19937_64 rng(1);
  std::map<uint64_t, uint64_t> live;  // offset -> slot size
  for (int op = 0; op < 200000; ++op) {
    if (live.empty() || rng() % 2 == 0) {
      const uint64_t size = 1 + rng() % (rng() % 8 == 0 ? 70000 : 300);
      const uint32_t c = SizeClassFor(size);
      absl::StatusOr<uint64_t> offset = pool.Allocate(c);
      ASSERT_TRUE(offset.ok()) << offset.status();
      auto next = live.lower_bound(*offset);
      ASSERT_TRUE(next == live.end() || next->first >= *offset + ClassSize(c));
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *offset);
      }
      live[*offset] = ClassSize(c);
    } else {
      auto it = live.lower_bound(rng() % (256 * kChunkSize));
      if (it == live.end()) it = live.begin();
      ASSERT_EQ(pool.Free(it->first), LocalFree::kFreed);
      live.erase(it);
    }
  }
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

}  // namespace
}  // namespace heapd
