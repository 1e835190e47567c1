// Issue 11: after any crash a heap reads exactly as at its last completed
// sync — allocations, names and every byte of object contents.
//
// A real heapd keeps its heaps on tmpfs (a state directory under /dev/shm;
// clients map the data file), and in the test directory (a file system,
// ext4 here: clients map a working image and the data file changes only at
// syncs, through the redo log; a fifth of ClientKilled's rounds).
// Worker processes (tests/data_crash_worker.cc) change a vector, a hash map
// and a linked list of variable-size nodes in a heap, step by step, from a
// deterministic stream of operations, and sync every K steps, printing
// "syncing N" before and "synced N" after each sync. Each round:
//   1. a worker continues from the step the last check confirmed;
//   2. after a random delay (0 to --max_delay_ms, so kills land during
//      attach, between syncs and inside them) the worker, heapd, or both are
//      SIGKILLed; heapd is restarted;
//   3. a checker process churns the heap (allocates and fills with 0xA5
//      every free slot and chunk, so memory whose allocation rolled back is
//      reused) and compares every element, pair, node and payload byte with
//      a reference model replayed to the last step the worker saw synced —
//      or to the step of the sync it was inside when it died ("syncing M"
//      printed, "synced M" not): both are legal, nothing else is;
//   4. the next round continues from the step the checker confirmed.
// A divergence is printed (structure, index, expected, got), counted, and the
// case goes on with a fresh heap; each case prints a tally and fails if
// anything diverged.
//
// Cases: ClientKilled (--client_kill_rounds), DaemonKilled, BothKilled, and
// TwoSessionsSamePages (two processes writing the even and odd words of the
// same pages; see that test).
//
// Deterministic given the seed: --seed, else $HEAPD_TEST_SEED, else 11; it is
// printed. The defaults keep it near two minutes; more rounds:
//   bazel test //tests:data_crash_test --test_output=streamed
//   bazel test //tests:data_crash_test --test_env=HEAPD_TEST_SEED=7
//   bazel run //tests:data_crash_test -- --client_kill_rounds=1000
#include <linux/magic.h>
#include <signal.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client_channel.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"

ABSL_FLAG(int, client_kill_rounds, 100, "rounds of ClientKilled");
ABSL_FLAG(int, daemon_kill_rounds, 12, "rounds of DaemonKilled");
ABSL_FLAG(int, both_kill_rounds, 12, "rounds of BothKilled");
ABSL_FLAG(int, shared_rounds, 8, "rounds of TwoSessionsSamePages");
ABSL_FLAG(int, max_delay_ms, 250, "longest a worker runs before it is killed");
ABSL_FLAG(uint64_t, seed, 0, "main seed (0: $HEAPD_TEST_SEED, else 11)");

namespace heapd {
namespace {

constexpr uint64_t kDefaultSeed = 11;
constexpr uint64_t kForever = 1000000000;  // steps: until killed
// Full details of the first divergences of a case; one line for the rest.
constexpr int kDetailedDivergences = 3;
// Steps a cowriter runs before it finishes (it is usually killed first).
constexpr uint64_t kCowriterSteps = 5000;

uint64_t MainSeed() {
  static const uint64_t seed = [] {
    uint64_t seed = absl::GetFlag(FLAGS_seed);
    const char* env = std::getenv("HEAPD_TEST_SEED");
    if (seed == 0 && env != nullptr && !absl::SimpleAtoi(env, &seed)) seed = 0;
    if (seed == 0) seed = kDefaultSeed;
    std::printf("data_crash_test: seed %" PRIu64 " (repeat with HEAPD_TEST_SEED=%" PRIu64 ")\n",
                seed, seed);
    return seed;
  }();
  return seed;
}

// What a worker's output says about the state it left.
struct WorkerLog {
  bool any_synced = false;         // a "synced" line
  uint64_t synced = 0;             // the last "synced N" (else its start)
  std::optional<uint64_t> inside;  // "syncing M" without "synced M" after it
  std::optional<uint64_t> done;    // "done N": it detached
  std::string error;               // its "error ..." line
};

WorkerLog ParseWorker(const std::string& output, uint64_t start) {
  WorkerLog log;
  log.synced = start;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    uint64_t n;
    if (absl::ConsumePrefix(&line, "syncing ") && absl::SimpleAtoi(line, &n)) {
      log.inside = n;
    } else if (absl::ConsumePrefix(&line, "synced ") && absl::SimpleAtoi(line, &n)) {
      log.any_synced = true;
      log.synced = n;
      log.inside.reset();
    } else if (absl::ConsumePrefix(&line, "done ") && absl::SimpleAtoi(line, &n)) {
      log.done = n;
    } else if (absl::StartsWith(line, "error ")) {
      log.error = std::string(line);
    }
  }
  if (log.inside == log.synced) log.inside.reset();
  return log;
}

// The step of the checker's "ok step N", if it printed one and exited 0.
std::optional<uint64_t> ConfirmedStep(const ChildResult& checked) {
  if (!checked.Exited(0)) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(checked.output, '\n')) {
    uint64_t step;
    if (absl::ConsumePrefix(&line, "ok step ") &&
        absl::SimpleAtoi(line.substr(0, line.find(' ')), &step)) {
      return step;
    }
  }
  return std::nullopt;
}

