#include "daemon/heap_registry.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "daemon/descriptor_room.h"
#include "gtest/gtest.h"
#include "heap/heap_dir.h"
#include "heap/test_dir.h"
#include "snapshot/snapshot_store.h"

namespace heapd {
namespace {

HeapConfig Config(uint32_t owner = 0) {
  HeapConfig config;
  config.max_size = 64 << 20;
  config.owner_uid = owner;
  return config;
}

// Reserves and creates heap `name` of `owner` on tier `storage` (empty:
// the default), with the image the registry chooses there.
absl::StatusOr<std::shared_ptr<ServedHeap>> Make(HeapRegistry& registry, const std::string& name,
                                                 uint32_t owner = 0,
                                                 const std::string& storage = "") {
  HeapConfig config = Config(owner);
  absl::StatusOr<ImageMode> image = registry.ChooseImage(name, std::nullopt, storage);
  if (!image.ok()) return image.status();
  config.image = *image;
  absl::StatusOr<HeapRegistry::Reservation> reserved =
      registry.Reserve(name, owner, config.max_size, /*replacing=*/false, storage);
  if (!reserved.ok()) return reserved.status();
  return registry.Create(*std::move(reserved), config);
}

TEST(ServedHeapTest, NoUnchangedTokenWhileAWriterIsAttachedAndANewOneAfter) {
  ServedHeap served;
  served.incarnation = "i";
  const std::string quiet = served.UnchangedToken();
  EXPECT_EQ(quiet, "i/0");
  served.WriterStarts();
  EXPECT_EQ(served.UnchangedToken(), "");
  served.WriterEnded();
  const std::string after = served.UnchangedToken();
  EXPECT_NE(after, "");
  EXPECT_NE(after, quiet) << "a writer came and went: the data may have changed";
  served.WriterStarts();
  served.WriterDidNotStart();
  EXPECT_NE(served.UnchangedToken(), "") << "a writer that did not start is not counted";
}

TEST(ServedHeapTest, AwaitProgressWakesOnProgressAndEndsAtItsDeadline) {
  ServedHeap served;
  const absl::Time start = absl::Now();
  served.AwaitProgress(served.progress(), start + absl::Milliseconds(50));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));

  const uint64_t seen = served.progress();
  std::thread syncer([&served] {
    absl::SleepFor(absl::Milliseconds(20));
    served.Progressed();
  });
  const absl::Time waited = absl::Now();
  served.AwaitProgress(seen, waited + absl::Seconds(30));
  EXPECT_LT(absl::Now() - waited, absl::Seconds(10)) << "not woken by Progressed";
  EXPECT_EQ(served.progress(), seen + 1);
  syncer.join();
  // Progress already past `seen` returns at once.
  served.AwaitProgress(seen, absl::InfiniteFuture());
}

TEST(HeapRegistryTest, HeapNamesAreValidated) {
  EXPECT_TRUE(ValidateHeapName("graph-2026_v1.0").ok());
  for (const char* bad : {"", ".hidden", "a/b", "a b", "..", "é"}) {
    EXPECT_EQ(ValidateHeapName(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ValidateHeapName(std::string(65, 'a')).ok());
}

TEST(HeapRegistryTest, CreateGetListRemoveAndReopen) {
  TestDir dir;
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_TRUE(Make(**registry, "a").ok());
  ASSERT_TRUE(Make(**registry, "b").ok());
  EXPECT_EQ(Make(**registry, "a").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Make(**registry, "../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*registry)->Get("c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*registry)->List().size(), 2u);
  absl::StatusOr<HeapRegistry::Removed> removed = (*registry)->Remove("b");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("heaps/b")));
  ASSERT_NE(removed->closing, nullptr);
  EXPECT_EQ(removed->closing->name, "b");
  const std::weak_ptr<ServedHeap> closed = removed->closing;
  const std::string removed_dir = removed->dir;
  (*registry)->DeleteRemoved(*std::move(removed));
  EXPECT_FALSE(std::filesystem::exists(removed_dir));
  EXPECT_TRUE(closed.expired()) << "the removed heap was not closed";
  EXPECT_EQ((*registry)->Remove("b").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*registry)->SyncAll().ok());
  registry->reset();

  auto reopened = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(reopened.ok());
  ASSERT_EQ((*reopened)->List().size(), 1u);
  EXPECT_EQ((*reopened)->List()[0]->name, "a");
}

