// The fd-relative file operations heapd and its snapshot children use in
// directories a hostile user may shape: none follows a symlink, opens a
// FIFO's reader waiting, or reads past a cap.
#include "util/dir_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace heapd {
namespace {

namespace fs = std::filesystem;

class DirFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/dir-files-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    fs::create_directory(root_ + "/dir");
    fs::create_directory(root_ + "/outside");
    std::ofstream(root_ + "/outside/secret") << "secret";
    dir_ = open((root_ + "/dir").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dir_, 0);
  }
  void TearDown() override {
    close(dir_);
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  std::string In(const std::string& name) const { return root_ + "/dir/" + name; }

  std::string root_;
  int dir_ = -1;
};

TEST_F(DirFilesTest, ReadsAndWritesFilesInTheDirectory) {
  ASSERT_TRUE(WriteNewFileAt(dir_, "f", "hello").ok());
  EXPECT_EQ(WriteNewFileAt(dir_, "f", "again").code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::string> read = ReadFileAt(dir_, "f", 5);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "hello");
  EXPECT_EQ(ReadFileAt(dir_, "f", 4).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadFileAt(dir_, "missing", 4).status().code(), absl::StatusCode::kNotFound);
  struct stat st;
  ASSERT_EQ(stat(In("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "a new file is readable by others";
}

TEST_F(DirFilesTest, SymlinksAreNeverFollowed) {
  fs::create_symlink(root_ + "/outside/secret", In("link"));
  fs::create_directory_symlink(root_ + "/outside", In("dirlink"));
  EXPECT_FALSE(ReadFileAt(dir_, "link", 100).ok());
  uint64_t size = 0;
  EXPECT_FALSE(OpenRegularFileAt(dir_, "link", &size).ok());
  EXPECT_FALSE(OpenDirectoryAt(dir_, "dirlink").ok());
  EXPECT_FALSE(WriteNewFileAt(dir_, "link", "overwrite").ok());
  // Removing a tree removes the links, never what they point to.
  fs::create_directory(In("tree"));
  fs::create_directory_symlink(root_ + "/outside", In("tree/dirlink"));
  fs::create_symlink(root_ + "/outside/secret", In("tree/link"));
  ASSERT_TRUE(RemoveTreeAt(dir_, "tree").ok());
  EXPECT_FALSE(fs::exists(In("tree")));
  ASSERT_TRUE(RemoveTreeAt(dir_, "dirlink").ok());
  std::ifstream secret(root_ + "/outside/secret");
  std::string contents;
  secret >> contents;
  EXPECT_EQ(contents, "secret") << "a removal followed a symlink";
  EXPECT_TRUE(RemoveTreeAt(dir_, "never-there").ok());
}

TEST_F(DirFilesTest, AFifoOrADeviceIsNotAFileAndOpeningOneDoesNotWait) {
  ASSERT_EQ(mkfifo(In("fifo").c_str(), 0600), 0);
  uint64_t size = 0;
  EXPECT_EQ(OpenRegularFileAt(dir_, "fifo", &size).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(ReadFileAt(dir_, "fifo", 10).ok());
  fs::create_directory(In("sub"));
  EXPECT_FALSE(OpenRegularFileAt(dir_, "sub", &size).ok());
}

TEST_F(DirFilesTest, ListingIsCappedAndLeavesOutDots) {
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(WriteNewFileAt(dir_, name, "").ok());
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir_, 3);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(names->size(), 3u);
  for (const std::string& name : *names) EXPECT_TRUE(name != "." && name != "..");
  EXPECT_EQ(ListDirectory(dir_, 2).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(DirFilesTest, WithinADirectoryIsByIdentityNotByName) {
  fs::create_directories(In("a/b"));
  struct stat top;
  ASSERT_EQ(fstat(dir_, &top), 0);
  absl::StatusOr<UniqueFd> a = OpenDirectoryAt(dir_, "a");
  ASSERT_TRUE(a.ok());
  absl::StatusOr<UniqueFd> b = OpenDirectoryAt(a->get(), "b");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(IsWithinDirectory(b->get(), top.st_dev, top.st_ino));
  EXPECT_TRUE(IsWithinDirectory(dir_, top.st_dev, top.st_ino));
  const int outside = open((root_ + "/outside").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(outside, 0);
  EXPECT_FALSE(IsWithinDirectory(outside, top.st_dev, top.st_ino));
  close(outside);
}

TEST_F(DirFilesTest, ReadAndWriteAtOffsetsCompleteOrFail) {
  const int fd = open(In("g").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAllAt(fd, "0123456789", 100));
  char out[4];
  ASSERT_TRUE(ReadAllAt(fd, out, 4, 103));
  EXPECT_EQ(std::string(out, 4), "3456");
  EXPECT_FALSE(ReadAllAt(fd, out, 4, 108)) << "read past the end";
  close(fd);
}

}  // namespace
}  // namespace heapd
