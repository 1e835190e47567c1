// gRPC across fork(): what lets a forked child talk to heapd itself.
//
// gRPC runs background threads that take its locks at any moment. A child
// forked while one of them held a lock found it held for ever, and the
// child's own attach (a new channel) hung on it. gRPC's fork support stops
// those threads before fork() and starts them again after it, in the
// parent and in the child. gRPC reads GRPC_ENABLE_FORK_SUPPORT once, as it
// starts, and leaves registering its handlers to the program.
//
// So as libheapd loads (before the program's main, or at its dlopen, such
// as Python's import), before any channel, it turns fork support on for
// this process and registers gRPC's handlers. Not when the program set
// GRPC_ENABLE_FORK_SUPPORT itself: its forks are then its own business
// (gRPC's handlers run twice would deadlock). Limits and costs:
// docs/api.md, "fork() and gRPC".
#include <pthread.h>
#include <stdlib.h>

#include "grpc/fork.h"
#include "grpc/grpc.h"

namespace heapd {
namespace {

constexpr char kForkSupport[] = "GRPC_ENABLE_FORK_SUPPORT";

bool RegisterGrpcForkHandlers() {
  if (getenv(kForkSupport) != nullptr) return false;  // the program's choice
  if (setenv(kForkSupport, "1", /*overwrite=*/0) != 0) return false;
  // Any gRPC call starts gRPC's process-wide setup, which reads the
  // variable; nonzero means gRPC was running already, without it.
  const bool started_before = grpc_is_initialized() != 0;
  unsetenv(kForkSupport);  // not for the programs this process runs
  if (started_before) return false;
  return pthread_atfork(grpc_prefork, grpc_postfork_parent, grpc_postfork_child) == 0;
}

[[maybe_unused]] const bool registered = RegisterGrpcForkHandlers();

}  // namespace
}  // namespace heapd
