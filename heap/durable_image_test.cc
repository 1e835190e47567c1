// DurableImage's two redo logs: the older log's records are applied before
// the newer's at open, whatever their file names; syncs go on in one log
// while the other is applied in the background; the data file holds the
// committed epoch after every step.
#include "heap/durable_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "heap/data_file.h"
#include "heap/fault_point.h"
#include "heap/redo_log.h"
#include "heap/test_dir.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr uint64_t kPage = kRedoBlockBytes;
constexpr uint64_t kDataBytes = 64 * kPage;

class DurableImageTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_fd_.reset(open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(dir_fd_.valid());
    ASSERT_TRUE(DataFile::Create(dir_.Sub("data"), kDataBytes).ok());
    source_.reset(open(dir_.Sub("source").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(source_.valid());
    ASSERT_EQ(ftruncate(source_.get(), kDataBytes), 0);
  }

  // Fills page `page` of the source (the working image) with `fill`.
  void Fill(uint64_t page, char fill) {
    const std::string bytes(kPage, fill);
    ASSERT_EQ(pwrite(source_.get(), bytes.data(), kPage, page * kPage), kPage);
  }
  char DataPage(uint64_t page) {
    char byte = 0;
    const UniqueFd data(open(dir_.Sub("data").c_str(), O_RDONLY | O_CLOEXEC));
    EXPECT_EQ(pread(data.get(), &byte, 1, page * kPage), 1);
    return byte;
  }
  absl::StatusOr<std::unique_ptr<DurableImage>> OpenImage(uint64_t committed) {
    absl::StatusOr<std::unique_ptr<DataFile>> data = DataFile::Open(dir_.Sub("data"));
    if (!data.ok()) return data.status();
    return DurableImage::Open(dir_fd_.get(), dir_.path(), *std::move(data), committed, 1 << 20);
  }
  // A log `name` whose pass begins at `applied`, with `records`: (epoch,
  // pages, fill).
  struct Record {
    uint64_t epoch;
    std::vector<uint64_t> pages;
    char fill;
  };
  void MakeLog(const char* name, uint64_t applied, const std::vector<Record>& records) {
    absl::StatusOr<std::unique_ptr<RedoLog>> log =
        RedoLog::Create(dir_fd_.get(), name, 1 << 20, dir_.Sub(name), applied);
    ASSERT_TRUE(log.ok()) << log.status();
    for (const Record& r : records) {
      std::vector<uint64_t> offsets;
      for (uint64_t page : r.pages) {
        Fill(page, r.fill);
        offsets.push_back(page * kPage);
      }
      ASSERT_TRUE((*log)->Append(r.epoch, offsets, source_.get()).ok());
    }
  }

  TestDir dir_;
  UniqueFd dir_fd_;
  UniqueFd source_;
};

// A crash while the older log was applied in the background, the newer
// taking syncs: the older log's pages go first, so the newer's win.
TEST_F(DurableImageTest, OpenAppliesTheOlderLogFirstWhateverItsName) {
  for (const bool older_is_b : {false, true}) {
    SCOPED_TRACE(older_is_b ? "older log in redo.b" : "older log in redo");
    ASSERT_TRUE(DataFile::Create(dir_.Sub("data.new"), kDataBytes).ok());
    ASSERT_EQ(rename(dir_.Sub("data.new").c_str(), dir_.Sub("data").c_str()), 0);
    unlink(dir_.Sub("redo").c_str());
    unlink(dir_.Sub("redo.b").c_str());
    MakeLog(older_is_b ? "redo.b" : "redo", 8, {{9, {0, 1}, 'a'}, {16, {0, 2}, 'b'}});
    MakeLog(older_is_b ? "redo" : "redo.b", 16, {{17, {0, 3}, 'c'}});
    absl::StatusOr<std::unique_ptr<DurableImage>> image = OpenImage(17);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(DataPage(0), 'c');
    EXPECT_EQ(DataPage(1), 'a');
    EXPECT_EQ(DataPage(2), 'b');
    EXPECT_EQ(DataPage(3), 'c');
  }
}

// A sync that logged to the newer log and never committed is taken back;
// a heap whose committed epoch is past every record is a DATA_LOSS.
TEST_F(DurableImageTest, OpenTakesBackWhatNeverCommitted) {
  MakeLog("redo", 8, {{9, {0}, 'a'}, {16, {0}, 'b'}});
  MakeLog("redo.b", 16, {{17, {0, 1}, 'c'}});
  absl::StatusOr<std::unique_ptr<DurableImage>> image = OpenImage(16);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(DataPage(0), 'b');
  EXPECT_EQ(DataPage(1), '\0');
  image->reset();
  // Now both are empty at epoch 16: a heap that claims epoch 20 lost them.
  absl::StatusOr<std::unique_ptr<DurableImage>> lost = OpenImage(20);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kDataLoss) << lost.status();
}

