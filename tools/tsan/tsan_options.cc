// Default ThreadSanitizer options of every --config=tsan binary (the test's
// TSAN_OPTIONS, from .bazelrc, add to them): heapd and the workers the
// tests start get them too.
extern "C" const char* __tsan_default_options() {
  // halt_on_error: the first report fails the process, so a test fails.
  // second_deadlock_stack: both stacks of a lock-order inversion.
  // handle_segv=0: the client maps a heap's growth from its own SIGSEGV
  // handler (client/growth_fault_handler.h); TSan's would report the first
  // touch as a crash. A real SIGSEGV still kills the process.
  // die_after_fork=0: a forked child of a client starts gRPC's threads
  // again (gRPC's fork support, client/grpc_fork.cc); TSan would kill any
  // child of a multi-threaded process that starts a thread.
  return "halt_on_error=1:second_deadlock_stack=1:handle_segv=0:die_after_fork=0";
}