// Fixed-address heaps hold their ranges in the registry: reserved ones
// too, across a restart, and two heap directories recording one range
// (one copied by hand) are not both served.
// A user's fixed-address ranges (reservations and heaps) count against
// their share of the window; a replaced heap's range is its
// replacement's; root is not limited.
TEST(HeapRegistryTest, AUsersFixedAddressRangesStayWithinTheirShare) {
  TestDir dir;
  UserLimits limits;
  const HeapConfig config = Config(1000);
  limits.fixed_address_bytes = 2 * FixedRangeBytes(config.max_size);
  auto registry = HeapRegistry::Open(dir.path(), HeapOptions(), limits);
  ASSERT_TRUE(registry.ok()) << registry.status();
  const FixedPlacement fixed{true, 0};
  absl::StatusOr<HeapRegistry::Reservation> a =
      (*registry)->Reserve("a", 1000, config.max_size, false, "", fixed);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*registry)->Create(*std::move(a), config).ok());
  {
    absl::StatusOr<HeapRegistry::Reservation> b =
        (*registry)->Reserve("b", 1000, config.max_size, false, "", fixed);
    ASSERT_TRUE(b.ok()) << b.status();
    const absl::Status third =
        (*registry)->Reserve("c", 1000, config.max_size, false, "", fixed).status();
    EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
    EXPECT_NE(third.message().find("uid 1000's fixed-address heaps hold"), std::string::npos)
        << third;
    // Not fixed, or another user's, or root's: not this share.
    EXPECT_TRUE((*registry)->Reserve("plain", 1000, config.max_size).ok());
    EXPECT_TRUE((*registry)->Reserve("theirs", 1001, config.max_size, false, "", fixed).ok());
    EXPECT_TRUE((*registry)->Reserve("root", 0, config.max_size, false, "", fixed).ok());
    // Replacing a keeps within the share: a's range becomes its replacement's.
    EXPECT_TRUE((*registry)->Reserve("a", 1000, config.max_size, true, "", fixed).ok());
  }  // b goes: its range is free again
  EXPECT_TRUE((*registry)->Reserve("c", 1000, config.max_size, false, "", fixed).ok());
}