// Logs that do not add up are DATA_LOSS, never a heap opened without some
// committed pages: the older log ends before the epoch the newer one
// restarted at (its last record lost); both hold records after the same
// epoch; redo.b without redo.
TEST_F(DurableImageTest, LogsThatDoNotAddUpAreDataLoss) {
  MakeLog("redo", 8, {{9, {0}, 'a'}, {15, {0}, 'b'}});  // 16 missing
  MakeLog("redo.b", 16, {{17, {0, 1}, 'c'}});
  absl::StatusOr<std::unique_ptr<DurableImage>> gap = OpenImage(17);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss) << gap.status();
  unlink(dir_.Sub("redo").c_str());
  unlink(dir_.Sub("redo.b").c_str());
  MakeLog("redo", 8, {{9, {0}, 'a'}});
  MakeLog("redo.b", 8, {{9, {1}, 'b'}});
  absl::StatusOr<std::unique_ptr<DurableImage>> both = OpenImage(9);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kDataLoss) << both.status();
  unlink(dir_.Sub("redo").c_str());
  absl::StatusOr<std::unique_ptr<DurableImage>> lone = OpenImage(9);
  EXPECT_EQ(lone.status().code(), absl::StatusCode::kDataLoss) << lone.status();
  // A heap of one log (made before there were two) opens, and gets the
  // second.
  unlink(dir_.Sub("redo.b").c_str());
  MakeLog("redo", 8, {{9, {0}, 'a'}});
  absl::StatusOr<std::unique_ptr<DurableImage>> one = OpenImage(9);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(DataPage(0), 'a');
  struct stat st;
  EXPECT_EQ(stat(dir_.Sub("redo.b").c_str(), &st), 0);
}

int switches = 0;
void CountSwitches(const char* point) {
  if (std::string(point) == "redo.switch.after_restart") ++switches;
}

