// heapd's lifecycle: READY=1 to systemd's notify socket, SIGTERM with
// clients attached (exit 0, heaps synced, reopened intact).
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

TEST(DaemonLifecycleTest, ReportsReadyToSystemd) {
  TestDaemon daemon;
  const std::string path = daemon.dir().Sub("notify");
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  daemon.Start();
  unsetenv("NOTIFY_SOCKET");
  char message[64] = {};
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ASSERT_GT(recv(fd, message, sizeof(message) - 1, 0), 0);
  EXPECT_STREQ(message, "READY=1");
  EXPECT_TRUE(WIFEXITED(daemon.Stop()));
  ASSERT_GT(recv(fd, message, sizeof(message) - 1, 0), 0);
  EXPECT_STREQ(message, "STOPPING=1");
  close(fd);
}

TEST(DaemonLifecycleTest, SigtermWithClientsAttachedSyncsAndExitsZero) {
  TestDaemon daemon;
  daemon.Start();
  const std::string worker = Runfile("tests/heap_worker");
  ASSERT_TRUE(RunChild({worker, daemon.socket(), "h", "put", "x", "5"}).Exited(0));
  Child busy({worker, daemon.socket(), "h", "hold", "1"});
  ASSERT_TRUE(busy.WaitForOutput("synced")) << daemon.Log();
  const int status = daemon.Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << daemon.Log();
  EXPECT_NE(daemon.Log().find("every heap synced"), std::string::npos) << daemon.Log();
  // The client's next sync sees the daemon gone and fails cleanly (no hang).
  busy.Kill(SIGUSR1);
  const ChildResult result = busy.Wait();
  EXPECT_FALSE(result.Exited(0)) << result.output;
  daemon.Start();
  const ChildResult read = RunChild({worker, daemon.socket(), "h", "get", "pre-1"});
  EXPECT_NE(read.output.find("value 1"), std::string::npos) << read.output;
}

// heapd lowers its OOM score so the kernel's OOM killer takes jobs first.
TEST(DaemonLifecycleTest, LowersItsOomScore) {
  // Lowering an OOM score needs CAP_SYS_RESOURCE (bit 24 of CapEff), which
  // some machines' root lacks.
  std::ifstream status("/proc/self/status");
  std::string line;
  uint64_t effective = 0;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) effective = std::stoull(line.substr(7), nullptr, 16);
  }
  if ((effective & (uint64_t{1} << 24)) == 0) {
    GTEST_SKIP() << "this process lacks CAP_SYS_RESOURCE: heapd cannot lower its OOM score here";
  }
  TestDaemon daemon;
  daemon.Start();
  std::ifstream score("/proc/" + std::to_string(daemon.pid()) + "/oom_score_adj");
  int adjustment = 0;
  score >> adjustment;
  EXPECT_EQ(adjustment, -900) << daemon.Log();
}

}  // namespace
}  // namespace heapd
