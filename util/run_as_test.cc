// RunAs with real helpers: this test binary spawns itself as each helper
// (util/run_as_test_main.cc).
#include "util/run_as.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "util/run_as_packets.h"

extern char** environ;

namespace heapd {
namespace {

// An unprivileged identity with no passwd entry: nothing on the machine
// belongs to it.
const Credentials kStranger{61001, 61001, {61005}};

absl::Status Errno(const char* what) {
  return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::StatusOr<std::vector<ChildMessage>> RunAsStranger(const RunAsJob& job,
                                                        const std::string& args = "",
                                                        std::vector<int> fds = {},
                                                        const RunAsOptions& options = {}) {
  RunAsRequest request;
  request.job = &job;
  request.args = args;
  request.fds = std::move(fds);
  return RunAs(kStranger, request, options);
}

absl::Status SendIdentity(JobInput&, MessageSink& out) {
  uid_t r, e, s;
  gid_t rg, eg, sg;
  getresuid(&r, &e, &s);
  getresgid(&rg, &eg, &sg);
  gid_t groups[8];
  const int count = getgroups(8, groups);
  std::string identity = absl::StrCat(r, " ", e, " ", s, " ", rg, " ", eg, " ", sg, " groups");
  for (int i = 0; i < count; ++i) absl::StrAppend(&identity, " ", groups[i]);
  absl::StrAppend(&identity, " dumpable ", prctl(PR_GET_DUMPABLE));
  char cwd[64] = {};
  absl::StrAppend(&identity, " cwd ", getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "?");
  return out.Send(identity);
}
HEAPD_RUN_AS_JOB(kSendIdentity, "test.identity", SendIdentity);

absl::Status ReadFile(JobInput& input, MessageSink& out) {
  std::string path;
  if (!input.args.Next(&path) || !input.args.Done()) return absl::InternalError("bad args");
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return Errno("open secret");
  close(fd);
  return out.Send("read it");
}
HEAPD_RUN_AS_JOB(kReadFile, "test.read_file", ReadFile);

// Which descriptors above 2 are open, and /dev/zero sent back.
absl::Status ListDescriptors(JobInput& input, MessageSink& out) {
  std::string open_fds;
  for (int fd = 3; fd < 64; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0) absl::StrAppend(&open_fds, fd, " ");
  }
  std::string lent;
  for (int fd : input.fds) {
    char byte = 1;
    absl::StrAppend(&lent, pread(fd, &byte, 1, 0) == 1 ? "readable " : "unreadable ");
  }
  const int zero = open("/dev/zero", O_RDONLY);
  if (zero < 0) return Errno("open /dev/zero");
  return out.Send(absl::StrCat(input.fds.size(), " lent: ", lent, "| open: ", open_fds), zero);
}
HEAPD_RUN_AS_JOB(kListDescriptors, "test.list_fds", ListDescriptors);

// Sends `bytes` x's, with the first lent descriptor if there is one, then
// "second".
absl::Status SendLarge(JobInput& input, MessageSink& out) {
  uint64_t bytes = 0;
  if (!input.args.Next(&bytes)) return absl::InternalError("bad args");
  const int fd = input.fds.empty() ? -1 : input.fds[0];
  if (absl::Status s = out.Send(std::string(bytes, 'x'), fd); !s.ok()) return s;
  return out.Send("second");
}
HEAPD_RUN_AS_JOB(kSendLarge, "test.large", SendLarge);

// A helper gone rogue, writing straight to its channel: a message said to
// be sealed in a memfd that is not (`how`: "unsealed", no seals at all;
// "writable", sealed but for writes; "not_memfd", a /proc file) or that is
// larger than heapd accepts ("huge", 1 GiB, sparse).
absl::Status SendForgedSealedMessage(JobInput& input, MessageSink&) {
  std::string how;
  if (!input.args.Next(&how)) return absl::InternalError("bad args");
  UniqueFd fd(how == "not_memfd" ? open("/proc/self/stat", O_RDONLY | O_CLOEXEC)
                                 : memfd_create("forged", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Errno("open");
  if (how != "not_memfd" && write(fd.get(), "abc", 3) != 3) return Errno("write");
  int seals = 0;
  if (how == "writable") seals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW;
  if (how == "huge") {
    if (ftruncate(fd.get(), off_t{1} << 30) != 0) return Errno("ftruncate");
    seals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
  }
  if (seals != 0 && fcntl(fd.get(), F_ADD_SEALS, seals) != 0) return Errno("seal");
  if (!SendPacket(kHelperChannelFd, kSealedMessage, "", {fd.get()}, 0)) return Errno("send");
  pause();  // heapd gives up on it
  return absl::OkStatus();
}
HEAPD_RUN_AS_JOB(kSendForgedSealedMessage, "test.forged_sealed", SendForgedSealedMessage);

absl::Status Hang(JobInput&, MessageSink&) {
  pause();
  return absl::OkStatus();
}
HEAPD_RUN_AS_JOB(kHang, "test.hang", Hang);

// Writes its pid and its parent's (the spawner) to the file the arguments
// name, then waits forever.
absl::Status WritePidAndHang(JobInput& input, MessageSink&) {
  std::string path;
  if (!input.args.Next(&path)) return absl::InternalError("bad args");
  FILE* file = fopen(path.c_str(), "w");
  if (file == nullptr) return Errno("create pid file");
  fprintf(file, "%d %d\n", getpid(), getppid());
  fclose(file);
  pause();
  return absl::OkStatus();
}
HEAPD_RUN_AS_JOB(kWritePidAndHang, "test.pid_and_hang", WritePidAndHang);

absl::Status SendSpawnerPid(JobInput&, MessageSink& out) {
  return out.Send(absl::StrCat(getppid()));
}
HEAPD_RUN_AS_JOB(kSendSpawnerPid, "test.spawner_pid", SendSpawnerPid);

absl::Status SendForever(JobInput&, MessageSink& out) {
  for (;;) {
    if (absl::Status s = out.Send(std::string(10000, 'y')); !s.ok()) return s;
  }
}
HEAPD_RUN_AS_JOB(kSendForever, "test.send_forever", SendForever);

absl::Status KillSelf(JobInput&, MessageSink&) {
  raise(SIGKILL);
  return absl::OkStatus();
}
HEAPD_RUN_AS_JOB(kKillSelf, "test.kill_self", KillSelf);

absl::Status ListDirectoryJob(JobInput& input, MessageSink& out) {
  struct stat st;
  if (fstatat(input.dir, "marker", &st, 0) != 0) return Errno("stat marker");
  return out.Send("found marker");
}
HEAPD_RUN_AS_JOB(kFindMarker, "test.find_marker", ListDirectoryJob);

absl::Status Fail(JobInput&, MessageSink&) {
  return absl::FailedPreconditionError("the job says no");
}
HEAPD_RUN_AS_JOB(kFail, "test.fail", Fail);

// Creates `path` holding `contents` with `mode`.
void WriteFile(const std::string& path, const std::string& contents, mode_t mode) {
  FILE* file = fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr) << path;
  fputs(contents.c_str(), file);
  fclose(file);
  chmod(path.c_str(), mode);
}

class RunAsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to switch credentials";
  }
};

TEST_F(RunAsTest, TheHelperHasExactlyTheCallersIdsAndGroupsAndIsNotDumpable) {
  auto messages = RunAsStranger(kSendIdentity);
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 1u);
  EXPECT_EQ((*messages)[0].bytes,
            "61001 61001 61001 61001 61001 61001 groups 61005 dumpable 0 cwd /");
}

