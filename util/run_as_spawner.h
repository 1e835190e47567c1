// The spawner: where RunAs helpers come from (util/run_as.h).
//
// A helper must start clean: not a fork of the multi-threaded daemon,
// whose locks another thread may hold. Executing the program afresh for
// each helper costs ~18 ms (the dynamic loader binding ~80 libraries), so
// the program is executed once, as the spawner: a single-threaded copy of
// itself, from the descriptor of the running executable, that holds none of
// the daemon's state or descriptors and only forks helpers on request
// (~0.3 ms each). A fork of a single-threaded process is safe: a helper may
// lock, log and start threads.
//
// heapd talks to its spawner over a SOCK_SEQPACKET pair. Each request
// lends the helper's channel and a status socket; the spawner answers on
// the status socket with the helper's pidfd (heapd kills through it), then,
// once it reaped the helper, its wait status. The spawner is started on
// first use (or before: StartSpawner, which heapd calls as it starts), and
// again if it died; it dies with the process that started
// it (its parent-death signal, from a thread that lives as long as that
// process; and the end of its control socket), and its helpers die with it.
#ifndef HEAPD_UTIL_RUN_AS_SPAWNER_H_
#define HEAPD_UTIL_RUN_AS_SPAWNER_H_

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "util/unique_fd.h"

namespace heapd {
namespace run_as_internal {

// A helper the spawner forked.
struct SpawnedHelper {
  UniqueFd pidfd;   // to kill it
  UniqueFd status;  // where its wait status arrives once it is reaped
};

// Has this process's spawner fork a helper whose channel is `channel`.
// `what` names the operation in errors.
absl::StatusOr<SpawnedHelper> SpawnHelper(int channel, absl::string_view what);

// Starts this process's spawner if it is not running; `what` names the
// operation in errors.
absl::Status StartSpawner(absl::string_view what);

// Sends the helper SIGKILL (nothing if it is gone).
void KillHelper(const SpawnedHelper& helper);

// True once `helper` exited, before `until`.
bool HelperExited(const SpawnedHelper& helper, absl::Time until);
// The wait status (waitpid's) of `helper`, which exited, once the spawner
// reaped it; UNAVAILABLE if the spawner died or did not report it in time.
absl::StatusOr<int> ReapedStatus(const SpawnedHelper& helper, absl::string_view what);

// The running executable: opened by main() through StartedAsRunAsHelper.
// False if the executable cannot be opened.
bool OpenExecutable();
bool ExecutableOpened();

// True if argv asks for the spawner; then RunSpawner().
bool IsSpawnerInvocation(int argc, char** argv);
// The spawner's whole life: each helper it forks runs `helper_main(spawner
// pid)` and exits with what it returns.
[[noreturn]] void RunSpawner(int (*helper_main)(pid_t spawner));

}  // namespace run_as_internal
}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_AS_SPAWNER_H_