TEST(HeapRegistryTest, FixedAddressRangesAreHeldOnceAndKeptAcrossRestarts) {
  TestDir dir;
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok()) << registry.status();
  const HeapConfig config = Config();
  absl::StatusOr<HeapRegistry::Reservation> a =
      (*registry)->Reserve("a", 0, config.max_size, false, "", FixedPlacement{true, 0});
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t at_a = a->fixed_base();
  // Still only reserved: the next heap goes elsewhere.
  std::optional<HeapRegistry::Reservation> b;
  {
    absl::StatusOr<HeapRegistry::Reservation> reserved =
        (*registry)->Reserve("b", 0, config.max_size, false, "", FixedPlacement{true, 0});
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    b.emplace(*std::move(reserved));
  }
  const uint64_t at_b = b->fixed_base();
  EXPECT_FALSE(FixedRangeOf(at_a, config.max_size).Overlaps(FixedRangeOf(at_b, config.max_size)));
  // A restore keeping a's range beside it: refused, naming a.
  absl::StatusOr<HeapRegistry::Reservation> beside =
      (*registry)->Reserve("c", 0, config.max_size, false, "", FixedPlacement{true, at_a});
  EXPECT_EQ(beside.status().code(), absl::StatusCode::kFailedPrecondition) << beside.status();
  EXPECT_NE(beside.status().message().find("heap a holds"), std::string::npos) << beside.status();
  // A range outside the window (a hostile snapshot's): refused.
  EXPECT_EQ((*registry)
                ->Reserve("d", 0, config.max_size, false, "", FixedPlacement{true, 0x555555554000})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*registry)->Create(*std::move(a), config).ok());
  ASSERT_EQ((*registry)->Get("a").value()->heap->config().fixed_base, at_a);
  b.reset();  // b was not made: its range is free again
  {
    absl::StatusOr<HeapRegistry::Reservation> again =
        (*registry)->Reserve("b", 0, config.max_size, false, "", FixedPlacement{true, 0});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->fixed_base(), at_b);
  }  // released before the registry goes
  ASSERT_TRUE((*registry)->SyncAll().ok());
  registry->reset();

  // Reopened: a keeps its range.
  {
    auto reopened = HeapRegistry::Open(dir.path());
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    absl::StatusOr<std::shared_ptr<ServedHeap>> kept = (*reopened)->Get("a");
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ((*kept)->heap->config().fixed_base, at_a);
  }
  // A copy of a's directory records a's range too: neither is served.
  std::filesystem::copy(dir.Sub("heaps/a"), dir.Sub("heaps/z"),
                        std::filesystem::copy_options::recursive);
  auto reopened = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  const absl::Status original = (*reopened)->Get("a").status();
  EXPECT_EQ(original.code(), absl::StatusCode::kFailedPrecondition) << original;
  EXPECT_NE(original.message().find("overlaps heap z's"), std::string::npos) << original;
  const absl::Status copy = (*reopened)->Get("z").status();
  EXPECT_EQ(copy.code(), absl::StatusCode::kFailedPrecondition) << copy;
  EXPECT_NE(copy.message().find("overlaps heap a's"), std::string::npos) << copy;
  // Removing the copy lets a be served after the next start.
  absl::StatusOr<HeapRegistry::Removed> removed = (*reopened)->Remove("z");
  ASSERT_TRUE(removed.ok()) << removed.status();
  (*reopened)->DeleteRemoved(*std::move(removed));
  reopened->reset();
  reopened = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_TRUE((*reopened)->Get("a").ok());
  // A new heap avoids a's range.
  absl::StatusOr<HeapRegistry::Reservation> next =
      (*reopened)->Reserve("n", 0, config.max_size, false, "", FixedPlacement{true, 0});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(FixedRangeOf(at_a, config.max_size)
                   .Overlaps(FixedRangeOf(next->fixed_base(), config.max_size)));
}

// A fixed-address heap that fails to open keeps its range held (its
// checkpoint says which) until it is removed.
TEST(HeapRegistryTest, AHeapThatFailsToOpenKeepsItsRange) {
  TestDir dir;
  const HeapConfig config = Config(1000);
  UserLimits limits;
  limits.fixed_address_bytes = FixedRangeBytes(config.max_size);  // one heap's
  uint64_t at = 0;
  {
    auto registry = HeapRegistry::Open(dir.path(), HeapOptions(), limits);
    ASSERT_TRUE(registry.ok()) << registry.status();
    absl::StatusOr<HeapRegistry::Reservation> reserved =
        (*registry)->Reserve("f", 1000, config.max_size, false, "", FixedPlacement{true, 0});
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    at = reserved->fixed_base();
    ASSERT_TRUE((*registry)->Create(*std::move(reserved), config).ok());
  }
  // Its data file replaced by a directory: it cannot open; its checkpoint
  // still reads.
  std::filesystem::remove(dir.Sub("heaps/f/data"));
  std::filesystem::create_directory(dir.Sub("heaps/f/data"));
  auto registry = HeapRegistry::Open(dir.path(), HeapOptions(), limits);
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_EQ((*registry)->Broken().count("f"), 1u);
  EXPECT_EQ((*registry)->FixedBytesHeld(), config.max_size + kFixedGuardBytes);
  // It still counts against its owner's share of the window.
  const absl::Status share =
      (*registry)->Reserve("e", 1000, config.max_size, false, "", FixedPlacement{true, 0}).status();
  EXPECT_EQ(share.code(), absl::StatusCode::kResourceExhausted) << share;
  const absl::Status taken =
      (*registry)->Reserve("g", 0, config.max_size, false, "", FixedPlacement{true, at}).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kFailedPrecondition) << taken;
  EXPECT_NE(taken.message().find("heap f holds"), std::string::npos) << taken;
  absl::StatusOr<HeapRegistry::Reservation> other =
      (*registry)->Reserve("h", 0, config.max_size, false, "", FixedPlacement{true, 0});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->fixed_base(), at);
  // Removed, it lets the range go.
  absl::StatusOr<HeapRegistry::Removed> removed = (*registry)->Remove("f");
  ASSERT_TRUE(removed.ok()) << removed.status();
  (*registry)->DeleteRemoved(*std::move(removed));
  EXPECT_TRUE(
      (*registry)->Reserve("g", 0, config.max_size, false, "", FixedPlacement{true, at}).ok());
}

