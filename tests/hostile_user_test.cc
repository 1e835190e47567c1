// A hostile local user against a real heapd running as root. Each test
// performs an attack as an unprivileged user (uid 61001, no passwd entry:
// nothing on the machine is theirs) and checks that its effect did not
// happen: root-owned victim files keep their content, owner and mode,
// nothing appears where only root may write, no descriptor or secret
// reaches the attacker, and other users' attaches are not held up. An
// error message alone proves nothing; the tests look at the victims.
//
// Needs root (to run clients as other users); skips otherwise.
// HEAPD_TEST_DAEMON=PATH runs them against another heapd binary.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client_channel.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel_posix.h"
#include "gtest/gtest.h"
#include "heap/metadata_format.h"
#include "heapd/client.h"
#include "proto/heapd.grpc.pb.h"
#include "testing/test_daemon.h"
#include "zlib.h"

namespace heapd {
namespace {

constexpr uint32_t kAttacker = 61001;
constexpr uint32_t kOtherUser = 61002;
constexpr uint32_t kSharedGroup = 61010;
constexpr char kSecret[] = "ROOT-SECRET-0123456789";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// What an attack must not change about a file.
struct FileState {
  bool exists = false;
  uid_t uid = 0;
  gid_t gid = 0;
  mode_t mode = 0;
  std::string content;
  bool operator==(const FileState& o) const {
    return exists == o.exists && uid == o.uid && gid == o.gid && mode == o.mode &&
           content == o.content;
  }
};

FileState StateOf(const std::string& path) {
  FileState state;
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return state;
  state.exists = true;
  state.uid = st.st_uid;
  state.gid = st.st_gid;
  state.mode = st.st_mode;
  if (S_ISREG(st.st_mode)) state.content = ReadAll(path);
  return state;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// CPU seconds process `pid` has used.
double CpuSeconds(pid_t pid) {
  std::istringstream stat(ReadAll(absl::StrCat("/proc/", pid, "/stat")));
  std::string field;
  std::vector<std::string> fields;
  while (stat >> field) fields.push_back(field);
  if (fields.size() < 15) return 0;
  return (std::stod(fields[13]) + std::stod(fields[14])) / sysconf(_SC_CLK_TCK);
}

// Resident memory of process `pid`, in MiB.
uint64_t ResidentMiB(pid_t pid) {
  for (absl::string_view line :
       absl::StrSplit(ReadAll(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    uint64_t kib = 0;
    if (std::sscanf(std::string(line).c_str(), "VmRSS: %lu kB", &kib) == 1) return kib >> 10;
  }
  return 0;
}

// Forks a process that becomes `uid` (gid `uid`, exactly `groups`) and
// runs `body`; returns its pid. It never returns into the test.
template <typename Body>
pid_t ForkAs(uint32_t uid, std::vector<gid_t> groups, Body body) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  if (setgroups(groups.size(), groups.data()) != 0 || setresgid(uid, uid, uid) != 0 ||
      setresuid(uid, uid, uid) != 0) {
    _exit(125);
  }
  _exit(body());
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class HostileUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to act as other users";
    StartDaemon({});
  }

  void StartDaemon(std::vector<std::string> flags, std::vector<std::string> launcher = {}) {
    daemon_ = std::make_unique<TestDaemon>(std::move(flags));
    daemon_->set_launcher(std::move(launcher));
    daemon_->Start();
    // Copies of the programs every user can run (the build tree is under
    // root's home).
    for (const char* program : {"tests/heap_worker", "client/heapctl"}) {
      const std::string copy = Dir(std::filesystem::path(program).filename());
      std::filesystem::copy_file(Runfile(program), copy,
                                 std::filesystem::copy_options::overwrite_existing);
      chmod(copy.c_str(), 0755);
    }
    // Root's victims: a readable and a private file, an empty directory.
    std::filesystem::create_directories(Dir("victim/dir"));
    chmod(Dir("victim").c_str(), 0755);
    chmod(Dir("victim/dir").c_str(), 0755);
    WriteAll(Dir("victim/secret"), kSecret);
    chmod(Dir("victim/secret").c_str(), 0644);
    WriteAll(Dir("victim/private"), kSecret);
    chmod(Dir("victim/private").c_str(), 0600);
    // The attacker's own directory.
    std::filesystem::create_directories(Dir("attacker"));
    chown(Dir("attacker").c_str(), kAttacker, kAttacker);
    victims_ = Victims();
  }

  std::string Dir(const std::string& name) const { return daemon_->dir().Sub(name); }

  std::map<std::string, FileState> Victims() const {
    std::map<std::string, FileState> states;
    for (const char* name : {"victim", "victim/dir", "victim/secret", "victim/private"}) {
      states[name] = StateOf(Dir(name));
    }
    return states;
  }

  // The victims are as they were, and nothing appeared among them.
  void ExpectVictimsUntouched() const {
    for (const auto& [name, state] : Victims()) {
      EXPECT_TRUE(state == victims_.at(name)) << name << " changed";
    }
    EXPECT_EQ(Entries(Dir("victim")), (std::vector<std::string>{"dir", "private", "secret"}));
    EXPECT_TRUE(Entries(Dir("victim/dir")).empty());
  }

  // `argv` run as `uid` with a clean environment (plus `env`).
  static std::vector<std::string> As(uint32_t uid, std::vector<std::string> argv,
                                     std::vector<std::string> env = {}) {
    std::vector<std::string> full = {"setpriv",
                                     absl::StrCat("--reuid=", uid),
                                     absl::StrCat("--regid=", uid),
                                     "--clear-groups",
                                     "--",
                                     "env",
                                     "-i",
                                     "PATH=/usr/bin:/bin",
                                     "HOME=/nonexistent"};
    full.insert(full.end(), env.begin(), env.end());
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }
  ChildResult Ctl(uint32_t uid, std::vector<std::string> args) const {
    std::vector<std::string> argv = {Dir("heapctl"), "--socket=" + daemon_->socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunChild(As(uid, argv));
  }
  std::vector<std::string> Worker(const std::string& heap, std::vector<std::string> args) const {
    std::vector<std::string> argv = {Dir("heap_worker"), daemon_->socket(), heap};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // The attacker's heap, and a snapshot of it in the attacker's directory
  // (attacker/snaps/legit) to forge others from.
  void MakeAttackerHeapAndSnapshot() {
    ASSERT_TRUE(Ctl(kAttacker, {"heap", "create", "a-heap", "--max_size=67108864"}).Exited(0));
    ASSERT_TRUE(RunChild(As(kAttacker, Worker("a-heap", {"put", "answer", "42"}))).Exited(0));
    std::filesystem::create_directories(Dir("attacker/snaps"));
    chown(Dir("attacker/snaps").c_str(), kAttacker, kAttacker);
    const ChildResult made =
        Ctl(kAttacker, {"snapshot", "create", "a-heap", "legit", "--to=" + Dir("attacker/snaps")});
    ASSERT_TRUE(made.Exited(0)) << made.output << daemon_->Log();
  }

  // A copy of attacker/snaps/legit as attacker/snaps/NAME, owned by the
  // attacker (as if they made it).
  std::string Forge(const std::string& name) const {
    const std::string dir = Dir("attacker/snaps/" + name);
    std::filesystem::copy(Dir("attacker/snaps/legit"), dir);
    ChownTree(dir);
    return dir;
  }
  // A snapshot NAME of an empty heap whose checkpoint records `config`,
  // with a manifest that matches it (forged from attacker/snaps/legit).
  void ForgeSnapshot(const std::string& name, const HeapConfig& config) const {
    const std::string dir = Forge(name);
    Checkpoint checkpoint;
    checkpoint.config = config;
    checkpoint.epoch = 1;
    checkpoint.log_generation = 1;
    const std::string bytes = EncodeCheckpoint(checkpoint);
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename().string().rfind("log.", 0) == 0) unlink(entry.path().c_str());
    }
    WriteAll(dir + "/checkpoint", bytes);
    ASSERT_EQ(truncate((dir + "/data").c_str(), 0), 0);
    v1::SnapshotManifest manifest;
    manifest.set_name(name);
    manifest.set_heap("a-heap");
    manifest.set_epoch(1);
    manifest.set_data_bytes(0);
    (*manifest.mutable_metadata_crc32())["checkpoint"] = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
              static_cast<uInt>(bytes.size())));
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(manifest, &json).ok());
    WriteAll(dir + "/manifest.json", json);
    ChownTree(dir);
  }

