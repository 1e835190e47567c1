// Access control for real: heaps owned by root, clients run as the
// unprivileged user nobody (setpriv). Needs root; skips otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "client/client_channel.h"
#include "gtest/gtest.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

constexpr char kNobody[] = "65534";  // nobody and nogroup on Debian

class AccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as another user";
    daemon_.Start();
    // Copies of the programs that nobody can execute (the build tree is
    // under root's home).
    for (const char* program : {"tests/heap_worker", "client/heapctl"}) {
      const std::string copy = daemon_.dir().Sub(std::filesystem::path(program).filename());
      std::filesystem::copy_file(Runfile(program), copy,
                                 std::filesystem::copy_options::overwrite_existing);
      chmod(copy.c_str(), 0755);
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    Create("private", 0600);
    Create("readable", 0644);
  }

  void Create(const std::string& name, uint32_t mode) {
    v1::CreateHeapRequest request;
    request.set_name(name);
    request.set_max_size(64 << 20);
    request.set_mode(mode);
    v1::HeapInfo info;
    grpc::ClientContext context;
    ASSERT_TRUE(FromGrpc(StubOf(*client_).CreateHeap(&context, request, &info)).ok());
  }

  std::vector<std::string> AsNobody(std::vector<std::string> argv) const {
    std::vector<std::string> full = {"setpriv", std::string("--reuid=") + kNobody,
                                     std::string("--regid=") + kNobody, "--clear-groups", "--"};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }
  std::vector<std::string> Worker(const std::string& heap, std::vector<std::string> args) const {
    std::vector<std::string> argv = {daemon_.dir().Sub("heap_worker"), daemon_.socket(), heap};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  std::vector<std::string> Heapctl(std::vector<std::string> args) const {
    std::vector<std::string> argv = {daemon_.dir().Sub("heapctl"), "--socket=" + daemon_.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  TestDaemon daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(AccessTest, HeapModeDecidesWhoAttachesHow) {
  ChildResult result = RunChild(AsNobody(Worker("private", {"attach", "ro"})));
  EXPECT_NE(result.output.find("PERMISSION_DENIED"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("uid 65534"), std::string::npos) << result.output;
  result = RunChild(AsNobody(Worker("readable", {"attach", "ro"})));
  EXPECT_TRUE(result.Exited(0)) << result.output;
  result = RunChild(AsNobody(Worker("readable", {"attach", "rw"})));
  EXPECT_NE(result.output.find("PERMISSION_DENIED"), std::string::npos) << result.output;
  // Root attaches anything read-write.
  EXPECT_TRUE(RunChild(Worker("private", {"attach", "rw"})).Exited(0));
}

TEST_F(AccessTest, AdminCallsNeedRootOrTheOwner) {
  ChildResult result = RunChild(AsNobody(Heapctl({"heap", "rm", "readable"})));
  EXPECT_TRUE(result.Exited(1)) << result.output;
  EXPECT_NE(result.output.find("PERMISSION_DENIED"), std::string::npos) << result.output;
  // nobody lists only the heaps it may read.
  result = RunChild(AsNobody(Heapctl({"heap", "ls"})));
  EXPECT_NE(result.output.find("readable"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("private"), std::string::npos) << result.output;
  // nobody's own heap: nobody may remove it, and so may root.
  ASSERT_TRUE(RunChild(AsNobody(Heapctl({"heap", "create", "mine"}))).Exited(0));
  result = RunChild(Heapctl({"--json", "heap", "stat", "mine"}));
  EXPECT_NE(result.output.find("\"owner_uid\": 65534"), std::string::npos) << result.output;
  EXPECT_TRUE(RunChild(AsNobody(Heapctl({"heap", "rm", "mine"}))).Exited(0));
  EXPECT_TRUE(RunChild(Heapctl({"heap", "rm", "readable"})).Exited(0));
}

TEST_F(AccessTest, SnapshotTargetsAreCheckedAgainstTheCaller) {
  const std::string roots = daemon_.dir().Sub("roots-only");
  const std::string open = daemon_.dir().Sub("open");
  std::filesystem::create_directory(roots);
  std::filesystem::create_directory(open);
  chmod(roots.c_str(), 0755);
  chmod(open.c_str(), 0777);
  ChildResult result =
      RunChild(AsNobody(Heapctl({"snapshot", "create", "readable", "s", "--to=" + roots})));
  EXPECT_TRUE(result.Exited(1)) << result.output;
  EXPECT_NE(result.output.find("PERMISSION_DENIED"), std::string::npos) << result.output;
  EXPECT_TRUE(std::filesystem::is_empty(roots));
  // A heap nobody cannot read cannot be snapshotted by nobody; nor one it
  // may only read: a snapshot holds the heap's sync point (its writers wait),
  // which a reader must not be able to do to them.
  for (const char* heap : {"private", "readable"}) {
    result = RunChild(AsNobody(Heapctl({"snapshot", "create", heap, "s", "--to=" + open})));
    EXPECT_NE(result.output.find("PERMISSION_DENIED"), std::string::npos) << result.output;
  }
  Create("writable", 0666);
  // Allowed: the snapshot belongs to nobody, and only nobody (or root) removes it.
  result = RunChild(AsNobody(Heapctl({"snapshot", "create", "writable", "s", "--to=" + open})));
  EXPECT_TRUE(result.Exited(0)) << result.output;
  struct stat st;
  ASSERT_EQ(stat((open + "/s").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_TRUE(RunChild(AsNobody(Heapctl({"snapshot", "rm", "s", "--to=" + open}))).Exited(0));
}

TEST_F(AccessTest, ClientsOfOtherUsersAreListedOnlyForAdmins) {
  Child holder(Worker("private", {"raw-attach"}));
  ASSERT_TRUE(holder.WaitForOutput("token"));
  ChildResult result = RunChild(AsNobody(Heapctl({"--json", "clients", "ls"})));
  EXPECT_TRUE(result.Exited(0)) << result.output;
  EXPECT_EQ(result.output.find("\"session\""), std::string::npos) << result.output;
  result = RunChild(Heapctl({"--json", "clients", "ls"}));
  EXPECT_NE(result.output.find("\"heap\": \"private\""), std::string::npos) << result.output;
}

TEST_F(AccessTest, AnFdTokenOfAnotherUserIsRefused) {
  Child holder(Worker("private", {"raw-attach"}));
  ASSERT_TRUE(holder.WaitForOutput(" session "));
  const size_t at = holder.output().find("token ") + 6;
  const std::string token = holder.output().substr(at, 32);
  const ChildResult refused = RunChild(AsNobody(Worker("-", {"redeem", token})));
  EXPECT_TRUE(refused.Exited(4)) << refused.output;
  EXPECT_NE(refused.output.find("issued to uid 0, not to uid 65534"), std::string::npos)
      << refused.output;
  // The token stays good for its owner.
  const ChildResult redeemed = RunChild(Worker("-", {"redeem", token}));
  EXPECT_TRUE(redeemed.Exited(0)) << redeemed.output;
}

TEST_F(AccessTest, AdminGroupMembersAdministerEveryHeap) {
  TestDaemon admin_daemon({std::string("--admin_group=") + kNobody});
  admin_daemon.Start();
  const std::string heapctl = daemon_.dir().Sub("heapctl");
  auto ctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {heapctl, "--socket=" + admin_daemon.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  };
  ASSERT_TRUE(RunChild(ctl({"heap", "create", "roots", "--mode=0600"})).Exited(0));
  const ChildResult removed = RunChild(AsNobody(ctl({"heap", "rm", "roots"})));
  EXPECT_TRUE(removed.Exited(0)) << removed.output;
  EXPECT_NE(admin_daemon.Log().find("heap roots removed by uid 65534"), std::string::npos);
}

}  // namespace
}  // namespace heapd
