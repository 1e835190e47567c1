// Kills a process working on a heap at hundreds of points — between
// operations and inside syncs and checkpoints (fault points, including
// half-written records) — and checks that the heap reopens exactly at its
// last completed sync: the same chunks and bitmaps and names as a replay of
// the same operations up to that sync, and every bound object's contents.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "heap/fault_point.h"
#include "heap/fixed_address.h"
#include "heap/heap.h"
#include "heap/test_dir.h"
#include "testing/in_process.h"
#include "tests/random_workload.h"

namespace heapd {
namespace {

constexpr int kKillRuns = 300;
// On a working image every sync is an fdatasync on a disk.
constexpr int kWorkingImageKillRuns = 192;
// A fixed-address heap differs only in where it is mapped.
constexpr int kFixedAddressKillRuns = 96;
constexpr int kMaxSteps = 600;
constexpr int kSyncsPerMille = 50;

// With content rollback: the client in the killed process takes
// pre-images as through heapd. The heaps are on tmpfs (direct), or in the
// test directory (a file system) with a working image.
HeapOptions Options() {
  HeapOptions options;
  options.checkpoint_log_bytes = 96 << 10;  // checkpoints every few syncs
  options.redo_log_bytes = 64 << 10;        // applied, and grown, every few syncs
  return options;
}

ImageMode g_image = ImageMode::kDirect;
bool g_fixed_address = false;

HeapConfig Config() {
  HeapConfig config;
  config.max_size = 1024 * kChunkSize;
  config.image = g_image;
  // Every run's heap at the window's first range: each process maps one
  // at a time.
  if (g_fixed_address) config.fixed_base = kFixedWindowBegin + kFixedGuardBytes;
  return config;
}

// Child side: the fault point countdown and where to report the kill.
std::atomic<int> g_hits_left{0};  // also counted on the background apply's thread
int g_report_fd = -1;
// Count only the fault points whose names start with this (empty: all).
std::string g_only;

void KillAtHit(const char* point) {
  if (!g_only.empty() && std::strncmp(point, g_only.data(), g_only.size()) != 0) return;
  if (--g_hits_left != 0) return;
  const std::string line = absl::StrCat(point, "\n");
  (void)!write(g_report_fd, line.data(), line.size());
  raise(SIGKILL);
}

[[noreturn]] void RunChild(const std::string& path, uint64_t seed, int kill_hit,
                           const std::string& only, int kill_step, int report_fd) {
  auto heap = PersistentHeap::Open(path, Options());
  if (!heap.ok()) _exit(2);
  auto workload = RandomWorkload::Start(heap->get(), seed, 1, 300, kSyncsPerMille);
  if (!workload.ok()) _exit(3);
  g_report_fd = report_fd;
  g_hits_left = kill_hit;
  g_only = only;
  SetFaultHandler(KillAtHit);
  for (int step = 1; step <= kMaxSteps; ++step) {
    if (absl::Status s = (*workload)->Step(); !s.ok()) {
      std::fprintf(stderr, "child: %s\n", s.ToString().c_str());
      _exit(4);
    }
    if (step == kill_step) {
      (void)!write(report_fd, "between-steps\n", 14);
      raise(SIGKILL);
    }
  }
  _exit(5);
}

std::string ReadAll(int fd) {
  std::string out;
  char buffer[256];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

void ExpectSameChunks(const std::vector<ChunkRecord>& got, const std::vector<ChunkRecord>& want,
                      const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].chunk, want[i].chunk) << where;
    ASSERT_EQ(got[i].kind, want[i].kind) << where << " chunk " << got[i].chunk;
    ASSERT_EQ(got[i].size_class, want[i].size_class) << where << " chunk " << got[i].chunk;
    ASSERT_EQ(got[i].run_chunks, want[i].run_chunks) << where << " chunk " << got[i].chunk;
    ASSERT_EQ(got[i].words, want[i].words) << where << " chunk " << got[i].chunk;
  }
}

