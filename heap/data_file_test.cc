#include "heap/data_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

TEST(DataFileTest, CreateReservesAndGrowKeepsTheSizeInChunks) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 4 << 20);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 4u << 20);
  ASSERT_TRUE((*file)->Grow(8 << 20).ok());
  struct stat st;
  ASSERT_EQ(fstat((*file)->fd(), &st), 0);
  EXPECT_EQ(st.st_size, 8 << 20);
  EXPECT_GE(st.st_blocks * 512, 8 << 20);  // reserved, not sparse
  ASSERT_TRUE((*file)->Flush().ok());
  auto reopened = DataFile::Open(dir.Sub("data"));
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->size(), 8u << 20);
}

TEST(DataFileTest, CreateRefusesAnExistingFileAndOpenAMissingOne) {
  TestDir dir;
  ASSERT_TRUE(DataFile::Create(dir.Sub("data"), 0).ok());
  auto again = DataFile::Create(dir.Sub("data"), 0);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find(dir.Sub("data")), std::string::npos);
  EXPECT_EQ(DataFile::Open(dir.Sub("missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(DataFileTest, DetectsTmpfs) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
  TestDir dir("/dev/shm");
  auto file = DataFile::Create(dir.Sub("data"), 0);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->backing(), BackingKind::kTmpfs);
  EXPECT_STREQ(BackingKindName((*file)->backing()), "tmpfs");
}

// A grow the file system refuses is RESOURCE_EXHAUSTED and leaves the file
// as it was. RLIMIT_FSIZE stands in for a full disk (EFBIG) without root;
// tests/ exercises a real full tmpfs.
TEST(DataFileTest, RefusedGrowIsResourceExhaustedAndChangesNothing) {
  TestDir dir;
  const std::string path = dir.Sub("data");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {16 << 20, 16 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    auto file = DataFile::Create(path, 8 << 20);
    if (!file.ok()) _exit(10);
    absl::Status grown = (*file)->Grow(32 << 20);
    if (grown.code() != absl::StatusCode::kResourceExhausted) _exit(11);
    if (grown.message().find(path) == std::string::npos) _exit(12);
    if ((*file)->size() != (8u << 20)) _exit(13);
    struct stat st;
    if (fstat((*file)->fd(), &st) != 0 || st.st_size != (8 << 20)) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(DataFileTest, ReflinkProbeLeavesNothingAndSaysNoOnTmpfs) {
  TestDir dir(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "");
  const bool tmpfs = access("/dev/shm", W_OK) == 0;
  const bool reflink = ReflinkSupported(dir.path());
  if (tmpfs) {
    EXPECT_FALSE(reflink);  // tmpfs cannot clone files
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_FALSE(ReflinkSupported(dir.Sub("missing")));
}

}  // namespace
}  // namespace heapd
