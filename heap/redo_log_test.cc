// RedoLog on a real file in a temporary directory (a block file system in
// CI, where O_DIRECT is used), pages read from a real working image file.
#include "heap/redo_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

constexpr uint64_t kPage = kRedoBlockBytes;

// A working image of `pages` pages whose contents tests set page by page.
class Image {
 public:
  explicit Image(const TestDir& dir, uint64_t pages)
      : fd_(open(dir.Sub("image").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    EXPECT_EQ(ftruncate(fd_.get(), static_cast<off_t>(pages * kPage)), 0);
  }
  // Fills page `index` with `fill`.
  void Set(uint64_t index, char fill) {
    const std::string page(kPage, fill);
    ASSERT_EQ(pwrite(fd_.get(), page.data(), kPage, static_cast<off_t>(index * kPage)),
              static_cast<ssize_t>(kPage));
  }
  // Fills pages [first, first + count) with `fill`; returns their offsets.
  std::vector<uint64_t> SetRun(uint64_t first, uint64_t count, char fill) {
    std::vector<uint64_t> offsets;
    for (uint64_t i = first; i < first + count; ++i) {
      Set(i, fill);
      offsets.push_back(i * kPage);
    }
    return offsets;
  }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
};

// Expects the replayed `pages` to be page 1 and one record's worth of a
// retry, and none of the taken-back attempt's pages [first, first + count).
void ExpectRetryOnly(const std::map<uint64_t, char>& pages, uint64_t first, uint64_t count) {
  EXPECT_EQ(pages.size(), 1 + RedoLog::PagesPerRecord());
  for (uint64_t i = first; i < first + count; ++i) {
    ASSERT_EQ(pages.count(i), 0u) << "page " << i << " of the taken-back attempt";
  }
}

std::vector<uint64_t> Offsets(std::initializer_list<uint64_t> indexes) {
  std::vector<uint64_t> offsets;
  for (uint64_t index : indexes) offsets.push_back(index * kPage);
  return offsets;
}

// Replays `log` up to `committed`: page index -> the fill of its last image.
std::map<uint64_t, char> Replayed(RedoLog& log, uint64_t committed) {
  std::map<uint64_t, char> pages;
  const absl::Status status = log.Replay(committed, [&](uint64_t offset, absl::string_view page) {
    EXPECT_EQ(page.size(), kPage);
    EXPECT_EQ(page.find_first_not_of(page[0]), absl::string_view::npos) << "a torn page";
    pages[offset / kPage] = page[0];
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return pages;
}

// Each test on the test directory's file system (a block file system in
// CI: O_DIRECT) and on /dev/shm (tmpfs: no STATX_DIOALIGN, buffered).
class RedoLogTest : public ::testing::TestWithParam<const char*> {
 protected:
  RedoLogTest()
      : dir_(GetParam()),
        image_(dir_, 4096),
        dir_fd_(open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY)) {}

  std::unique_ptr<RedoLog> Create(uint64_t capacity = uint64_t{64} << 20) {
    absl::StatusOr<std::unique_ptr<RedoLog>> log =
        RedoLog::Create(dir_fd_.get(), kRedoLogFileName, capacity, dir_.Sub("redo"));
    EXPECT_TRUE(log.ok()) << log.status();
    return log.ok() ? *std::move(log) : nullptr;
  }
  std::unique_ptr<RedoLog> Reopen() {
    absl::StatusOr<std::unique_ptr<RedoLog>> log =
        RedoLog::Open(dir_fd_.get(), kRedoLogFileName, dir_.Sub("redo"));
    EXPECT_TRUE(log.ok()) << log.status();
    return log.ok() ? *std::move(log) : nullptr;
  }

  // Writes the log's records up to `committed` into a durable image.
  void ApplyAll(RedoLog& log, uint64_t committed) {
    const UniqueFd durable(open(dir_.Sub("durable").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    const absl::StatusOr<uint64_t> applied = log.ApplyTo(durable.get(), committed);
    ASSERT_TRUE(applied.ok()) << applied.status();
  }

  TestDir dir_;
  Image image_;
  UniqueFd dir_fd_;
};

TEST_P(RedoLogTest, ReplayGivesTheCommittedEpochsPagesInOrder) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  image_.Set(2, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1, 2}), image_.fd()).ok());
  image_.Set(2, 'b');
  image_.Set(7, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({2, 7}), image_.fd()).ok());

  log = Reopen();  // as after a crash
  EXPECT_EQ(Replayed(*log, 1), (std::map<uint64_t, char>{{1, 'a'}, {2, 'a'}}));
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{{1, 'a'}, {2, 'b'}, {7, 'b'}}));
  EXPECT_EQ(Replayed(*log, 0), (std::map<uint64_t, char>{}));
}

