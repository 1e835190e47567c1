// ContentUndo against simulated clients that follow the protocol: before a
// session's first store to a page in a generation, append the page as it is
// (a pre-image) to the session's journal in one write, then store into the
// data file. Every case checks the data file's bytes. The data file is on
// tmpfs (/dev/shm), where heapd tracks contents.
#include "heap/content_undo.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "gtest/gtest.h"
#include "heap/data_file.h"
#include "heap/test_dir.h"
#include "heap/undo_record.h"

namespace heapd {
namespace {

constexpr uint64_t kPage = kUndoPageBytes;

uint64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}

// A page's bytes, distinct per page and per `tag`.
std::string Pattern(uint64_t page, char tag) {
  std::string bytes(kPage, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(tag + (page / kPage) * 13 + i % 251);
  }
  return bytes;
}

// `page` with `bytes` stored at `offset`.
std::string Stored(std::string page, uint64_t offset, const std::string& bytes) {
  page.replace(offset, bytes.size(), bytes);
  return page;
}

// Compares two pages, naming the first byte that differs (gtest would
// print both pages whole).
::testing::AssertionResult SamePage(const std::string& got, const std::string& want) {
  if (got == want) return ::testing::AssertionSuccess();
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " bytes, not " << want.size();
  }
  size_t at = 0;
  while (got[at] == want[at]) ++at;
  return ::testing::AssertionFailure()
         << "byte " << at << " differs: " << testing::PrintToString(got.substr(at, 24))
         << " instead of " << testing::PrintToString(want.substr(at, 24));
}

// A simulated client's read-write session.
struct Session {
  ClientId id = 0;
  UniqueFd journal;
  uint64_t generation = 1;
  std::set<uint64_t> imaged;  // pages with a pre-image in this generation
};

class ContentUndoTest : public ::testing::Test {
 protected:
  // A data file of `size` bytes whose every page holds Pattern(page, 'o'),
  // and the ContentUndo of a heap whose committed epoch is `epoch`.
  void Make(uint64_t size = 16 * kPage, uint64_t epoch = 1) {
    auto data = DataFile::Create(dir_.Sub("data"), size);
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = std::move(*data);
    ASSERT_EQ(data_->backing(), BackingKind::kTmpfs);
    for (uint64_t page = 0; page < size; page += kPage) Put(page, 0, Pattern(page, 'o'));
    ASSERT_NO_FATAL_FAILURE(OpenUndo(epoch));
  }

  // (Re)opens the ContentUndo, as a heapd starting with the heap would.
  void OpenUndo(uint64_t epoch, UndoCounts* recovered = nullptr) {
    undo_.reset();
    auto undo = ContentUndo::Open(undo_dir(), data_.get(), epoch, recovered, compact_at_);
    ASSERT_TRUE(undo.ok()) << undo.status();
    undo_ = std::move(*undo);
    epoch_ = epoch;
  }

  std::string undo_dir() const { return dir_.Sub("undo"); }

  // The data file's bytes of `page`.
  std::string Page(uint64_t page) const {
    std::string bytes(kPage, '\0');
    EXPECT_EQ(pread(data_->fd(), bytes.data(), bytes.size(), static_cast<off_t>(page)),
              static_cast<ssize_t>(kPage));
    return bytes;
  }

  // Stores into the data file without a pre-image.
  void Put(uint64_t page, uint64_t offset, const std::string& bytes) {
    ASSERT_EQ(pwrite(data_->fd(), bytes.data(), bytes.size(), static_cast<off_t>(page + offset)),
              static_cast<ssize_t>(bytes.size()));
  }