// Names with what they bind (not when).
std::vector<std::tuple<std::string, uint64_t, uint64_t, std::string>> Bindings(
    const std::vector<NameEntry>& names) {
  std::vector<std::tuple<std::string, uint64_t, uint64_t, std::string>> bindings;
  for (const NameEntry& e : names) bindings.emplace_back(e.name, e.offset, e.size, e.type_name);
  return bindings;
}

// The bytes of the object `entry` binds.
std::string Bytes(const PersistentHeap& heap, const NameEntry& entry) {
  std::string bytes(entry.size, '\0');
  EXPECT_EQ(pread(heap.data_fd(), bytes.data(), bytes.size(), static_cast<off_t>(entry.offset)),
            static_cast<ssize_t>(bytes.size()));
  return bytes;
}

// The parent of the heaps: /dev/shm (tmpfs, direct), or "" (the test
// directory, with a working image); and whether the heaps are
// fixed-address ones.
struct Storage {
  std::string parent;
  bool fixed_address;
};
class CrashTest : public testing::TestWithParam<Storage> {};

INSTANTIATE_TEST_SUITE_P(Storage, CrashTest,
                         testing::Values(Storage{"/dev/shm", false}, Storage{"", false},
                                         Storage{"/dev/shm", true}),
                         [](const testing::TestParamInfo<Storage>& info) {
                           return std::string(info.param.parent.empty() ? "WorkingImage"
                                                                        : "Tmpfs") +
                                  (info.param.fixed_address ? "FixedAddress" : "");
                         });

