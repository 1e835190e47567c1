#include "client/grpc_fork.h"

#include <pthread.h>
#include <stdlib.h>

#include <atomic>

#include "grpc/fork.h"
#include "grpc/grpc.h"

namespace heapd {
namespace {

constexpr char kForkSupport[] = "GRPC_ENABLE_FORK_SUPPORT";

// Runs as libheapd loads (before the program's main, or at its dlopen,
// such as Python's import), so before any channel.
bool TurnOnGrpcForkSupport() {
  if (getenv(kForkSupport) != nullptr) return false;  // the program's choice
  if (setenv(kForkSupport, "1", /*overwrite=*/0) != 0) return false;
  // Any gRPC call starts gRPC's process-wide setup, which reads the
  // variable; nonzero means gRPC was running already, without it.
  const bool started_before = grpc_is_initialized() != 0;
  unsetenv(kForkSupport);  // not for the programs this process runs
  return !started_before;
}

const bool fork_support_on = TurnOnGrpcForkSupport();

// No lock and no function-local static: a fork while another thread
// registers must leave the child nothing half done to wait on.
std::atomic<bool> handlers_registered{false};

}  // namespace

void RegisterGrpcForkHandlers() {
  if (!fork_support_on || handlers_registered.exchange(true)) return;
  pthread_atfork(grpc_prefork, grpc_postfork_parent, grpc_postfork_child);
}

}  // namespace heapd