  uint64_t DataFileBytes() const {
    struct stat st;
    return fstat(data_->fd(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }

  std::unique_ptr<Session> Attach(ClientId id) {
    auto session = std::make_unique<Session>();
    session->id = id;
    absl::StatusOr<UniqueFd> journal = undo_->OpenJournal(id);
    EXPECT_TRUE(journal.ok()) << journal.status();
    if (journal.ok()) session->journal = std::move(*journal);
    return session;
  }

  // Appends `record` to the session's journal in one write.
  static void Append(Session& s, const std::string& record) {
    ASSERT_EQ(write(s.journal.get(), record.data(), record.size()),
              static_cast<ssize_t>(record.size()));
  }

  static std::string PreImage(uint64_t page, uint64_t generation, const std::string& image) {
    UndoRecordHeader h;
    h.kind = static_cast<uint32_t>(UndoKind::kPreImage);
    h.page = page;
    h.time_ns = MonotonicNs();
    h.generation = generation;
    return EncodeUndoRecord(h, image);
  }

  // The session stores `bytes` at `offset` of `page`: a pre-image first if
  // it is the session's first store to the page in its generation.
  void Write(Session& s, uint64_t page, uint64_t offset, const std::string& bytes) {
    if (s.imaged.insert(page).second) {
      ASSERT_NO_FATAL_FAILURE(Append(s, PreImage(page, s.generation, Page(page))));
    }
    ASSERT_NO_FATAL_FAILURE(Put(page, offset, bytes));
  }

  // A sync of the session: its generation is committed with the next epoch.
  void Sync(Session& s) {
    ++epoch_;
    ASSERT_TRUE(undo_->PrepareCommit(s.id, s.generation, epoch_).ok());
    undo_->Committed(epoch_);
    ++s.generation;
    s.imaged.clear();
  }

  void Detach(Session& s) {
    ASSERT_NO_FATAL_FAILURE(Sync(s));
    undo_->EndSession(s.id);
  }

  UndoCounts Die(Session& s) { return undo_->RollBack(s.id); }

  // The bytes of records in the session's journal (after its control page).
  uint64_t JournalBytes(const Session& s) const {
    struct stat st;
    return fstat(s.journal.get(), &st) == 0
               ? static_cast<uint64_t>(st.st_size) - kJournalControlBytes
               : 0;
  }

  // The names in the undo directory, sorted.
  std::vector<std::string> UndoFiles() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(undo_dir())) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  TestDir dir_{"/dev/shm"};
  uint64_t compact_at_ = 16 << 20;  // heap.undo's rewrite threshold
  std::unique_ptr<DataFile> data_;
  std::unique_ptr<ContentUndo> undo_;
  uint64_t epoch_ = 0;
};

const std::vector<std::string> kOnlyHeapJournal = {"heap.undo"};

TEST_F(ContentUndoTest, DeadSessionsPagesGoBack) {
  ASSERT_NO_FATAL_FAILURE(Make());
  auto s = Attach(7);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "first"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 3 * kPage, 100, "second"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 4000, "again"));  // no second pre-image
  ASSERT_NO_FATAL_FAILURE(Write(*s, 5 * kPage, 0, std::string(kPage, 'x')));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 5 * kPage, 10, "twice"));
  EXPECT_EQ(JournalBytes(*s), 3 * kUndoImageRecordBytes);
  EXPECT_TRUE(SamePage(Page(0), Stored(Stored(Pattern(0, 'o'), 0, "first"), 4000, "again")));
  EXPECT_TRUE(SamePage(Page(5 * kPage), Stored(std::string(kPage, 'x'), 10, "twice")));

  const UndoCounts died = Die(*s);
  EXPECT_EQ(died.pages_restored, 3u);
  EXPECT_EQ(died.pages_handed_over, 0u);
  EXPECT_EQ(died.bad_journals, 0u);
  EXPECT_EQ(undo_->counts().pages_restored, 3u);
  for (uint64_t page = 0; page < 16 * kPage; page += kPage) {
    EXPECT_TRUE(SamePage(Page(page), Pattern(page, 'o'))) << "page " << page / kPage;
  }
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
  // A second death of the same session does nothing.
  EXPECT_EQ(Die(*s).pages_restored, 0u);
}

TEST_F(ContentUndoTest, DetachedSessionsPagesStay) {
  ASSERT_NO_FATAL_FAILURE(Make());
  auto s = Attach(7);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 2 * kPage, 0, "kept"));
  ASSERT_NO_FATAL_FAILURE(Detach(*s));
  EXPECT_TRUE(SamePage(Page(2 * kPage), Stored(Pattern(2 * kPage, 'o'), 0, "kept")));
  EXPECT_EQ(undo_->counts().pages_restored, 0u);
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, DeathGoesBackToTheLastSync) {
  ASSERT_NO_FATAL_FAILURE(Make());
  auto s = Attach(7);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "gen1-a"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "gen1-b"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s));
  const std::string synced0 = Page(0);
  const std::string synced1 = Page(kPage);
  ASSERT_TRUE(SamePage(synced1, Stored(Pattern(kPage, 'o'), 0, "gen1-b")));
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 8, "gen2-b"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 100, "gen2-b again"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 2 * kPage, 0, "gen2-c"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s));
  const std::string synced2 = Page(2 * kPage);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 2 * kPage, 50, "gen3-c"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 3 * kPage, 0, "gen3-d"));

  const UndoCounts died = Die(*s);
  EXPECT_EQ(died.pages_restored, 2u);
  EXPECT_TRUE(SamePage(Page(0), synced0));
  EXPECT_TRUE(SamePage(Page(kPage), Stored(Stored(synced1, 8, "gen2-b"), 100, "gen2-b again")));
  EXPECT_TRUE(SamePage(Page(2 * kPage), synced2));
  EXPECT_TRUE(SamePage(Page(3 * kPage), Pattern(3 * kPage, 'o')));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, APageTwoSessionsWroteIsHandedOverThenGoesBack) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 4 * kPage;
  auto s1 = Attach(1);
  auto s2 = Attach(2);
  ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 0, "AAAAAAAA"));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 8, "BBBBBBBB"));  // its pre-image holds s1's bytes
  const std::string both = Stored(Stored(Pattern(p, 'o'), 0, "AAAAAAAA"), 8, "BBBBBBBB");
  ASSERT_TRUE(SamePage(Page(p), both));

  const UndoCounts s1_died = Die(*s1);
  EXPECT_EQ(s1_died.pages_handed_over, 1u);
  EXPECT_EQ(s1_died.pages_restored, 0u);
  EXPECT_TRUE(SamePage(Page(p), both));  // s2 lives: the page stays
  EXPECT_EQ(UndoFiles(), (std::vector<std::string>{"heap.undo", "session-2.undo"}));

  const UndoCounts s2_died = Die(*s2);
  EXPECT_EQ(s2_died.pages_restored, 1u);
  EXPECT_TRUE(SamePage(Page(p), Pattern(p, 'o')));  // before s1, not s2's pre-image
  EXPECT_EQ(undo_->counts().pages_handed_over, 1u);
  EXPECT_EQ(undo_->counts().pages_restored, 1u);
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

