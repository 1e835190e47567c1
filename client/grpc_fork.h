// gRPC across fork(): what lets a forked child talk to heapd itself.
//
// gRPC runs background threads that take its locks at any moment. A child
// forked while one of them held a lock found it held for ever, and the
// child's own attach (a new channel) hung on it; its calls never reached
// their deadlines either (timer threads are not copied by fork()). gRPC's
// fork support stops those threads before fork() and starts them again
// after it, in the parent and in the child. gRPC reads
// GRPC_ENABLE_FORK_SUPPORT once, as it starts, and leaves registering its
// handlers to the program. Limits and costs: docs/api.md, "fork() and
// gRPC".
#ifndef HEAPD_CLIENT_GRPC_FORK_H_
#define HEAPD_CLIENT_GRPC_FORK_H_

namespace heapd {

// Registers gRPC's fork handlers, once per process, if gRPC's fork support
// is on (libheapd turns it on as it loads, unless GRPC_ENABLE_FORK_SUPPORT
// is set; HEAPD_GRPC_FORK_HANDLERS=0 opts out, for a program that runs
// gRPC's handlers itself: run twice they deadlock). Called before each new
// channel: a process with no channel has no gRPC thread to stop. Handlers
// registered late run first at a fork, before ones a program or a
// sanitizer registered as it started (ASan's lock its allocator, which the
// stopping gRPC threads still need).
void RegisterGrpcForkHandlers();

}  // namespace heapd

#endif  // HEAPD_CLIENT_GRPC_FORK_H_