// A restored heap directory renamed into place that then fails to open
// stays a heap that failed to open: listed, holding its range (no other
// heap takes it), removable.
TEST(HeapRegistryTest, ARestoreThatFailsToOpenHoldsItsRangeUntilRemoved) {
  TestDir dir;
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok()) << registry.status();
  const HeapConfig config = Config();
  uint64_t at = 0;
  {
    absl::StatusOr<HeapRegistry::Reservation> reserved =
        (*registry)->Reserve("src", 0, config.max_size, false, "", FixedPlacement{true, 0});
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    at = reserved->fixed_base();
    ASSERT_TRUE((*registry)->Create(*std::move(reserved), config).ok());
  }
  ASSERT_TRUE((*registry)->SyncAll().ok());
  std::filesystem::copy(dir.Sub("heaps/src"), dir.Sub("copy"),
                        std::filesystem::copy_options::recursive);
  absl::StatusOr<HeapRegistry::Removed> removed = (*registry)->Remove("src");
  ASSERT_TRUE(removed.ok()) << removed.status();
  (*registry)->DeleteRemoved(*std::move(removed));
  // The restore: src's files, but a data file that cannot open.
  absl::StatusOr<std::unique_ptr<HeapDirBuilder>> built =
      HeapDirBuilder::Start(dir.Sub("heaps"), "r", HiddenPurpose::kRestoring);
  ASSERT_TRUE(built.ok()) << built.status();
  for (const auto& entry : std::filesystem::directory_iterator(dir.Sub("copy"))) {
    const std::string name = entry.path().filename();
    if (name == "lock") continue;
    if (name == "data") {
      std::filesystem::create_directory((*built)->PathOf(name));
    } else {
      std::filesystem::copy(entry.path(), (*built)->PathOf(name),
                            std::filesystem::copy_options::recursive);
    }
  }
  RestoredHeapDir restored(*std::move(built), config);
  absl::StatusOr<HeapRegistry::Reservation> reserved =
      (*registry)->Reserve("r", 0, config.max_size, false, "", FixedPlacement{true, at});
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  const absl::Status failed = (*registry)->AddRestored(*std::move(reserved), restored).status();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ((*registry)->Get("r").status().code(), failed.code());
  EXPECT_EQ((*registry)->Broken().count("r"), 1u);
  EXPECT_EQ((*registry)->FixedBytesHeld(), FixedRangeBytes(config.max_size));
  const absl::Status taken =
      (*registry)->Reserve("s", 0, config.max_size, false, "", FixedPlacement{true, at}).status();
  EXPECT_NE(taken.message().find("heap r holds"), std::string::npos) << taken;
  removed = (*registry)->Remove("r");
  ASSERT_TRUE(removed.ok()) << removed.status();
  (*registry)->DeleteRemoved(*std::move(removed));
  EXPECT_EQ((*registry)->FixedBytesHeld(), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("heaps/r")));
}