class ContentUndoSyncTest : public ContentUndoTest {
 protected:
  // s1 and s2 both write a page; s2 syncs, committing the page as it is
  // (s1's bytes too); s1 dies. With `s1_writes_after_sync`, s1 also stored
  // into the page after s2's sync (in the generation it already has a
  // pre-image for): that store goes.
  void Run(bool s1_writes_after_sync) {
    ASSERT_NO_FATAL_FAILURE(Make());
    const uint64_t p = 4 * kPage;
    const uint64_t q = 6 * kPage;
    auto s1 = Attach(1);
    auto s2 = Attach(2);
    ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 0, "AAAAAAAA"));
    ASSERT_NO_FATAL_FAILURE(Write(*s1, q, 0, "s1 only"));
    ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 8, "BBBBBBBB"));
    ASSERT_NO_FATAL_FAILURE(Sync(*s2));
    const std::string at_sync = Page(p);
    ASSERT_TRUE(SamePage(at_sync, Stored(Stored(Pattern(p, 'o'), 0, "AAAAAAAA"), 8, "BBBBBBBB")));
    if (s1_writes_after_sync) {
      ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 16, "CCCCCCCC"));
      ASSERT_EQ(JournalBytes(*s1), 2 * kUndoImageRecordBytes);
    }

    const UndoCounts s1_died = Die(*s1);
    EXPECT_EQ(s1_died.pages_handed_over, 0u);
    EXPECT_EQ(s1_died.pages_restored, 2u);  // p to s2's commit, q to the original
    EXPECT_TRUE(SamePage(Page(p), at_sync));
    EXPECT_TRUE(SamePage(Page(q), Pattern(q, 'o')));

    // s2's next generation: a new pre-image, and its death puts back the
    // page as its sync left it.
    ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 24, "DDDDDDDD"));
    ASSERT_EQ(JournalBytes(*s2), 2 * kUndoImageRecordBytes);
    EXPECT_TRUE(SamePage(Page(p), Stored(at_sync, 24, "DDDDDDDD")));
    const UndoCounts s2_died = Die(*s2);
    EXPECT_EQ(s2_died.pages_restored, 1u);
    EXPECT_TRUE(SamePage(Page(p), at_sync));
    EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
  }
};

TEST_F(ContentUndoSyncTest, ASyncCommitsASharedPageAsItIs) { Run(false); }

TEST_F(ContentUndoSyncTest, ASyncCommitsASharedPageAsItIsAndLaterStoresGo) { Run(true); }

// After a commit image, a later sync of the page by another session
// commits what that session stored: nothing puts back the older image.
TEST_F(ContentUndoTest, ALaterSyncOfASharedPageIsKept) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 4 * kPage;
  auto s1 = Attach(1);
  auto s2 = Attach(2);
  ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 0, "AAAAAAAA"));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 8, "BBBBBBBB"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s2));  // commits the page as it is
  ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 16, "CCCCCCCC"));
  ASSERT_NO_FATAL_FAILURE(Detach(*s1));  // commits s1's later store
  const std::string committed = Page(p);
  ASSERT_TRUE(SamePage(
      committed,
      Stored(Stored(Stored(Pattern(p, 'o'), 0, "AAAAAAAA"), 8, "BBBBBBBB"), 16, "CCCCCCCC")));
  // s2 dies having stored nothing since its sync: the page stays. (Its
  // death ends the last session: the page is rewritten from s1's commit
  // image, counted as restored though no byte changes.)
  Die(*s2);
  EXPECT_TRUE(SamePage(Page(p), committed));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

// The same, with heapd crashing while s2 lives: recovery keeps s1's commit.
TEST_F(ContentUndoTest, ALaterSyncOfASharedPageSurvivesRecovery) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 4 * kPage;
  auto s1 = Attach(1);
  auto s2 = Attach(2);
  ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 0, "AAAAAAAA"));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 8, "BBBBBBBB"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s2));
  ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 16, "CCCCCCCC"));
  ASSERT_NO_FATAL_FAILURE(Detach(*s1));
  const std::string committed = Page(p);
  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(epoch_, &recovered));
  EXPECT_TRUE(SamePage(Page(p), committed));
  EXPECT_EQ(recovered.bad_journals, 0u);
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

// A page handed over by a dead session, then synced twice by the session
// that lives: its second sync is what stays.
TEST_F(ContentUndoTest, AHandedOverPageKeepsItsLastSync) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 4 * kPage;
  auto s1 = Attach(1);
  auto s2 = Attach(2);
  ASSERT_NO_FATAL_FAILURE(Write(*s1, p, 0, "AAAAAAAA"));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 8, "BBBBBBBB"));
  EXPECT_EQ(Die(*s1).pages_handed_over, 1u);
  ASSERT_NO_FATAL_FAILURE(Sync(*s2));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 16, "CCCCCCCC"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s2));
  const std::string committed = Page(p);
  ASSERT_NO_FATAL_FAILURE(Write(*s2, p, 24, "DDDDDDDD"));
  EXPECT_EQ(Die(*s2).pages_restored, 1u);
  EXPECT_TRUE(SamePage(Page(p), committed));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, JournalsOfACrashedHeapdAreRecoveredAtOpen) {
  ASSERT_NO_FATAL_FAILURE(Make(2 << 20, 3));
  const uint64_t last = (2 << 20) - kPage;
  auto s1 = Attach(1);
  auto s2 = Attach(2);
  ASSERT_NO_FATAL_FAILURE(Write(*s1, 0, 0, "s1-0"));
  ASSERT_NO_FATAL_FAILURE(Write(*s1, kPage, 0, "s1-1"));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, kPage, 8, "s2-1"));  // after s1's store
  ASSERT_NO_FATAL_FAILURE(Write(*s2, last, 0, std::string(kPage, 'z')));
  ASSERT_NO_FATAL_FAILURE(Write(*s2, 0, 2000, "s2-0"));
  EXPECT_EQ(UndoFiles(),
            (std::vector<std::string>{"heap.undo", "session-1.undo", "session-2.undo"}));

  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(3, &recovered));  // heapd crashed: no RollBack
  EXPECT_EQ(recovered.pages_restored, 3u);
  EXPECT_EQ(recovered.bad_journals, 0u);
  EXPECT_EQ(undo_->counts().pages_restored, 3u);
  for (uint64_t page = 0; page < (2 << 20); page += kPage) {
    ASSERT_TRUE(SamePage(Page(page), Pattern(page, 'o'))) << "page " << page / kPage;
  }
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);

  // And again: nothing is left to put back.
  Put(0, 0, "after");
  ASSERT_NO_FATAL_FAILURE(OpenUndo(3, &recovered));
  EXPECT_EQ(recovered.pages_restored, 0u);
  EXPECT_TRUE(SamePage(Page(0), Stored(Pattern(0, 'o'), 0, "after")));
}

