// Linked into every binary of --config=tsan (.bazelrc, --custom_malloc):
// makes Debian's absl::Mutex and absl::CondVar visible to ThreadSanitizer
// where heapd uses them.
//
// Why: libabsl is Debian's, built with gcc and without -fsanitize=thread, so
// the annotations absl's mutex.cc carries for ThreadSanitizer are compiled
// out and TSan sees no lock, unlock or wait: every handoff of data through
// an absl::Mutex in heapd would be reported as a data race. TSan's
// interceptors do not help: absl blocks on a futex through syscall(2),
// which TSan does not interpret.
//
// How: the executable defines the Mutex and CondVar member functions that
// lock, unlock or wait. Definitions in the executable take precedence over
// libabsl_synchronization.so for every caller in the process (heapd's code,
// and libabsl's own calls, which go through the PLT; the binary is linked
// with -rdynamic so that they are exported). Each one tells TSan what it
// does with the __tsan_mutex_* calls absl's own instrumented build makes,
// around the real function: libabsl's definition of the same symbol, whose
// name is read back from the definition here (no mangled name is written
// by hand). A start-up check stops the process if the definitions here do
// not interpose. Condition functions that absl evaluates inside a lock or
// unlock run inside the pre/post pair, where TSan ignores accesses; an
// Await or a CondVar wait is an unlock followed by a lock.
//
// gRPC uses absl::Mutex too: its locks, annotated the same way, give TSan
// the happens-before edges of gRPC's handoffs that go through a mutex (a
// call from the thread that accepted a connection to the thread that
// serves it), without which every handler's first touch of data the main
// thread made would be reported.
//
// The suppressions (tsan_suppressions.txt, compiled in as
// __tsan_default_suppressions) are for reports inside the system libraries
// only.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace {

// The real function behind one of the definitions below: libabsl's
// definition of the same symbol. The symbol's name is read back from the
// definition here (`ours`, any address inside it; the executable exports
// it, -rdynamic), so no mangled name is written by hand and none can go
// stale when absl changes. Fails loudly, naming the function, if the name
// cannot be read or libabsl does not define it.
template <typename F>
F NextDefinition(const void* ours, const char* what) {
  Dl_info info;
  if (dladdr(ours, &info) == 0 || info.dli_sname == nullptr) {
    std::fprintf(stderr,
                 "tsan absl annotations: no exported symbol for %s (is the executable linked "
                 "with -rdynamic?)\n",
                 what);
    std::abort();
  }
  void* real = dlsym(RTLD_NEXT, info.dli_sname);
  if (real == nullptr) {
    std::fprintf(stderr, "tsan absl annotations: %s (%s) is not in libabsl: %s\n", what,
                 info.dli_sname, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(real);
}

// The code address of a non-virtual member function: the Itanium C++ ABI
// represents a pointer to one as {address, this-adjustment}.
template <typename MemberFn>
const void* CodeOf(MemberFn member) {
  static_assert(sizeof(member) == 2 * sizeof(void*), "not an Itanium pointer to member");
  const void* code;
  std::memcpy(&code, &member, sizeof(code));
  return code;
}

// An address inside the function that calls it (for the destructor, whose
// address cannot be taken).
__attribute__((noinline)) const void* AddressInCaller() { return __builtin_return_address(0); }

// gRPC destroys objects holding mutexes after handing them between its
// threads through reference counts and queues TSan cannot see: a destroy
// annotation (a write of the mutex's memory) would be reported against
// the last lock in another thread. Those destroys are left out; heapd's
// are annotated (a mutex destroyed while in use is a bug TSan finds).
bool CalledFromGrpc(const void* caller) {
  Dl_info info;
  if (dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* base = std::strrchr(info.dli_fname, '/');
  base = base != nullptr ? base + 1 : info.dli_fname;
  return std::strncmp(base, "libgrpc", 7) == 0 || std::strncmp(base, "libgpr.", 7) == 0;
}

void PreLock(const void* m, unsigned flags) { __tsan_mutex_pre_lock(const_cast<void*>(m), flags); }
void PostLock(const void* m, unsigned flags) {
  __tsan_mutex_post_lock(const_cast<void*>(m), flags, 0);
}
void PreUnlock(const void* m, unsigned flags) {
  __tsan_mutex_pre_unlock(const_cast<void*>(m), flags);
}
void PostUnlock(const void* m, unsigned flags) {
  __tsan_mutex_post_unlock(const_cast<void*>(m), flags);
}

// Member functions are called through these types, taking `this` first
// (the Itanium C++ ABI).
using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Time;
using LockFn = void (*)(Mutex*);
using TryLockFn = bool (*)(Mutex*);
using LockWhenFn = void (*)(Mutex*, const Condition&);
using LockWhenUntilFn = bool (*)(Mutex*, const Condition&, Time);
using WaitFn = void (*)(CondVar*, Mutex*);
using WaitUntilFn = bool (*)(CondVar*, Mutex*, Time);

// The ...WithTimeout forms are their ...WithDeadline forms at
// Now() + timeout, as in absl (whose ...WithTimeout calls ...WithDeadline
// through the PLT: wrapping both would annotate twice).
bool LockWhenUntil(Mutex* mu, const Condition& cond, Time deadline, unsigned flags) {
  static const auto exclusive = NextDefinition<LockWhenUntilFn>(
      CodeOf(&Mutex::LockWhenWithDeadline), "absl::Mutex::LockWhenWithDeadline");
  static const auto reader = NextDefinition<LockWhenUntilFn>(
      CodeOf(&Mutex::ReaderLockWhenWithDeadline), "absl::Mutex::ReaderLockWhenWithDeadline");
  PreLock(mu, flags);
  // Returns holding the mutex whether or not the condition became true.
  const bool met = (flags & __tsan_mutex_read_lock ? reader : exclusive)(mu, cond, deadline);
  PostLock(mu, flags);
  return met;
}

// An Await may release the mutex and take it again: to TSan an unlock,
// then a lock (exclusive: heapd never awaits holding a reader lock).
bool AwaitUntil(Mutex* mu, const Condition& cond, Time deadline) {
  static const auto real = NextDefinition<LockWhenUntilFn>(CodeOf(&Mutex::AwaitWithDeadline),
                                                           "absl::Mutex::AwaitWithDeadline");
  PreUnlock(mu, 0);
  const bool met = real(mu, cond, deadline);
  PostUnlock(mu, 0);
  PreLock(mu, 0);
  PostLock(mu, 0);
  return met;
}

// A wait releases `mu` and takes it again before returning.
bool WaitUntil(CondVar* cv, Mutex* mu, Time deadline) {
  static const auto real = NextDefinition<WaitUntilFn>(CodeOf(&CondVar::WaitWithDeadline),
                                                       "absl::CondVar::WaitWithDeadline");
  PreUnlock(mu, 0);
  const bool timed_out = real(cv, mu, deadline);
  PostUnlock(mu, 0);
  PreLock(mu, 0);
  PostLock(mu, 0);
  return timed_out;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// Exempt from -Wthread-safety: each one does to the mutex what its
// declaration says, through the real function.

Mutex::~Mutex() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = NextDefinition<LockFn>(AddressInCaller(), "absl::Mutex::~Mutex");
  if (!CalledFromGrpc(__builtin_return_address(0))) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = NextDefinition<LockFn>(CodeOf(&Mutex::Lock), "absl::Mutex::Lock");
  PreLock(this, 0);
  real(this);
  PostLock(this, 0);
}

void Mutex::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      NextDefinition<LockFn>(CodeOf(&Mutex::ReaderLock), "absl::Mutex::ReaderLock");
  PreLock(this, __tsan_mutex_read_lock);
  real(this);
  PostLock(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      NextDefinition<TryLockFn>(CodeOf(&Mutex::TryLock), "absl::Mutex::TryLock");
  PreLock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  PostLock(this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed));
  return locked;
}

bool Mutex::ReaderTryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      NextDefinition<TryLockFn>(CodeOf(&Mutex::ReaderTryLock), "absl::Mutex::ReaderTryLock");
  const unsigned flags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  PreLock(this, flags);
  const bool locked = real(this);
  PostLock(this, flags | (locked ? 0 : __tsan_mutex_try_lock_failed));
  return locked;
}

void Mutex::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = NextDefinition<LockFn>(CodeOf(&Mutex::Unlock), "absl::Mutex::Unlock");
  PreUnlock(this, 0);
  real(this);
  PostUnlock(this, 0);
}

