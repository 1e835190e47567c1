#include "snapshot/snapshot.h"

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
#include "heap/heap_session.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

std::string ScratchParent() { return access("/dev/shm", W_OK) == 0 ? "/dev/shm" : ""; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A heap with objects, contents and names, synced.
std::unique_ptr<PersistentHeap> MakeHeap(const std::string& dir) {
  HeapConfig config;
  config.max_size = uint64_t{256} << 20;
  auto heap = PersistentHeap::Create(dir, config);
  EXPECT_TRUE(heap.ok()) << heap.status();
  auto session = HeapSession::Start(heap->get(), 1);
  EXPECT_TRUE(session.ok());
  for (uint64_t i = 0; i < 5000; ++i) {
    const uint64_t offset = *(*session)->Allocate(16 + i % 300);
    *(*session)->At<uint64_t>(offset) = i * 7;
    if (i % 1000 == 0) {
      NameEntry entry{"object-" + std::to_string(i), offset, 16 + i % 300, "u64", 0, 1};
      EXPECT_TRUE((*heap)->Bind(1, entry).ok());
    }
  }
  const uint64_t large = *(*session)->Allocate(5 << 20);
  std::memset((*session)->base() + large, 0xab, 5 << 20);
  EXPECT_TRUE((*session)->Detach().ok());
  return *std::move(heap);
}

v1::HeapInfo Source() {
  v1::HeapInfo info;
  info.set_name("h");
  return info;
}

bool DirectoryIsEmpty(const std::string& dir) { return std::filesystem::is_empty(dir); }

TEST(SnapshotTest, ASnapshotOpensAsTheHeapAtItsEpoch) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap = MakeHeap(dir.Sub("h"));
  std::filesystem::create_directory(dir.Sub("snaps"));
  absl::StatusOr<v1::SnapshotManifest> manifest =
      CreateSnapshot(*heap, "h", Source(), {"s1", dir.Sub("snaps"), {{"slurm_job_id", "42"}}});
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->epoch(), heap->epoch());
  EXPECT_EQ(manifest->labels().at("slurm_job_id"), "42");
  EXPECT_EQ(manifest->data_bytes(), heap->capacity_bytes());
  EXPECT_FALSE(manifest->copy_method().empty());
  EXPECT_TRUE(manifest->metadata_crc32().count("checkpoint"));
  EXPECT_TRUE(VerifySnapshot(dir.Sub("snaps/s1")).ok());
  // Same bytes, and it opens with the same allocations and names.
  EXPECT_EQ(ReadAll(dir.Sub("snaps/s1/data")), ReadAll(dir.Sub("h/data")));
  const HeapStats before = heap->Stats();
  auto reopened = PersistentHeap::Open(dir.Sub("snaps/s1"));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->epoch(), manifest->epoch());
  EXPECT_EQ((*reopened)->Stats().directory.live_objects, before.directory.live_objects);
  EXPECT_EQ((*reopened)->ListNames(""), heap->ListNames(""));
  EXPECT_EQ((*reopened)->PersistedChunks().size(), heap->PersistedChunks().size());
  // Read back.
  auto read = ReadManifest(dir.Sub("snaps/s1"));
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->DebugString(), manifest->DebugString());
  // Nothing left besides the snapshot.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.Sub("snaps")), {}), 1);
}