// Zeros, then bytes that are not a record's start (a journal not following
// the protocol: a header of zeros), after records a sync punched out:
// recovery looks for records on a record's boundary, and reads nothing
// there.
TEST_F(ContentUndoTest, AHeaderOfZerosAfterPunchedRecordsIsNotReadAtOpen) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage, 3));
  auto s = Attach(1);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "synced"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s));  // its pre-image punched out
  std::string torn(kUndoHeaderBytes, '\0');
  torn += Page(kPage);  // an image after a header of zeros
  ASSERT_NO_FATAL_FAILURE(Append(*s, torn));
  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(epoch_, &recovered));  // heapd crashed
  EXPECT_EQ(recovered.bad_journals, 0u);
  EXPECT_EQ(recovered.pages_restored, 0u);
  EXPECT_TRUE(SamePage(Page(0), Stored(Pattern(0, 'o'), 0, "synced")));
}

TEST_F(ContentUndoTest, RecoveryKeepsWhatACommittedSyncCommitted) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage, 4));
  auto s = Attach(9);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "gen1-0"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "gen1-1"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s));
  ASSERT_EQ(epoch_, 5u);
  const std::string synced0 = Page(0);
  const std::string synced1 = Page(kPage);
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 100, "gen2-1"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 2 * kPage, 0, "gen2-2"));

  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(5, &recovered));
  EXPECT_EQ(recovered.bad_journals, 0u);
  EXPECT_EQ(recovered.pages_restored, 2u);
  EXPECT_TRUE(SamePage(Page(0), synced0));
  EXPECT_TRUE(SamePage(Page(kPage), synced1));
  EXPECT_TRUE(SamePage(Page(2 * kPage), Pattern(2 * kPage, 'o')));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, RecoveryIgnoresAGenerationEndOfAnUncommittedEpoch) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage, 5));
  auto s = Attach(9);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "gen1-0"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, 3 * kPage, 0, "gen1-3"));
  // A sync whose epoch 6 never got persisted.
  ASSERT_TRUE(undo_->PrepareCommit(s->id, 1, 6).ok());

  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(5, &recovered));
  EXPECT_EQ(recovered.pages_restored, 2u);
  EXPECT_TRUE(SamePage(Page(0), Pattern(0, 'o')));
  EXPECT_TRUE(SamePage(Page(3 * kPage), Pattern(3 * kPage, 'o')));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, RecoveryGoesBackToTheLastCommittedOfTwoSyncs) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage, 4));
  auto s = Attach(9);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "gen1-0"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s));  // epoch 5, committed
  ASSERT_EQ(epoch_, 5u);
  const std::string synced0 = Page(0);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 100, "gen2-0"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "gen2-1"));
  ASSERT_TRUE(undo_->PrepareCommit(s->id, 2, 6).ok());  // epoch 6 not persisted

  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(5, &recovered));
  EXPECT_EQ(recovered.bad_journals, 0u);
  EXPECT_EQ(recovered.pages_restored, 2u);
  EXPECT_TRUE(SamePage(Page(0), synced0));
  EXPECT_TRUE(SamePage(Page(kPage), Pattern(kPage, 'o')));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, RecoveryKeepsASyncWhoseEpochWasPersisted) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage, 5));
  auto s = Attach(9);
  ASSERT_NO_FATAL_FAILURE(Write(*s, 0, 0, "gen1-0"));
  ASSERT_TRUE(undo_->PrepareCommit(s->id, 1, 6).ok());
  const std::string synced0 = Page(0);
  // heapd persisted epoch 6 and crashed before Committed.
  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(6, &recovered));
  EXPECT_EQ(recovered.pages_restored, 0u);
  EXPECT_TRUE(SamePage(Page(0), synced0));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

TEST_F(ContentUndoTest, ForgottenPagesAreNotPutBack) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 5 * kPage;
  const uint64_t q = 9 * kPage;
  auto s = Attach(3);
  ASSERT_NO_FATAL_FAILURE(Write(*s, p, 0, "before free"));
  ASSERT_NO_FATAL_FAILURE(Write(*s, q, 0, "kept tracked"));
  // [4, 8) pages is freed and handed out again: its new owner stores
  // without pre-images.
  auto owner = Attach(4);
  ASSERT_TRUE(undo_->Forget(owner->id, 4 * kPage, 4 * kPage).ok());
  ASSERT_NO_FATAL_FAILURE(Put(p, 0, std::string(kPage, 'n')));

  const UndoCounts died = Die(*s);
  EXPECT_EQ(died.pages_restored, 1u);
  EXPECT_TRUE(SamePage(Page(p), std::string(kPage, 'n')));
  EXPECT_TRUE(SamePage(Page(q), Pattern(q, 'o')));
  ASSERT_NO_FATAL_FAILURE(Detach(*owner));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

