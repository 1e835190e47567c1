// Soak test: many worker processes (tests/soak_worker.cc) on one heap of a
// real heapd for a while, objects of 8 B to 6 MiB handed between them and
// freed by their receivers, names bound and unbound, boost containers built
// and checked, a sync per transaction; the harness SIGKILLs a worker now and
// then (a replacement takes over its role) and SIGTERMs heapd and restarts it
// once. At the end every worker drains and detaches, a finisher resolves
// what the kills left in doubt, and the heap must be empty: 0 live objects,
// 0 leased chunks, 0 names, no client; no process saw an error it did not
// expect, and heapd logged no rejected free and no error.
//
//   bazel test //tests:soak_test                       the short run (CI)
//   bazel run //tests:soak_test -- --duration_s=600 --workers=32
//
// ## The protocol
//
// What heapd guarantees, and what the protocol is built on
// (docs/consistency.md):
//   - After a process dies (or heapd restarts, which ends every session),
//     its allocations and own frees roll back to its last sync; a free it
//     sent to heapd (of an object another process allocated, or of a large
//     one) stands; names are bound and unbound at once and stay so.
//   - Object contents do not roll back: memory keeps whatever was written
//     last, also into objects the rollback freed. So a structure may only
//     point at an object once that object's allocation is synced.
//
// The heap holds a registry ("soak.registry") linking, with offset
// pointers, one slot per worker role ("soak.slot.<i>"); a slot outlives the
// processes that take the role. Setup allocates them, the finisher frees
// them; nothing else does. A slot holds:
//   - owned[]: the objects the role owns (offset, size, key);
//   - inbox[s]: a ring of objects worker s handed to this one. The sender
//     writes entries past the tail, syncs, then moves the tail (the
//     "published" counter): every published object is synced. Entries
//     [head, tail) belong to the receiver, which verifies each one, frees it
//     (a cross-process free), syncs, then moves the head;
//   - names[k]: the tag object that name "soak.n.<i>.<k>" binds;
//   - a journal and an in-doubt list (below), counters, the incarnation.
//
// Every object is stamped when allocated: word 0 its key (slot, incarnation,
// sequence: unique for the run), word 1 its size, every other byte derived
// from the key. Whoever reads an object compares every byte: before freeing
// or handing over its own objects, two more own objects per transaction,
// every object it receives, every name's tag, every adopted tag, every
// object in doubt.
//
// A worker works in transactions. It plans (frees, hand-overs, what it
// consumes from its inboxes, allocations into empty owned[] entries, a name
// bound or unbound, maybe a container), writes the plan into the journal and
// marks it PERFORMING; then allocates and stamps (each recorded in the
// journal after its stamp), writes hand-over entries past the receivers'
// tails, binds, builds, checks and destroys a container, and only then frees
// (own objects, consumed ones, unbound tags) and syncs. Frees come last so
// that nothing the transaction allocates reuses memory it freed: were the
// sync never to land, such a free would roll back and its object come back
// live holding another allocation's bytes (the soak found this). Once sync()
// returns it marks the journal SYNCED and applies it:
// owned[] entries cleared and set, receivers' tails and its own inbox heads
// moved, names[] and counters updated — every step idempotent — then IDLE.
// The first allocation of each transaction is small: its "witness".
//
// A process taking over a role (the replacement of a killed worker, or the
// same worker reconnecting after heapd's restart) first waits until heapd
// no longer lists the predecessor's session, then reads the journal:
//   - IDLE: nothing to do;
//   - SYNCED: the sync happened; apply the journal again;
//   - PERFORMING: the sync may or may not have happened, and frees may or
//     may not have reached heapd. Everything the transaction touched goes to
//     the slot's in-doubt list: its allocations (the witness first), its own
//     frees, the objects it consumed, the tags it unbound (when heapd no
//     longer binds the name); tags it bound are adopted when heapd binds the
//     name to them. Those entries leave owned[] and the inboxes; hand-overs
//     were never published and stay owned. This happens at positions fixed
//     before it starts (RECOVERING), so a kill during recovery is recovered
//     the same way.
// Objects in doubt are not touched again during the run: their memory may
// be free and reused, and a free of it could hit another object. One that is
// still live is whole: no process writes it (frees come last, see above).
//
// At the end the harness tells the workers to drain: they stop handing over
// and binding, free everything they own, unbind their names, consume their
// inboxes until every other worker said it sends nothing more, sync and
// detach. Then the finisher, alone on the heap (no lease anywhere, so heapd's
// view of every slot is exact), resolves each transaction left in doubt:
// an object is live if its contents are still its own stamp and heapd
// accepts its free (then it is freed); else it is not live. The witness tells
// whether the transaction's sync landed:
//   - landed: each of its allocations must be live, each of its frees,
//     consumes and unbinds must not be (else heapd lost or leaked one);
//   - not landed: none of its allocations may be live; its frees may have
//     reached heapd or not, both are right.
// And the counters must add up: allocated = freed + handed over + frees in
// doubt; handed over = received + consumes in doubt; names bound + adopted =
// unbound + unbinds in doubt. Then it frees the slots and the registry.
//
// Errors: a worker accepts an error only if it says the session is gone
// (UNAVAILABLE, or NOT_FOUND/FAILED_PRECONDITION naming the session) while
// the control block (tests/soak_control.h) shows that heapd is being or has
// been restarted since the worker attached. Every other error, any corrupt
// byte, any failed check, ends the worker with status 3 and fails the test.
// Every worker alive at the restart must have lost its session exactly once.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client_channel.h"
#include "gtest/gtest.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"
#include "tests/soak_control.h"

