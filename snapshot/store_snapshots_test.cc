// StoreSnapshots through real RunAs helpers: parts stored and restored
// byte-exact, incremental, shared by two "nodes"; damaged stores refused;
// gc against creates running at the same time; hostile store layouts.
#include "snapshot/store_snapshots.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "allocator/size_class.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"
#include "snapshot/store_recipe.h"
#include "testing/in_process.h"

namespace heapd {
namespace {

const SnapshotCaller kRoot{{0, 0, {}}, true, {}};
const SnapshotCaller kUser{{61001, 61001, {}}, false, {}};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every bound object's bytes, by name.
std::map<std::string, std::string> Objects(const PersistentHeap& heap) {
  std::map<std::string, std::string> objects;
  for (const NameEntry& entry : heap.ListNames("")) {
    std::string bytes(entry.size, '\0');
    EXPECT_EQ(pread(heap.data_fd(), bytes.data(), bytes.size(), static_cast<off_t>(entry.offset)),
              static_cast<ssize_t>(bytes.size()));
    objects[entry.name] = bytes;
  }
  return objects;
}

// One node: a state directory with a heap "h", heapd's own snapshots and
// block cache, and its StoreSnapshots.
struct Node {
  // `dir` on tmpfs: the heap tracks its contents (heap/content_undo.h).
  Node(const std::string& dir, const std::string& name) : dir(dir) {
    std::filesystem::create_directories(dir + "/heaps");
    HeapConfig config;
    config.max_size = uint64_t{128} << 20;
    config.owner_uid = kUser.credentials.uid;
    auto created = PersistentHeap::Create(dir + "/heaps/h", config);
    EXPECT_TRUE(created.ok()) << created.status();
    heap = *std::move(created);
    auto opened = SnapshotStore::Open(dir + "/snapshots", {dir}, {});
    EXPECT_TRUE(opened.ok()) << opened.status();
    snapshots = *std::move(opened);
    StoreSnapshotsOptions options;
    options.node = name;
    options.block_bytes = 256 << 10;
    options.cache_dir = dir + "/block-cache";
    auto store = StoreSnapshots::Open(snapshots.get(), options);
    EXPECT_TRUE(store.ok()) << store.status();
    versions = *std::move(store);
  }

  // A session of the real client on the heap.
  std::unique_ptr<Heap> Attach() {
    auto session = AttachInProcess(heap.get(), next_session++);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  // Runs `work` in a session of the real client, then detaches.
  void InSession(const std::function<void(Heap&)>& work) {
    auto session = AttachInProcess(heap.get(), next_session++);
    ASSERT_TRUE(session.ok()) << session.status();
    work(**session);
    ASSERT_TRUE((*session)->detach().ok());
  }

  absl::StatusOr<v1::SnapshotManifest> Create(const std::string& store, const std::string& name,
                                              const SnapshotCaller& caller = kRoot) {
    v1::HeapInfo source;
    source.set_name("h");
    source.set_owner_uid(heap->config().owner_uid);
    return versions->Create(caller, *heap, "h", source, store, name, {{"step", name}});
  }

  // Restores `which` as heap `as` and opens it.
  absl::StatusOr<std::unique_ptr<PersistentHeap>> Restore(const PartSelector& which,
                                                          const std::string& as,
                                                          uint64_t* fetched = nullptr,
                                                          const SnapshotCaller& caller = kRoot) {
    RestoreOptions options;
    options.owner_uid = kUser.credentials.uid;
    v1::SnapshotManifest manifest;
    auto restored = versions->Restore(caller, which, dir + "/heaps", as, options, &manifest);
    if (!restored.ok()) return restored.status();
    if (absl::Status s = (*restored)->Commit(as); !s.ok()) return s;
    if (fetched != nullptr) *fetched = manifest.store().fetched_blocks();
    return PersistentHeap::Open(dir + "/heaps/" + as);
  }

  std::string dir;
  std::unique_ptr<PersistentHeap> heap;
  std::unique_ptr<SnapshotStore> snapshots;
  std::unique_ptr<StoreSnapshots> versions;
  ClientId next_session = 1;
};

class StoreSnapshotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (store workers switch users)";
    store_ = dir_.Sub("store");
    std::filesystem::create_directories(store_);
  }
  // Fills heap objects obj-0..obj-N (some large, one byte repeated).
  static void Fill(Heap& heap, int objects) {
    for (int i = 0; i < objects; ++i) {
      const uint64_t size = i % 5 == 4 ? (3 << 20) : 1000 + 300 * i;
      auto* object = static_cast<char*>(*heap.allocate(size));
      std::memset(object, 'a' + i, size);
      ASSERT_TRUE(heap.Bind("obj-" + std::to_string(i), object, size, "bytes").ok());
    }
    // Freed before the sync: its chunks are free at the epoch, never stored.
    ASSERT_TRUE(heap.deallocate(*heap.allocate(20 << 20), 20 << 20).ok());
  }