// A live session's pre-image older than the page's cut still counts: its
// later stores in that generation took none, and putting the page back to
// the cut would undo them.
TEST_F(ContentUndoTest, ALiveWriterFromBeforeTheCutKeepsItsStores) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 6 * kPage;
  auto live = Attach(1);
  auto dies = Attach(2);
  ASSERT_NO_FATAL_FAILURE(Write(*live, p, 0, "live-1"));
  ASSERT_NO_FATAL_FAILURE(Write(*dies, p, 16, "dies-1"));
  ASSERT_NO_FATAL_FAILURE(Sync(*dies));                    // a commit image of p: the cut
  ASSERT_NO_FATAL_FAILURE(Write(*live, p, 32, "live-2"));  // same generation: no pre-image
  ASSERT_NO_FATAL_FAILURE(Write(*dies, p, 48, "dies-2"));
  const std::string now = Page(p);

  const UndoCounts died = Die(*dies);
  EXPECT_EQ(died.pages_restored, 0u);
  EXPECT_EQ(died.pages_handed_over, 1u);
  EXPECT_TRUE(SamePage(Page(p), now));
}

// Memory handed to a live session free is written without pre-images; a
// dead session's pre-image of such a page is handed over to it, never put
// back over its stores. Its sync then commits the page; its death puts the
// page back.
class ContentUndoFreshTest : public ContentUndoTest {
 protected:
  void Run(bool owner_syncs) {
    ASSERT_NO_FATAL_FAILURE(Make());
    const uint64_t p = 3 * kPage;
    auto owner = Attach(1);
    auto other = Attach(2);
    ASSERT_TRUE(undo_->Forget(owner->id, 2 * kPage, 2 * kPage).ok());
    ASSERT_NO_FATAL_FAILURE(Put(p, 0, "fresh-1"));  // the owner, no pre-image
    ASSERT_NO_FATAL_FAILURE(Write(*other, p, 16, "other"));
    const std::string before_other_died = Page(p);
    ASSERT_NO_FATAL_FAILURE(Put(p, 32, "fresh-2"));

    const UndoCounts died = Die(*other);
    EXPECT_EQ(died.pages_restored, 0u);
    EXPECT_EQ(died.pages_handed_over, 1u);
    EXPECT_TRUE(SamePage(Page(p), Stored(before_other_died, 32, "fresh-2")));
    if (owner_syncs) {
      ASSERT_NO_FATAL_FAILURE(Sync(*owner));
      const std::string synced = Page(p);
      ASSERT_NO_FATAL_FAILURE(Write(*owner, p, 48, "after"));
      EXPECT_EQ(Die(*owner).pages_restored, 1u);
      EXPECT_TRUE(SamePage(Page(p), synced));
    } else {
      // Free at the last commit: any contents will do, but the page must
      // be put back to what the dead session's pre-image held.
      EXPECT_EQ(Die(*owner).pages_restored, 1u);
      EXPECT_TRUE(SamePage(Page(p), Stored(Pattern(p, 'o'), 0, "fresh-1")));
    }
    EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
  }
};

TEST_F(ContentUndoFreshTest, ThenItsSyncCommitsThePage) { Run(true); }
TEST_F(ContentUndoFreshTest, ThenItsDeathPutsThePageBack) { Run(false); }

