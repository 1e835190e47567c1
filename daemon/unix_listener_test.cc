#include "daemon/unix_listener.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

// Socket paths must fit 107 bytes: a directory of its own under /tmp.
class UnixListenerTest : public ::testing::Test {
 protected:
  TestDir dir_{"/tmp"};
  std::string path_ = dir_.Sub("s.sock");
};

ino_t InodeOf(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST_F(UnixListenerTest, NeverReplacesASocketSomeoneAnswersOn) {
  absl::StatusOr<ListeningSocket> first = ListenUnix(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  const ino_t inode = InodeOf(path_);
  absl::StatusOr<ListeningSocket> second = ListenUnix(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("a process answers on " + path_), std::string::npos)
      << second.status();
  EXPECT_EQ(InodeOf(path_), inode);
  close(first->fd);
}

TEST_F(UnixListenerTest, ReplacesASocketNobodyAnswersOn) {
  absl::StatusOr<ListeningSocket> dead = ListenUnix(path_);
  ASSERT_TRUE(dead.ok());
  close(dead->fd);  // as if its heapd died
  absl::StatusOr<ListeningSocket> next = ListenUnix(path_);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(next->inode, dead->inode);  // the dead one's inode is still held
  close(next->fd);
  next->Remove();
  EXPECT_EQ(InodeOf(path_), 0u);
}

TEST_F(UnixListenerTest, LeavesAloneAPathThatIsNotASocket) {
  ASSERT_EQ(close(open(path_.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  absl::StatusOr<ListeningSocket> listening = ListenUnix(path_);
  ASSERT_FALSE(listening.ok());
  EXPECT_NE(listening.status().message().find("is not a socket"), std::string::npos);
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(UnixListenerTest, RemovesOnlyTheSocketItBound) {
  absl::StatusOr<ListeningSocket> first = ListenUnix(path_);
  ASSERT_TRUE(first.ok());
  close(first->fd);
  // Another process took the path over since (after the first one died).
  absl::StatusOr<ListeningSocket> other = ListenUnix(path_);
  ASSERT_TRUE(other.ok());
  first->Remove();
  EXPECT_EQ(InodeOf(path_), other->inode);
  other->Remove();
  EXPECT_EQ(InodeOf(path_), 0u);
  close(other->fd);
}

TEST_F(UnixListenerTest, RefusesAPathTooLongForASocket) {
  absl::StatusOr<ListeningSocket> listening = ListenUnix("/tmp/" + std::string(120, 'x'));
  ASSERT_FALSE(listening.ok());
  EXPECT_EQ(listening.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace heapd
