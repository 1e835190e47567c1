#include "snapshot/snapshot_store.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "heap/heap.h"
#include "heap/test_dir.h"
#include "testing/in_process.h"

namespace heapd {
namespace {

const SnapshotCaller kRoot{{0, 0, {}}, true, {}};
// An unprivileged user with no passwd entry.
const SnapshotCaller kUser{{61001, 61001, {}}, false, {}};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

size_t Entries(const std::string& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

// A heap with objects, contents and names, synced.
std::unique_ptr<PersistentHeap> MakeHeap(const std::string& dir) {
  HeapConfig config;
  config.max_size = uint64_t{256} << 20;
  config.owner_uid = 4242;
  config.mode = 0640;
  auto heap = PersistentHeap::Create(dir, config);
  EXPECT_TRUE(heap.ok()) << heap.status();
  auto session = AttachInProcess(heap->get(), 1);
  EXPECT_TRUE(session.ok()) << session.status();
  for (uint64_t i = 0; i < 5000; ++i) {
    auto* object = static_cast<uint64_t*>(*(*session)->allocate(16 + i % 300));
    *object = i * 7;
    if (i % 1000 == 0) {
      NameEntry entry{
          "object-" + std::to_string(i), (*session)->offset_of(object), 16 + i % 300, "u64", 0, 1};
      EXPECT_TRUE((*heap)->Bind(1, entry).ok());
    }
  }
  std::memset(*(*session)->allocate(5 << 20), 0xab, 5 << 20);
  EXPECT_TRUE((*session)->detach().ok());
  return *std::move(heap);
}

v1::HeapInfo Source(const PersistentHeap& heap) {
  v1::HeapInfo info;
  info.set_name("h");
  info.set_owner_uid(heap.config().owner_uid);
  info.set_mode(heap.config().mode);
  return info;
}

// A state directory with heaps/ and snapshots/ (heapd's own), and a target
// directory outside it.
class SnapshotStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (snapshot workers switch users)";
    std::filesystem::create_directories(dir_.Sub("state/heaps"));
    std::filesystem::create_directories(dir_.Sub("target"));
    chmod(dir_.path().c_str(), 0755);
    auto store = SnapshotStore::Open(dir_.Sub("state/snapshots"), {dir_.Sub("state")}, {});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    heap_ = MakeHeap(dir_.Sub("state/heaps/h"));
  }

  absl::StatusOr<v1::SnapshotManifest> Create(const SnapshotCaller& caller, const SnapshotRef& ref,
                                              std::map<std::string, std::string> labels = {}) {
    return store_->Create(caller, *heap_, "h", Source(*heap_), ref, labels);
  }