  TestDir dir_{"/tmp"};  // users' children must reach it
  std::string store_;
};

TEST_F(StoreSnapshotsTest, VersionsRestoreExactlyAndShareTheirUnchangedBlocks) {
  Node node(dir_.Sub("a"), "node-a");
  node.InSession([](Heap& heap) { Fill(heap, 20); });
  const auto at_v1 = Objects(*node.heap);
  auto first = node.Create(store_, "v1");
  ASSERT_TRUE(first.ok()) << first.status();
  const v1::StoreUsage& usage = first->store();
  // Blocks of the same bytes are stored once even within a version; free
  // chunks and zeros are holes, never read.
  EXPECT_GT(usage.blocks_written(), 0u);
  EXPECT_LT(usage.blocks_written(), usage.blocks());
  EXPECT_LT(usage.blocks() * (256 << 10), node.heap->capacity_bytes() / 2) << usage.blocks();
  // Only chunks in use are read: the small-object chunks and the large
  // objects (4 of 3 MiB: 2 chunks each), not the freed 20 MiB.
  EXPECT_LE(usage.hashed_bytes(), uint64_t{40} << 20) << usage.hashed_bytes();
  EXPECT_EQ(node.Create(store_, "v1").status().code(), absl::StatusCode::kAlreadyExists);

  node.InSession([](Heap& heap) {
    auto object = heap.Find("obj-3", "bytes", 1);
    ASSERT_TRUE(object.ok());
    std::memcpy(*object, "changed", 7);
  });
  const auto at_v2 = Objects(*node.heap);
  auto second = node.Create(store_, "v2");
  ASSERT_TRUE(second.ok()) << second.status();
  // One data block changed, and the metadata.
  EXPECT_LE(second->store().blocks_written(), 4u) << second->store().DebugString();

  auto listed = node.versions->List(kRoot, store_, "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].name(), "v1");
  EXPECT_EQ((*listed)[0].node(), "node-a");
  EXPECT_EQ((*listed)[0].labels().at("step"), "v1");
  EXPECT_EQ((*listed)[1].store().blocks_written(), second->store().blocks_written());

  // Restored on a node holding none of the blocks: everything fetched;
  // then the next version: only what changed.
  Node other(dir_.Sub("b"), "node-b");
  uint64_t fetched = 0;
  auto v1 = other.Restore({store_, "v1", "", ""}, "v1", &fetched);
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(Objects(**v1), at_v1);
  EXPECT_GE(fetched, usage.blocks_written());
  auto v2 = other.Restore({store_, "v2", "", ""}, "v2", &fetched);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(Objects(**v2), at_v2);
  EXPECT_LE(fetched, 4u);
  EXPECT_EQ((*v2)->config().owner_uid, kUser.credentials.uid);
  EXPECT_TRUE((*v2)->CheckInvariants().ok());

  auto verified = node.versions->Verify(kRoot, {store_, "", "", ""});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->size(), 2u);
  auto du = node.versions->Usage(kRoot, store_);
  ASSERT_TRUE(du.ok()) << du.status();
  ASSERT_EQ(du->parts_size(), 2);
  // Most blocks are shared: each version's exclusive bytes are a sliver.
  // Most of each version's blocks are the other's too: stored once.
  uint64_t named = 0;
  for (const v1::SnapshotManifest& part : du->parts()) {
    EXPECT_LT(part.store().exclusive_bytes(), part.store().stored_bytes())
        << part.name() << ": " << part.store().DebugString();
    named += part.store().stored_bytes();
  }
  EXPECT_LT(du->stored_bytes(), named);
  EXPECT_LT(du->stored_bytes(), du->logical_bytes() / 1000);
}

// A heap that tracks its contents, written by a session that stays
// attached: each create reads only the chunks heapd knows changed since
// this node's last part (reusing the rest), and restores stay exact,
// including stores made after a create's mark without a new pre-image.
TEST_F(StoreSnapshotsTest, ChunksKnownUnchangedAreNotReadAgain) {
  TestDir shm("/dev/shm");
  Node node(shm.Sub("a"), "node-a");
  ASSERT_TRUE(node.heap->Stats().content_rollback);
  node.InSession([](Heap& heap) { Fill(heap, 20); });
  auto first = node.Create(store_, "v1");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->store().reused_blocks(), 0u);
  EXPECT_FALSE(first->store().changes_token().empty());