TEST_F(RunAsTest, TheKernelRefusesWhatTheCallerMayNotDo) {
  char dir[] = "/tmp/run-as-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string secret = absl::StrCat(dir, "/secret");
  ASSERT_NO_FATAL_FAILURE(WriteFile(secret, "root only", 0600));
  auto messages = RunAsStranger(kReadFile, ArgsWriter().Add(secret).Take());
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kPermissionDenied) << messages.status();
  EXPECT_NE(messages.status().message().find("open secret"), std::string::npos);
  unlink(secret.c_str());
  rmdir(dir);
}

TEST_F(RunAsTest, OnlyTheLentDescriptorsReachTheHelperAndDescriptorsComeBack) {
  const int lent = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  const int other = open("/dev/null", O_RDONLY);  // not close-on-exec, not lent
  ASSERT_GE(lent, 0);
  ASSERT_GE(other, 0);
  auto messages = RunAsStranger(kListDescriptors, "", {lent});
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 1u);
  // The channel (3) and the lent descriptor, received as the next number.
  EXPECT_EQ((*messages)[0].bytes, "1 lent: readable | open: 3 4 ");
  ASSERT_TRUE((*messages)[0].fd.valid());
  char byte = 1;
  EXPECT_EQ(read((*messages)[0].fd.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 0);
  close(lent);
  close(other);
}

