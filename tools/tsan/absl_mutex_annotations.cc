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
// around the real function, found with dlsym(RTLD_NEXT). Condition
// functions that absl evaluates inside a lock or unlock run inside the
// pre/post pair, where TSan ignores accesses; an Await or a CondVar wait is
// an unlock followed by a lock.
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
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace {

#define HEAPD_STR2(x) #x
#define HEAPD_STR(x) HEAPD_STR2(x)

// The mangled name of absl::<inline namespace>::<rest>, e.g.
// Mangled("5Mutex4LockEv") for absl::Mutex::Lock().
std::string Mangled(const char* rest) {
  const char* ns = HEAPD_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string("_ZN4absl") + std::to_string(std::strlen(ns)) + ns + rest;
}

template <typename F>
F Real(const char* rest) {
  void* f = dlsym(RTLD_NEXT, Mangled(rest).c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan absl annotations: %s not found: %s\n", Mangled(rest).c_str(),
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

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
  static const auto exclusive =
      Real<LockWhenUntilFn>("5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  static const auto reader =
      Real<LockWhenUntilFn>("5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  PreLock(mu, flags);
  // Returns holding the mutex whether or not the condition became true.
  const bool met = (flags & __tsan_mutex_read_lock ? reader : exclusive)(mu, cond, deadline);
  PostLock(mu, flags);
  return met;
}

// An Await may release the mutex and take it again: to TSan an unlock,
// then a lock (exclusive: heapd never awaits holding a reader lock).
bool AwaitUntil(Mutex* mu, const Condition& cond, Time deadline) {
  static const auto real =
      Real<LockWhenUntilFn>("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  PreUnlock(mu, 0);
  const bool met = real(mu, cond, deadline);
  PostUnlock(mu, 0);
  PreLock(mu, 0);
  PostLock(mu, 0);
  return met;
}

// A wait releases `mu` and takes it again before returning.
bool WaitUntil(CondVar* cv, Mutex* mu, Time deadline) {
  static const auto real = Real<WaitUntilFn>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
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
  static const auto real = Real<LockFn>("5MutexD2Ev");
  if (!CalledFromGrpc(__builtin_return_address(0))) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<LockFn>("5Mutex4LockEv");
  PreLock(this, 0);
  real(this);
  PostLock(this, 0);
}

void Mutex::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<LockFn>("5Mutex10ReaderLockEv");
  PreLock(this, __tsan_mutex_read_lock);
  real(this);
  PostLock(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<TryLockFn>("5Mutex7TryLockEv");
  PreLock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  PostLock(this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed));
  return locked;
}

bool Mutex::ReaderTryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<TryLockFn>("5Mutex13ReaderTryLockEv");
  const unsigned flags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  PreLock(this, flags);
  const bool locked = real(this);
  PostLock(this, flags | (locked ? 0 : __tsan_mutex_try_lock_failed));
  return locked;
}

void Mutex::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<LockFn>("5Mutex6UnlockEv");
  PreUnlock(this, 0);
  real(this);
  PostUnlock(this, 0);
}

// Out of line in libabsl: its call of Unlock goes through the PLT, here,
// but a future absl could inline it.
void ReleasableMutexLock::Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto unlock = Real<LockFn>("5Mutex6UnlockEv");
  PreUnlock(mu_, 0);
  unlock(mu_);
  PostUnlock(mu_, 0);
  mu_ = nullptr;
}

void Mutex::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<LockFn>("5Mutex12ReaderUnlockEv");
  PreUnlock(this, __tsan_mutex_read_lock);
  real(this);
  PostUnlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<LockWhenFn>("5Mutex8LockWhenERKNS0_9ConditionE");
  PreLock(this, 0);
  real(this, cond);
  PostLock(this, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static const auto real = Real<LockWhenFn>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
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