  static void ChownTree(const std::string& dir) {
    lchown(dir.c_str(), kAttacker, kAttacker);
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      lchown(entry.path().c_str(), kAttacker, kAttacker);
    }
  }
  static void Plant(const std::string& dir, const std::string& file, const std::string& target) {
    const std::string path = dir + "/" + file;
    unlink(path.c_str());
    ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
    lchown(path.c_str(), kAttacker, kAttacker);
  }

  // Attaches heap `name` as `uid` (read-write) and returns how long it took.
  absl::Duration TimedAttach(uint32_t uid, const std::string& heap) const {
    const absl::Time start = absl::Now();
    const ChildResult result = RunChild(As(uid, Worker(heap, {"attach", "rw"})));
    EXPECT_TRUE(result.Exited(0)) << result.output;
    return absl::Now() - start;
  }

  std::unique_ptr<TestDaemon> daemon_;
  std::map<std::string, FileState> victims_;
};

// Snapshot targets that lead where the attacker may not write.
TEST_F(HostileUserTest, SnapshotTargetsLeadingToRootsDirectoriesWriteNothing) {
  MakeAttackerHeapAndSnapshot();
  ASSERT_EQ(symlink(Dir("victim/dir").c_str(), Dir("attacker/link").c_str()), 0);
  for (const std::string& target : {Dir("victim/dir"), Dir("attacker/link"), Dir("attacker/link/"),
                                    Dir("state/heaps"), Dir("state/snapshots")}) {
    const ChildResult result =
        Ctl(kAttacker, {"snapshot", "create", "a-heap", "s", "--to=" + target});
    EXPECT_FALSE(result.Exited(0)) << target << ": " << result.output;
  }
  // Nor by removing or restoring through them.
  EXPECT_FALSE(Ctl(kAttacker, {"snapshot", "rm", "dir", "--to=" + Dir("victim")}).Exited(0));
  ExpectVictimsUntouched();
  EXPECT_EQ(Entries(Dir("state/snapshots")), std::vector<std::string>{});
}

// A component of the target swapped between a directory of the attacker's
// and a symlink to root's, thousands of times, while snapshots are made
// into it: every snapshot lands in the attacker's directory, as the
// attacker's; none in root's.
TEST_F(HostileUserTest, SwappingTheTargetMidOperationRedirectsNothing) {
  MakeAttackerHeapAndSnapshot();
  const std::string race = Dir("attacker/race");
  std::filesystem::create_directories(race + "/t");
  ASSERT_EQ(symlink(Dir("victim/dir").c_str(), (race + "/alt").c_str()), 0);
  lchown(race.c_str(), kAttacker, kAttacker);
  lchown((race + "/t").c_str(), kAttacker, kAttacker);
  lchown((race + "/alt").c_str(), kAttacker, kAttacker);
  const pid_t racer = ForkAs(kAttacker, {}, [&] {
    for (;;) {
      renameat2(AT_FDCWD, (race + "/t").c_str(), AT_FDCWD, (race + "/alt").c_str(),
                RENAME_EXCHANGE);
    }
    return 0;
  });
  // A thousand snapshots, as fast as the attacker's client can ask.
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t asker = ForkAs(kAttacker, {}, [&] {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->socket());
    if (!client.ok()) return 1;
    int made = 0;
    for (int i = 0; i < 1000; ++i) {
      v1::CreateSnapshotRequest request;
      request.set_heap("a-heap");
      request.set_name(absl::StrCat("s", i));
      request.set_target_dir(race + "/t");
      v1::SnapshotManifest manifest;
      grpc::ClientContext context;
      made += StubOf(**client).CreateSnapshot(&context, request, &manifest).ok();
    }
    (void)!write(report[1], &made, sizeof(made));
    return 0;
  });
  int made = -1;
  ASSERT_EQ(read(report[0], &made, sizeof(made)), static_cast<ssize_t>(sizeof(made)));
  WaitExit(asker);
  close(report[0]);
  close(report[1]);
  kill(racer, SIGKILL);
  WaitExit(racer);
  ExpectVictimsUntouched();
  // What was made is the attacker's, in the attacker's directory.
  const std::string real = std::filesystem::is_symlink(race + "/t") ? race + "/alt" : race + "/t";
  EXPECT_EQ(static_cast<int>(Entries(real).size()), made);
  for (const std::string& name : Entries(real)) {
    EXPECT_EQ(StateOf(real + "/" + name).uid, kAttacker) << name;
  }
}