  std::unique_ptr<Heap> session = node.Attach();
  ASSERT_NE(session, nullptr);
  Heap& heap = *session;
  auto object = [&](const std::string& name) {
    auto found = heap.Find(name, "bytes", 1);
    EXPECT_TRUE(found.ok()) << found.status();
    return static_cast<char*>(*found);
  };
  // obj-4 is 3 MiB: its first chunk changes.
  std::memcpy(object("obj-4"), "changed", 7);
  ASSERT_TRUE(heap.sync().ok());
  const auto at_v2 = Objects(*node.heap);
  auto second = node.Create(store_, "v2");
  ASSERT_TRUE(second.ok()) << second.status();
  const v1::StoreUsage& usage = second->store();
  EXPECT_GT(usage.reused_blocks(), 0u) << usage.DebugString();
  EXPECT_FALSE(usage.data_reused());
  EXPECT_LE(usage.hashed_bytes(), kChunkSize) << usage.DebugString();

  // A store before v3 (its page's pre-image taken), another to the same
  // page after v3's mark (none taken: same generation), then a sync: v4
  // has the second.
  std::memcpy(object("obj-9") + 100, "before v3", 9);
  auto third = node.Create(store_, "v3");
  ASSERT_TRUE(third.ok()) << third.status();
  std::memcpy(object("obj-9") + 100, "after v3!", 9);
  ASSERT_TRUE(heap.sync().ok());
  const auto at_v4 = Objects(*node.heap);
  auto fourth = node.Create(store_, "v4");
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_GT(fourth->store().reused_blocks(), 0u);
  ASSERT_TRUE(heap.detach().ok());

  Node other(dir_.Sub("b"), "node-b");
  auto v2 = other.Restore({store_, "v2", "", ""}, "v2");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(Objects(**v2), at_v2);
  auto v4 = other.Restore({store_, "v4", "", ""}, "v4");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(Objects(**v4), at_v4);
  EXPECT_EQ(Objects(**v4).at("obj-9").substr(100, 9), "after v3!");
  auto verified = node.versions->Verify(kRoot, {store_, "", "", ""});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->size(), 4u);
}

// A store whose pre-image could not be appended (here the journal cannot
// grow: RLIMIT_FSIZE) goes through unseen; the client says so with its
// sync, and the next create reads every chunk instead of reusing blocks.
TEST_F(StoreSnapshotsTest, StoresTheTrackerCouldNotJournalAreNotMissed) {
  TestDir shm("/dev/shm");
  Node node(shm.Sub("a"), "node-a");
  node.InSession([](Heap& heap) { Fill(heap, 10); });
  ASSERT_TRUE(node.Create(store_, "v1").ok());
  std::unique_ptr<Heap> session = node.Attach();
  ASSERT_NE(session, nullptr);
  Heap& heap = *session;
  auto object = heap.Find("obj-4", "bytes", 1);
  ASSERT_TRUE(object.ok()) << object.status();
  signal(SIGXFSZ, SIG_IGN);
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit tiny = old;
  tiny.rlim_cur = 1;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  std::memcpy(*object, "unseen", 6);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_DFL);
  // The sync commits, and reports the pre-image it could not take.
  EXPECT_EQ(heap.sync().status().code(), absl::StatusCode::kDataLoss);
  const auto at_v2 = Objects(*node.heap);
  auto second = node.Create(store_, "v2");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->store().reused_blocks(), 0u) << second->store().DebugString();
  ASSERT_TRUE(heap.detach().ok());
  Node other(dir_.Sub("b"), "node-b");
  auto v2 = other.Restore({store_, "v2", "", ""}, "v2");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(Objects(**v2).at("obj-4").substr(0, 6), "unseen");
  EXPECT_EQ(Objects(**v2), at_v2);
}