// The last `lines` lines of `text`.
std::string Tail(const std::string& text, int lines) {
  size_t at = text.size();
  for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

// Where kills fell and what the checks found.
struct Tally {
  int rounds = 0;
  int before_first_sync = 0;  // during startup, attach or its first sync
  int between_syncs = 0;
  int inside_sync = 0;
  int inside_sync_committed = 0;  // ... and that sync had committed
  int completed = 0;              // the worker detached before the kill
  int worker_errors = 0;          // a worker failed on its own (ClientKilled: a failure)
  int divergences = 0;
  std::string first_divergence;

  void Print(const std::string& name) const {
    std::printf(
        "%s: %d rounds; kills before the first sync %d, between syncs %d, inside a sync %d "
        "(%d of them after it committed); completed before the kill %d; worker errors %d; "
        "DIVERGENCES %d\n",
        name.c_str(), rounds, before_first_sync, between_syncs, inside_sync, inside_sync_committed,
        completed, worker_errors, divergences);
    std::fflush(stdout);
  }
};

enum class Kill { kClient, kDaemon, kBoth };

// The parameter: where heapd's state directory lives, /dev/shm (tmpfs) or
// "" (the test directory, a file system: heaps with a working image).
class DataCrashTest : public ::testing::TestWithParam<std::string> {
 protected:
  // heapd's state directory is under the parameter's directory (the later
  // --state_dir wins over TestDaemon's own). A worker killed between its
  // Attach call and fetching its fd leaves a session that ends when its
  // token expires: 3 s here (default 10), well within the 10 s
  // WaitForNoClients allows.
  DataCrashTest()
      : shm_(GetParam()),
        daemon_({"--state_dir=" + shm_.Sub("state"), "--attach_token_seconds=3"}) {}

  bool on_tmpfs() const { return !GetParam().empty(); }
  // ClientKilled's rounds: a fifth of them on a working image (each sync
  // there is an fdatasync on a disk); heapd's kills, the rarer case, get
  // them all on both.
  int ClientRounds(int flag) const { return on_tmpfs() ? flag : std::max(1, flag / 5); }

  void SetUp() override {
    struct statfs fs;
    ASSERT_EQ(statfs(shm_.path().c_str(), &fs), 0);
    if (on_tmpfs()) {
      ASSERT_EQ(fs.f_type, TMPFS_MAGIC) << shm_.path() << " is not on tmpfs";
    } else if (fs.f_type == TMPFS_MAGIC) {
      GTEST_SKIP() << shm_.path() << " is on tmpfs: no working image there";
    }
    daemon_.Start();
    Reconnect();
    worker_ = Runfile("tests/data_crash_worker");
  }

  void Reconnect() {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // A generator for the case named `name`: the same rounds for the same seed.
  static std::mt19937_64 CaseRng(const std::string& name) {
    std::seed_seq seq(name.begin(), name.end());
    std::mt19937_64 rng(seq);
    rng.seed(rng() ^ MainSeed());
    return rng;
  }

  std::vector<std::string> WorkerArgs(const std::string& heap, uint64_t seed,
                                      std::vector<std::string> more) const {
    std::vector<std::string> argv = {worker_, "--socket=" + daemon_.socket(), "--heap=" + heap,
                                     absl::StrCat("--seed=", seed)};
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  }

  // Lets `child` run for `ms` milliseconds, reading its output meanwhile (a
  // full pipe would stop it).
  static void RunFor(Child& child, int ms) { child.WaitForOutput("\x01 never printed", ms); }

  // A delay before a kill: mostly over the whole range, now and then within
  // the worker's start (connect, attach, its first sync).
  int PickDelay(std::mt19937_64& rng) const {
    const int max_ms = std::max(1, absl::GetFlag(FLAGS_max_delay_ms));
    return static_cast<int>(rng() % 10 == 0 ? rng() % 40 : rng() % (max_ms + 1));
  }

  // Waits until heapd has ended every session of `heap` (a killed
  // client's is reclaimed when its connection closes).
  void WaitForNoClients(const std::string& heap) {
    absl::StatusOr<v1::HeapStats> stats;
    for (int i = 0; i < 2000; ++i) {
      stats = StatHeap(*client_, heap);
      if (!stats.ok() && stats.status().code() == absl::StatusCode::kNotFound) return;
      if (stats.ok() && stats->info().clients() == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "heap " << heap << " still has clients after 10 s (last stat: "
                  << (stats.ok() ? absl::StrCat(stats->info().clients(), " clients")
                                 : stats.status().ToString())
                  << ")\n"
                  << Tail(daemon_.Log(), 20) << HeapdStacks();
  }

  // heapd's threads' stacks, when gdb is there to say where it is stuck.
  std::string HeapdStacks() const {
    if (access("/usr/bin/gdb", X_OK) != 0) return "";
    const ChildResult gdb = RunChild({"/usr/bin/gdb", "-p", absl::StrCat(daemon_.pid()), "-batch",
                                      "-ex", "thread apply all bt 12"});
    return "heapd's threads:\n" + gdb.output;
  }

  void RemoveHeap(const std::string& heap) {
    v1::RemoveHeapRequest request;
    request.set_heap(heap);
    v1::RemoveHeapResponse response;
    grpc::ClientContext context;
    const absl::Status s = FromGrpc(StubOf(*client_).RemoveHeap(&context, request, &response));
    EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kNotFound) << s;
  }

  // Stops `worker` as `kill` says (restarting heapd if it was killed) and
  // returns its whole output; `at_kill` gets what it had printed when the
  // kill came.
  std::string KillRound(Kill kill, Child& worker, std::mt19937_64& rng, std::string* at_kill) {
    RunFor(worker, 1);  // what is in the pipe now
    *at_kill = worker.output();
    switch (kill) {
      case Kill::kClient:
        worker.Kill(SIGKILL);
        break;
      case Kill::kDaemon:
        // The worker fails at its next call to heapd and exits; heapd is
        // restarted only once it is gone: a process still mapping the heap
        // could store into it after heapd reopened it.
        daemon_.Crash();
        RunFor(worker, 10000);
        worker.Kill(SIGKILL);
        break;
      case Kill::kBoth:
        if (rng() % 2 == 0) {
          worker.Kill(SIGKILL);
          daemon_.Crash();
        } else {
          daemon_.Crash();
          worker.Kill(SIGKILL);
        }
        break;
    }
    const ChildResult result = worker.Wait();
    if (kill != Kill::kClient) {
      daemon_.Start();
      Reconnect();
    }
    return result.output;
  }

  // The three-structure workload with `kill` at every round.
  void RunStructureRounds(const std::string& name, Kill kill, int rounds);

  TestDir shm_;  // before daemon_: removed after heapd stopped
  TestDaemon daemon_;
  std::unique_ptr<Client> client_;
  std::string worker_;
};

void DataCrashTest::RunStructureRounds(const std::string& name, Kill kill, int rounds) {
  constexpr uint64_t kSyncEvery[] = {1, 4, 16, 64, 512};
  std::mt19937_64 rng = CaseRng(name);
  const uint64_t case_seed = rng();
  Tally tally;
  int generation = 0;
  std::string heap = "data-0";
  uint64_t step = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int round = 0; round < rounds; ++round) {
    const uint64_t sync_every = kSyncEvery[rng() % 5];
    const uint64_t steps = rng() % 10 == 0 ? 1 + rng() % 3000 : kForever;
    const int delay_ms = PickDelay(rng);
    const uint64_t seed = case_seed + generation;
    Child worker(WorkerArgs(heap, seed,
                            {absl::StrCat("--start_step=", step), absl::StrCat("--steps=", steps),
                             absl::StrCat("--sync_every=", sync_every)}));
    RunFor(worker, delay_ms);
    std::string at_kill;
    const std::string output = KillRound(kill, worker, rng, &at_kill);
    WaitForNoClients(heap);
    ++tally.rounds;
    // The legal states come from the whole output (after heapd died the
    // worker may have begun a sync that could not commit: allowing it is
    // harmless); where the kill fell, from what it had printed by then.
    const WorkerLog log = ParseWorker(output, step);
    const WorkerLog when = ParseWorker(at_kill, step);
    if (log.done) {
      ++tally.completed;
    } else if (when.inside) {
      ++tally.inside_sync;
    } else if (!when.any_synced) {
      ++tally.before_first_sync;
    } else {
      ++tally.between_syncs;
    }
    if (!log.error.empty()) {
      ++tally.worker_errors;
      EXPECT_NE(kill, Kill::kClient)
          << "round " << round << ": the worker failed on its own: " << log.error << "\n"
          << Tail(output, 10);
    }
    std::vector<std::string> check = {"--check", absl::StrCat("--expect_step=", log.synced)};
    if (log.inside) check.push_back(absl::StrCat("--or_step=", *log.inside));
    const ChildResult checked = RunChild(WorkerArgs(heap, seed, check));
    if (const std::optional<uint64_t> confirmed = ConfirmedStep(checked)) {
      if (log.inside && *confirmed == *log.inside) ++tally.inside_sync_committed;
      step = *confirmed;
      continue;
    }
    ++tally.divergences;
    const std::string context = absl::StrCat(
        name, " round ", round, ": heap ", heap, ", seed ", seed, ", worker from step ", step,
        " syncing every ", sync_every, ", killed after ", delay_ms, " ms; it had synced step ",
        log.synced,
        log.inside ? absl::StrCat(" and was inside the sync of step ", *log.inside) : "",
        log.done ? " and had detached" : "");
    if (tally.divergences == 1) tally.first_divergence = context + "\n" + checked.output;
    if (tally.divergences <= kDetailedDivergences) {
      std::printf("%s\n--- the worker's last lines:\n%s--- the checker:\n%s\n", context.c_str(),
                  Tail(output, 4).c_str(), checked.output.c_str());
    } else {
      std::printf("%s: DIVERGENCE (%s)\n", context.c_str(), Tail(checked.output, 1).c_str());
    }
    std::fflush(stdout);
    // The structures are broken: go on with a new heap.
    RemoveHeap(heap);
    heap = absl::StrCat("data-", ++generation);
    step = 0;
  }
  tally.Print(absl::StrCat(
      name, " (",
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started)
          .count(),
      " s, last step ", step, ")"));
  EXPECT_EQ(tally.divergences, 0) << "the first divergence:\n" << tally.first_divergence;
}

// SIGKILL the worker at --client_kill_rounds random points.
INSTANTIATE_TEST_SUITE_P(Storage, DataCrashTest, testing::Values("/dev/shm", ""),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? "WorkingImage" : "Tmpfs";
                         });

