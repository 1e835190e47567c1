#include "util/run_as.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace heapd {
namespace {

// An unprivileged identity with no passwd entry: nothing on the machine
// belongs to it.
const Credentials kStranger{61001, 61001, {61005}};

absl::Status Errno(const char* what) {
  return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(errno)));
}

class RunAsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to switch credentials";
  }
};

TEST_F(RunAsTest, TheChildHasExactlyTheCallersIdsAndGroupsAndIsNotDumpable) {
  auto messages = RunAs(kStranger, {}, {}, [](MessageSink& channel) {
    uid_t r, e, s;
    gid_t rg, eg, sg;
    getresuid(&r, &e, &s);
    getresgid(&rg, &eg, &sg);
    gid_t groups[8];
    const int count = getgroups(8, groups);
    std::string out = absl::StrCat(r, " ", e, " ", s, " ", rg, " ", eg, " ", sg, " groups");
    for (int i = 0; i < count; ++i) absl::StrAppend(&out, " ", groups[i]);
    absl::StrAppend(&out, " dumpable ", prctl(PR_GET_DUMPABLE));
    return channel.Send(out);
  });
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 1u);
  EXPECT_EQ((*messages)[0].bytes, "61001 61001 61001 61001 61001 61001 groups 61005 dumpable 0");
}

TEST_F(RunAsTest, TheKernelRefusesWhatTheCallerMayNotDo) {
  char dir[] = "/tmp/run-as-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string secret = absl::StrCat(dir, "/secret");
  FILE* file = fopen(secret.c_str(), "w");
  ASSERT_NE(file, nullptr);
  fputs("root only", file);
  fclose(file);
  chmod(secret.c_str(), 0600);
  auto messages = RunAs(kStranger, {}, {}, [&](MessageSink& channel) -> absl::Status {
    const int fd = open(secret.c_str(), O_RDONLY);
    if (fd < 0) return Errno("open secret");
    return channel.Send("read it");
  });
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kPermissionDenied) << messages.status();
  EXPECT_NE(messages.status().message().find("open secret"), std::string::npos);
  unlink(secret.c_str());
  rmdir(dir);
}

TEST_F(RunAsTest, OnlyTheKeptDescriptorsReachTheChildAndDescriptorsComeBack) {
  const int kept = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(kept, 0);
  ASSERT_GE(other, 0);
  auto messages = RunAs(kStranger, {kept}, {}, [&](MessageSink& channel) -> absl::Status {
    const bool kept_open = fcntl(kept, F_GETFD) >= 0;
    const bool other_open = fcntl(other, F_GETFD) >= 0;
    const int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) return Errno("open /dev/zero");
    return channel.Send(absl::StrCat(kept_open, other_open), fd);
  });
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 1u);
  EXPECT_EQ((*messages)[0].bytes, "10");
  ASSERT_TRUE((*messages)[0].fd.valid());
  char byte = 1;
  EXPECT_EQ(read((*messages)[0].fd.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 0);
  close(kept);
  close(other);
}

TEST_F(RunAsTest, LargeMessagesArriveWholeAndInOrder) {
  const std::string big(300000, 'x');
  auto messages = RunAs(kStranger, {}, {}, [&](MessageSink& channel) -> absl::Status {
    if (absl::Status s = channel.Send(big); !s.ok()) return s;
    return channel.Send("second");
  });
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 2u);
  EXPECT_EQ((*messages)[0].bytes, big);
  EXPECT_EQ((*messages)[1].bytes, "second");
}

TEST_F(RunAsTest, AChildThatHangsIsKilledAtTheDeadline) {
  RunAsOptions options;
  options.timeout = absl::Milliseconds(300);
  options.what = "hang";
  const absl::Time start = absl::Now();
  auto messages = RunAs(kStranger, {}, options, [](MessageSink&) {
    pause();
    return absl::OkStatus();
  });
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(RunAsTest, CancellationKillsTheChild) {
  const int cancel = eventfd(0, EFD_CLOEXEC);
  RunAsOptions options;
  options.cancel_fd = cancel;
  const uint64_t one = 1;
  ASSERT_EQ(write(cancel, &one, sizeof(one)), 8);
  auto messages = RunAs(kStranger, {}, options, [](MessageSink&) {
    pause();
    return absl::OkStatus();
  });
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kUnavailable);
  close(cancel);
}

TEST_F(RunAsTest, AChildSendingTooMuchIsStopped) {
  RunAsOptions options;
  options.max_reply_bytes = 100000;
  auto messages = RunAs(kStranger, {}, options, [](MessageSink& channel) -> absl::Status {
    for (;;) {
      if (absl::Status s = channel.Send(std::string(10000, 'y')); !s.ok()) return s;
    }
  });
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(RunAsTest, AChildKilledByTheUserFailsTheOperation) {
  auto messages = RunAs(kStranger, {}, {}, [](MessageSink&) {
    raise(SIGKILL);
    return absl::OkStatus();
  });
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(messages.status().message().find("signal 9"), std::string::npos);
}

}  // namespace
}  // namespace heapd
