// RunAs: work done with a local user's rights, not root's.
//
// heapd runs as root, and a path that a user names (a snapshot directory on
// the parallel file system, say) is under that user's control: any
// component may be swapped for a symlink between a check and a use. So heapd
// never resolves such a path itself. It spawns a short-lived helper process,
// which switches to the user's uid, gid and supplementary groups and does
// the work: the kernel then grants exactly what the user could do
// (symlinks, permissions, sticky directories, ACLs, quotas) and nothing
// more. The helper sends back bytes and file descriptors over a socket; the
// parent trusts neither beyond what it checks itself (an fd's type and
// size, every byte parsed with bounds).
//
// The helper is never a fork of the multi-threaded daemon (whose locks
// another thread may have held): this very program, executed once from a
// descriptor of the running executable opened at start, is a
// single-threaded spawner that forks each helper (util/run_as_spawner.h).
// So a job may log, lock and use any library, and an upgraded package can
// never put a helper of another version behind a running heapd. Every
// program that calls RunAs starts its main() with
//
//   if (StartedAsRunAsHelper(argc, argv)) return RunAsHelperMain();
//
// (RunAs refuses to run in a program that did not). What a helper may do is
// a job: a function registered by name (HEAPD_RUN_AS_JOB) that reads its
// arguments from bytes (util/run_as_args.h) and descriptors lent to it.
//
// The helper gets only those descriptors besides 0-2 (the daemon's others
// are never inherited), and takes them only once it is the user and not
// dumpable (and refuses a tracer attached meanwhile), so the user can
// neither trace it nor reach the daemon's files through it; the user can
// only kill it, which fails the operation. It starts with its signals at
// their defaults (then ignores SIGPIPE and SIGXFSZ: errors, not deaths) in
// "/". heapd kills it through a pidfd; the spawner reaps it and reports its
// exit. If heapd dies the helper dies too: the spawner dies with heapd, and
// the helper with the spawner (parent-death signals), and a watchdog
// thread ends it when heapd's end of its socket closes.
#ifndef HEAPD_UTIL_RUN_AS_H_
#define HEAPD_UTIL_RUN_AS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "util/run_as_args.h"
#include "util/unique_fd.h"

namespace heapd {

// Who a helper acts as: exactly these ids and supplementary groups.
struct Credentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
};

// One message from a job: bytes and at most one descriptor.
struct ChildMessage {
  std::string bytes;
  UniqueFd fd;
};

// Where a job sends what it found: bytes and, with them, at most one fd
// (the sink takes a copy of it; the sender keeps its own).
class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual absl::Status Send(absl::string_view bytes, int fd = -1) = 0;
};

// Collects messages in this process: a job run without a helper.
class MessageList final : public MessageSink {
 public:
  absl::Status Send(absl::string_view bytes, int fd = -1) override;
  std::vector<ChildMessage>& messages() { return messages_; }

 private:
  std::vector<ChildMessage> messages_;
};

// What a job gets: the directory it works in (-1: none), the descriptors
// lent to it, in the order given, and its arguments. The job does not own
// them.
struct JobInput {
  int dir = -1;
  std::vector<int> fds;
  ArgsReader args;
};

// A job: registered once per program under a unique name.
struct RunAsJob {
  const char* name;
  absl::Status (*run)(JobInput& input, MessageSink& out);
};

// What a job returns when its arguments do not read back as its caller
// wrote them (a bug: both sides are this program).
inline absl::Status MalformedJobArgs() { return absl::InternalError("malformed job arguments"); }

// Registers `job` (at static initialization); returns it.
RunAsJob RegisterRunAsJob(const RunAsJob& job);

// Defines `variable`, a RunAsJob registered as `name`, run by `function`.
#define HEAPD_RUN_AS_JOB(variable, name, function) \
  const ::heapd::RunAsJob variable = ::heapd::RegisterRunAsJob({name, function})

// A job and what it is given.
struct RunAsRequest {
  const RunAsJob* job = nullptr;
  std::string args;      // an ArgsWriter's bytes
  std::vector<int> fds;  // lent to the helper for the call
  // Non-empty: the directory the job works in, opened by the helper with
  // the user's rights (no magic links: /proc/self/fd/N leads nowhere), and
  // refused if it is or lies beneath any of `forbidden` (heapd's own
  // directories, as (device, inode)).
  std::string dir;
  std::vector<std::pair<dev_t, ino_t>> forbidden;
};

struct RunAsOptions {
  // The helper is killed at this deadline: DEADLINE_EXCEEDED.
  absl::Duration timeout = absl::Minutes(10);
  // When this descriptor becomes readable (the daemon is stopping), the
  // helper is killed: UNAVAILABLE. -1: none.
  int cancel_fd = -1;
  // Asked every 100 ms; when it returns true (the caller went away), the
  // helper is killed: CANCELLED. Empty: never.
  std::function<bool()> cancelled;
  // Bytes received by all RunAs calls sharing this budget, and its limit:
  // a call that would pass it fails with RESOURCE_EXHAUSTED (heapd-wide
  // memory bound). Null: none.
  struct Budget {
    std::atomic<uint64_t> used{0};
    uint64_t limit = 0;
  };
  Budget* budget = nullptr;
  // Total bytes the helper may send; beyond them it is killed:
  // RESOURCE_EXHAUSTED.
  uint64_t max_reply_bytes = uint64_t{64} << 20;
  // Names the operation in errors ("create snapshot /x/y").
  std::string what;
};

// Runs `request` in a helper process with credentials `who`. Returns what
// the job sent, or the status it returned (its code and message), or an
// error if the helper died, timed out or was cancelled.
absl::StatusOr<std::vector<ChildMessage>> RunAs(const Credentials& who, const RunAsRequest& request,
                                                const RunAsOptions& options);

// Runs `job` here, in this process, working in `dir`.
absl::StatusOr<std::vector<ChildMessage>> RunJobHere(const RunAsJob& job, int dir,
                                                     const std::vector<int>& fds,
                                                     absl::string_view args);

// Starts the process that forks RunAs's helpers now rather than in the
// first RunAs call, which then does not wait the ~6-20 ms it takes to
// execute (heapd calls this at start). Later calls restart it if it died.
absl::Status StartRunAsSpawner();

// For main(), first thing: true if this process was started as RunAs's
// spawner (then return RunAsHelperMain()). Otherwise opens the running
// executable for later RunAs calls and returns false.
bool StartedAsRunAsHelper(int argc, char** argv);
// The spawner's whole life: forks a helper for each request (which
// receives its request, becomes the user, runs the job, sends its result
// and exits). Never returns.
int RunAsHelperMain();

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_AS_H_