// Two sessions syncing the same page write a commit image at every sync;
// heap.undo is rewritten with only what still applies, and rolling back and
// recovering still find the page's last commit.
TEST_F(ContentUndoTest, HeapUndoStaysSmallUnderManySyncsOfASharedPage) {
  compact_at_ = 64 << 10;
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t p = 2 * kPage;
  auto a = Attach(1);
  auto b = Attach(2);
  for (int i = 0; i < 300; ++i) {
    ASSERT_NO_FATAL_FAILURE(Write(*a, p, 0, absl::StrCat("a", i, ";")));
    ASSERT_NO_FATAL_FAILURE(Write(*b, p, 16, absl::StrCat("b", i, ";")));
    ASSERT_NO_FATAL_FAILURE(Sync(*a));
    ASSERT_NO_FATAL_FAILURE(Sync(*b));
  }
  // 600 commit images (2.4 MiB) were written.
  struct stat st;
  ASSERT_EQ(stat((undo_dir() + "/heap.undo").c_str(), &st), 0);
  EXPECT_LT(st.st_size, 256 << 10);
  const std::string synced = Page(p);
  ASSERT_NO_FATAL_FAILURE(Write(*a, p, 0, "unsynced"));
  EXPECT_EQ(Die(*a).pages_restored, 1u);
  EXPECT_TRUE(SamePage(Page(p), synced));
  // heapd crashes: recovery finds the same commit.
  ASSERT_NO_FATAL_FAILURE(Write(*b, p, 16, "unsynced too"));
  ASSERT_NO_FATAL_FAILURE(OpenUndo(epoch_));
  EXPECT_TRUE(SamePage(Page(p), synced));
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

// Hostile journals: a client may append anything to its journal.
class ContentUndoHostileTest : public ContentUndoTest {
 protected:
  static constexpr uint64_t kSize = 2 << 20;

  // A session that writes pages 1 and 2 properly, then appends `bad`, then
  // (unless `torn`) writes page 3 properly (not read: the journal stopped
  // before it). Its death puts back pages 1 and 2 only, writes nothing
  // else, and counts a bad journal (unless `torn`: `bad` is then only a
  // tail still being written).
  void DiesWith(const std::string& bad, bool torn = false) {
    const uint64_t bad_before = undo_->counts().bad_journals;
    auto s = Attach(next_id_++);
    ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "good-1"));
    ASSERT_NO_FATAL_FAILURE(Write(*s, 2 * kPage, 0, "good-2"));
    ASSERT_NO_FATAL_FAILURE(Append(*s, bad));
    if (!torn) {
      ASSERT_NO_FATAL_FAILURE(Write(*s, 3 * kPage, 0, "after"));
    }
    const std::string page3 = Page(3 * kPage);

    const UndoCounts died = Die(*s);
    EXPECT_EQ(died.bad_journals, torn ? 0u : 1u);
    EXPECT_EQ(undo_->counts().bad_journals, bad_before + (torn ? 0 : 1));
    EXPECT_EQ(died.pages_restored, 2u);
    EXPECT_TRUE(SamePage(Page(0), Pattern(0, 'o')));
    EXPECT_TRUE(SamePage(Page(kPage), Pattern(kPage, 'o')));
    EXPECT_TRUE(SamePage(Page(2 * kPage), Pattern(2 * kPage, 'o')));
    EXPECT_TRUE(SamePage(Page(3 * kPage), page3));
    EXPECT_EQ(DataFileBytes(), kSize);
    EXPECT_EQ(data_->size(), kSize);
    for (uint64_t page = 4 * kPage; page < kSize; page += kPage) {
      ASSERT_TRUE(SamePage(Page(page), Pattern(page, 'o'))) << "page " << page / kPage;
    }
    EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
    // Put page 3 back for the next case.
    ASSERT_NO_FATAL_FAILURE(Put(3 * kPage, 0, Pattern(3 * kPage, 'o')));
  }

  static std::string Record(UndoKind kind, uint64_t page) {
    UndoRecordHeader h;
    h.kind = static_cast<uint32_t>(kind);
    h.page = page;
    h.time_ns = MonotonicNs();
    h.session = 1;
    h.generation = 1;
    h.epoch = 1;
    return EncodeUndoRecord(h, UndoKindHasImage(h.kind) ? std::string(kPage, '!') : std::string());
  }

  ClientId next_id_ = 1;
};

TEST_F(ContentUndoHostileTest, Garbage) {
  ASSERT_NO_FATAL_FAILURE(Make(kSize));
  ASSERT_NO_FATAL_FAILURE(DiesWith(std::string(kUndoImageRecordBytes, 'G')));
  // A record with a bad checksum.
  std::string flipped = Record(UndoKind::kPreImage, 4 * kPage);
  flipped[kUndoHeaderBytes + 10] ^= 1;
  ASSERT_NO_FATAL_FAILURE(DiesWith(flipped));
  // A record claiming a page not aligned.
  ASSERT_NO_FATAL_FAILURE(DiesWith(Record(UndoKind::kPreImage, 4 * kPage + 1)));
}

TEST_F(ContentUndoHostileTest, ShortGarbageIsATornTail) {
  ASSERT_NO_FATAL_FAILURE(Make(kSize));
  // Shorter than a header: read as a record still being written; the
  // pages before it go back.
  ASSERT_NO_FATAL_FAILURE(DiesWith(std::string(kUndoHeaderBytes - 1, 'G'), /*torn=*/true));
}

TEST_F(ContentUndoHostileTest, PagesBeyondTheDataFile) {
  ASSERT_NO_FATAL_FAILURE(Make(kSize));
  for (uint64_t page :
       {kSize, kSize + kPage, uint64_t{1} << 40, uint64_t{1} << 63, UINT64_MAX - kPage + 1}) {
    SCOPED_TRACE(page);
    ASSERT_NO_FATAL_FAILURE(DiesWith(Record(UndoKind::kPreImage, page)));
  }
}

TEST_F(ContentUndoHostileTest, KindsOnlyHeapdWrites) {
  ASSERT_NO_FATAL_FAILURE(Make(kSize));
  for (UndoKind kind : {UndoKind::kCommitImage, UndoKind::kClear, UndoKind::kGenerationEnd}) {
    SCOPED_TRACE(static_cast<uint32_t>(kind));
    ASSERT_NO_FATAL_FAILURE(DiesWith(Record(kind, 4 * kPage)));
  }
}

// A forged generation end in a journal does not void another session's
// pre-images.
TEST_F(ContentUndoHostileTest, AForgedGenerationEndVoidsNothing) {
  ASSERT_NO_FATAL_FAILURE(Make(kSize));
  auto victim = Attach(100);
  ASSERT_NO_FATAL_FAILURE(Write(*victim, 10 * kPage, 0, "victim"));
  auto forger = Attach(101);
  UndoRecordHeader h;
  h.kind = static_cast<uint32_t>(UndoKind::kGenerationEnd);
  h.session = victim->id;
  h.generation = 1;
  h.epoch = 0;
  ASSERT_NO_FATAL_FAILURE(Append(*forger, EncodeUndoRecord(h, "")));
  EXPECT_EQ(Die(*forger).bad_journals, 1u);
  EXPECT_EQ(Die(*victim).pages_restored, 1u);
  EXPECT_TRUE(SamePage(Page(10 * kPage), Pattern(10 * kPage, 'o')));
}