TEST_F(RunAsTest, TheJobWorksInTheDirectoryOpenedAsTheUser) {
  char dir[] = "/tmp/run-as-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string marker = absl::StrCat(dir, "/marker");
  ASSERT_NO_FATAL_FAILURE(WriteFile(marker, "", 0644));
  RunAsRequest request;
  request.job = &kFindMarker;
  request.dir = dir;
  // mkdtemp's 0700: the stranger may not open it.
  auto refused = RunAs(kStranger, request, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_NE(refused.status().message().find(dir), std::string::npos) << refused.status();
  chmod(dir, 0755);
  auto found = RunAs(kStranger, request, {});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)[0].bytes, "found marker");
  // A directory inside the forbidden one is refused.
  struct stat st;
  ASSERT_EQ(stat("/tmp", &st), 0);
  request.forbidden = {{st.st_dev, st.st_ino}};
  auto forbidden = RunAs(kStranger, request, {});
  EXPECT_EQ(forbidden.status().code(), absl::StatusCode::kInvalidArgument) << forbidden.status();
  unlink(marker.c_str());
  rmdir(dir);
}

TEST_F(RunAsTest, TheJobsStatusComesBackWithItsCode) {
  auto messages = RunAsStranger(kFail);
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(messages.status().message(), "the job says no");
}

TEST_F(RunAsTest, LargeMessagesArriveWholeAndInOrderWithTheirDescriptor) {
  const UniqueFd lent(eventfd(0, EFD_CLOEXEC));
  struct stat sent;
  ASSERT_EQ(fstat(lent.get(), &sent), 0);
  // Around the largest inline message, and far above it (a sealed memfd).
  for (const uint64_t bytes : {kPacketBodyBytes, kPacketBodyBytes + 1, uint64_t{5} << 20}) {
    auto messages = RunAsStranger(kSendLarge, ArgsWriter().Add(bytes).Take(), {lent.get()});
    ASSERT_TRUE(messages.ok()) << messages.status();
    ASSERT_EQ(messages->size(), 2u);
    EXPECT_EQ((*messages)[0].bytes, std::string(bytes, 'x'));
    struct stat received;
    ASSERT_TRUE((*messages)[0].fd.valid()) << bytes;
    ASSERT_EQ(fstat((*messages)[0].fd.get(), &received), 0);
    EXPECT_EQ(received.st_ino, sent.st_ino) << bytes;
    EXPECT_EQ((*messages)[1].bytes, "second");
    EXPECT_FALSE((*messages)[1].fd.valid());
  }
}

TEST_F(RunAsTest, AForgedSealedMessageIsRefusedUnread) {
  RunAsOptions::Budget budget;
  budget.limit = uint64_t{4} << 30;
  RunAsOptions options;
  options.budget = &budget;
  options.what = "forged";
  for (const char* how : {"unsealed", "writable", "not_memfd"}) {
    auto messages =
        RunAsStranger(kSendForgedSealedMessage, ArgsWriter().Add(how).Take(), {}, options);
    EXPECT_EQ(messages.status().code(), absl::StatusCode::kFailedPrecondition) << how;
    EXPECT_EQ(messages.status().message(), "forged: a message's descriptor is not a sealed memfd")
        << how;
  }
  auto messages =
      RunAsStranger(kSendForgedSealedMessage, ArgsWriter().Add("huge").Take(), {}, options);
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kResourceExhausted) << messages.status();
  EXPECT_EQ(budget.used.load(), 0u);  // nothing held past the calls
}

TEST_F(RunAsTest, LargeRequestsArriveWhole) {
  std::string path = "/nonexistent/";
  path.append(5 << 20, 'p');
  auto messages = RunAsStranger(kReadFile, ArgsWriter().Add(path).Take());
  // The helper read the whole path (ENAMETOOLONG, not a malformed request).
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kPermissionDenied) << messages.status();
  EXPECT_NE(messages.status().message().find("File name too long"), std::string::npos)
      << messages.status();
}

TEST_F(RunAsTest, AHelperThatHangsIsKilledAtTheDeadline) {
  RunAsOptions options;
  options.timeout = absl::Milliseconds(300);
  options.what = "hang";
  const absl::Time start = absl::Now();
  auto messages = RunAsStranger(kHang, "", {}, options);
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(RunAsTest, CancellationKillsTheHelper) {
  const int cancel = eventfd(0, EFD_CLOEXEC);
  RunAsOptions options;
  options.cancel_fd = cancel;
  const uint64_t one = 1;
  ASSERT_EQ(write(cancel, &one, sizeof(one)), 8);
  auto messages = RunAsStranger(kHang, "", {}, options);
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kUnavailable);
  close(cancel);
}