// A call still holding a removed heap (a snapshot, a sync) must not reach
// the files of the heap that takes its name next (a restore replacing it):
// it gets NOT_FOUND, and the new heap's files are untouched.
TEST(HeapRegistryTest, ARemovedHeapStillHeldReachesNoFilesOfItsName) {
  TestDir dir;
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok()) << registry.status();
  auto held = Make(**registry, "h");
  ASSERT_TRUE(held.ok()) << held.status();
  auto removed = (*registry)->Remove("h");
  ASSERT_TRUE(removed.ok()) << removed.status();
  // The name is taken until the heap is marked removed.
  ASSERT_NE(removed->name_held, nullptr);
  EXPECT_EQ(Make(**registry, "h").status().code(), absl::StatusCode::kAlreadyExists);
  (*registry)->DeleteRemoved(*std::move(removed));
  auto successor = Make(**registry, "h");
  ASSERT_TRUE(successor.ok()) << successor.status();
  ASSERT_TRUE((*successor)->heap->Sync(/*client=*/0, {}).ok());
  const uint64_t epoch = (*successor)->heap->epoch();

  bool copied = false;
  const absl::Status snapshot = (*held)->heap->WithCommittedState([&](const CommittedState&) {
    copied = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(snapshot.code(), absl::StatusCode::kNotFound) << snapshot;
  EXPECT_FALSE(copied) << "a snapshot of the removed heap read its successor's files";
  const absl::Status synced = (*held)->heap->Sync(/*client=*/0, {}).status();
  EXPECT_EQ(synced.code(), absl::StatusCode::kNotFound) << synced;
  EXPECT_NE(synced.message().find("was removed"), std::string::npos) << synced;
  held->reset();
  successor->reset();

  registry->reset();
  auto reopened = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto heap = (*reopened)->Get("h");
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->heap->epoch(), epoch);
}

TEST(HeapRegistryTest, ABrokenHeapIsReportedAndLeftAlone) {
  TestDir dir;
  {
    auto registry = HeapRegistry::Open(dir.path());
    ASSERT_TRUE(registry.ok());
    ASSERT_TRUE(Make(**registry, "good").ok());
    ASSERT_TRUE(Make(**registry, "bad").ok());
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir.Sub("heaps/bad"))) {
    if (entry.path().filename().string().rfind("checkpoint", 0) == 0) {
      std::ofstream(entry.path(), std::ios::trunc) << "garbage";
    }
  }
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok());
  EXPECT_TRUE((*registry)->Get("good").ok());
  EXPECT_EQ((*registry)->Broken().count("bad"), 1u);
  EXPECT_FALSE((*registry)->Get("bad").ok());
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("heaps/bad")));
}

// Hidden entries are what interrupted creations, restores and removals
// leave: never served, swept at open.
TEST(HeapRegistryTest, LeftoversOfInterruptedWorkAreSweptNotServed) {
  TestDir dir;
  {
    auto registry = HeapRegistry::Open(dir.path());
    ASSERT_TRUE(registry.ok());
    ASSERT_TRUE(Make(**registry, "h").ok());
  }
  std::filesystem::copy(dir.Sub("heaps/h"), dir.Sub("heaps/.creating.x.0123"));
  std::filesystem::copy(dir.Sub("heaps/h"), dir.Sub("heaps/.restoring.y.4567"));
  std::filesystem::create_directory(dir.Sub("heaps/.removing.z.89ab"));
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok());
  EXPECT_EQ((*registry)->List().size(), 1u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.Sub("heaps")), {}), 1);
}