// A client rewrites its journal after heapd read it (truncate, append a
// record of its own choosing at the same offset): heapd puts back nothing
// it did not check.
TEST_F(ContentUndoHostileTest, ARecordChangedAfterItWasReadIsNotRestored) {
  ASSERT_NO_FATAL_FAILURE(Make(kSize));
  auto s = Attach(next_id_++);
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "stored"));
  const std::string stored = Page(kPage);
  ASSERT_TRUE(undo_->Forget(0, 100 * kPage, kPage).ok());  // heapd reads the journal
  ASSERT_EQ(ftruncate(s->journal.get(), 0), 0);
  ASSERT_NO_FATAL_FAILURE(Append(*s, PreImage(kPage, 1, std::string(kPage, 'F'))));
  EXPECT_EQ(Die(*s).pages_restored, 0u);
  EXPECT_TRUE(SamePage(Page(kPage), stored));
}

// A client inside its journal's guard (taking a pre-image without the OFD
// lock) keeps heapd from putting pages back, as one holding its lock
// does: after trying for kLockAttempts * kLockRetry, heapd hands the dead
// session's pages over instead. Its guard is open again afterwards.
TEST_F(ContentUndoTest, AClientInsideItsGuardKeepsPagesFromGoingBack) {
  ASSERT_NO_FATAL_FAILURE(Make());
  auto busy_client = Attach(20);
  // Its control page, as the client maps it (the journal's descriptor
  // appends whatever the offset).
  UniqueFd control(open((undo_dir() + "/session-20.undo").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(control.valid());
  auto set = [&](uint64_t at, uint32_t value) {
    ASSERT_EQ(pwrite(control.get(), &value, sizeof(value), at),
              static_cast<ssize_t>(sizeof(value)));
  };
  auto get = [&](uint64_t at) {
    uint32_t value = 7;
    EXPECT_EQ(pread(control.get(), &value, sizeof(value), at), static_cast<ssize_t>(sizeof(value)));
    return value;
  };
  EXPECT_EQ(get(0), kJournalControlMagic);
  // The client lives: it holds its read lock on kJournalAliveAt.
  struct flock alive = JournalAliveLock(F_RDLCK);
  ASSERT_EQ(fcntl(control.get(), F_OFD_SETLK, &alive), 0);
  ASSERT_NO_FATAL_FAILURE(set(kJournalBusyAt, 1));
  auto dead = Attach(21);
  ASSERT_NO_FATAL_FAILURE(Write(*dead, 2 * kPage, 0, "dead"));
  UndoCounts died = Die(*dead);
  EXPECT_EQ(died.pages_restored, 0u);
  EXPECT_EQ(died.pages_handed_over, 1u);
  EXPECT_EQ(get(kJournalClosedAt), 0u);

  ASSERT_NO_FATAL_FAILURE(set(kJournalBusyAt, 0));
  auto dead_too = Attach(22);
  ASSERT_NO_FATAL_FAILURE(Write(*dead_too, 3 * kPage, 0, "dead too"));
  died = Die(*dead_too);
  EXPECT_EQ(died.pages_restored, 1u);
  EXPECT_TRUE(SamePage(Page(3 * kPage), Pattern(3 * kPage, 'o')));
  EXPECT_EQ(get(kJournalClosedAt), 0u);

  // The client died inside its guard (busy left set, its lock gone with
  // it): not waited for.
  ASSERT_NO_FATAL_FAILURE(set(kJournalBusyAt, 1));
  alive = JournalAliveLock(F_UNLCK);
  ASSERT_EQ(fcntl(control.get(), F_OFD_SETLK, &alive), 0);
  auto dead_third = Attach(23);
  ASSERT_NO_FATAL_FAILURE(Write(*dead_third, 4 * kPage, 0, "dead third"));
  died = Die(*dead_third);
  EXPECT_EQ(died.pages_restored, 1u);
  EXPECT_EQ(died.pages_handed_over, 0u);
}

TEST_F(ContentUndoHostileTest, AnOversizedJournalStopsBeingRead) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage));
  auto s = Attach(5);
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "written"));
  const std::string written = Page(kPage);
  // Far more than a session of a 16-page heap could need.
  ASSERT_EQ(ftruncate(s->journal.get(), 1 << 30), 0);
  const UndoCounts died = Die(*s);
  EXPECT_EQ(died.bad_journals, 1u);
  EXPECT_EQ(died.pages_restored, 0u);  // its pages stay as they are
  EXPECT_TRUE(SamePage(Page(kPage), written));
  EXPECT_EQ(DataFileBytes(), 16 * kPage);
  EXPECT_EQ(UndoFiles(), kOnlyHeapJournal);
}