  TestDir dir_{"/tmp"};
  std::unique_ptr<SnapshotStore> store_;
  std::unique_ptr<PersistentHeap> heap_;
};

TEST_F(SnapshotStoreTest, ASnapshotOpensInPlaceAndRestoresAsTheHeapAtItsEpoch) {
  for (const std::string& target : {std::string(), dir_.Sub("target")}) {
    SCOPED_TRACE(target.empty() ? "heapd's own directory" : "a caller's directory");
    absl::StatusOr<v1::SnapshotManifest> manifest =
        Create(kRoot, {target, "s1"}, {{"slurm_job_id", "42"}});
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->epoch(), heap_->epoch());
    EXPECT_EQ(manifest->labels().at("slurm_job_id"), "42");
    EXPECT_EQ(manifest->data_bytes(), heap_->capacity_bytes());
    EXPECT_FALSE(manifest->copy_method().empty());
    EXPECT_TRUE(manifest->metadata_crc32().count("checkpoint"));
    const std::string dir = (target.empty() ? dir_.Sub("state/snapshots") : target) + "/s1";
    EXPECT_EQ(ReadAll(dir + "/data"), ReadAll(dir_.Sub("state/heaps/h/data")));
    ASSERT_TRUE(store_->Verify(kRoot, {target, "s1"}, kMaxHeapBytes).ok());

    // In place: the same allocations and names, read-only.
    v1::SnapshotManifest opened_manifest;
    auto opened = store_->OpenInPlace(kRoot, {target, "s1"}, kMaxHeapBytes, 0, &opened_manifest);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_TRUE((*opened)->read_only());
    EXPECT_EQ((*opened)->epoch(), manifest->epoch());
    EXPECT_EQ((*opened)->Stats().directory.live_objects, heap_->Stats().directory.live_objects);
    EXPECT_EQ((*opened)->ListNames(""), heap_->ListNames(""));
    EXPECT_EQ((*opened)->LeaseChunks(1, 0, 1).status().code(),
              absl::StatusCode::kFailedPrecondition);

    // Restored: a heap of the caller's, with the same contents.
    RestoreOptions options;
    options.owner_uid = 7;
    options.owner_gid = 8;
    v1::SnapshotManifest restored_manifest;
    auto restored = store_->Restore(kRoot, {target, "s1"}, dir_.Sub("state/heaps"), "r", options,
                                    &restored_manifest);
    ASSERT_TRUE(restored.ok()) << restored.status();
    ASSERT_TRUE((*restored)->Commit("r").ok());
    auto reopened = PersistentHeap::Open(dir_.Sub("state/heaps/r"));
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    EXPECT_EQ((*reopened)->config().owner_uid, 7u);
    EXPECT_EQ((*reopened)->config().owner_gid, 8u);
    EXPECT_EQ((*reopened)->config().mode, 0640u);
    EXPECT_EQ((*reopened)->epoch(), manifest->epoch());
    EXPECT_EQ((*reopened)->ListNames(""), heap_->ListNames(""));
    EXPECT_EQ((*reopened)->PersistedChunks().size(), heap_->PersistedChunks().size());
    EXPECT_EQ(ReadAll(dir_.Sub("state/heaps/r/data")), ReadAll(dir + "/data"));
    reopened->reset();
    std::filesystem::remove_all(dir_.Sub("state/heaps/r"));

    auto listed = store_->List(kRoot, target);
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->snapshots_size(), 1) << listed->DebugString();
    EXPECT_EQ(listed->snapshots(0).name(), "s1");
    EXPECT_TRUE(listed->skipped().empty()) << listed->DebugString();
    ASSERT_TRUE(store_->Remove(kRoot, {target, "s1"}).ok());
    EXPECT_EQ(store_->Remove(kRoot, {target, "s1"}).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(Entries(target.empty() ? dir_.Sub("state/snapshots") : target), 0u);
    EXPECT_EQ(Entries(dir_.Sub("state/heaps")), 1u);  // no leftovers of the restore
  }
}

// Chunks the snapshot's epoch does not use are not copied: their bytes
// never matter (free memory), and read as zeros in the copy.
TEST_F(SnapshotStoreTest, OnlyTheChunksInUseAreCopied) {
  auto session = AttachInProcess(heap_.get(), 2);
  ASSERT_TRUE(session.ok()) << session.status();
  char* freed = static_cast<char*>(*(*session)->allocate(6 << 20));
  const uint64_t freed_at = (*session)->offset_of(freed);
  std::memset(freed, 0xcd, 6 << 20);
  ASSERT_TRUE((*session)->sync().ok());
  ASSERT_TRUE((*session)->deallocate(freed).ok());
  ASSERT_TRUE((*session)->detach().ok());
  // On a heap that tracks contents (tmpfs) the free persists with the
  // next epoch: commit one.
  auto next = AttachInProcess(heap_.get(), 3);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE((*next)->sync().ok());
  ASSERT_TRUE((*next)->detach().ok());

  absl::StatusOr<v1::SnapshotManifest> manifest = Create(kRoot, {dir_.Sub("target"), "s"});
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  if (manifest->copy_method() == "reflink") {
    GTEST_SKIP() << "a reflink shares the whole file, the free chunks too";
  }
  const std::string copy = ReadAll(dir_.Sub("target/s/data"));
  const std::string data = ReadAll(dir_.Sub("state/heaps/h/data"));
  ASSERT_EQ(copy.size(), data.size());
  ASSERT_EQ(data.substr(freed_at, 6 << 20), std::string(6 << 20, '\xcd'));
  EXPECT_EQ(copy.substr(freed_at, 6 << 20), std::string(6 << 20, '\0'));
  EXPECT_EQ(copy.substr(0, freed_at), data.substr(0, freed_at));  // MakeHeap's objects
  // Opened in place, it holds what the heap holds.
  v1::SnapshotManifest opened_manifest;
  auto opened =
      store_->OpenInPlace(kRoot, {dir_.Sub("target"), "s"}, kMaxHeapBytes, 0, &opened_manifest);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->Stats().directory.live_objects, heap_->Stats().directory.live_objects);
  EXPECT_EQ((*opened)->PersistedChunks().size(), heap_->PersistedChunks().size());
}

