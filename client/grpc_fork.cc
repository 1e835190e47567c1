#include "client/grpc_fork.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <atomic>
#include <initializer_list>

#include "grpc/fork.h"
#include "grpc/grpc.h"

namespace heapd {
namespace {

constexpr char kForkSupport[] = "GRPC_ENABLE_FORK_SUPPORT";
constexpr char kOptOut[] = "HEAPD_GRPC_FORK_HANDLERS";

// As gRPC reads its variable: 1, t, true, y or yes (any case) is on.
bool IsOn(const char* setting) {
  for (const char* on : {"1", "t", "true", "y", "yes"}) {
    if (strcasecmp(setting, on) == 0) return true;
  }
  return false;
}

// Runs as libheapd loads (before the program's main, or at its dlopen,
// such as Python's import), so before any channel. True if gRPC's fork
// support is on in this process, unless the program opted out.
bool ForkSupportOn() {
  const char* opt_out = getenv(kOptOut);
  if (opt_out != nullptr && strcmp(opt_out, "0") == 0) return false;
  // Set already (often exported for Python's grpcio, whose gRPC is its own
  // copy): gRPC reads it, or has read it, as it is.
  if (const char* setting = getenv(kForkSupport); setting != nullptr) return IsOn(setting);
  if (setenv(kForkSupport, "1", /*overwrite=*/0) != 0) return false;
  // Any gRPC call starts gRPC's process-wide setup, which reads the
  // variable; nonzero means gRPC was running already, without it.
  const bool started_before = grpc_is_initialized() != 0;
  unsetenv(kForkSupport);  // not for the programs this process runs
  return !started_before;
}

const bool fork_support_on = ForkSupportOn();

// gRPC's handlers share unguarded state (whether the prepare step ran):
// two threads forking at once could leave gRPC blocked for good in the
// parent. One fork at a time passes through them.
pthread_mutex_t one_fork_at_a_time = PTHREAD_MUTEX_INITIALIZER;

void BeforeFork() {
  pthread_mutex_lock(&one_fork_at_a_time);
  grpc_prefork();
}
void AfterForkInParent() {
  grpc_postfork_parent();
  pthread_mutex_unlock(&one_fork_at_a_time);
}
void AfterForkInChild() {
  grpc_postfork_child();
  // The child's only thread is not the one that locked it.
  pthread_mutex_init(&one_fork_at_a_time, nullptr);
}

// No lock and no function-local static: a fork while another thread
// registers must leave the child nothing half done to wait on.
std::atomic<bool> handlers_registered{false};

}  // namespace

void RegisterGrpcForkHandlers() {
  if (!fork_support_on || handlers_registered.exchange(true)) return;
  // Fails only without memory for the entry: the next connection tries again.
  if (pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild) != 0) {
    handlers_registered = false;
  }
}

}  // namespace heapd