// Two nodes add their parts to one job version; a restore names a part,
// or takes this node's.
TEST_F(StoreSnapshotsTest, TwoNodesAddPartsToOneVersion) {
  Node a(dir_.Sub("a"), "node-a");
  Node b(dir_.Sub("b"), "node-b");
  a.InSession([](Heap& heap) { Fill(heap, 6); });
  b.InSession([](Heap& heap) { Fill(heap, 9); });
  const auto objects_a = Objects(*a.heap);
  const auto objects_b = Objects(*b.heap);
  std::thread other([&] { ASSERT_TRUE(b.Create(store_, "job-42").ok()); });
  ASSERT_TRUE(a.Create(store_, "job-42").ok());
  other.join();
  auto listed = a.versions->List(kRoot, store_, "job-42");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  Node c(dir_.Sub("c"), "node-c");
  const absl::Status ambiguous = c.Restore({store_, "job-42", "", ""}, "x").status();
  EXPECT_EQ(ambiguous.code(), absl::StatusCode::kFailedPrecondition) << ambiguous;
  EXPECT_NE(ambiguous.message().find("node-a/h"), std::string::npos) << ambiguous;
  auto from_b = c.Restore({store_, "job-42", "node-b", "h"}, "b-h");
  ASSERT_TRUE(from_b.ok()) << from_b.status();
  EXPECT_EQ(Objects(**from_b), objects_b);
  // Node a's own part, unnamed.
  auto own = a.Restore({store_, "job-42", "", ""}, "h2");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(Objects(**own), objects_a);
  EXPECT_EQ(c.Restore({store_, "job-42", "node-z", ""}, "y").status().code(),
            absl::StatusCode::kNotFound);
}

// Nothing read from a store is trusted.
TEST_F(StoreSnapshotsTest, ADamagedRecipeOrBlockIsDataLossAndLeavesNothing) {
  Node node(dir_.Sub("a"), "node-a");
  node.InSession([](Heap& heap) { Fill(heap, 5); });
  ASSERT_TRUE(node.Create(store_, "v1").ok());
  const std::string recipe = store_ + "/versions/v1/node-a/h.recipe";
  const std::string good = ReadFile(recipe);
  auto decoded = DecodeRecipeFile(good, "v1");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  Node other(dir_.Sub("b"), "node-b");
  auto expect_loss = [&](const std::string& why) {
    const absl::Status restored = other.Restore({store_, "v1", "", ""}, "r").status();
    EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss) << why << ": " << restored;
    EXPECT_EQ(other.versions->Verify(kRoot, {store_, "v1", "", ""}).status().code(),
              absl::StatusCode::kDataLoss)
        << why;
    // No heap, and no half-built one.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(other.dir + "/heaps"), {}), 1)
        << why;
  };
  RecipeFile lying = *decoded;
  lying.recipe.mutable_data_blocks()->append(std::string(32, '\0'));
  std::ofstream(recipe, std::ios::binary | std::ios::trunc) << EncodeRecipeFile(lying);
  expect_loss("a block too many");
  lying = *decoded;
  lying.manifest_json = "{\"name\": \"v1\", \"heap\": \"../../etc\"}";
  std::ofstream(recipe, std::ios::binary | std::ios::trunc) << EncodeRecipeFile(lying);
  expect_loss("a manifest naming another heap");
  std::ofstream(recipe, std::ios::binary | std::ios::trunc) << "not a recipe";
  expect_loss("garbage");
  std::ofstream(recipe, std::ios::binary | std::ios::trunc) << good;
  ASSERT_TRUE(other.versions->Verify(kRoot, {store_, "v1", "", ""}).ok());

  // A data block changed under its name, then lost.
  std::string id;
  const std::string& blocks = decoded->recipe.data_blocks();
  for (size_t i = 0; i * 32 < blocks.size() && id.empty(); ++i) {
    const BlockId block = BlockId::FromRaw(PackedId(blocks, i).data());
    if (!block.IsZero()) id = block.Hex();
  }
  const std::string path = store_ + "/blocks/" + id.substr(0, 2) + "/" + id;
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);
    file.put('!');
  }
  expect_loss("a changed block");
  std::filesystem::remove(path);
  expect_loss("a lost block");
}