TEST_F(SnapshotStoreTest, BadRequestsChangeNothing) {
  const std::string target = dir_.Sub("target");
  ASSERT_TRUE(Create(kRoot, {target, "s"}).ok());
  EXPECT_EQ(Create(kRoot, {target, "s"}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Create(kRoot, {target, "../x"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Create(kRoot, {target, "t"}, {{"", "x"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Create(kRoot, {"relative/dir", "t"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Create(kRoot, {dir_.Sub("none"), "t"}).status().code(), absl::StatusCode::kNotFound);
  // heapd's state directory is never a target, not even for root.
  EXPECT_EQ(Create(kRoot, {dir_.Sub("state/heaps"), "t"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Entries(target), 1u);
  EXPECT_EQ(Entries(dir_.Sub("state/heaps")), 1u);
}

TEST_F(SnapshotStoreTest, VerifyFindsACorruptFile) {
  const std::string target = dir_.Sub("target");
  ASSERT_TRUE(Create(kRoot, {target, "s"}).ok());
  {
    std::fstream checkpoint(target + "/s/checkpoint", std::ios::in | std::ios::out);
    checkpoint.seekp(20);
    checkpoint.put('\x5a');
  }
  const absl::Status verified = store_->Verify(kRoot, {target, "s"}, kMaxHeapBytes).status();
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(verified.message().find("checkpoint"), absl::string_view::npos) << verified;
  EXPECT_EQ(store_->Verify(kRoot, {target, "none"}, kMaxHeapBytes).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Create(kRoot, {target, "t"}).ok());
  ASSERT_EQ(truncate((target + "/t/data").c_str(), 1 << 20), 0);
  EXPECT_EQ(store_->Verify(kRoot, {target, "t"}, kMaxHeapBytes).status().code(),
            absl::StatusCode::kDataLoss);
}

// Work in a caller's directory is done as the caller: a user cannot write
// where only root may, and what a user makes is the user's.
TEST_F(SnapshotStoreTest, ACallersDirectoryIsWorkedInWithTheCallersRights) {
  const std::string root_only = dir_.Sub("target");
  chmod(root_only.c_str(), 0755);
  EXPECT_EQ(Create(kUser, {root_only, "s"}).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Entries(root_only), 0u);
  const std::string users = dir_.Sub("users");
  std::filesystem::create_directory(users);
  ASSERT_EQ(chown(users.c_str(), 61001, 61001), 0);
  absl::StatusOr<v1::SnapshotManifest> manifest = Create(kUser, {users, "s"});
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->created_by_uid(), 61001u);
  for (const std::string& file : {users + "/s", users + "/s/data", users + "/s/manifest.json"}) {
    struct stat st;
    ASSERT_EQ(stat(file.c_str(), &st), 0) << file;
    EXPECT_EQ(st.st_uid, 61001u) << file;
  }
  // heapd's own directory: others see and remove only what they may.
  ASSERT_TRUE(Create(kRoot, {"", "mine"}).ok());
  const SnapshotCaller other{{61002, 61002, {}}, false, {}};
  EXPECT_EQ(store_->Verify(other, {"", "mine"}, kMaxHeapBytes).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store_->Remove(other, {"", "mine"}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(store_->List(other, "")->snapshots().empty());
  EXPECT_TRUE(store_->List(other, "")->skipped().empty());  // not even named
  const SnapshotCaller owner{{4242, 4242, {}}, false, {}};  // the source heap's owner
  EXPECT_TRUE(store_->Verify(owner, {"", "mine"}, kMaxHeapBytes).ok());
  EXPECT_EQ(store_->List(owner, "")->snapshots_size(), 1);
  EXPECT_TRUE(store_->Remove(owner, {"", "mine"}).ok());
}

// A target file system too small for the snapshot: stood in for by a file
// size limit (EFBIG, as ENOSPC: RESOURCE_EXHAUSTED), in a child process.
TEST_F(SnapshotStoreTest, AFullTargetLeavesNoSnapshotAndTheHeapIntact) {
  const std::string target = dir_.Sub("target");
  const std::string before = ReadAll(dir_.Sub("state/heaps/h/data"));
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit limit{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status status = Create(kRoot, {target, "s"}).status();
    _exit(status.code() == absl::StatusCode::kResourceExhausted ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(Entries(target), 0u);
  EXPECT_EQ(ReadAll(dir_.Sub("state/heaps/h/data")), before);
  EXPECT_TRUE(heap_->CheckInvariants().ok());
}

// A snapshot killed midway (SIGKILL while it copies) leaves nothing that
// lists as a snapshot, the heap intact, and the next try succeeds.
TEST_F(SnapshotStoreTest, AKilledSnapshotLeavesNoSnapshot) {
  const std::string target = dir_.Sub("target");
  const std::string before = ReadAll(dir_.Sub("state/heaps/h/data"));
  for (int delay_us : {0, 200, 2000, 20000}) {
    const pid_t child = fork();
    if (child == 0) {
      (void)Create(kRoot, {target, "s"});
      _exit(0);
    }
    usleep(delay_us);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    usleep(20000);  // the helper stops once its channel to the dead caller closes
    if (std::filesystem::exists(target + "/s")) {
      EXPECT_TRUE(
          store_->Verify(kRoot, {target, "s"}, kMaxHeapBytes).ok());  // it had finished: whole
      std::filesystem::remove_all(target + "/s");
    }
    EXPECT_TRUE(store_->List(kRoot, target)->snapshots().empty());
  }
  EXPECT_EQ(ReadAll(dir_.Sub("state/heaps/h/data")), before);
  ASSERT_TRUE(Create(kRoot, {target, "s"}).ok());
  EXPECT_EQ(Entries(target), 1u);
  EXPECT_TRUE(store_->Verify(kRoot, {target, "s"}, kMaxHeapBytes).ok());
}

// Mounts a file system made by `make_fs` (on an image file) at `mount_point`.
bool MountImage(const TestDir& dir, const std::string& make_fs, const std::string& mount_point) {
  const std::string image = dir.Sub("fs.img");
  std::filesystem::create_directory(mount_point);
  const std::string make = "truncate -s 512M " + image + " && " + make_fs + " " + image +
                           " >/dev/null && mount -o loop " + image + " " + mount_point;
  return std::system(make.c_str()) == 0;
}

// On ext4 (a loop-mounted image): no reflink, a sparse copy, same bytes.
TEST_F(SnapshotStoreTest, OnExt4TheDataIsCopiedSparse) {
  TestDir fs("/tmp");
  const std::string mount_point = fs.Sub("mnt");
  if (!MountImage(fs, "mkfs.ext4 -q -F", mount_point)) GTEST_SKIP() << "cannot mount ext4";
  {
    absl::StatusOr<v1::SnapshotManifest> manifest = Create(kRoot, {mount_point, "s"});
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->copy_method(), "sparse");
    // Space reserved but never written (fallocate) is not copied.
    EXPECT_LT(manifest->bytes_written(), manifest->data_bytes() / 2);
    EXPECT_EQ(ReadAll(mount_point + "/s/data"), ReadAll(dir_.Sub("state/heaps/h/data")));
    // A restore reserves the whole data file again, as a heap needs.
    v1::SnapshotManifest restored_manifest;
    auto restored = store_->Restore(kRoot, {mount_point, "s"}, dir_.Sub("state/heaps"), "r", {},
                                    &restored_manifest);
    ASSERT_TRUE(restored.ok()) << restored.status();
    ASSERT_TRUE((*restored)->Commit("r").ok());
    struct stat st;
    ASSERT_EQ(stat(dir_.Sub("state/heaps/r/data").c_str(), &st), 0);
    EXPECT_GE(uint64_t(st.st_blocks) * 512, uint64_t(st.st_size));
    auto reopened = PersistentHeap::Open(dir_.Sub("state/heaps/r"));
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    EXPECT_EQ((*reopened)->ListNames(""), heap_->ListNames(""));
  }
  EXPECT_EQ(std::system(("umount " + mount_point).c_str()), 0);
}

// A real file system too small for the snapshot (a 2 MiB tmpfs).
TEST_F(SnapshotStoreTest, ASmallTmpfsTargetFailsCleanly) {
  const std::string small = dir_.Sub("small");
  std::filesystem::create_directory(small);
  if (std::system(("mount -t tmpfs -o size=2m tmpfs " + small).c_str()) != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs";
  }
  const absl::Status status = Create(kRoot, {small, "s"}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(Entries(small), 0u);
  EXPECT_TRUE(heap_->CheckInvariants().ok());
  EXPECT_EQ(std::system(("umount " + small).c_str()), 0);
}

// Returns true if every extent of `path` is shared with another file.
bool AllExtentsShared(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  alignas(fiemap) char buffer[sizeof(fiemap) + 64 * sizeof(fiemap_extent)] = {};
  auto* map = reinterpret_cast<fiemap*>(buffer);
  map->fm_length = FIEMAP_MAX_OFFSET;
  map->fm_extent_count = 64;
  const bool ok = ioctl(fd, FS_IOC_FIEMAP, map) == 0 && map->fm_mapped_extents > 0;
  close(fd);
  if (!ok) return false;
  for (uint32_t i = 0; i < map->fm_mapped_extents; ++i) {
    if ((map->fm_extents[i].fe_flags & FIEMAP_EXTENT_SHARED) == 0) return false;
  }
  return true;
}

// On XFS with reflink (a loop-mounted image holding the heap and the
// target), the snapshot clones the data file: nothing is copied and the
// extents are shared.
TEST_F(SnapshotStoreTest, OnXfsWithReflinkTheDataIsCloned) {
  TestDir fs("/tmp");
  const std::string mount_point = fs.Sub("mnt");
  if (!MountImage(fs, "mkfs.xfs -q -m reflink=1", mount_point)) GTEST_SKIP() << "cannot mount XFS";
  {
    std::filesystem::create_directories(mount_point + "/state/heaps");
    std::filesystem::create_directories(mount_point + "/target");
    auto store =
        SnapshotStore::Open(mount_point + "/state/snapshots", {mount_point + "/state"}, {});
    ASSERT_TRUE(store.ok()) << store.status();
    std::unique_ptr<PersistentHeap> heap = MakeHeap(mount_point + "/state/heaps/h");
    struct statvfs before, after;
    ASSERT_EQ(statvfs(mount_point.c_str(), &before), 0);
    absl::StatusOr<v1::SnapshotManifest> manifest =
        (*store)->Create(kRoot, *heap, "h", Source(*heap), {mount_point + "/target", "s"}, {});
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    ASSERT_EQ(statvfs(mount_point.c_str(), &after), 0);
    // Free space barely moves: metadata and the manifest only.
    const uint64_t used = (before.f_bfree - after.f_bfree) * uint64_t{before.f_frsize};
    EXPECT_LT(used, uint64_t{1} << 20)
        << used << " bytes used by a snapshot of " << manifest->data_bytes();
    EXPECT_EQ(manifest->copy_method(), "reflink");
    EXPECT_EQ(manifest->bytes_written(), 0u);
    EXPECT_TRUE(AllExtentsShared(mount_point + "/target/s/data"));
    EXPECT_EQ(ReadAll(mount_point + "/target/s/data"),
              ReadAll(mount_point + "/state/heaps/h/data"));
  }
  EXPECT_EQ(std::system(("umount " + mount_point).c_str()), 0);
}

}  // namespace
}  // namespace heapd