TEST_P(RedoLogTest, RecordsOfAnEpochNeverCommittedAreTakenBackByReplay) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());
  // Epoch 2's sync wrote its pages, then died before its commit.
  image_.Set(1, 'x');
  image_.Set(3, 'x');
  image_.Set(4, 'x');
  ASSERT_TRUE(log->Append(2, Offsets({1, 3, 4}), image_.fd()).ok());

  log = Reopen();
  EXPECT_EQ(Replayed(*log, 1), (std::map<uint64_t, char>{{1, 'a'}}));
  // The reopened heap's next sync is epoch 2 again, with other pages.
  image_.Set(5, 'c');
  ASSERT_TRUE(log->Append(2, Offsets({5}), image_.fd()).ok());
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{{1, 'a'}, {5, 'c'}}));
}

TEST_P(RedoLogTest, ARewoundAppendLeavesNothingBehindForALaterEpochOfTheSameNumber) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());
  // Epoch 2: three records' worth of pages, then its commit failed.
  const std::vector<uint64_t> many = image_.SetRun(10, 3 * RedoLog::PagesPerRecord(), 'x');
  absl::StatusOr<RedoLog::Position> failed = log->Append(2, many, image_.fd());
  ASSERT_TRUE(failed.ok()) << failed.status();
  ASSERT_TRUE(log->RewindTo(*failed).ok());
  // Its retry, exactly as long as the first record it overwrites, then
  // committed.
  ASSERT_TRUE(
      log->Append(2, image_.SetRun(2000, RedoLog::PagesPerRecord(), 'r'), image_.fd()).ok());
  log = Reopen();
  ExpectRetryOnly(Replayed(*log, 2), 10, 3 * RedoLog::PagesPerRecord());
}

TEST_P(RedoLogTest, ApplyWritesEachCommittedPageOnceAsItsLastRecordHasIt) {
  std::unique_ptr<RedoLog> log = Create();
  image_.SetRun(1, 3, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1, 2, 3}), image_.fd()).ok());
  image_.Set(2, 'b');
  image_.Set(5, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({2, 5}), image_.fd()).ok());
  image_.Set(7, 'x');
  ASSERT_TRUE(log->Append(3, Offsets({7}), image_.fd()).ok());  // never committed

  const UniqueFd durable(open(dir_.Sub("durable").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_EQ(ftruncate(durable.get(), 16 * kPage), 0);
  log = Reopen();
  absl::StatusOr<uint64_t> written = log->ApplyTo(durable.get(), 2);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, 4u);  // pages 1, 2, 3 and 5; page 2 once
  const std::string expected[8] = {"", "a", "b", "a", "", "b", "", ""};
  for (uint64_t i = 0; i < 8; ++i) {
    std::string page(kPage, '?');
    ASSERT_EQ(pread(durable.get(), page.data(), kPage, static_cast<off_t>(i * kPage)),
              static_cast<ssize_t>(kPage));
    const char fill = expected[i].empty() ? '\0' : expected[i][0];
    EXPECT_EQ(page, std::string(kPage, fill)) << "page " << i;
  }
  // Epoch 3 was taken back: the log goes on from epoch 2.
  EXPECT_TRUE(log->Append(3, Offsets({7}), image_.fd()).ok());
}