// gc removes what no version names, and never what a create running at
// the same time (on another node) is about to name.
TEST_F(StoreSnapshotsTest, GcRunningWithCreatesLosesNoBlock) {
  Node a(dir_.Sub("a"), "node-a");
  Node b(dir_.Sub("b"), "node-b");
  a.InSession([](Heap& heap) { Fill(heap, 10); });
  ASSERT_TRUE(a.Create(store_, "v0").ok());
  ASSERT_EQ(a.versions->Remove(kRoot, {store_, "v0", "", ""}).status().code(),
            absl::StatusCode::kOk);
  auto swept = a.versions->CollectGarbage(kRoot, store_, absl::ZeroDuration(), false);
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_GT(swept->blocks_removed(), 0u);
  EXPECT_EQ(swept->blocks_kept(), 0u);

  std::atomic<bool> done{false};
  std::thread collector([&] {
    while (!done) {
      auto result = b.versions->CollectGarbage(kRoot, store_, absl::ZeroDuration(), false);
      EXPECT_TRUE(result.ok()) << result.status();
      (void)b.versions->Verify(kRoot, {store_, "", "", ""});  // reads race removals: any answer
    }
  });
  for (int round = 0; round < 12; ++round) {
    a.InSession([&](Heap& heap) {
      auto object = heap.Find("obj-" + std::to_string(round % 10), "bytes", 1);
      ASSERT_TRUE(object.ok());
      std::memset(*object, 'A' + round, 100);
    });
    const std::string name = "v" + std::to_string(round + 1);
    ASSERT_TRUE(a.Create(store_, name).ok());
    // Each older version removed at once: its blocks, shared with the
    // next, are what a careless gc would take.
    if (round > 0) {
      ASSERT_TRUE(a.versions->Remove(kRoot, {store_, "v" + std::to_string(round), "", ""}).ok());
    }
  }
  done = true;
  collector.join();
  auto verified = a.versions->Verify(kRoot, {store_, "v12", "", ""});
  ASSERT_TRUE(verified.ok()) << verified.status();
  auto restored = b.Restore({store_, "v12", "", ""}, "r");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Objects(**restored), Objects(*a.heap));
}

