// JournalAppender on real files: what heapd reads back (every record, in
// order, checked), whichever way they were appended.
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

class JournalAppenderTest : public ::testing::Test {
 protected:
  UniqueFd Open() {
    return UniqueFd(open(Path().c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  }
  std::string Path() const { return dir_.Sub("journal"); }
  uint64_t FileBytes() const {
    struct stat st;
    return stat(Path().c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  // Appends `records` pre-images of pages 0, 1, ...
  static void AppendMany(JournalAppender& journal, uint64_t records) {
    for (uint64_t i = 0; i < records; ++i) {
      UndoRecordHeader h;
      h.kind = static_cast<uint32_t>(UndoKind::kPreImage);
      h.page = i * kUndoPageBytes;
      h.time_ns = i + 1;
      h.generation = 1;
      const std::string image = Image(i);
      ASSERT_TRUE(journal.Append(h, image.data()).ok());
    }
  }
  // Reads the journal as heapd does; checks record i is page i's, with
  // `magic`; returns how many there are before the end (or zeros).
  uint64_t ReadBack(uint32_t magic) const {
    std::string bytes;
    UniqueFd fd(open(Path().c_str(), O_RDONLY | O_CLOEXEC));
    char buffer[1 << 16];
    for (ssize_t n; (n = read(fd.get(), buffer, sizeof(buffer))) > 0;) bytes.append(buffer, n);
    uint64_t records = 0;
    for (uint64_t at = 0;; ++records) {
      auto decoded = DecodeUndoRecord(absl::string_view(bytes).substr(at), at);
      EXPECT_TRUE(decoded.ok()) << decoded.status();
      if (!decoded.ok() || !decoded->has_value()) break;
      const DecodedUndoRecord& r = **decoded;
      EXPECT_EQ(r.header.magic, magic);
      EXPECT_EQ(r.header.page, records * kUndoPageBytes);
      EXPECT_EQ(bytes.substr(r.image_at, kUndoPageBytes), Image(records)) << records;
      at += r.size;
    }
    return records;
  }

  TestDir dir_{"/dev/shm"};
};

// More records than one window holds: the file grows a window at a time,
// records run on across the windows' borders, and the file ends in zeros.
TEST_F(JournalAppenderTest, MappedRecordsRunAcrossWindows) {
  const uint64_t records = 2 * kUndoJournalWindowBytes / kUndoImageRecordBytes + 5;
  {
    JournalAppender journal(Open(), /*heapd_reads_mapped=*/true);
    ASSERT_TRUE(journal.mapped());
    ASSERT_NO_FATAL_FAILURE(AppendMany(journal, records));
    EXPECT_EQ(ReadBack(kUndoMagic), records);  // while still mapped
  }
  EXPECT_EQ(ReadBack(kUndoMagic), records);
  EXPECT_GT(FileBytes(), records * kUndoImageRecordBytes);
  EXPECT_LE(FileBytes(), records * kUndoImageRecordBytes + kUndoJournalWindowBytes);
}

// A journal that already holds records (an appender of the same session
// before): the next ones follow them.
TEST_F(JournalAppenderTest, MappedRecordsFollowTheFilesRecords) {
  {
    JournalAppender written(Open(), /*heapd_reads_mapped=*/false);
    ASSERT_NO_FATAL_FAILURE(AppendMany(written, 1));
  }
  UniqueFd fd = Open();
  JournalAppender journal(std::move(fd), /*heapd_reads_mapped=*/true);
  UndoRecordHeader h;
  h.kind = static_cast<uint32_t>(UndoKind::kPreImage);
  h.page = kUndoPageBytes;
  h.generation = 1;
  const std::string image = Image(1);
  ASSERT_TRUE(journal.Append(h, image.data()).ok());
  std::string bytes(2 * kUndoImageRecordBytes, '\0');
  UniqueFd reader(open(Path().c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(pread(reader.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  auto first = DecodeUndoRecord(bytes, 0);
  auto second = DecodeUndoRecord(absl::string_view(bytes).substr(kUndoImageRecordBytes),
                                 kUndoImageRecordBytes);
  ASSERT_TRUE(first.ok() && first->has_value() && second.ok() && second->has_value());
  EXPECT_EQ((*first)->header.magic, kUndoMagicCrc32);
  EXPECT_EQ((*second)->header.magic, kUndoMagic);
  EXPECT_EQ((*second)->header.page, kUndoPageBytes);
}

// heapd 0.4.0 reads records appended with write() and checked with CRC-32,
// nothing after them.
TEST_F(JournalAppenderTest, ForAnOlderHeapdOneWritePerRecord) {
  JournalAppender journal(Open(), /*heapd_reads_mapped=*/false);
  EXPECT_FALSE(journal.mapped());
  ASSERT_NO_FATAL_FAILURE(AppendMany(journal, 10));
  EXPECT_EQ(FileBytes(), 10 * kUndoImageRecordBytes);
  EXPECT_EQ(ReadBack(kUndoMagicCrc32), 10u);
}

// No room for the next window (here: a file size limit): the record is
// refused (the tracker lets the store through and says the page cannot be
// put back), and the records before it are all still read.
TEST_F(JournalAppenderTest, NoRoomForTheNextWindowIsAnError) {
  JournalAppender journal(Open(), /*heapd_reads_mapped=*/true);
  const uint64_t fit = kUndoJournalWindowBytes / kUndoImageRecordBytes;  // in the first window
  ASSERT_NO_FATAL_FAILURE(AppendMany(journal, fit));
  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  struct rlimit limited = before;
  limited.rlim_cur = kUndoJournalWindowBytes;
  signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  UndoRecordHeader h;
  h.kind = static_cast<uint32_t>(UndoKind::kPreImage);
  h.page = fit * kUndoPageBytes;
  const std::string image = Image(fit);
  const absl::Status refused = journal.Append(h, image.data());
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  signal(SIGXFSZ, SIG_DFL);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("extend the undo journal"), absl::string_view::npos) << refused;
  EXPECT_EQ(ReadBack(kUndoMagic), fit);
}

}  // namespace
}  // namespace heapd