TEST_P(RedoLogTest, ApplyRefusesACommittedRecordThatNoLongerReadsBack) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());
  image_.Set(2, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({2}), image_.fd()).ok());
  log = Reopen();  // read whole here
  // Then the disk returns other bytes for epoch 2's page (block 4).
  const UniqueFd raw(open(dir_.Sub("redo").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_EQ(pwrite(raw.get(), "rot", 3, 4 * kPage + 9), 3);
  const UniqueFd durable(open(dir_.Sub("durable").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  const absl::StatusOr<uint64_t> written = log->ApplyTo(durable.get(), 2);
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss) << written.status();
  EXPECT_EQ(log->Append(3, Offsets({1}), image_.fd()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(RedoLogTest, ATornRecordEndsTheLogAndACommittedOneTornIsDataLoss) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());
  image_.Set(2, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({2}), image_.fd()).ok());
  log.reset();
  // Epoch 2's page half written: block 1 is epoch 1's header, 2 its page,
  // 3 epoch 2's header, 4 its page.
  const UniqueFd raw(open(dir_.Sub("redo").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_EQ(pwrite(raw.get(), "zz", 2, 4 * kPage + 100), 2);

  log = Reopen();  // the sync of epoch 2 died writing: 1 is committed
  EXPECT_EQ(Replayed(*log, 1), (std::map<uint64_t, char>{{1, 'a'}}));
  // Had epoch 2 committed, its record would have been whole.
  log = Reopen();
  const absl::Status lost =
      log->Replay(2, [](uint64_t, absl::string_view) { return absl::OkStatus(); });
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss) << lost;
  EXPECT_NE(lost.message().find("epoch 2 is committed, but the log reaches epoch 1 only"),
            std::string::npos)
      << lost;
}

TEST_P(RedoLogTest, ResetStartsAnEmptyPassThatIgnoresTheOldRecords) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  image_.Set(2, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1, 2}), image_.fd()).ok());
  EXPECT_GT(log->used_bytes(), 0u);
  // Not before its records reached the image.
  EXPECT_EQ(log->Reset().code(), absl::StatusCode::kFailedPrecondition);
  ApplyAll(*log, 1);
  ASSERT_TRUE(log->Reset().ok());
  EXPECT_EQ(log->used_bytes(), 0u);
  image_.Set(3, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({3}), image_.fd()).ok());
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{{3, 'b'}}));
  EXPECT_EQ(log->Reset().code(), absl::StatusCode::kFailedPrecondition);
  ApplyAll(*log, 2);
  ASSERT_TRUE(log->Reset().ok());
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{}));
}

TEST_P(RedoLogTest, AnAppendThatDoesNotFitWritesNothing) {
  // Room for a record of 3 pages and one of 1 (each with its header).
  std::unique_ptr<RedoLog> log = Create(RedoLog::BytesFor(3) + RedoLog::BytesFor(1));
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1, 2, 3}), image_.fd()).ok());
  const absl::StatusOr<RedoLog::Position> full = log->Append(2, Offsets({4, 5}), image_.fd());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_NE(full.status().message().find("2 pages need"), std::string::npos) << full.status();
  ASSERT_TRUE(log->Append(2, Offsets({4}), image_.fd()).ok());  // what is left
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2).size(), 4u);
}