TEST(SnapshotTest, BadRequestsChangeNothing) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap = MakeHeap(dir.Sub("h"));
  std::filesystem::create_directory(dir.Sub("snaps"));
  ASSERT_TRUE(CreateSnapshot(*heap, "h", Source(), {"s", dir.Sub("snaps"), {}}).ok());
  EXPECT_EQ(CreateSnapshot(*heap, "h", Source(), {"s", dir.Sub("snaps"), {}}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(CreateSnapshot(*heap, "h", Source(), {"../x", dir.Sub("snaps"), {}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CreateSnapshot(*heap, "h", Source(), {"t", dir.Sub("snaps"), {{"", "x"}}}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateSnapshot(*heap, "h", Source(), {"t", dir.Sub("none"), {}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.Sub("snaps")), {}), 1);
}

TEST(SnapshotTest, VerifyFindsACorruptMetadataFile) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap = MakeHeap(dir.Sub("h"));
  std::filesystem::create_directory(dir.Sub("snaps"));
  ASSERT_TRUE(CreateSnapshot(*heap, "h", Source(), {"s", dir.Sub("snaps"), {}}).ok());
  {
    std::fstream checkpoint(dir.Sub("snaps/s/checkpoint"), std::ios::in | std::ios::out);
    checkpoint.seekp(20);
    checkpoint.put('\x5a');
  }
  const absl::Status verified = VerifySnapshot(dir.Sub("snaps/s"));
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(verified.message().find("checkpoint"), absl::string_view::npos) << verified;
  EXPECT_EQ(VerifySnapshot(dir.Sub("snaps/none")).code(), absl::StatusCode::kNotFound);
}

// A target file system too small for the snapshot: stood in for by a file
// size limit (EFBIG, as ENOSPC: RESOURCE_EXHAUSTED), in a child process.
TEST(SnapshotTest, AFullTargetLeavesNoSnapshotAndTheHeapIntact) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap = MakeHeap(dir.Sub("h"));
  std::filesystem::create_directory(dir.Sub("snaps"));
  const std::string before = ReadAll(dir.Sub("h/data"));
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit limit{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    const absl::Status status =
        CreateSnapshot(*heap, "h", Source(), {"s", dir.Sub("snaps"), {}}).status();
    _exit(status.code() == absl::StatusCode::kResourceExhausted ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(DirectoryIsEmpty(dir.Sub("snaps")));
  EXPECT_EQ(ReadAll(dir.Sub("h/data")), before);
  EXPECT_TRUE(heap->CheckInvariants().ok());
}

// A snapshot killed midway (SIGKILL while it copies) leaves nothing that
// lists as a snapshot, the heap intact, and the next try succeeds.
TEST(SnapshotTest, AKilledSnapshotLeavesNoSnapshot) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap = MakeHeap(dir.Sub("h"));
  std::filesystem::create_directory(dir.Sub("snaps"));
  const std::string before = ReadAll(dir.Sub("h/data"));
  for (int delay_us : {0, 200, 2000, 20000}) {
    const pid_t child = fork();
    if (child == 0) {
      (void)CreateSnapshot(*heap, "h", Source(), {"s", dir.Sub("snaps"), {}});
      _exit(0);
    }
    usleep(delay_us);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    if (std::filesystem::exists(dir.Sub("snaps/s"))) {
      EXPECT_TRUE(VerifySnapshot(dir.Sub("snaps/s")).ok());  // it had finished: whole
      std::filesystem::remove_all(dir.Sub("snaps/s"));
    }
    for (const auto& entry : std::filesystem::directory_iterator(dir.Sub("snaps"))) {
      EXPECT_EQ(entry.path().filename().string().rfind(".s.partial-", 0), 0u) << entry.path();
    }
  }
  EXPECT_EQ(ReadAll(dir.Sub("h/data")), before);
  ASSERT_TRUE(CreateSnapshot(*heap, "h", Source(), {"s", dir.Sub("snaps"), {}}).ok());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.Sub("snaps")), {}), 1);
  EXPECT_TRUE(VerifySnapshot(dir.Sub("snaps/s")).ok());
}