// Every file of a snapshot replaced by a symlink to root's files: heapd
// reads nothing through them, truncates nothing, and gives the attacker no
// heap made of root's bytes.
TEST_F(HostileUserTest, PlantedSymlinksInASnapshotReadAndTruncateNothing) {
  MakeAttackerHeapAndSnapshot();
  // The classic: a log the manifest does not list, pointing at a root file.
  // A heap opened from it would cut its "torn" log back: truncate the file.
  {
    const std::string dir = Forge("torn-log");
    v1::SnapshotManifest manifest;
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(ReadAll(dir + "/manifest.json"), &manifest)
            .ok());
    for (auto it = manifest.mutable_metadata_crc32()->begin();
         it != manifest.mutable_metadata_crc32()->end();) {
      it = it->first == "checkpoint" ? std::next(it) : manifest.mutable_metadata_crc32()->erase(it);
    }
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(manifest, &json, options).ok());
    WriteAll(dir + "/manifest.json", json);
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename();
      if (name.rfind("log.", 0) == 0) Plant(dir, name, Dir("victim/secret"));
    }
  }
  for (const char* file : {"manifest.json", "data", "checkpoint", "lock"}) {
    for (const char* victim : {"victim/secret", "victim/private"}) {
      const std::string dir = Forge(absl::StrCat("via-", file, "-", victim + 7));
      Plant(dir, file, Dir(victim));
    }
  }
  std::vector<std::string> outputs;
  for (const std::string& name : Entries(Dir("attacker/snaps"))) {
    if (name == "legit") continue;
    const std::string to = "--to=" + Dir("attacker/snaps");
    outputs.push_back(Ctl(kAttacker, {"snapshot", "verify", name, to}).output);
    const ChildResult restored =
        Ctl(kAttacker, {"snapshot", "restore", name, to, "--heap=r-" + name});
    outputs.push_back(restored.output);
    const ChildResult attached =
        RunChild(As(kAttacker, Worker("-", {"attach-snapshot", Dir("attacker/snaps"), name})));
    outputs.push_back(attached.output);
    // A lock file is never read: a symlink there harms nothing.
    if (name.find("torn-log") == std::string::npos && name.find("-lock-") == std::string::npos) {
      EXPECT_FALSE(restored.Exited(0)) << name << ": " << restored.output;
      EXPECT_FALSE(attached.Exited(0)) << name << ": " << attached.output;
    }
  }
  outputs.push_back(
      Ctl(kAttacker, {"--json", "snapshot", "ls", "--to=" + Dir("attacker/snaps")}).output);
  ExpectVictimsUntouched();
  for (const std::string& output : outputs) {
    EXPECT_EQ(output.find(kSecret), std::string::npos) << output;
  }
  // No heap holds root's bytes.
  for (const std::string& heap : Entries(Dir("state/heaps"))) {
    const std::string data = ReadAll(Dir("state/heaps/" + heap + "/data"));
    EXPECT_EQ(data.find(kSecret), std::string::npos) << heap;
  }
}