TEST_P(RedoLogTest, BadAppendsAreRefusedAndChangeNothing) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(2, Offsets({1}), image_.fd()).ok());
  const uint64_t used = log->used_bytes();
  EXPECT_EQ(log->Append(3, {kPage + 1}, image_.fd()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log->Append(1, Offsets({1}), image_.fd()).status().code(),
            absl::StatusCode::kInvalidArgument);  // an epoch going back
  EXPECT_EQ(log->Append(2, Offsets({1}), image_.fd()).status().code(),
            absl::StatusCode::kInvalidArgument);  // the same epoch again
  // A page past the end of the working image, after a good one.
  EXPECT_EQ(log->Append(3, Offsets({2, 5000}), image_.fd()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(log->Append(3, {~uint64_t{0} - kPage + 1}, image_.fd()).status().code(),
            absl::StatusCode::kOutOfRange);  // one that wraps around
  EXPECT_EQ(log->used_bytes(), used);
  image_.Set(2, 'b');
  ASSERT_TRUE(log->Append(3, Offsets({2}), image_.fd()).ok());
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 3), (std::map<uint64_t, char>{{1, 'a'}, {2, 'b'}}));
}

TEST_P(RedoLogTest, AHeaderTornInAResetLeavesTheOtherSlot) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());
  ApplyAll(*log, 1);
  ASSERT_TRUE(log->Reset().ok());  // the second slot now
  image_.Set(2, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({2}), image_.fd()).ok());
  log.reset();
  // The next Reset's write into the first slot, torn.
  const UniqueFd raw(open(dir_.Sub("redo").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_EQ(pwrite(raw.get(), "torn", 4, 20), 4);
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{{2, 'b'}}));
}