TEST_F(RunAsTest, AHelperSendingTooMuchIsStopped) {
  RunAsOptions options;
  options.max_reply_bytes = 100000;
  auto messages = RunAsStranger(kSendForever, "", {}, options);
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(RunAsTest, AHelperKilledByTheUserFailsTheOperation) {
  auto messages = RunAsStranger(kKillSelf);
  EXPECT_EQ(messages.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(messages.status().message().find("signal 9"), std::string::npos);
}

// True once `pid` has exited (gone, or a zombie no one reaped yet).
bool Exited(pid_t pid) {
  FILE* stat = fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (stat == nullptr) return true;
  char state = '?';
  const int read = fscanf(stat, "%*d (%*[^)]) %c", &state);
  fclose(stat);
  return read == 1 && (state == 'Z' || state == 'X');
}

// Waits up to 5 s for `pid` to exit; true if it did.
bool WaitUntilExited(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (Exited(pid)) return true;
    usleep(10000);
  }
  return false;
}

// Waits up to `seconds` for WritePidAndHang's file at `path`: the helper's
// pid and its spawner's. False if it did not appear.
bool ReadHelperPids(const std::string& path, int seconds, pid_t* helper, pid_t* spawner) {
  for (int i = 0; i < seconds * 100; ++i) {
    usleep(10000);
    if (FILE* file = fopen(path.c_str(), "r"); file != nullptr) {
      const bool read = fscanf(file, "%d %d", helper, spawner) == 2;
      fclose(file);
      if (read) return true;
    }
  }
  return false;
}

// The process that spawns the helper below: this test binary run again
// (not forked: a fork of a multi-threaded process may not start the
// spawner thread under TSan) with only this test selected and the pid
// file named in the environment. Elsewhere it does nothing.
constexpr char kPidFileVariable[] = "HEAPD_RUN_AS_TEST_PID_FILE";

TEST(RunAsSpawner, SpawnsAHelperThatWritesItsPidAndHangs) {
  const char* pid_file = getenv(kPidFileVariable);
  if (pid_file == nullptr) GTEST_SKIP() << "run by AHelperStopsWhenTheProcessThatSpawnedItDies";
  (void)RunAsStranger(kWritePidAndHang, ArgsWriter().Add(pid_file).Take());
}

// Even stopped (SIGSTOP, as its user may): the parent-death signal is
// SIGKILL, which ends a stopped process too.
class HelperOutlivingTest : public RunAsTest, public ::testing::WithParamInterface<bool> {};

TEST_P(HelperOutlivingTest, AHelperStopsWhenTheProcessThatSpawnedItDies) {
  const bool stopped = GetParam();
  char dir[] = "/tmp/run-as-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  chmod(dir, 0777);
  const std::string pid_file = absl::StrCat(dir, "/pid");
  const std::string variable = absl::StrCat(kPidFileVariable, "=", pid_file);
  std::vector<char*> environment;
  // Not Bazel's test protocol: the spawner is killed, and must not leave
  // a premature-exit marker, an XML report or a shard assignment.
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view name = *entry;
    if (absl::StartsWith(name, "TEST_PREMATURE_EXIT_FILE=") ||
        absl::StartsWith(name, "XML_OUTPUT_FILE=") || absl::StartsWith(name, "GTEST_") ||
        absl::StartsWith(name, "TEST_SHARD") || absl::StartsWith(name, "TEST_TOTAL_SHARDS=")) {
      continue;
    }
    environment.push_back(*entry);
  }
  environment.push_back(const_cast<char*>(variable.c_str()));
  environment.push_back(nullptr);
  char program[] = "run_as_test";
  char filter[] = "--gtest_filter=RunAsSpawner.*";
  char* argv[] = {program, filter, nullptr};
  pid_t spawner = -1;
  ASSERT_EQ(posix_spawn(&spawner, "/proc/self/exe", nullptr, nullptr, argv, environment.data()), 0);
  absl::Cleanup end_spawner = [spawner] {
    kill(spawner, SIGKILL);
    waitpid(spawner, nullptr, 0);
  };
  pid_t helper = 0, its_spawner = 0;
  ASSERT_TRUE(ReadHelperPids(pid_file, 30, &helper, &its_spawner));
  ASSERT_GT(helper, 0);
  if (stopped) kill(helper, SIGSTOP);
  std::move(end_spawner).Invoke();
  for (const pid_t pid : {helper, its_spawner}) {
    const bool exited = WaitUntilExited(pid);
    EXPECT_TRUE(exited) << (pid == helper ? "helper " : "spawner ") << pid
                        << " outlived the process that started it";
    if (!exited) kill(pid, SIGKILL);
  }
  unlink(pid_file.c_str());
  rmdir(dir);
}