// Files that stall or exhaust a reader: a FIFO, a device, a huge sparse
// file. heapd refuses them quickly, its memory stays small, and no other
// user's attach waits meanwhile.
TEST_F(HostileUserTest, FifosDevicesAndHugeFilesStallNoOne) {
  MakeAttackerHeapAndSnapshot();
  ASSERT_TRUE(Ctl(kOtherUser, {"heap", "create", "o-heap", "--max_size=67108864"}).Exited(0));
  {
    const std::string dir = Forge("fifo-data");
    unlink((dir + "/data").c_str());
    ASSERT_EQ(mkfifo((dir + "/data").c_str(), 0644), 0);
    const std::string meta = Forge("fifo-checkpoint");
    unlink((meta + "/checkpoint").c_str());
    ASSERT_EQ(mkfifo((meta + "/checkpoint").c_str(), 0644), 0);
    const std::string manifest = Forge("fifo-manifest");
    unlink((manifest + "/manifest.json").c_str());
    ASSERT_EQ(mkfifo((manifest + "/manifest.json").c_str(), 0644), 0);
    Plant(Forge("device-data"), "data", "/dev/zero");
    Plant(Forge("device-checkpoint"), "checkpoint", "/dev/zero");
    const std::string huge = Forge("huge-data");  // 4 TiB, sparse (1 TiB where too big)
    ASSERT_TRUE(truncate((huge + "/data").c_str(), int64_t{4} << 40) == 0 ||
                truncate((huge + "/data").c_str(), int64_t{1} << 40) == 0);
    const std::string big = Forge("huge-checkpoint");
    ASSERT_EQ(truncate((big + "/checkpoint").c_str(), int64_t{64} << 30), 0);
    const std::string big_manifest = Forge("huge-manifest");
    ASSERT_EQ(truncate((big_manifest + "/manifest.json").c_str(), int64_t{64} << 30), 0);
    for (const std::string& name : Entries(Dir("attacker/snaps"))) {
      ChownTree(Dir("attacker/snaps/" + name));
    }
  }
  const double cpu_before = CpuSeconds(daemon_->pid());
  std::vector<std::unique_ptr<Child>> attacks;
  for (const std::string& name : Entries(Dir("attacker/snaps"))) {
    if (name == "legit") continue;
    const std::string to = "--to=" + Dir("attacker/snaps");
    for (std::vector<std::string> args :
         {std::vector<std::string>{"snapshot", "verify", name, to},
          std::vector<std::string>{"snapshot", "restore", name, to, "--heap=r-" + name}}) {
      args.insert(args.begin(), {Dir("heapctl"), "--socket=" + daemon_->socket()});
      attacks.push_back(std::make_unique<Child>(As(kAttacker, args)));
    }
    attacks.push_back(std::make_unique<Child>(
        As(kAttacker, Worker("-", {"attach-snapshot", Dir("attacker/snaps"), name}))));
  }
  // Meanwhile another user attaches, again and again, without waiting.
  for (int i = 0; i < 10; ++i) {
    EXPECT_LT(TimedAttach(kOtherUser, "o-heap"), absl::Seconds(3)) << daemon_->Log();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (const std::unique_ptr<Child>& attack : attacks) {
    while (absl::Now() < deadline && kill(attack->pid(), 0) == 0 &&
           waitpid(attack->pid(), nullptr, WNOHANG) == 0) {
      usleep(10000);
    }
  }
  EXPECT_LT(absl::Now(), deadline) << "an attack still runs: heapd waits on it";
  EXPECT_LT(ResidentMiB(daemon_->pid()), 512u);
  EXPECT_LT(CpuSeconds(daemon_->pid()) - cpu_before, 20.0);
  // None made a heap.
  for (const std::string& heap : Entries(Dir("state/heaps"))) {
    EXPECT_EQ(heap.rfind("r-", 0), std::string::npos) << heap;
  }
  ExpectVictimsUntouched();
}

// A snapshot whose checkpoint claims root owns the heap, everyone may
// write it and it is 32 TiB: a restore by the attacker makes a heap of the
// attacker's (or none), within the attacker's limits.
TEST_F(HostileUserTest, AForgedSnapshotConfigGivesNeitherOwnershipNorSize) {
  MakeAttackerHeapAndSnapshot();
  for (const auto& [name, max_size] : std::vector<std::pair<std::string, uint64_t>>{
           {"huge", uint64_t{32} << 40}, {"rooted", uint64_t{64} << 20}}) {
    HeapConfig config;
    config.max_size = max_size;
    config.owner_uid = 0;
    config.owner_gid = 0;
    config.mode = 0777;
    ForgeSnapshot(name, config);
  }
  const std::string to = "--to=" + Dir("attacker/snaps");
  EXPECT_FALSE(Ctl(kAttacker, {"snapshot", "restore", "huge", to, "--heap=big"}).Exited(0));
  EXPECT_FALSE(Ctl(kAttacker, {"snapshot", "restore", "rooted", to, "--heap=mine", "--keep_owner"})
                   .Exited(0));
  const ChildResult restored = Ctl(kAttacker, {"snapshot", "restore", "rooted", to, "--heap=mine"});
  ASSERT_TRUE(restored.Exited(0)) << restored.output;
  const ChildResult stat =
      RunChild({Dir("heapctl"), "--socket=" + daemon_->socket(), "--json", "heap", "stat", "mine"});
  ASSERT_TRUE(stat.Exited(0)) << stat.output;
  v1::HeapStats stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(stat.output, &stats).ok()) << stat.output;
  EXPECT_EQ(stats.info().owner_uid(), kAttacker);
  EXPECT_EQ(stats.info().owner_gid(), kAttacker);
  EXPECT_FALSE(std::filesystem::exists(Dir("state/heaps/big")));
  ExpectVictimsUntouched();
}

// Forged fixed addresses: a snapshot recording a base outside heapd's
// window (where PIE binaries load), or another user's heap's range, is
// restored as nothing, and the other user's heap keeps its range.
TEST_F(HostileUserTest, AForgedFixedAddressTakesNoOnesRange) {
  ASSERT_TRUE(
      Ctl(kOtherUser, {"heap", "create", "o-fixed", "--max_size=67108864", "--fixed_address"})
          .Exited(0));
  const ChildResult stat = RunChild(
      {Dir("heapctl"), "--socket=" + daemon_->socket(), "--json", "heap", "stat", "o-fixed"});
  v1::HeapStats stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(stat.output, &stats).ok()) << stat.output;
  const uint64_t victim_base = stats.info().fixed_address();
  ASSERT_NE(victim_base, 0u);
  MakeAttackerHeapAndSnapshot();
  for (const auto& [name, base] : std::vector<std::pair<std::string, uint64_t>>{
           {"pie", uint64_t{0x555555400000}},
           {"squat", victim_base},
           {"overlap", victim_base + (uint64_t{32} << 20)}}) {
    HeapConfig config;
    config.max_size = uint64_t{64} << 20;
    config.owner_uid = kAttacker;
    config.owner_gid = kAttacker;
    config.fixed_base = base;
    ForgeSnapshot(name, config);
    const ChildResult restored =
        Ctl(kAttacker,
            {"snapshot", "restore", name, "--to=" + Dir("attacker/snaps"), "--heap=" + name});
    EXPECT_FALSE(restored.Exited(0)) << name << ": " << restored.output;
    EXPECT_NE(restored.output.find(name == "pie" ? "inside heapd's window" : "heap o-fixed holds"),
              std::string::npos)
        << name << ": " << restored.output;
    EXPECT_FALSE(std::filesystem::exists(Dir("state/heaps/" + name))) << name;
  }
  // The victim's heap is mapped where it always was.
  const ChildResult attached = RunChild(As(kOtherUser, Worker("o-fixed", {"attach", "rw"})));
  EXPECT_TRUE(attached.Exited(0)) << attached.output;
  const ChildResult again = RunChild(
      {Dir("heapctl"), "--socket=" + daemon_->socket(), "--json", "heap", "stat", "o-fixed"});
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(again.output, &stats).ok());
  EXPECT_EQ(stats.info().fixed_address(), victim_base);
  ExpectVictimsUntouched();
}