TEST_P(DataCrashTest, ClientKilled) {
  RunStructureRounds("ClientKilled", Kill::kClient,
                     ClientRounds(absl::GetFlag(FLAGS_client_kill_rounds)));
}

// SIGKILL heapd while a worker runs; restart it once the worker is gone.
TEST_P(DataCrashTest, DaemonKilled) {
  RunStructureRounds("DaemonKilled", Kill::kDaemon, absl::GetFlag(FLAGS_daemon_kill_rounds));
}

// SIGKILL both, in either order.
TEST_P(DataCrashTest, BothKilled) {
  RunStructureRounds("BothKilled", Kill::kBoth, absl::GetFlag(FLAGS_both_kill_rounds));
}

// Two sessions write the same pages: an owner process keeps "ts.shared", a
// vector of 64 Ki words (128 pages), and writes only its even words; a
// cowriter process writes only the odd words. Each syncs on its own
// schedule. The cowriter is SIGKILLed at a random point; then the owner is
// stopped cleanly (it syncs and detaches).
//
// The rule for a page written by two sessions: it commits as it is at each
// sync of either. So
//   - the owner's even words must equal the owner's model at its final
//     step, exactly (nothing the cowriter's death rolls back may take them
//     back);
//   - each odd word must equal the cowriter's model at its last sync, or a
//     value the cowriter wrote to that word later: its unsynced stores
//     survive its death only where a sync of the owner committed them, and
//     which did is a matter of timing, so the check accepts either.
// The least important case; it checks that rolling back a dead session's
// pages does not roll back another session's synced stores to them.
TEST_P(DataCrashTest, TwoSessionsSamePages) {
  constexpr uint64_t kOwnerSyncEvery[] = {3, 10, 30};
  constexpr uint64_t kCowriterSyncEvery[] = {5, 17, 40};
  const std::string heap = "shared";
  std::mt19937_64 rng = CaseRng("TwoSessionsSamePages");
  const uint64_t owner_seed = rng();
  const uint64_t cowriter_seed = rng();
  uint64_t owner_step = 0;
  uint64_t cowriter_step = 0;
  uint64_t cowriter_max = 0;
  Tally tally;
  for (int round = 0; round < absl::GetFlag(FLAGS_shared_rounds); ++round) {
    Child owner(
        WorkerArgs(heap, owner_seed,
                   {"--mode=owner", "--name_prefix=ts", absl::StrCat("--start_step=", owner_step),
                    absl::StrCat("--sync_every=", kOwnerSyncEvery[rng() % 3])}));
    ASSERT_TRUE(owner.WaitForOutput("ready")) << owner.output() << Tail(daemon_.Log(), 20);
    const uint64_t cowriter_sync_every = kCowriterSyncEvery[rng() % 3];
    Child cowriter(WorkerArgs(
        heap, cowriter_seed,
        {"--mode=cowriter", "--name_prefix=ts", absl::StrCat("--start_step=", cowriter_step),
         absl::StrCat("--steps=", kCowriterSteps),
         absl::StrCat("--sync_every=", cowriter_sync_every)}));
    cowriter_max = std::max(cowriter_max, cowriter_step + kCowriterSteps);
    for (int waited = 0, delay = PickDelay(rng); waited < delay; waited += 10) {
      RunFor(cowriter, std::min(10, delay - waited));
      RunFor(owner, 1);
    }
    RunFor(cowriter, 1);
    const WorkerLog when = ParseWorker(cowriter.output(), cowriter_step);
    cowriter.Kill(SIGKILL);
    const WorkerLog b = ParseWorker(cowriter.Wait().output, cowriter_step);
    RunFor(owner, static_cast<int>(rng() % 50));  // the owner may sync after the kill
    owner.Kill(SIGTERM);
    const ChildResult a = owner.Wait();
    const WorkerLog a_log = ParseWorker(a.output, owner_step);
    ASSERT_TRUE(a.Exited(0) && a_log.done) << a.output;
    WaitForNoClients(heap);
    ++tally.rounds;
    if (b.done) {
      ++tally.completed;
    } else if (when.inside) {
      ++tally.inside_sync;
    } else if (!when.any_synced) {
      ++tally.before_first_sync;
    } else {
      ++tally.between_syncs;
    }
    const ChildResult checked = RunChild(WorkerArgs(
        heap, owner_seed,
        {"--check", "--mode=shared", "--name_prefix=ts",
         absl::StrCat("--expect_step=", *a_log.done), absl::StrCat("--b_seed=", cowriter_seed),
         absl::StrCat("--b_step=", b.synced), absl::StrCat("--b_max_step=", cowriter_max)}));
    std::printf("TwoSessionsSamePages round %d: owner at step %" PRIu64
                ", cowriter synced step %" PRIu64 "%s: %s",
                round, *a_log.done, b.synced, when.inside ? " (killed inside a sync)" : "",
                Tail(checked.output, 1).c_str());
    if (!checked.Exited(0)) {
      ++tally.divergences;
      if (tally.divergences == 1) tally.first_divergence = checked.output;
      std::printf("%s\n", checked.output.c_str());
    }
    std::fflush(stdout);
    owner_step = *a_log.done;
    cowriter_step = b.synced;
  }
  tally.Print("TwoSessionsSamePages (kills are the cowriter's)");
  EXPECT_EQ(tally.divergences, 0) << "the first divergence:\n" << tally.first_divergence;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  heapd::MainSeed();
  return RUN_ALL_TESTS();
}