INSTANTIATE_TEST_SUITE_P(RunningOrStopped, HelperOutlivingTest, ::testing::Bool());

pid_t SpawnerPid() {
  auto messages = RunAsStranger(kSendSpawnerPid);
  if (!messages.ok() || messages->size() != 1) return -1;
  return std::stoi((*messages)[0].bytes);
}

// A spawner that dies (killed by root or the OOM killer: no user may)
// takes its running helpers with it, failing their calls with a clear
// error; the next call gets a new spawner, and the old one is reaped.
TEST_F(RunAsTest, AKilledSpawnerFailsItsRunningCallsAndIsReplaced) {
  char dir[] = "/tmp/run-as-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  chmod(dir, 0777);
  const std::string pid_file = absl::StrCat(dir, "/pid");
  RunAsOptions options;
  options.timeout = absl::Seconds(30);  // a lost kill fails, not hangs, the test
  absl::StatusOr<std::vector<ChildMessage>> hung;
  std::thread hang([&] {
    hung = RunAsStranger(kWritePidAndHang, ArgsWriter().Add(pid_file).Take(), {}, options);
  });
  pid_t helper = 0, spawner = 0;
  EXPECT_TRUE(ReadHelperPids(pid_file, 10, &helper, &spawner));
  EXPECT_GT(helper, 0);
  EXPECT_GT(spawner, 1);
  if (spawner > 1) kill(spawner, SIGKILL);
  hang.join();
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kUnavailable) << hung.status();
  EXPECT_TRUE(absl::StrContains(hung.status().message(),
                                "the helpers' spawner died before the helper's exit"))
      << hung.status();
  EXPECT_TRUE(helper <= 0 || WaitUntilExited(helper))
      << "helper " << helper << " outlived its spawner";
  const pid_t next = SpawnerPid();
  EXPECT_GT(next, 1);
  EXPECT_NE(next, spawner);
  EXPECT_TRUE(kill(spawner, 0) != 0 && errno == ESRCH) << "spawner " << spawner << " not reaped";
  unlink(pid_file.c_str());
  rmdir(dir);
}

// The spawner's parent-death signal fires when the thread that started it
// exits: it must be started by a thread that lives as long as the process,
// not by the caller's (gRPC retires idle threads).
TEST_F(RunAsTest, TheSpawnerOutlivesTheThreadWhoseCallStartedIt) {
  const pid_t before = SpawnerPid();
  ASSERT_GT(before, 1);
  ASSERT_EQ(kill(before, SIGKILL), 0);  // the next call starts a new one
  WaitUntilExited(before);
  pid_t started = -1;
  std::thread caller([&started] { started = SpawnerPid(); });
  caller.join();
  ASSERT_GT(started, 1);
  ASSERT_NE(started, before);
  usleep(100000);
  EXPECT_FALSE(Exited(started)) << "the spawner died with the thread whose call started it";
  EXPECT_EQ(SpawnerPid(), started);
}

// The pidfds this process holds.
int PidfdsOpen() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (std::filesystem::read_symlink(entry.path(), error).string() == "anon_inode:[pidfd]") {
      ++count;
    }
  }
  return count;
}

TEST_F(RunAsTest, AForkedChildGetsItsOwnSpawnerAndKeepsNoneOfTheParents) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork";
#endif
#endif
  auto parents = RunAsStranger(kSendSpawnerPid);  // this process's spawner runs
  ASSERT_TRUE(parents.ok()) << parents.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto own = RunAsStranger(kSendSpawnerPid);
    // Its own spawner's pidfd only (the helper's is closed once reaped).
    _exit(own.ok() && (*own)[0].bytes != (*parents)[0].bytes && PidfdsOpen() == 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(RunAsTest, TheSameJobRunsInThisProcessToo) {
  auto messages = RunJobHere(kSendLarge, -1, {}, ArgsWriter().Add(uint64_t{10}).Take());
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 2u);
  EXPECT_EQ((*messages)[0].bytes, "xxxxxxxxxx");
}

}  // namespace
}  // namespace heapd
