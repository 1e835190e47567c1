#include "daemon/instance_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

// Runs `body` in a forked child (POSIX locks belong to a process: only
// another process meets them); returns its exit status.
template <typename Body>
int InChild(Body body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

class InstanceLockTest : public ::testing::Test {
 protected:
  void SetUp() override { chmod(dir_.path().c_str(), 0700); }
  std::string lock_path() const { return dir_.Sub(kInstanceLockName); }
  TestDir dir_;
};

TEST_F(InstanceLockTest, ASecondProcessIsToldWhoHoldsIt) {
  absl::StatusOr<InstanceLock> lock = InstanceLock::Take(dir_.path(), "--state_dir");
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_TRUE(lock->warning().empty());
  const std::string expected = "another heapd (pid " + std::to_string(getpid()) + ") runs on " +
                               dir_.path() + " (--state_dir";
  EXPECT_EQ(InChild([&] {
              absl::StatusOr<InstanceLock> second = InstanceLock::Take(dir_.path(), "--state_dir");
              if (second.ok()) return 1;
              if (second.status().code() != absl::StatusCode::kFailedPrecondition) return 2;
              return second.status().message().find(expected) == 0 ? 0 : 3;
            }),
            0);
  // Gone with the holder: a later process takes it.
  lock = absl::UnknownError("let go");
  EXPECT_EQ(InChild([&] { return InstanceLock::Take(dir_.path(), "--state_dir").ok() ? 0 : 1; }),
            0);
}

TEST_F(InstanceLockTest, ALockOfAnotherKindIsNotCalledAHeapd) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t holder = fork();
  if (holder == 0) {  // takes a read lock, as a process that is not heapd would
    const int fd = open(lock_path().c_str(), O_RDWR | O_CREAT, 0600);
    struct flock shared {};
    shared.l_type = F_RDLCK;
    shared.l_whence = SEEK_SET;
    if (fd < 0 || fcntl(fd, F_SETLK, &shared) != 0) _exit(1);
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  absl::StatusOr<InstanceLock> lock = InstanceLock::Take(dir_.path(), "--runtime_dir");
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find("(pid " + std::to_string(holder) +
                                         ") that is not heapd holds a lock"),
            std::string::npos)
      << lock.status();
  close(ready[0]);
  close(ready[1]);
}

TEST_F(InstanceLockTest, NoOtherUserCanOpenTheFile) {
  ASSERT_EQ(close(open(lock_path().c_str(), O_CREAT | O_WRONLY, 0644)), 0);
  ASSERT_EQ(chmod(lock_path().c_str(), 0644), 0);  // as an older heapd left it
  ASSERT_TRUE(InstanceLock::Take(dir_.path(), "--state_dir").ok());
  struct stat st;
  ASSERT_EQ(stat(lock_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(InstanceLockTest, RefusesADirectoryOthersMayWriteAndALinkInPlaceOfTheFile) {
  ASSERT_EQ(chmod(dir_.path().c_str(), 0777), 0);
  absl::StatusOr<InstanceLock> lock = InstanceLock::Take(dir_.path(), "--runtime_dir");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lock.status().message().find("--runtime_dir " + dir_.path()), std::string::npos)
      << lock.status();
  ASSERT_EQ(chmod(dir_.path().c_str(), 0700), 0);
  ASSERT_EQ(symlink("/etc/passwd", lock_path().c_str()), 0);
  lock = InstanceLock::Take(dir_.path(), "--runtime_dir");
  EXPECT_FALSE(lock.ok());
  struct stat st;
  ASSERT_EQ(stat("/etc/passwd", &st), 0);
  EXPECT_NE(st.st_mode & 07777, 0600u);  // the link was not followed
}

}  // namespace
}  // namespace heapd