// Space taken past the journal's end (fallocate, keeping its size) counts
// against it as well: the journal stops being read, and that space goes.
TEST_F(ContentUndoHostileTest, SpaceTakenPastTheJournalsEndCounts) {
  ASSERT_NO_FATAL_FAILURE(Make(16 * kPage));
  auto s = Attach(6);
  ASSERT_NO_FATAL_FAILURE(Write(*s, kPage, 0, "written"));
  ASSERT_EQ(fallocate(s->journal.get(), FALLOC_FL_KEEP_SIZE, 1 << 20, 256 << 20), 0);
  (void)undo_->MarkChanges();  // heapd reads the journals
  EXPECT_EQ(undo_->counts().bad_journals, 1u);
  struct stat st;
  ASSERT_EQ(fstat(s->journal.get(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, kJournalControlBytes + 2 * kUndoPageBytes);
}

// Marks (snapshot stores): a chunk's stamp says whether it may have changed
// since an earlier mark; stores that can still come without a pre-image
// (the page's generation is open, memory granted fresh) count as changes
// after the mark too; an unread journal makes every chunk changed.
TEST_F(ContentUndoTest, MarksSayWhichChunksChangedSinceThem) {
  ASSERT_NO_FATAL_FAILURE(Make(4 * kChunkSize));
  auto changed_since = [](const ChunkChanges& now, const ChunkChanges& then) {
    std::vector<int> chunks;
    for (int chunk = 0; chunk < 4; ++chunk) {
      if (now.ChangedAt(chunk) > then.mark) chunks.push_back(chunk);
    }
    return chunks;
  };
  using Chunks = std::vector<int>;
  const ChunkChanges m1 = undo_->MarkChanges();
  auto s = Attach(3);
  ASSERT_NO_FATAL_FAILURE(Write(*s, kChunkSize + 5 * kPage, 0, "first"));
  const ChunkChanges m2 = undo_->MarkChanges();
  EXPECT_EQ(m2.source, m1.source);
  EXPECT_EQ(changed_since(m2, m1), Chunks{1});
  // More stores of that generation take no pre-image: after m2 too.
  ASSERT_NO_FATAL_FAILURE(Write(*s, kChunkSize + 5 * kPage, 0, "second"));
  ASSERT_NO_FATAL_FAILURE(Sync(*s));
  const ChunkChanges m3 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m3, m2), Chunks{1});
  const ChunkChanges m4 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m4, m3), Chunks{});
  // Memory handed out fresh is written without pre-images until its grant
  // ends (a sync but one later).
  auto owner = Attach(4);
  ASSERT_TRUE(undo_->Forget(owner->id, 2 * kChunkSize, kChunkSize).ok());
  const ChunkChanges m5 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m5, m4), Chunks{2});
  ASSERT_NO_FATAL_FAILURE(Sync(*owner));
  const ChunkChanges m6 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m6, m5), Chunks{2});
  ASSERT_NO_FATAL_FAILURE(Sync(*owner));
  const ChunkChanges m7 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m7, m6), Chunks{2});
  EXPECT_EQ(changed_since(undo_->MarkChanges(), m7), Chunks{});
  // A dead session's pages put back are changes.
  auto dying = Attach(5);
  ASSERT_NO_FATAL_FAILURE(Write(*dying, 3 * kChunkSize, 0, "lost"));
  const ChunkChanges m8 = undo_->MarkChanges();
  EXPECT_EQ(Die(*dying).pages_restored, 1u);
  const ChunkChanges m9 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m9, m8), Chunks{3});
  // A journal heapd stops reading hides its writer's stores: everything.
  auto broken = Attach(6);
  ASSERT_NO_FATAL_FAILURE(Append(*broken, std::string(kUndoImageRecordBytes, 'G')));
  const ChunkChanges m10 = undo_->MarkChanges();
  EXPECT_EQ(changed_since(m10, m9), (Chunks{0, 1, 2, 3}));
  EXPECT_EQ(changed_since(undo_->MarkChanges(), m10), (Chunks{0, 1, 2, 3}));
  // Another ContentUndo's marks are not comparable.
  ASSERT_NO_FATAL_FAILURE(OpenUndo(epoch_));
  EXPECT_NE(undo_->MarkChanges().source, m1.source);
}

// A sync writes its commit images, then its generation end: one that
// failed in between leaves commit images that never apply (they would put
// back what the session stored after its last completed sync).
TEST_F(ContentUndoTest, CommitImagesApplyOnlyWithTheirGenerationEnd) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const uint64_t page = 3 * kPage;
  auto append_to_heap_journal = [&](UndoRecordHeader h, const std::string& image) {
    undo_.reset();
    UniqueFd fd(open(absl::StrCat(undo_dir(), "/heap.undo").c_str(), O_WRONLY | O_APPEND));
    ASSERT_TRUE(fd.valid());
    const std::string record = EncodeUndoRecord(h, image);
    ASSERT_EQ(write(fd.get(), record.data(), record.size()), static_cast<ssize_t>(record.size()));
  };
  UndoRecordHeader commit;
  commit.kind = static_cast<uint32_t>(UndoKind::kCommitImage);
  commit.page = page;
  commit.time_ns = MonotonicNs();
  commit.session = 9;
  commit.generation = 4;
  commit.epoch = 1;  // committed
  ASSERT_NO_FATAL_FAILURE(append_to_heap_journal(commit, Pattern(page, 'x')));
  ASSERT_NO_FATAL_FAILURE(OpenUndo(1));  // puts back every page a record names
  EXPECT_TRUE(SamePage(Page(page), Pattern(page, 'o')));
  EXPECT_EQ(undo_->counts().pages_restored, 0u);

  // With its generation end (of that generation and epoch), it applies.
  commit.time_ns = MonotonicNs();
  ASSERT_NO_FATAL_FAILURE(append_to_heap_journal(commit, Pattern(page, 'x')));
  UndoRecordHeader end;
  end.kind = static_cast<uint32_t>(UndoKind::kGenerationEnd);
  end.session = 9;
  end.generation = 4;
  end.epoch = 1;
  ASSERT_NO_FATAL_FAILURE(append_to_heap_journal(end, ""));
  UndoCounts recovered;
  ASSERT_NO_FATAL_FAILURE(OpenUndo(1, &recovered));
  EXPECT_TRUE(SamePage(Page(page), Pattern(page, 'x')));
  EXPECT_EQ(recovered.pages_restored, 1u);
}

}  // namespace
}  // namespace heapd