// Out of line in libabsl: its call of Unlock goes through the PLT, here,
// but a future absl could inline it.
void ReleasableMutexLock::Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto unlock = NextDefinition<LockFn>(CodeOf(&Mutex::Unlock), "absl::Mutex::Unlock");
  PreUnlock(mu_, 0);
  unlock(mu_);
  PostUnlock(mu_, 0);
  mu_ = nullptr;
}

void Mutex::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      NextDefinition<LockFn>(CodeOf(&Mutex::ReaderUnlock), "absl::Mutex::ReaderUnlock");
  PreUnlock(this, __tsan_mutex_read_lock);
  real(this);
  PostUnlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      NextDefinition<LockWhenFn>(CodeOf(&Mutex::LockWhen), "absl::Mutex::LockWhen");
  PreLock(this, 0);
  real(this, cond);
  PostLock(this, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real =
      NextDefinition<LockWhenFn>(CodeOf(&Mutex::ReaderLockWhen), "absl::Mutex::ReaderLockWhen");
  PreLock(this, __tsan_mutex_read_lock);
  real(this, cond);
  PostLock(this, __tsan_mutex_read_lock);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond,
                                 Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return LockWhenUntil(this, cond, deadline, 0);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond,
                                Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return LockWhenUntil(this, cond, Now() + timeout, 0);
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond,
                                       Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return LockWhenUntil(this, cond, deadline, __tsan_mutex_read_lock);
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond,
                                      Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return LockWhenUntil(this, cond, Now() + timeout, __tsan_mutex_read_lock);
}

void Mutex::Await(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AwaitUntil(this, cond, InfiniteFuture());
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return AwaitUntil(this, cond, deadline);
}

bool Mutex::AwaitWithTimeout(const Condition& cond,
                             Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return AwaitUntil(this, cond, Now() + timeout);
}

void CondVar::Wait(Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  WaitUntil(this, mu, InfiniteFuture());
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return WaitUntil(this, mu, deadline);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return WaitUntil(this, mu, Now() + timeout);
}

ABSL_NAMESPACE_END
}  // namespace absl

namespace {

// Before main: the process's callers of absl::Mutex (libabsl's own, gRPC's,
// heapd's) must bind to the definitions above, else TSan sees none of their
// locks and reports races that are not. Fails loudly instead.
__attribute__((constructor)) void CheckTheDefinitionsInterpose() {
  const void* ours = CodeOf(&absl::Mutex::Lock);
  Dl_info info;
  if (dladdr(ours, &info) == 0 || info.dli_sname == nullptr ||
      dlsym(RTLD_DEFAULT, info.dli_sname) != ours) {
    std::fprintf(stderr,
                 "tsan absl annotations: absl::Mutex::Lock of this executable is not the one "
                 "the process calls (not exported with -rdynamic, or libabsl's comes first)\n");
    std::abort();
  }
}

}  // namespace