TEST_P(CrashTest, EveryKillPointReopensAtTheLastCompletedSync) {
  const std::string& parent = GetParam().parent;
  if (!parent.empty() && access(parent.c_str(), W_OK) != 0) GTEST_SKIP() << "no /dev/shm";
  TestDir root(parent);
  g_image = parent.empty() ? ImageMode::kWorkingImage : ImageMode::kDirect;
  g_fixed_address = GetParam().fixed_address;
  std::map<std::string, int> kills_by_point;
  const int runs = g_fixed_address                       ? kFixedAddressKillRuns
                   : g_image == ImageMode::kWorkingImage ? kWorkingImageKillRuns
                                                         : kKillRuns;
  for (int run = 0; run < runs; ++run) {
    const uint64_t seed = 7000 + run;
    std::mt19937_64 rng(seed);
    // A third of the runs aim at checkpoints, which are rarer than syncs;
    // on a working image (whose background applies make the hits of other
    // points vary from run to run), a twelfth at the metadata log's
    // points, a twelfth at applying a redo log (in the
    // background), a twelfth at handing a log over to that apply and a
    // sixth at replacing one with a larger one (rarer still).
    std::string only;
    if (run % 3 == 2) only = "checkpoint.";
    if (g_image == ImageMode::kWorkingImage && run % 12 == 0) only = "log.";
    if (g_image == ImageMode::kWorkingImage && run % 12 == 1) only = "redo.apply.";
    if (g_image == ImageMode::kWorkingImage && run % 12 == 7) only = "redo.switch.";
    if (g_image == ImageMode::kWorkingImage && run % 6 == 4) only = "redo.larger.";
    const int kill_hit = 1 + static_cast<int>(rng() % (only.empty()            ? 160
                                                       : only == "checkpoint." ? 12
                                                       : only == "log."        ? 8
                                                                               : 2));
    const int kill_step = 1 + static_cast<int>(rng() % kMaxSteps);
    const std::string where =
        absl::StrCat("run ", run, " (seed ", seed, ", hit ", kill_hit, ", step ", kill_step, ")");
    const std::string path = root.Sub(absl::StrCat("heap", run));
    ASSERT_TRUE(PersistentHeap::Create(path, Config(), Options()).ok());

    int report[2];
    ASSERT_EQ(pipe(report), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(report[0]);
      RunChild(path, seed, kill_hit, only, kill_step, report[1]);
    }
    close(report[1]);
    const std::string point = ReadAll(report[0]);
    close(report[0]);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << where << ": child ended with status " << status;
    ++kills_by_point[point.substr(0, point.find('\n'))];

    auto recovered = PersistentHeap::Open(path, Options());
    ASSERT_TRUE(recovered.ok()) << where << ": " << recovered.status();
    ASSERT_TRUE((*recovered)->CheckInvariants().ok()) << where;
    const uint64_t epoch = (*recovered)->epoch();

    // Replay the same operations on a fresh heap up to that epoch, crash
    // there, and reopen it: the heap as that sync left it on disk.
    const std::string replay_path = root.Sub(absl::StrCat("replay", run));
    {
      auto replaying = PersistentHeap::Create(replay_path, Config(), Options());
      ASSERT_TRUE(replaying.ok());
      auto workload = RandomWorkload::Start(replaying->get(), seed, 1, 300, kSyncsPerMille);
      ASSERT_TRUE(workload.ok());
      while ((*workload)->syncs() < epoch) {
        ASSERT_LT((*workload)->steps(), static_cast<uint64_t>(kMaxSteps)) << where;
        ASSERT_TRUE((*workload)->Step().ok()) << where;
      }
      (*workload)->Crash();
    }
    auto replay = PersistentHeap::Open(replay_path, Options());
    ASSERT_TRUE(replay.ok()) << where << ": " << replay.status();
    ASSERT_EQ((*replay)->epoch(), epoch) << where;
    ASSERT_NO_FATAL_FAILURE(
        ExpectSameChunks((*recovered)->PersistedChunks(), (*replay)->PersistedChunks(), where));
    const std::vector<NameEntry> names = (*recovered)->ListNames("");
    ASSERT_EQ(Bindings(names), Bindings((*replay)->ListNames(""))) << where;

    // With content rollback, a bound object holds exactly what it held at
    // the sync, every byte: the process's later stores (a later bind's tag,
    // a later allocation's mark after an unbind and free) went back with it.
    if ((*recovered)->content_rollback()) {
      for (const NameEntry& entry : names) {
        ASSERT_EQ(Bytes(**recovered, entry), Bytes(**replay, entry))
            << where << ": name " << entry.name;
      }
    }
    // The recovered heap goes on working.
    const uint64_t live = (*recovered)->Stats().directory.live_objects;
    auto after = AttachInProcess(recovered->get(), 99);
    ASSERT_TRUE(after.ok()) << where << ": " << after.status();
    if (g_fixed_address) {
      ASSERT_EQ(reinterpret_cast<uintptr_t>((*after)->base()), Config().fixed_base) << where;
    }
    for (int i = 0; i < 100; ++i) ASSERT_TRUE((*after)->allocate(1 + i * 37).ok()) << where;
    ASSERT_TRUE((*after)->detach().ok()) << where;
    EXPECT_EQ((*recovered)->Stats().directory.live_objects, live + 100) << where;
    ASSERT_TRUE((*recovered)->CheckInvariants().ok()) << where;
    after->reset();
    recovered->reset();
    replay->reset();
    std::filesystem::remove_all(path);
    std::filesystem::remove_all(replay_path);
  }
  for (const auto& [point, kills] : kills_by_point) {
    std::printf("kills at %-28s %d\n", point.c_str(), kills);
  }
  // Every crash-relevant place was hit, half-written records included.
  for (const char* point :
       {"between-steps", "sync.after_data_flush", "log.before_write", "log.torn", "log.before_sync",
        "log.after_sync", "checkpoint.torn", "checkpoint.before_rename", "checkpoint.after_rename",
        "checkpoint.new_log"}) {
    EXPECT_GT(kills_by_point[point], 0) << point;
  }
  if (g_image == ImageMode::kWorkingImage) {
    for (const char* point : {"redo.before_append", "redo.apply.before_reset",
                              "redo.switch.after_restart", "redo.larger.before_rename"}) {
      EXPECT_GT(kills_by_point[point], 0) << point;
    }
  }
}

}  // namespace
}  // namespace heapd