TEST_P(RedoLogTest, BothHeaderSlotsDamagedIsDataLossNamingTheFile) {
  Create().reset();
  const UniqueFd raw(open(dir_.Sub("redo").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_EQ(pwrite(raw.get(), "x", 1, 20), 1);  // slot 0; slot 1 was never written
  absl::StatusOr<std::unique_ptr<RedoLog>> log =
      RedoLog::Open(dir_fd_.get(), kRedoLogFileName, dir_.Sub("redo"));
  EXPECT_EQ(log.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(log.status().message().find(dir_.Sub("redo")), std::string::npos) << log.status();
}

TEST_P(RedoLogTest, AnOpenedLogTakesNoAppendBeforeItsReplay) {
  Create().reset();
  std::unique_ptr<RedoLog> log = Reopen();
  image_.Set(1, 'a');
  EXPECT_EQ(log->Append(1, Offsets({1}), image_.fd()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(log->Replay(0, [](uint64_t, absl::string_view) { return absl::OkStatus(); }).ok());
  // Only epochs after the one replayed as committed.
  EXPECT_EQ(log->Append(0, Offsets({1}), image_.fd()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(log->Append(2, Offsets({1}), image_.fd()).ok());
  // A replay whose apply fails leaves it refusing.
  log = Reopen();
  EXPECT_EQ(
      log->Replay(2, [](uint64_t, absl::string_view) { return absl::InternalError("no"); }).code(),
      absl::StatusCode::kInternal);
  EXPECT_EQ(log->Append(3, Offsets({1}), image_.fd()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A stale record whose sequence a crash made look new again (found by a
// review): epoch 2 appended as two records, taken back; its retry torn by
// a crash; after the restart a shorter retry of epoch 2 commits. The
// second record of the first attempt must not join it.
TEST_P(RedoLogTest, ARecordOfATakenBackAttemptNeverJoinsALaterChain) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());  // blocks 1-2
  absl::StatusOr<RedoLog::Position> taken_back =
      log->Append(2, image_.SetRun(10, 2 * RedoLog::PagesPerRecord(), 'x'), image_.fd());
  ASSERT_TRUE(taken_back.ok()) << taken_back.status();
  ASSERT_TRUE(log->RewindTo(*taken_back).ok());
  log.reset();
  // The retry's crash: one page of its first record landed (block 4), not
  // its header (block 3).
  {
    const UniqueFd raw(open(dir_.Sub("redo").c_str(), O_RDWR | O_CLOEXEC));
    const std::string page(kPage, 'y');
    ASSERT_EQ(pwrite(raw.get(), page.data(), kPage, 4 * kPage), static_cast<ssize_t>(kPage));
  }
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 1), (std::map<uint64_t, char>{{1, 'a'}}));
  // The shorter retry, exactly one record long (over the first attempt's
  // first record), committed.
  ASSERT_TRUE(
      log->Append(2, image_.SetRun(2000, RedoLog::PagesPerRecord(), 'r'), image_.fd()).ok());
  log = Reopen();
  ExpectRetryOnly(Replayed(*log, 2), 10, 2 * RedoLog::PagesPerRecord());
}

TEST_P(RedoLogTest, RewindRefusesAPositionOfAnotherPassOrPastTheEnd) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  absl::StatusOr<RedoLog::Position> at = log->Append(1, Offsets({1}), image_.fd());
  ASSERT_TRUE(at.ok());
  RedoLog::Position past = *at;
  past.block += 100;
  EXPECT_EQ(log->RewindTo(past).code(), absl::StatusCode::kFailedPrecondition);
  // Only the last Append, once.
  image_.Set(2, 'b');
  ASSERT_TRUE(log->Append(2, Offsets({2}), image_.fd()).ok());
  EXPECT_EQ(log->RewindTo(*at).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<RedoLog::Position> second = log->Append(3, Offsets({2}), image_.fd());
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(log->RewindTo(*second).ok());
  EXPECT_EQ(log->RewindTo(*second).code(), absl::StatusCode::kFailedPrecondition);
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{{1, 'a'}, {2, 'b'}}));
}

// A sync taken back, then its epoch committed without pages (found by a
// review): the epoch's record of its header alone ends the chain before
// the taken-back pages.
TEST_P(RedoLogTest, AnEpochWithoutPagesStillEndsWhatATakenBackAppendLeft) {
  std::unique_ptr<RedoLog> log = Create();
  image_.Set(1, 'a');
  ASSERT_TRUE(log->Append(1, Offsets({1}), image_.fd()).ok());
  image_.Set(5, 'x');
  absl::StatusOr<RedoLog::Position> taken_back = log->Append(2, Offsets({5}), image_.fd());
  ASSERT_TRUE(taken_back.ok());
  ASSERT_TRUE(log->RewindTo(*taken_back).ok());
  ASSERT_TRUE(log->Append(2, {}, image_.fd()).ok());  // committed
  log = Reopen();
  EXPECT_EQ(Replayed(*log, 2), (std::map<uint64_t, char>{{1, 'a'}}));
}

TEST_P(RedoLogTest, CreateRefusesAnExistingFileAndLeavesItAlone) {
  Create().reset();
  absl::StatusOr<std::unique_ptr<RedoLog>> again =
      RedoLog::Create(dir_fd_.get(), kRedoLogFileName, kPage, dir_.Sub("redo"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(RedoLog::Open(dir_fd_.get(), kRedoLogFileName, dir_.Sub("redo")).ok());
}

TEST_P(RedoLogTest, CreateReplacesWhatAnInterruptedCreateLeftAndRefusesBadSizes) {
  // A crash midway left the temporary file; nothing under the real name.
  const UniqueFd partial(open(dir_.Sub("redo.new").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(partial.valid());
  EXPECT_EQ(RedoLog::Create(dir_fd_.get(), kRedoLogFileName, 0, dir_.Sub("redo")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RedoLog::Create(dir_fd_.get(), kRedoLogFileName, uint64_t{1} << 62, dir_.Sub("redo"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_NE(Create(), nullptr);
  EXPECT_NE(access(dir_.Sub("redo.new").c_str(), F_OK), 0);
}

// Which write path each directory takes is the file system's to say;
// both are exercised either way.
TEST_P(RedoLogTest, ItsWritePathIsTheFileSystems) {
  std::unique_ptr<RedoLog> log = Create();
  if (std::string(GetParam()) == "/dev/shm") EXPECT_FALSE(log->direct());
  std::printf("%s: %s\n", dir_.path().c_str(), log->direct() ? "O_DIRECT" : "buffered");
}

INSTANTIATE_TEST_SUITE_P(TestDirAndTmpfs, RedoLogTest, ::testing::Values("", "/dev/shm"));

}  // namespace
}  // namespace heapd