// The fixed-address window is one budget for the node: a user who makes
// fixed-address heaps until heapd refuses stops at their share
// (--max_fixed_address_bytes_per_user, 256 GiB by default), and another
// user still gets a range.
TEST_F(HostileUserTest, FixedAddressHeapsStopAtTheirOwnersShareOfTheWindow) {
  const std::string size = absl::StrCat("--max_size=", uint64_t{64} << 30);
  int made = 0;
  ChildResult refused;
  for (int i = 0; i < 8; ++i) {
    refused = Ctl(kAttacker, {"heap", "create", absl::StrCat("fill-", i), size, "--fixed_address"});
    if (!refused.Exited(0)) break;
    ++made;
  }
  EXPECT_EQ(made, 3) << "64 GiB ranges and their guards: three fit in 256 GiB";
  EXPECT_NE(refused.output.find("--max_fixed_address_bytes_per_user"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("RESOURCE_EXHAUSTED"), std::string::npos) << refused.output;
  EXPECT_FALSE(std::filesystem::exists(Dir("state/heaps/fill-3")));
  const ChildResult other =
      Ctl(kOtherUser, {"heap", "create", "o-share", "--max_size=67108864", "--fixed_address"});
  EXPECT_TRUE(other.Exited(0)) << other.output;
  // A heap that is not fixed counts only against the other limits.
  EXPECT_TRUE(Ctl(kAttacker, {"heap", "create", "fill-plain", "--max_size=67108864"}).Exited(0));
  ExpectVictimsUntouched();
}

// Another user binds a socket where a client would look for heapd: the
// client sends it nothing.
TEST_F(HostileUserTest, ASquattedSocketGetsNothingFromClients) {
  const std::string fake = Dir("attacker/heapd.sock");
  const std::string old_default = absl::StrCat("/tmp/heapd-", kOtherUser);
  std::filesystem::remove_all(old_default);
  std::filesystem::create_directory(old_default);
  chown(old_default.c_str(), kAttacker, kAttacker);
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  // The fake heapd: counts connections and bytes it receives.
  const pid_t server = ForkAs(kAttacker, {}, [&] {
    close(report[0]);
    std::vector<int> listeners;
    for (const std::string& path : {fake, old_default + "/heapd.sock"}) {
      const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
      if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return 1;
      chmod(path.c_str(), 0777);
      listen(fd, 16);
      fcntl(fd, F_SETFL, O_NONBLOCK);
      listeners.push_back(fd);
    }
    (void)!write(report[1], "R", 1);
    uint64_t connections = 0, bytes = 0;
    const absl::Time end = absl::Now() + absl::Seconds(4);
    while (absl::Now() < end) {
      for (int listener : listeners) {
        const int fd = accept(listener, nullptr, nullptr);
        if (fd < 0) continue;
        ++connections;
        char buffer[4096];
        timeval timeout{0, 200000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
        ssize_t n;
        while ((n = read(fd, buffer, sizeof(buffer))) > 0) bytes += static_cast<uint64_t>(n);
        close(fd);
      }
      usleep(5000);
    }
    const std::string result = absl::StrCat(connections, " ", bytes);
    (void)!write(report[1], result.data(), result.size());
    return 0;
  });
  close(report[1]);
  char ready;
  ASSERT_EQ(read(report[0], &ready, 1), 1);
  // A user whose client is pointed at the fake, and one using defaults.
  const ChildResult pointed =
      RunChild(As(kOtherUser, {Dir("heap_worker"), fake, "h", "attach", "rw"}));
  EXPECT_FALSE(pointed.Exited(0));
  EXPECT_NE(pointed.output.find("uid 61001"), std::string::npos) << pointed.output;
  // With no HEAPD_SOCKET and no XDG_RUNTIME_DIR: the system daemon's
  // socket, never the squatted /tmp one.
  RunChild(As(kOtherUser, {Dir("heapctl"), "heap", "ls"}));
  std::string result(64, '\0');
  result.resize(static_cast<size_t>(std::max<ssize_t>(0, read(report[0], result.data(), 64))));
  WaitExit(server);
  close(report[0]);
  std::filesystem::remove_all(old_default);
  uint64_t connections = 99, bytes = 99;
  ASSERT_EQ(std::sscanf(result.c_str(), "%lu %lu", &connections, &bytes), 2) << result;
  EXPECT_EQ(bytes, 0u) << "a client sent " << bytes << " bytes to another user's socket";
  EXPECT_LE(connections, 1u) << "only the pointed client may connect (and sends nothing)";
}

// A process's supplementary groups are those it had when it connected: a
// later process with the same pid lends it none of its own.
TEST_F(HostileUserTest, AReusedPidLendsNoGroups) {
  // A heap of the shared group that only the group may use (made by a
  // user whose primary group it is).
  const ChildResult member = RunChild(
      {"setpriv", absl::StrCat("--reuid=", kOtherUser), absl::StrCat("--regid=", kSharedGroup),
       "--clear-groups", "--", Dir("heapctl"), "--socket=" + daemon_->socket(), "heap", "create",
       "shared", "--max_size=67108864", "--mode=0060"});
  ASSERT_TRUE(member.Exited(0)) << member.output;
  bool tried = false;
  for (int attempt = 0; attempt < 20 && !tried; ++attempt) {
    int go[2], verdict[2], pid_pipe[2];
    ASSERT_EQ(pipe(go), 0);
    ASSERT_EQ(pipe(verdict), 0);
    ASSERT_EQ(pipe(pid_pipe), 0);
    // X connects as the attacker (no groups), hands the connection to its
    // child Y and exits; Y uses it once told to.
    const pid_t x = ForkAs(kAttacker, {}, [&] {
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, daemon_->socket().c_str(), sizeof(address.sun_path) - 1);
      if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return 1;
      const pid_t y = fork();
      if (y == 0) {
        char byte;
        if (read(go[0], &byte, 1) != 1) _exit(1);
        auto channel = grpc::CreateInsecureChannelFromFd("heapd", fd);
        auto stub = v1::Heapd::NewStub(channel);
        v1::AttachRequest request;
        request.set_heap("shared");
        request.set_read_only(true);
        v1::AttachResponse response;
        grpc::ClientContext context;
        const grpc::Status status = stub->Attach(&context, request, &response);
        const char code = static_cast<char>(status.error_code());
        (void)!write(verdict[1], &code, 1);
        _exit(0);
      }
      const pid_t self = getpid();
      (void)!write(pid_pipe[1], &self, sizeof(self));
      return 0;
    });
    pid_t x_pid = 0;
    ASSERT_EQ(read(pid_pipe[0], &x_pid, sizeof(x_pid)), static_cast<ssize_t>(sizeof(x_pid)));
    WaitExit(x);
    // Z: a process of the attacker's that is in the group, with X's pid.
    std::ofstream(std::string("/proc/sys/kernel/ns_last_pid")) << x_pid - 1;
    int z_ready[2];
    ASSERT_EQ(pipe(z_ready), 0);
    const pid_t z = ForkAs(kAttacker, {kSharedGroup}, [&] {
      (void)!write(z_ready[1], "Z", 1);
      pause();
      return 0;
    });
    char byte;
    ASSERT_EQ(read(z_ready[0], &byte, 1), 1);
    if (z == x_pid) {
      tried = true;
      (void)!write(go[1], "G", 1);
      char code = 0;
      ASSERT_EQ(read(verdict[0], &code, 1), 1);
      EXPECT_EQ(code, static_cast<char>(grpc::StatusCode::PERMISSION_DENIED))
          << "the attacker's connection got the group of a process that reused its pid";
    }
    kill(z, SIGKILL);
    WaitExit(z);
    close(go[1]);  // Y ends
    for (int fd :
         {go[0], verdict[0], verdict[1], pid_pipe[0], pid_pipe[1], z_ready[0], z_ready[1]}) {
      close(fd);
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
  if (!tried) GTEST_SKIP() << "could not reuse a pid (ns_last_pid) on this machine";
}

// Floods of heaps, bytes, names, sessions and connections stop at each
// user's limits; other users go on.
TEST_F(HostileUserTest, FloodsStopAtTheUsersLimits) {
  StartDaemon({"--max_heaps_per_user=3", "--max_names_per_heap=50", "--max_sessions_per_user=4",
               "--max_connections_per_user=16", "--max_heap_bytes_per_user=1073741824"});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        Ctl(kAttacker, {"heap", "create", absl::StrCat("a", i), "--max_size=67108864"}).Exited(0));
  }
  ChildResult refused = Ctl(kAttacker, {"heap", "create", "a3", "--max_size=67108864"});
  EXPECT_FALSE(refused.Exited(0));
  EXPECT_NE(refused.output.find("--max_heaps_per_user"), std::string::npos) << refused.output;
  ASSERT_TRUE(Ctl(kAttacker, {"heap", "rm", "a2"}).Exited(0));
  refused = Ctl(kAttacker, {"heap", "create", "a2", "--max_size=2147483648"});
  EXPECT_NE(refused.output.find("--max_heap_bytes_per_user"), std::string::npos) << refused.output;
  // Names.
  const ChildResult names = RunChild(As(kAttacker, Worker("a0", {"bind-many", "60"})));
  EXPECT_NE(names.output.find("--max_names_per_heap"), std::string::npos) << names.output;
  EXPECT_NE(names.output.find("at 50"), std::string::npos) << names.output;
  // Sessions: four held, the fifth refused.
  std::vector<std::unique_ptr<Child>> holders;
  for (int i = 0; i < 4; ++i) {
    holders.push_back(
        std::make_unique<Child>(As(kAttacker, Worker("a1", {"hold", std::to_string(i)}))));
    ASSERT_TRUE(holders.back()->WaitForOutput("synced")) << holders.back()->output();
  }
  const ChildResult fifth = RunChild(As(kAttacker, Worker("a1", {"attach", "rw"})));
  EXPECT_NE(fifth.output.find("--max_sessions_per_user"), std::string::npos) << fifth.output;
  holders.clear();
  // Connections: hundreds held open on both sockets.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t flood = ForkAs(kAttacker, {}, [&] {
    std::vector<int> fds;
    for (int i = 0; i < 200; ++i) {
      for (const std::string& path : {daemon_->socket(), daemon_->fd_socket()}) {
        const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
        if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
          fds.push_back(fd);
        }
      }
    }
    (void)!write(ready[1], "F", 1);
    pause();
    return 0;
  });
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  usleep(300 * 1000);  // heapd accepts, counts and closes
  ASSERT_TRUE(Ctl(kOtherUser, {"heap", "create", "o", "--max_size=67108864"}).Exited(0));
  EXPECT_LT(TimedAttach(kOtherUser, "o"), absl::Seconds(3));
  size_t descriptors = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", daemon_->pid(), "/fd"))) {
    (void)entry;
    ++descriptors;
  }
  EXPECT_LT(descriptors, 150u) << "heapd holds a descriptor per flooding connection";
  EXPECT_NE(daemon_->Log().find("--max_connections_per_user"), std::string::npos);
  kill(flood, SIGKILL);
  WaitExit(flood);
  close(ready[0]);
  close(ready[1]);
}

