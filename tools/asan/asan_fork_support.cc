// Linked into every binary of --config=asan (and --config=fuzz) through
// --custom_malloc (.bazelrc): makes fork() safe for a child that allocates.
//
// Why: heapd forks short-lived children from its multi-threaded process
// (util/run_as.h) and the children allocate, which is safe with glibc's
// malloc (fork takes its locks). The ASan runtime of clang 14 does not do
// the same for its own allocator: a child forked while another thread held
// one of its size-class locks waits on it forever (seen in
// //tests:hostile_user_test, a snapshot child stuck in
// SizeClassAllocator64::GetFromAllocator). Later LLVM releases lock the
// allocator and the stack depot around fork themselves (asan_posix.cpp,
// InstallAtForkHandler); this does the same with the runtime's functions
// that clang 14 already has.
#include <pthread.h>

namespace __asan {
void asan_mz_force_lock();  // the allocator and its fallback lock
void asan_mz_force_unlock();
}  // namespace __asan
namespace __sanitizer {
void StackDepotLockAll();  // where allocation stacks are recorded
void StackDepotUnlockAll();
}  // namespace __sanitizer

namespace {

void BeforeFork() {
  __asan::asan_mz_force_lock();
  __sanitizer::StackDepotLockAll();
}

void AfterFork() {
  __sanitizer::StackDepotUnlockAll();
  __asan::asan_mz_force_unlock();
}

__attribute__((constructor)) void InstallForkHandlers() {
  pthread_atfork(BeforeFork, AfterFork, AfterFork);
}

}  // namespace