ABSL_FLAG(int, duration_s, 60, "seconds of work before the workers drain");
ABSL_FLAG(int, workers, 16, "worker processes (2..64; the soak needs at least 16)");
ABSL_FLAG(double, kill_interval_s, 4,
          "mean seconds between SIGKILLs of a random worker (0: no kills)");
ABSL_FLAG(double, restart_at, 0.45,
          "heapd is SIGTERMed and restarted once at this fraction of the run (negative: never)");
ABSL_FLAG(int, restarts, 1, "how many times heapd is restarted, from --restart_at on");
ABSL_FLAG(uint64_t, seed, 0, "random seed (0: from the clock)");
ABSL_FLAG(bool, fixed_address, false, "soak a fixed-address heap (mapped at one address)");
ABSL_FLAG(int, drain_timeout_s, 300, "seconds the workers get to drain and detach");
ABSL_FLAG(std::string, state_parent, "",
          "where heapd's heaps live (empty: under /tmp, a file system, where heapd runs with "
          "--working_images=false so that object contents do not roll back). The protocol "
          "below assumes they do not: on tmpfs (/dev/shm) a worker's steps after its sync "
          "(moving heads and tails) roll back when it or heapd dies, which the protocol does "
          "not expect yet");

namespace heapd {
namespace {

constexpr char kHeap[] = "soak";

// Whether the child has exited, without reaping it (Child::Wait reaps).
bool HasExited(const Child& child) {
  siginfo_t info{};
  if (waitid(P_PID, child.pid(), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == child.pid();
}

uint64_t PeakRssKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmHWM:")) {
      uint64_t kib = 0;
      std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &kib)) return kib;
    }
  }
  return 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Tail(const std::string& text, size_t bytes) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

// "key=value" fields of the line of `output` starting with `prefix`.
std::map<std::string, uint64_t> Fields(const std::string& output, const std::string& prefix) {
  std::map<std::string, uint64_t> fields;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      uint64_t value;
      if (!kv.second.empty() && absl::SimpleAtoi(kv.second, &value)) fields[kv.first] = value;
    }
  }
  return fields;
}

struct Incarnation {
  std::unique_ptr<Child> child;
  std::string log;
  int restarts_before = 0;  // heapd restarts done when it started
};

// Keeps the workers' logs and heapd's log of a failed run: in Bazel's
// undeclared outputs (bazel-testlogs/tests/soak_test/test.outputs/), else
// in a directory under /tmp.
void KeepArtifacts(const TestDaemon& daemon) {
  const char* outputs = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  std::string into = outputs != nullptr ? std::string(outputs) : "";
  if (into.empty()) {
    into = "/tmp/heapd-soak-XXXXXX";
    if (mkdtemp(into.data()) == nullptr) return;
  }
  std::error_code error;
  std::filesystem::copy(daemon.dir().Sub("logs"), into + "/logs",
                        std::filesystem::copy_options::recursive, error);
  std::filesystem::copy_file(daemon.dir().Sub("heapd.log"), into + "/heapd.log", error);
  std::printf("soak: logs kept in %s\n", into.c_str());
}