TEST(HeapRegistryTest, PerUserLimitsCountHeapsAndBytesIncludingReservations) {
  TestDir dir;
  UserLimits limits;
  limits.heaps = 2;
  limits.heap_bytes = 3 * Config().max_size;
  auto registry = HeapRegistry::Open(dir.path(), {}, limits);
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE(Make(**registry, "a", 1000).ok());
  absl::StatusOr<HeapRegistry::Reservation> pending =
      (*registry)->Reserve("b", 1000, Config().max_size);
  ASSERT_TRUE(pending.ok());
  // A reservation counts: a third heap is refused, naming the flag.
  const absl::Status third = Make(**registry, "c", 1000).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("--max_heaps_per_user"), std::string::npos) << third;
  EXPECT_EQ((*registry)->Get("b").status().code(), absl::StatusCode::kUnavailable);
  // Bytes: another user, one heap too big.
  const absl::Status big = (*registry)->Reserve("d", 2000, 4 * Config().max_size).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("--max_heap_bytes_per_user"), std::string::npos) << big;
  EXPECT_EQ((*registry)->HeapBytesLeft(1000), Config().max_size);
  EXPECT_EQ((*registry)->HeapBytesLeft(0), UINT64_MAX);
  // Root is not limited; a released reservation frees its share.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Make(**registry, "root" + std::to_string(i)).ok());
  pending = absl::InternalError("released");
  EXPECT_TRUE(Make(**registry, "c", 1000).ok());
}

// A heapd short of descriptors refuses a new heap before it makes
// anything, naming the limit; the heaps it has stay served.
TEST(HeapRegistryTest, AHeapIsRefusedWhenDescriptorsRunShort) {
  TestDir dir;
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_TRUE(Make(**registry, "first").ok());
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Not even room for the heap itself.
  rlimit tight = saved;
  absl::StatusOr<uint64_t> held = DescriptorsHeld();
  ASSERT_TRUE(held.ok()) << held.status();
  tight.rlim_cur = *held + kDescriptorsPerHeap / 2;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  const absl::Status refused = Make(**registry, "second").status();
  // None left at all, not even to count them with: refused too.
  tight.rlim_cur = *held;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  const absl::Status exhausted = Make(**registry, "second").status();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(exhausted.code(), absl::StatusCode::kResourceExhausted) << exhausted;
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("LimitNOFILE"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("heap second"), std::string::npos) << refused;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/heaps/second"));
  EXPECT_TRUE((*registry)->Get("first").ok());
  // With room again, the name is free.
  EXPECT_TRUE(Make(**registry, "second").ok());
}