// Out of descriptors, heapd's accept loops wait instead of spinning, and
// serve again once connections go away.
TEST_F(HostileUserTest, OutOfDescriptorsIsNoBusyLoop) {
  StartDaemon({}, {"prlimit", "--nofile=64:64", "--"});
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t flood = ForkAs(kAttacker, {}, [&] {
    std::vector<int> fds;
    for (int i = 0; i < 100; ++i) {
      for (const std::string& path : {daemon_->socket(), daemon_->fd_socket()}) {
        const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
        if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
          fds.push_back(fd);
        }
      }
    }
    (void)!write(ready[1], "F", 1);
    pause();
    return 0;
  });
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  usleep(500 * 1000);
  const double before = CpuSeconds(daemon_->pid());
  usleep(2000 * 1000);
  const double used = CpuSeconds(daemon_->pid()) - before;
  EXPECT_LT(used, 0.5) << "heapd spun for " << used << " s of 2 s with no descriptors left";
  kill(flood, SIGKILL);
  WaitExit(flood);
  close(ready[0]);
  close(ready[1]);
  usleep(300 * 1000);
  ASSERT_TRUE(Ctl(kOtherUser, {"heap", "create", "o", "--max_size=67108864"}).Exited(0))
      << daemon_->Log();
  EXPECT_LT(TimedAttach(kOtherUser, "o"), absl::Seconds(3));
}