// On ext4 (a loop-mounted image): no reflink, a sparse copy, same bytes.
TEST(SnapshotTest, OnExt4TheDataIsCopiedSparse) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to loop-mount an ext4 image";
  TestDir dir("/tmp");
  const std::string image = dir.Sub("ext4.img");
  const std::string mount_point = dir.Sub("mnt");
  std::filesystem::create_directory(mount_point);
  const std::string make = "truncate -s 512M " + image + " && mkfs.ext4 -q -F " + image +
                           " && mount -o loop " + image + " " + mount_point;
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "cannot make and mount ext4: " << make;
  {
    std::unique_ptr<PersistentHeap> heap = MakeHeap(mount_point + "/h");
    std::filesystem::create_directory(mount_point + "/snaps");
    absl::StatusOr<v1::SnapshotManifest> manifest =
        CreateSnapshot(*heap, "h", Source(), {"s", mount_point + "/snaps", {}});
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->copy_method(), "sparse");
    // Space reserved but never written (fallocate) is not copied.
    EXPECT_LT(manifest->bytes_written(), manifest->data_bytes() / 2);
    EXPECT_EQ(ReadAll(mount_point + "/snaps/s/data"), ReadAll(mount_point + "/h/data"));
    // A restore reserves the whole data file again, as a heap needs.
    ASSERT_TRUE(RestoreSnapshotInto(mount_point + "/snaps/s", mount_point + "/r").ok());
    struct stat st;
    ASSERT_EQ(stat((mount_point + "/r/data").c_str(), &st), 0);
    EXPECT_GE(uint64_t(st.st_blocks) * 512, uint64_t(st.st_size));
    auto restored = PersistentHeap::Open(mount_point + "/r");
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ((*restored)->ListNames(""), heap->ListNames(""));
    EXPECT_TRUE(PersistentHeap::Open(mount_point + "/snaps/s").ok());
  }
  EXPECT_EQ(std::system(("umount " + mount_point).c_str()), 0);
}

// A real file system too small for the snapshot (a 2 MiB tmpfs, as root).
TEST(SnapshotTest, ASmallTmpfsTargetFailsCleanly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  TestDir dir("/tmp");
  std::unique_ptr<PersistentHeap> heap = MakeHeap(dir.Sub("h"));
  const std::string small = dir.Sub("small");
  std::filesystem::create_directory(small);
  if (std::system(("mount -t tmpfs -o size=2m tmpfs " + small).c_str()) != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs";
  }
  const absl::Status status =
      CreateSnapshot(*heap, "h", Source(), {"s", small, {}}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(DirectoryIsEmpty(small));
  EXPECT_TRUE(heap->CheckInvariants().ok());
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

// On XFS with reflink (a loop-mounted image the test makes), the snapshot
// clones the data file: nothing is copied and the extents are shared.
TEST(SnapshotTest, OnXfsWithReflinkTheDataIsCloned) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to loop-mount an XFS image";
  TestDir dir("/tmp");
  const std::string image = dir.Sub("xfs.img");
  const std::string mount_point = dir.Sub("mnt");
  std::filesystem::create_directory(mount_point);
  const std::string make = "truncate -s 512M " + image + " && mkfs.xfs -q -m reflink=1 " + image +
                           " && mount -o loop " + image + " " + mount_point;
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "cannot make and mount XFS: " << make;
  {
    std::unique_ptr<PersistentHeap> heap = MakeHeap(mount_point + "/h");
    std::filesystem::create_directory(mount_point + "/snaps");
    struct statvfs before, after;
    ASSERT_EQ(statvfs(mount_point.c_str(), &before), 0);
    absl::StatusOr<v1::SnapshotManifest> manifest =
        CreateSnapshot(*heap, "h", Source(), {"s", mount_point + "/snaps", {}});
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    ASSERT_EQ(statvfs(mount_point.c_str(), &after), 0);
    // Free space barely moves: metadata and the manifest only.
    const uint64_t used = (before.f_bfree - after.f_bfree) * uint64_t{before.f_frsize};
    EXPECT_LT(used, uint64_t{1} << 20) << used << " bytes used by a snapshot of "
                                       << manifest->data_bytes();
    EXPECT_EQ(manifest->copy_method(), "reflink");
    EXPECT_EQ(manifest->bytes_written(), 0u);
    EXPECT_TRUE(AllExtentsShared(mount_point + "/snaps/s/data"));
    EXPECT_EQ(ReadAll(mount_point + "/snaps/s/data"), ReadAll(mount_point + "/h/data"));
    EXPECT_TRUE(PersistentHeap::Open(mount_point + "/snaps/s").ok());
  }
  EXPECT_EQ(std::system(("umount " + mount_point).c_str()), 0);
}

}  // namespace
}  // namespace heapd