TEST(HeapRegistryTest, AStateDirectoryOthersMayWriteIsRefused) {
  TestDir dir;
  std::filesystem::create_directory(dir.Sub("heaps"));
  ASSERT_EQ(chmod(dir.Sub("heaps").c_str(), 0777), 0);
  const absl::Status status = HeapRegistry::Open(dir.path()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

// The per-heap budget of working images: a heap larger than it is direct,
// and says why.
TEST(HeapRegistryTest, AHeapAboveTheWorkingImageBudgetIsDirectAndSaysWhy) {
  TestDir dir;
  HeapOptions options;
  options.working_image_max_bytes = 64 << 20;
  auto registry = HeapRegistry::Open(dir.path(), options);
  ASSERT_TRUE(registry.ok()) << registry.status();
  HeapRegistry& r = **registry;
  EXPECT_EQ(*r.ChooseImage("fits", std::nullopt, "", 64 << 20), ImageMode::kWorkingImage);
  EXPECT_EQ(*r.ChooseImage("big", std::nullopt, "", 66 << 20), ImageMode::kDirect);
  EXPECT_EQ(*r.ChooseImage("big", ImageMode::kDirect, "", 66 << 20), ImageMode::kDirect);
  absl::StatusOr<ImageMode> refused = r.ChooseImage("big", ImageMode::kWorkingImage, "", 66 << 20);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--working_image_max_bytes"), absl::string_view::npos)
      << refused.status();
  HeapConfig config = Config();
  config.max_size = 66 << 20;
  config.image = *r.ChooseImage("big", std::nullopt, "", config.max_size);
  absl::StatusOr<HeapRegistry::Reservation> reserved = r.Reserve("big", 0, config.max_size);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  absl::StatusOr<std::shared_ptr<ServedHeap>> big = r.Create(*std::move(reserved), config);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_FALSE((*big)->heap->content_rollback());
  EXPECT_NE((*big)->heap->content_rollback_note().find("working-image budget of 67108864"),
            std::string::npos)
      << (*big)->heap->content_rollback_note();
}

// Two tiers, on tmpfs and on the test directory's file system (ext4 here).
TEST(HeapRegistryTest, HeapsLiveOnTheirTiersAndAreFoundWhateverTheOrder) {
  TestDir disk;
  TestDir mem("/dev/shm");
  const StorageTier on_mem{"mem", mem.Sub("root")};
  const StorageTier on_disk{"disk", disk.Sub("root")};
  {
    auto registry = HeapRegistry::Open({on_mem, on_disk});
    ASSERT_TRUE(registry.ok()) << registry.status();
    HeapRegistry& r = **registry;
    EXPECT_EQ(*r.ChooseStorage("a", ""), "mem") << "the first tier is the default";
    absl::StatusOr<std::string> unknown = r.ChooseStorage("a", "nvme");
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(unknown.status().message().find("no tier named 'nvme'; its tiers are mem, disk"),
              absl::string_view::npos)
        << unknown.status();
    EXPECT_EQ(r.Reserve("a", 0, 64 << 20, false, "nvme").status().code(),
              absl::StatusCode::kInvalidArgument);
    // Each tier's file system chooses the image.
    EXPECT_EQ(*r.ChooseImage("a", std::nullopt, "mem"), ImageMode::kDirect);
    EXPECT_EQ(*r.ChooseImage("b", std::nullopt, "disk"), ImageMode::kWorkingImage);
    absl::StatusOr<ImageMode> refused = r.ChooseImage("a", ImageMode::kWorkingImage, "mem");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("storage tier mem is on tmpfs,"),
              absl::string_view::npos)
        << refused.status();

    absl::StatusOr<std::shared_ptr<ServedHeap>> a = Make(r, "a");
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->storage, "mem");
    absl::StatusOr<std::shared_ptr<ServedHeap>> b = Make(r, "b", 0, "disk");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->storage, "disk");
    EXPECT_EQ((*b)->heap->config().image, ImageMode::kWorkingImage);
    EXPECT_TRUE(std::filesystem::is_directory(mem.Sub("root/heaps/a")));
    EXPECT_TRUE(std::filesystem::is_directory(disk.Sub("root/heaps/b")));
    EXPECT_FALSE(std::filesystem::exists(disk.Sub("root/heaps/a")));
    // One name space over every tier.
    EXPECT_EQ(Make(r, "b", 0, "mem").status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(*r.HeapsDir("disk"), disk.Sub("root/heaps"));
  }
  // The list reordered: each heap is found on its own tier.
  auto registry = HeapRegistry::Open({on_disk, on_mem});
  ASSERT_TRUE(registry.ok()) << registry.status();
  HeapRegistry& r = **registry;
  ASSERT_EQ(r.List().size(), 2u);
  EXPECT_EQ((*r.Get("a"))->storage, "mem");
  EXPECT_EQ((*r.Get("b"))->storage, "disk");
  EXPECT_EQ((*r.Get("b"))->heap->config().image, ImageMode::kWorkingImage);
  EXPECT_EQ(*r.ChooseStorage("c", ""), "disk");
  // A heap replaced stays on its tier unless one is asked for.
  EXPECT_EQ(*r.ChooseStorage("a", "", /*replacing=*/true), "mem");
  EXPECT_EQ(*r.ChooseStorage("a", "disk", /*replacing=*/true), "disk");
  absl::StatusOr<HeapRegistry::Removed> removed = r.Remove("a");
  ASSERT_TRUE(removed.ok()) << removed.status();
  r.DeleteRemoved(*std::move(removed));
  EXPECT_FALSE(std::filesystem::exists(mem.Sub("root/heaps/a")));
  EXPECT_TRUE(std::filesystem::is_empty(mem.Sub("root/heaps")));
}