// A snapshot cannot be made to wait for weeks, and SIGTERM ends the wait.
TEST_F(HostileUserTest, SnapshotWaitsAreBoundedAndEndAtShutdown) {
  MakeAttackerHeapAndSnapshot();
  const ChildResult forever =
      Ctl(kAttacker, {"snapshot", "create", "a-heap", "x", "--wait_ms=4000000000"});
  EXPECT_FALSE(forever.Exited(0));
  Child writer(As(kAttacker, Worker("a-heap", {"hold", "7"})));
  ASSERT_TRUE(writer.WaitForOutput("synced"));
  std::vector<std::string> argv = {
      Dir("heapctl"),    "--socket=" + daemon_->socket(), "snapshot", "create", "a-heap", "waiting",
      "--wait_ms=600000"};
  Child waiting(As(kAttacker, argv));
  usleep(500 * 1000);
  const absl::Time start = absl::Now();
  const int status = daemon_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "shutdown waited for the snapshot";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(waiting.Wait().Exited(0));
}

// A writer cuts the data file it holds to nothing: heapd survives, puts
// the file back to its size and goes on serving the heap.
TEST_F(HostileUserTest, AWriterTruncatingTheDataFileIsRepairedNotFatal) {
  ASSERT_TRUE(
      Ctl(kAttacker, {"heap", "create", "t", "--max_size=268435456", "--mode=0666"}).Exited(0));
  const ChildResult truncated = RunChild(As(kAttacker, Worker("t", {"truncate-data"})));
  EXPECT_NE(truncated.output.find("truncated"), std::string::npos) << truncated.output;
  EXPECT_EQ(kill(daemon_->pid(), 0), 0) << "heapd died";
  // The file's size is the heap's capacity once no growth (heapd grows
  // heaps ahead of demand, in the background) is half done.
  v1::HeapStats stats;
  struct stat st;
  for (int i = 0; i < 100; ++i) {
    const ChildResult stat =
        RunChild({Dir("heapctl"), "--socket=" + daemon_->socket(), "--json", "heap", "stat", "t"});
    ASSERT_TRUE(stat.Exited(0)) << stat.output;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(stat.output, &stats).ok());
    ASSERT_EQ(::stat(Dir("state/heaps/t/data").c_str(), &st), 0);
    if (static_cast<uint64_t>(st.st_size) == stats.info().capacity_bytes()) break;
    usleep(20 * 1000);
  }
  EXPECT_GE(stats.data_file_repairs(), 1u) << truncated.output << daemon_->Log();
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), stats.info().capacity_bytes());
  // Others go on using it.
  EXPECT_TRUE(RunChild(As(kOtherUser, Worker("t", {"put", "after", "1"}))).Exited(0));
}

// A user allowed to read a heap opens its read-only descriptor again,
// writable, through /proc/self/fd (a memfd's mode would let anyone): heapd
// refuses, and the heap is unchanged.
TEST_F(HostileUserTest, AReaderCannotReopenTheHeapWritable) {
  ASSERT_TRUE(Ctl(kOtherUser, {"heap", "create", "shared", "--max_size=268435456", "--mode=0644"})
                  .Exited(0));
  ASSERT_TRUE(RunChild(As(kOtherUser, Worker("shared", {"put", "x", "11"}))).Exited(0));
  const ChildResult stat = RunChild(
      {Dir("heapctl"), "--socket=" + daemon_->socket(), "--json", "heap", "stat", "shared"});
  ASSERT_TRUE(stat.Exited(0)) << stat.output;
  v1::HeapStats stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(stat.output, &stats).ok());
  if (stats.info().image() != v1::IMAGE_WORKING) {
    GTEST_SKIP() << "heaps here have no working image (the state directory is on tmpfs)";
  }
  const ChildResult attack = RunChild(As(kAttacker, Worker("shared", {"ro-reopen", "x"})));
  EXPECT_TRUE(attack.Exited(0)) << attack.output;
  EXPECT_NE(attack.output.find("refused"), std::string::npos) << attack.output;
  const ChildResult got = RunChild(As(kOtherUser, Worker("shared", {"get", "x"})));
  EXPECT_EQ(got.output, "value 11\n");
}

// The pids of heapd's snapshot workers running as `uid`: the children of
// heapd's children (RunAs helpers are forked by heapd's spawner).
std::vector<pid_t> WorkersOf(pid_t heapd, uint32_t uid) {
  struct Process {
    pid_t parent = -1;
    uint32_t uid = 0;
  };
  std::map<pid_t, Process> processes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    Process process;
    for (absl::string_view line :
         absl::StrSplit(ReadAll(entry.path().string() + "/status"), '\n')) {
      std::sscanf(std::string(line).c_str(), "PPid: %d", &process.parent);
      std::sscanf(std::string(line).c_str(), "Uid: %u", &process.uid);
    }
    processes[std::stoi(name)] = process;
  }
  std::vector<pid_t> pids;
  for (const auto& [pid, process] : processes) {
    const auto parent = processes.find(process.parent);
    if (process.uid == uid && parent != processes.end() && parent->second.parent == heapd) {
      pids.push_back(pid);
    }
  }
  return pids;
}