TEST(SoakTest, WorkersKilledAndHeapdRestartedLeaveNothingBehind) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const absl::Duration duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  const double kill_interval = absl::GetFlag(FLAGS_kill_interval_s);
  const double restart_at = absl::GetFlag(FLAGS_restart_at);
  const int restarts_wanted = restart_at < 0 ? 0 : absl::GetFlag(FLAGS_restarts);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  ASSERT_GE(workers, 2);
  ASSERT_LE(workers, 64);
  std::printf(
      "soak: %d workers, %s, kills every %.1f s on average, %d restart(s) from %.0f%%, "
      "seed %" PRIu64 "%s\n",
      workers, absl::FormatDuration(duration).c_str(), kill_interval, restarts_wanted,
      restart_at * 100, seed, absl::GetFlag(FLAGS_fixed_address) ? ", a fixed-address heap" : "");
  std::mt19937_64 rng(seed);

  // Contents that do not roll back (see --state_parent).
  TestDaemon daemon({"--working_images=false"}, absl::GetFlag(FLAGS_state_parent));
  daemon.Start();
  struct KeepOnFailure {
    const TestDaemon& daemon;
    ~KeepOnFailure() {
      if (::testing::Test::HasFailure()) KeepArtifacts(daemon);
    }
  } keep_on_failure{daemon};
  const std::string logs = daemon.dir().Sub("logs");
  mkdir(logs.c_str(), 0755);
  const std::string control_path = daemon.dir().Sub("control");
  SoakControl* control = MapSoakControl(control_path, /*create=*/true);
  ASSERT_NE(control, nullptr);
  const std::string worker = Runfile("tests/soak_worker");
  {
    std::vector<std::string> argv = {worker, daemon.socket(), kHeap, "setup",
                                     std::to_string(workers)};
    if (absl::GetFlag(FLAGS_fixed_address)) argv.push_back("fixed");
    const ChildResult setup = RunChild(argv);
    ASSERT_TRUE(setup.Exited(0)) << setup.output << daemon.Log();
  }

  std::vector<Incarnation> running(workers);
  std::vector<int> incarnations(workers, 0);
  int restarts = 0;
  auto start = [&](int slot) {
    Incarnation& inc = running[slot];
    inc.log = absl::StrCat(logs, "/worker-", slot, "-", ++incarnations[slot], ".log");
    inc.restarts_before = restarts;
    inc.child = std::make_unique<Child>(
        std::vector<std::string>{worker, daemon.socket(), kHeap, "run", std::to_string(slot),
                                 control_path, inc.log, std::to_string(rng() | 1)});
  };
  for (int slot = 0; slot < workers; ++slot) start(slot);
  auto fail_with = [&](int slot, const std::string& why, const std::string& output) {
    ADD_FAILURE() << "worker " << slot << " " << why << ":\n"
                  << output << "\nits log:\n"
                  << Tail(ReadFile(running[slot].log), 20000) << "\nheapd's log:\n"
                  << Tail(daemon.Log(), 20000);
  };

  const absl::Time begin = absl::Now();
  const absl::Time end = begin + duration;
  // Restart i at restart_at + i * (0.9 - restart_at) / restarts of the run.
  auto restart_time = [&](int i) {
    if (i >= restarts_wanted) return absl::InfiniteFuture();
    return begin + duration * (restart_at + i * (0.9 - restart_at) / restarts_wanted);
  };
  auto next_kill_after = [&](absl::Time now) {
    if (kill_interval <= 0) return absl::InfiniteFuture();
    std::uniform_real_distribution<double> spread(0.5, 1.5);
    return now + absl::Seconds(kill_interval * spread(rng));
  };
  absl::Time next_kill = next_kill_after(begin);
  uint64_t peak_rss_kib = 0;
  int kills = 0;
  absl::Duration restart_took;
  while (absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(50));
    for (int slot = 0; slot < workers; ++slot) {
      if (HasExited(*running[slot].child)) {
        const ChildResult result = running[slot].child->Wait();
        fail_with(slot, "exited during the run", result.output);
        return;
      }
    }
    absl::Time now = absl::Now();
    if (now >= restart_time(restarts)) {
      control->daemon_generation.fetch_add(1);  // odd: restarting
      peak_rss_kib = std::max(peak_rss_kib, PeakRssKib(daemon.pid()));
      const absl::Time stop_begin = absl::Now();
      const int status = daemon.Stop();
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "heapd's wait status after SIGTERM: " << status << "\n"
          << Tail(daemon.Log(), 20000);
      daemon.Start();
      restart_took = std::max(restart_took, absl::Now() - stop_begin);
      control->daemon_generation.fetch_add(1);  // even: serving again
      ++restarts;
      std::printf("soak: heapd restarted at %s (took %s)\n",
                  absl::FormatDuration(absl::Now() - begin).c_str(),
                  absl::FormatDuration(absl::Now() - stop_begin).c_str());
      now = absl::Now();
      next_kill = std::max(next_kill, now + absl::Seconds(2));
    }
    if (now >= next_kill && now < end - absl::Seconds(1) &&
        now < restart_time(restarts) - absl::Seconds(1)) {
      const int slot = static_cast<int>(rng() % workers);
      running[slot].child->Kill(SIGKILL);
      const ChildResult result = running[slot].child->Wait();
      if (!result.KilledBy(SIGKILL)) {
        fail_with(slot, "ended before its SIGKILL", result.output);
        return;
      }
      ++kills;
      start(slot);
      next_kill = next_kill_after(now);
    }
  }

  // Drain: every worker frees what it owns and detaches.
  const absl::Time drain_begin = absl::Now();
  control->phase.store(SoakControl::kDrain);
  const absl::Time drain_deadline =
      drain_begin + absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  uint64_t stale_ok = 0, recoveries = 0;
  for (int slot = 0; slot < workers; ++slot) {
    Incarnation& inc = running[slot];
    while (!HasExited(*inc.child) && absl::Now() < drain_deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (!HasExited(*inc.child)) {
      fail_with(slot, "did not drain in time", inc.child->output());
      return;
    }
    const ChildResult result = inc.child->Wait();
    if (!result.Exited(0) || !absl::StrContains(result.output, "drained")) {
      fail_with(slot, "failed", result.output);
      return;
    }
    std::map<std::string, uint64_t> f = Fields(result.output, "drained");
    // A worker lost its session exactly once per restart it lived through.
    EXPECT_EQ(f["session_losses"], static_cast<uint64_t>(restarts - inc.restarts_before))
        << "worker " << slot << ": " << result.output << ReadFile(inc.log);
    stale_ok += f["stale_detaches_ok"];
    recoveries += f["recoveries"];
  }
  const absl::Duration drain_took = absl::Now() - drain_begin;
  peak_rss_kib = std::max(peak_rss_kib, PeakRssKib(daemon.pid()));

  // The finisher resolves what is in doubt and frees the shared structures.
  const absl::Time finish_begin = absl::Now();
  const ChildResult finished = RunChild({worker, daemon.socket(), kHeap, "finish"});
  const absl::Duration finish_took = absl::Now() - finish_begin;
  EXPECT_TRUE(finished.Exited(0)) << finished.output << Tail(daemon.Log(), 20000);
  std::map<std::string, uint64_t> totals = Fields(finished.output, "finished");

  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::HeapStats> stats = StatHeap(**client, kHeap);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->info().live_objects(), 0u);
  EXPECT_EQ(stats->info().allocated_bytes(), 0u);
  EXPECT_EQ(stats->large_objects(), 0u);
  EXPECT_EQ(stats->leased_chunks(), 0u);
  EXPECT_EQ(stats->info().names(), 0u);
  EXPECT_EQ(stats->info().clients(), 0u);
  EXPECT_EQ(stats->clients_size(), 0);

  // heapd rejected no free and logged no error.
  const std::string log = daemon.Log();
  std::vector<std::string> warnings;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "rejected") || absl::StrContains(line, " error ") ||
        absl::StrContains(line, " critical ")) {
      ADD_FAILURE() << "heapd: " << line;
    }
    if (absl::StrContains(line, " warning ")) warnings.emplace_back(line);
  }
  for (const std::string& w : warnings) std::printf("soak: heapd warned: %s\n", w.c_str());

  std::printf("soak: %d workers for %s (seed %" PRIu64
              "): %d kills, %d heapd restart(s) (longest %s), "
              "%" PRIu64 " worker processes\n",
              workers, absl::FormatDuration(duration).c_str(), seed, kills, restarts,
              absl::FormatDuration(restart_took).c_str(), totals["incarnations"]);
  std::printf("soak: %s\n", finished.output.c_str());
  std::printf("soak: errors the workers expected %" PRIu64 " (sessions ended by a restart: %" PRIu64
              " lost), unexpected 0; stale detaches that succeeded %" PRIu64
              "; journal recoveries by the last processes %" PRIu64 "; objects verified %" PRIu64
              " (%" PRIu64 " MiB)\n",
              totals["expected_errors"], totals["session_losses"], stale_ok, recoveries,
              totals["verified_objects"], totals["verified_bytes"] >> 20);
  std::printf("soak: final stats: live_objects=%" PRIu64 " allocated_bytes=%" PRIu64
              " large_objects=%" PRIu64 " leased_chunks=%u names=%u clients=%u capacity=%" PRIu64
              " MiB epoch=%" PRIu64 "\n",
              stats->info().live_objects(), stats->info().allocated_bytes(), stats->large_objects(),
              stats->leased_chunks(), stats->info().names(), stats->info().clients(),
              stats->info().capacity_bytes() >> 20, stats->info().epoch());
  std::printf("soak: drain %s, finish %s, heapd peak RSS %" PRIu64 " MiB\n",
              absl::FormatDuration(drain_took).c_str(), absl::FormatDuration(finish_took).c_str(),
              peak_rss_kib >> 10);
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