TEST(HeapRegistryTest, AHeapNameOnTwoTiersIsServedFromNeither) {
  TestDir dir;
  const StorageTier one{"one", dir.Sub("one")};
  const StorageTier two{"two", dir.Sub("two")};
  for (const StorageTier& tier : {one, two}) {
    auto registry = HeapRegistry::Open({tier});
    ASSERT_TRUE(registry.ok()) << registry.status();
    ASSERT_TRUE(Make(**registry, "x").ok());
    ASSERT_TRUE(Make(**registry, tier.name == "one" ? "only-one" : "only-two").ok());
  }
  for (const std::vector<StorageTier>& order :
       {std::vector<StorageTier>{one, two}, std::vector<StorageTier>{two, one}}) {
    auto registry = HeapRegistry::Open(order);
    ASSERT_TRUE(registry.ok()) << registry.status();
    absl::StatusOr<std::shared_ptr<ServedHeap>> x = (*registry)->Get("x");
    EXPECT_EQ(x.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(x.status().message().find("on tiers " + order[0].name + " and " + order[1].name),
              absl::string_view::npos)
        << x.status();
    EXPECT_EQ((*registry)->List().size(), 2u) << "the others are served";
    EXPECT_EQ((*registry)->Broken().count("x"), 1u);
  }
  // Removed by name: from the first tier holding it; the other is served
  // from the next start on.
  {
    auto registry = HeapRegistry::Open({one, two});
    ASSERT_TRUE(registry.ok());
    absl::StatusOr<HeapRegistry::Removed> removed = (*registry)->Remove("x");
    ASSERT_TRUE(removed.ok()) << removed.status();
    (*registry)->DeleteRemoved(*std::move(removed));
    EXPECT_FALSE(std::filesystem::exists(dir.Sub("one/heaps/x")));
    EXPECT_TRUE(std::filesystem::exists(dir.Sub("two/heaps/x")));
    // The copy left is not served yet, and its name is not free.
    absl::StatusOr<std::shared_ptr<ServedHeap>> left = (*registry)->Get("x");
    EXPECT_NE(left.status().message().find("the one on tier two is served once heapd restarts"),
              absl::string_view::npos)
        << left.status();
    EXPECT_EQ(Make(**registry, "x").status().code(), absl::StatusCode::kAlreadyExists);
    // Nor is a name some tier holds an entry of, heap or not.
    std::filesystem::create_directory_symlink("/tmp", dir.Sub("two/heaps/stray"));
    absl::StatusOr<std::shared_ptr<ServedHeap>> stray = Make(**registry, "stray");
    EXPECT_EQ(stray.status().code(), absl::StatusCode::kAlreadyExists) << stray.status();
    std::filesystem::remove(dir.Sub("two/heaps/stray"));
  }
  auto registry = HeapRegistry::Open({one, two});
  ASSERT_TRUE(registry.ok());
  absl::StatusOr<std::shared_ptr<ServedHeap>> x = (*registry)->Get("x");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ((*x)->storage, "two");
}

TEST(HeapRegistryTest, OneDirectoryIsNotTwoTiers) {
  TestDir dir;
  ASSERT_TRUE(std::filesystem::create_directory(dir.Sub("real")));
  std::filesystem::create_directory_symlink(dir.Sub("real"), dir.Sub("alias"));
  // Through a symlink earlier in the path (a bind mount looks the same).
  auto registry =
      HeapRegistry::Open({{"a", dir.Sub("real/x")}, {"b", dir.Sub("alias/x")}}, HeapOptions{});
  EXPECT_EQ(registry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(registry.status().message().find("storage tiers a and b are the same directory"),
            absl::string_view::npos)
      << registry.status();
}

}  // namespace
}  // namespace heapd
