// JournalAppender on real files: what heapd reads back (every record, in
// order, checked as the heapd of each revision checks), and the guard.
#include "client/journal_appender.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"
#include "heap/undo_record.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

std::string Image(uint64_t i) {
  std::string image(kUndoPageBytes, '\0');
  for (size_t k = 0; k < image.size(); ++k) image[k] = static_cast<char>(i * 31 + k);
  return image;
}

UndoRecordHeader PreImage(uint64_t i) {
  UndoRecordHeader h;
  h.kind = static_cast<uint32_t>(UndoKind::kPreImage);
  h.page = i * kUndoPageBytes;
  h.time_ns = i + 1;
  h.generation = 1;
  return h;
}

class JournalAppenderTest : public ::testing::Test {
 protected:
  // The journal as heapd makes it: with a control page for revision 2.
  UniqueFd Open(bool control_page) {
    UniqueFd fd(open(Path().c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (control_page) {
      const std::string control = EncodeJournalControl();
      EXPECT_EQ(write(fd.get(), control.data(), control.size()),
                static_cast<ssize_t>(control.size()));
    }
    return fd;
  }
  std::string Path() const { return dir_.Sub("journal"); }
  // Reads the journal as heapd does from `start`; checks record i is page
  // i's, with `magic`; returns how many there are.
  uint64_t ReadBack(uint64_t start, uint32_t magic) const {
    std::string bytes;
    UniqueFd fd(open(Path().c_str(), O_RDONLY | O_CLOEXEC));
    char buffer[1 << 16];
    for (ssize_t n; (n = read(fd.get(), buffer, sizeof(buffer))) > 0;) bytes.append(buffer, n);
    uint64_t records = 0;
    for (uint64_t at = start;; ++records) {
      auto decoded = DecodeUndoRecord(absl::string_view(bytes).substr(at), at);
      EXPECT_TRUE(decoded.ok()) << decoded.status();
      if (!decoded.ok() || !decoded->has_value()) break;
      const DecodedUndoRecord& r = **decoded;
      EXPECT_EQ(r.header.magic, magic);
      EXPECT_EQ(r.header.page, records * kUndoPageBytes);
      EXPECT_EQ(bytes.substr(r.image_at, kUndoPageBytes), Image(records)) << records;
      at += r.size;
    }
    EXPECT_EQ(bytes.size(), start + records * kUndoImageRecordBytes) << "bytes after the records";
    return records;
  }

  TestDir dir_{"/dev/shm"};
};

TEST_F(JournalAppenderTest, ForHeapdOfRevision2RecordsCheckedWithXxh3) {
  JournalAppender journal(Open(/*control_page=*/true), /*heapd_revision_2=*/true);
  EXPECT_TRUE(journal.guarded());
  for (uint64_t i = 0; i < 100; ++i) {
    const std::string image = Image(i);
    ASSERT_TRUE(journal.Append(PreImage(i), image.data()).ok());
  }
  EXPECT_EQ(ReadBack(kJournalControlBytes, kUndoMagic), 100u);
}

// heapd 0.4.0 reads records checked with CRC-32, from the journal's start,
// and has no guard.
TEST_F(JournalAppenderTest, ForHeapdOfRevision1RecordsCheckedWithCrc32) {
  JournalAppender journal(Open(/*control_page=*/false), /*heapd_revision_2=*/false);
  EXPECT_FALSE(journal.guarded());
  EXPECT_FALSE(journal.EnterGuard());
  for (uint64_t i = 0; i < 10; ++i) {
    const std::string image = Image(i);
    ASSERT_TRUE(journal.Append(PreImage(i), image.data()).ok());
  }
  EXPECT_EQ(ReadBack(0, kUndoMagicCrc32), 10u);
}

// The guard: entered while heapd has it open, refused (the caller takes the
// OFD lock) once heapd closed it; this process's read lock on
// kJournalAliveAt says it lives.
TEST_F(JournalAppenderTest, TheGuardAndTheLockThatSaysTheClientLives) {
  JournalAppender journal(Open(/*control_page=*/true), /*heapd_revision_2=*/true);
  UniqueFd heapd_side(open(Path().c_str(), O_RDWR | O_CLOEXEC));
  auto word = [&](uint64_t at) {
    uint32_t value = 7;
    EXPECT_EQ(pread(heapd_side.get(), &value, sizeof(value), at), 4);
    return value;
  };
  ASSERT_TRUE(journal.EnterGuard());
  EXPECT_EQ(word(kJournalBusyAt), 1u);
  journal.LeaveGuard();
  EXPECT_EQ(word(kJournalBusyAt), 0u);
  const uint32_t closed = 1;
  ASSERT_EQ(pwrite(heapd_side.get(), &closed, sizeof(closed), kJournalClosedAt), 4);
  EXPECT_FALSE(journal.EnterGuard());
  EXPECT_EQ(word(kJournalBusyAt), 0u);
  struct flock alive = JournalAliveLock(F_WRLCK);
  ASSERT_EQ(fcntl(heapd_side.get(), F_OFD_GETLK, &alive), 0);
  EXPECT_EQ(alive.l_type, F_RDLCK);
}

// A record the file system refuses (here a file size limit): an error, and
// the records before it are all still read.
TEST_F(JournalAppenderTest, ARecordThatCannotBeWrittenIsAnError) {
  JournalAppender journal(Open(/*control_page=*/true), /*heapd_revision_2=*/true);
  for (uint64_t i = 0; i < 3; ++i) {
    const std::string image = Image(i);
    ASSERT_TRUE(journal.Append(PreImage(i), image.data()).ok());
  }
  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  struct rlimit limited = before;
  limited.rlim_cur = kJournalControlBytes + 3 * kUndoImageRecordBytes;
  signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string image = Image(3);
  const absl::Status refused = journal.Append(PreImage(3), image.data());
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  signal(SIGXFSZ, SIG_DFL);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_EQ(ReadBack(kJournalControlBytes, kUndoMagic), 3u);
}

}  // namespace
}  // namespace heapd