// Syncs larger than half a log: each hands its log to the background apply
// and goes on in the other; the data file holds every committed epoch once
// applied, and a reopen at any point reads the last commit.
TEST_F(DurableImageTest, SyncsGoOnInOneLogWhileTheOtherIsApplied) {
  MakeLog("redo", 0, {});
  MakeLog("redo.b", 0, {});
  absl::StatusOr<std::unique_ptr<DurableImage>> image = OpenImage(0);
  ASSERT_TRUE(image.ok()) << image.status();
  const uint64_t capacity = (*image)->log_capacity();
  // Each sync takes a quarter of a log (its pages, a third of the log's,
  // fall on 64 distinct pages of a 1 MiB log).
  const uint64_t pages = capacity / kPage / 3;
  ASSERT_GT(pages, 2u);
  switches = 0;
  SetFaultHandler(CountSwitches);
  for (uint64_t epoch = 1; epoch <= 12; ++epoch) {
    std::vector<uint64_t> offsets;
    for (uint64_t p = 0; p < pages; ++p) {
      Fill(p % 64, static_cast<char>('A' + epoch));
      offsets.push_back((p % 64) * kPage);
    }
    std::sort(offsets.begin(), offsets.end());
    offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
    ASSERT_TRUE((*image)->MakeRoom(offsets.size(), epoch - 1).ok()) << epoch;
    ASSERT_TRUE((*image)->Log(epoch, offsets, source_.get()).ok()) << epoch;
    EXPECT_LE((*image)->log_used_bytes(), (*image)->log_capacity());
  }
  SetFaultHandler(nullptr);
  // A log more than half full is handed over once the other one's apply
  // ended (else it takes syncs while they fit): at least every fourth.
  EXPECT_GE(switches, 3);
  image->reset();  // waits for the background apply
  EXPECT_NE(DataPage(0), '\0');
  absl::StatusOr<std::unique_ptr<DurableImage>> reopened = OpenImage(12);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(DataPage(0), 'A' + 12);
  EXPECT_EQ((*reopened)->log_used_bytes(), 0u);
  // Apply brings the data to the epoch at once, whatever was in flight.
  EXPECT_TRUE((*reopened)->Apply(12).ok());
}

// The background apply fails (the data file's writes fail, as a failing
// disk's would): the next switch retries it on the sync's path and fails
// the sync, saying why (heapd then breaks the heap, which reopens at its
// last epoch); a DurableImage itself goes on once the disk works again,
// and nothing is lost.
TEST_F(DurableImageTest, AFailedApplyIsRetriedAndLosesNothing) {
  MakeLog("redo", 0, {});
  MakeLog("redo.b", 0, {});
  absl::StatusOr<std::unique_ptr<DurableImage>> image = OpenImage(0);
  ASSERT_TRUE(image.ok()) << image.status();
  const uint64_t pages = 64;  // a quarter of the 1 MiB log
  // Every descriptor of the data file (the image's own, and the one its
  // applies write through).
  std::vector<int> data_fds;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (std::filesystem::read_symlink(fd.path(), error) == dir_.Sub("data")) {
      data_fds.push_back(std::stoi(fd.path().filename().string()));
    }
  }
  ASSERT_EQ(data_fds.size(), 2u);
  auto sync = [&](uint64_t epoch) {
    std::vector<uint64_t> offsets;
    for (uint64_t p = 0; p < pages; ++p) {
      Fill(p, static_cast<char>('A' + epoch));
      offsets.push_back(p * kPage);
    }
    absl::Status room = (*image)->MakeRoom(offsets.size(), epoch - 1);
    if (!room.ok()) return room;
    return (*image)->Log(epoch, offsets, source_.get());
  };
  ASSERT_TRUE(sync(1).ok());
  ASSERT_TRUE(sync(2).ok());
  // The data file's writes fail from here on: the apply the next sync
  // starts in the background fails.
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  for (int fd : data_fds) ASSERT_EQ(dup2(null, fd), fd);
  close(null);
  ASSERT_TRUE(sync(3).ok()) << "the switch itself needs no write to the data file";
  ASSERT_TRUE(sync(4).ok());
  (*image)->AwaitBackgroundApply();
  absl::Status failed = sync(5);  // the other log is still not applied: retried, fails
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("redo log"), absl::string_view::npos) << failed;
  // The disk works again: the retry succeeds, the syncs go on.
  const int data = open(dir_.Sub("data").c_str(), O_RDWR | O_CLOEXEC);
  for (int fd : data_fds) ASSERT_EQ(dup2(data, fd), fd);
  close(data);
  ASSERT_TRUE(sync(5).ok());
  image->reset();
  absl::StatusOr<std::unique_ptr<DurableImage>> reopened = OpenImage(5);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(DataPage(0), 'A' + 5);
  EXPECT_EQ(DataPage(pages - 1), 'A' + 5);
}

}  // namespace
}  // namespace heapd