// The store is worked in with the caller's rights only: a user cannot
// write where the user may not, and a symlink planted in a store is not
// followed.
TEST_F(StoreSnapshotsTest, AUserWorksInAStoreWithTheUsersRightsOnly) {
  Node node(dir_.Sub("a"), "node-a");
  node.InSession([](Heap& heap) { Fill(heap, 3); });
  chmod(dir_.path().c_str(), 0755);
  // Root's store: the user may not write in it.
  EXPECT_EQ(node.Create(store_, "v1", kUser).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(std::filesystem::exists(store_ + "/versions/v1"));
  // The user's store, whose blocks/ leads into root's directory.
  const std::string mine = dir_.Sub("mine");
  const std::string roots = dir_.Sub("roots");
  std::filesystem::create_directories(mine);
  std::filesystem::create_directories(roots);
  chown(mine.c_str(), kUser.credentials.uid, kUser.credentials.gid);
  std::filesystem::create_symlink(roots, mine + "/blocks");
  EXPECT_FALSE(node.Create(mine, "v1", kUser).ok());
  EXPECT_TRUE(std::filesystem::is_empty(roots));
  std::filesystem::remove(mine + "/blocks");
  auto made = node.Create(mine, "v1", kUser);
  ASSERT_TRUE(made.ok()) << made.status();
  struct stat st;
  ASSERT_EQ(stat((mine + "/versions/v1/node-a/h.recipe").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUser.credentials.uid);
  // heapd's state directory is never a store.
  EXPECT_EQ(node.Create(node.dir, "v2").status().code(), absl::StatusCode::kInvalidArgument);
}

// The node's block cache serves a user only blocks that user fetched: a
// recipe naming another user's blocks (their ids are no secret) gets none
// of their bytes.
TEST_F(StoreSnapshotsTest, TheNodeCacheGivesNoUserAnothersBlocks) {
  const SnapshotCaller other{{61002, 61002, {}}, false, {}};
  Node node(dir_.Sub("a"), "node-a");
  node.InSession([](Heap& heap) { Fill(heap, 6); });
  chmod(dir_.path().c_str(), 0755);
  const std::string mine = dir_.Sub("mine");
  const std::string theirs = dir_.Sub("theirs");
  std::filesystem::create_directories(mine);
  std::filesystem::create_directories(theirs);
  ASSERT_EQ(chown(mine.c_str(), kUser.credentials.uid, kUser.credentials.gid), 0);
  ASSERT_EQ(chown(theirs.c_str(), 61002, 61002), 0);
  chmod(mine.c_str(), 0700);
  ASSERT_TRUE(node.Create(mine, "v1", kUser).ok());
  Node restorer(dir_.Sub("b"), "node-b");
  uint64_t fetched = 0;
  auto own = restorer.Restore({mine, "v1", "", ""}, "own", &fetched, kUser);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_GT(fetched, 0u);
  auto again = restorer.Restore({mine, "v1", "", ""}, "again", &fetched, kUser);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(fetched, 0u);  // the user's own cache
  // The other user's store: a copy of the recipe, no blocks.
  const std::string recipe = "/versions/v1/node-a";
  std::filesystem::create_directories(theirs + recipe);
  std::filesystem::copy_file(mine + recipe + "/h.recipe", theirs + recipe + "/h.recipe");
  for (const auto& entry : std::filesystem::recursive_directory_iterator(theirs)) {
    ASSERT_EQ(lchown(entry.path().c_str(), 61002, 61002), 0);
  }
  const absl::Status stolen =
      restorer.Restore({theirs, "v1", "", ""}, "stolen", nullptr, other).status();
  EXPECT_EQ(stolen.code(), absl::StatusCode::kDataLoss) << stolen;
}

// gc stops at a version it cannot read instead of taking its blocks; a
// block a killed gc left set aside is still read.
TEST_F(StoreSnapshotsTest, GcTakesNothingOfAVersionItCannotReadAndAsideBlocksAreRead) {
  Node node(dir_.Sub("a"), "node-a");
  node.InSession([](Heap& heap) { Fill(heap, 6); });
  chmod(dir_.path().c_str(), 0755);
  const std::string mine = dir_.Sub("mine");
  std::filesystem::create_directories(mine);
  ASSERT_EQ(chown(mine.c_str(), kUser.credentials.uid, kUser.credentials.gid), 0);
  ASSERT_TRUE(node.Create(mine, "v1", kUser).ok());
  chmod((mine + "/versions/v1").c_str(), 0);
  auto swept = node.versions->CollectGarbage(kUser, mine, absl::ZeroDuration(), false);
  EXPECT_FALSE(swept.ok());
  chmod((mine + "/versions/v1").c_str(), 0755);
  ASSERT_TRUE(node.versions->Verify(kUser, {mine, "v1", "", ""}).ok());
  // A block renamed aside (as by a gc killed before it put it back).
  std::string block;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(mine + "/blocks")) {
    if (entry.is_regular_file()) block = entry.path().string();
  }
  ASSERT_FALSE(block.empty());
  const std::filesystem::path path(block);
  std::filesystem::rename(path, path.parent_path() / (".trash-" + path.filename().string()));
  auto verified = node.versions->Verify(kUser, {mine, "v1", "", ""});
  EXPECT_TRUE(verified.ok()) << verified.status();
  // The next gc puts it back in place.
  auto collected = node.versions->CollectGarbage(kUser, mine, absl::ZeroDuration(), false);
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_TRUE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace heapd