// The user stops its own snapshot worker (SIGSTOP): the heap's sync point
// stays held, the user's own sessions pile up behind it and end. Nobody
// else waits: other users attach, their tokens are redeemed; the user's
// calls stop at its limit, heapd's threads stay bounded; and a cancelled
// call kills its worker.
TEST_F(HostileUserTest, AStoppedSnapshotWorkerStallsOnlyItsOwner) {
  StartDaemon({"--max_calls_per_user=16"});
  const ChildResult filled = RunChild(As(kAttacker, Worker("a-heap", {"alloc", "1", "20000"})));
  ASSERT_TRUE(filled.Exited(0)) << filled.output;
  ASSERT_TRUE(Ctl(kOtherUser, {"heap", "create", "o-heap", "--max_size=67108864"}).Exited(0));
  std::filesystem::create_directories(Dir("attacker/stall"));
  chown(Dir("attacker/stall").c_str(), kAttacker, kAttacker);
  std::vector<std::string> argv = {
      Dir("heapctl"), "--socket=" + daemon_->socket(), "snapshot", "create", "a-heap",
      "stalled",      "--to=" + Dir("attacker/stall")};
  auto snapshot = std::make_unique<Child>(As(kAttacker, argv));
  std::vector<pid_t> workers;
  for (int i = 0; i < 500 && workers.empty(); ++i) {
    for (pid_t pid : WorkersOf(daemon_->pid(), kAttacker)) {
      if (kill(pid, SIGSTOP) == 0) workers.push_back(pid);
    }
    usleep(1000);
  }
  if (workers.empty()) GTEST_SKIP() << "the snapshot finished before it could be stopped";
  // The attacker's sessions pile syncs behind the held sync point, and end.
  std::vector<std::unique_ptr<Child>> piled;
  for (int i = 0; i < 40; ++i) {
    piled.push_back(std::make_unique<Child>(
        As(kAttacker, Worker("a-heap", {"put", absl::StrCat("p", i), "1"}))));
  }
  usleep(500 * 1000);
  for (int i = 0; i < 5; ++i) {
    EXPECT_LT(TimedAttach(kOtherUser, "o-heap"), absl::Seconds(3)) << daemon_->Log();
  }
  const std::string status = ReadAll(absl::StrCat("/proc/", daemon_->pid(), "/status"));
  int threads = 0;
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    std::sscanf(std::string(line).c_str(), "Threads: %d", &threads);
  }
  EXPECT_LT(threads, 80) << "heapd grew a thread per piled call";
  // The attacker gives up: its cancelled call kills the stopped worker.
  snapshot.reset();  // SIGKILLs heapctl: the call is cancelled
  piled.clear();
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    gone = kill(workers[0], 0) != 0;
    usleep(10 * 1000);
  }
  EXPECT_TRUE(gone) << "the worker of a cancelled call still runs";
}

// Asked to make its own heap, a user's job does not silently attach a heap
// of that name another user made (to read what the job writes into it).
TEST_F(HostileUserTest, ASquattedHeapNameGetsNothingWritten) {
  ASSERT_TRUE(Ctl(kAttacker, {"heap", "create", "results", "--mode=0666", "--max_size=67108864"})
                  .Exited(0));
  const ChildResult victim = RunChild(As(kOtherUser, Worker("results", {"alloc", "1", "10"})));
  EXPECT_FALSE(victim.Exited(0));
  EXPECT_NE(victim.output.find("belongs to uid 61001"), std::string::npos) << victim.output;
  const ChildResult stat = RunChild(
      {Dir("heapctl"), "--socket=" + daemon_->socket(), "--json", "heap", "stat", "results"});
  v1::HeapStats stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(stat.output, &stats).ok());
  EXPECT_EQ(stats.info().live_objects(), 0u);
  EXPECT_EQ(stats.info().names(), 0u);
}

// Another user holding the metrics port does not keep heapd down.
TEST_F(HostileUserTest, AHeldMetricsPortDoesNotKeepHeapdDown) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t holder = ForkAs(kAttacker, {}, [&] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(fd, 1) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return 1;
    }
    const uint16_t port = ntohs(address.sin_port);
    (void)!write(ready[1], &port, sizeof(port));
    pause();
    return 0;
  });
  uint16_t port = 0;
  ASSERT_EQ(read(ready[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  StartDaemon({absl::StrCat("--metrics_address=127.0.0.1:", port)});
  ASSERT_TRUE(Ctl(kOtherUser, {"heap", "create", "o", "--max_size=67108864"}).Exited(0));
  EXPECT_LT(TimedAttach(kOtherUser, "o"), absl::Seconds(3));
  EXPECT_NE(daemon_->Log().find("trying again"), std::string::npos) << daemon_->Log();
  kill(holder, SIGKILL);
  WaitExit(holder);
  close(ready[0]);
  close(ready[1]);
}

// A target through a magic link (/proc/self/cwd, the worker's working
// directory, which is heapd's) leads nowhere the user could not go.
TEST_F(HostileUserTest, MagicLinkTargetsLeadNowhere) {
  MakeAttackerHeapAndSnapshot();
  const std::vector<std::string> before = Entries(std::filesystem::current_path());
  for (const char* target : {"/proc/self/cwd", "/proc/self/root/tmp", "/proc/thread-self/cwd"}) {
    const ChildResult made =
        Ctl(kAttacker, {"snapshot", "create", "a-heap", "planted", std::string("--to=") + target});
    EXPECT_FALSE(made.Exited(0)) << target << ": " << made.output;
  }
  EXPECT_EQ(Entries(std::filesystem::current_path()), before);
  std::filesystem::remove_all("/tmp/planted");
}

}  // namespace
}  // namespace heapd
