// soak_worker: one process of //tests:soak_test. What it keeps in the heap,
// and what it and its successors may trust after a SIGKILL or a heapd
// restart, is the protocol described at the top of tests/soak_test.cc.
//
//   soak_worker SOCKET HEAP setup WORKERS [fixed]
//                                             create the heap (a fixed-address
//                                             one with "fixed"), its registry and
//                                             one slot per worker; print "ok"
//   soak_worker SOCKET HEAP run SLOT CONTROL LOG SEED
//                                             be worker SLOT (taking over from a
//                                             killed predecessor) until drained;
//                                             print "drained ..." or "error ..."
//   soak_worker SOCKET HEAP finish            after every worker drained: resolve
//                                             what kills and the restart left in
//                                             doubt, check every slot, free
//                                             everything; print "finished ..."
// Exit status 0 on success, 3 on any error it did not expect.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boost/container/map.hpp"
#include "boost/container/vector.hpp"
#include "boost/interprocess/offset_ptr.hpp"
#include "client/client_channel.h"
#include "heapd/allocator.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "tests/soak_control.h"

namespace heapd {
namespace soak {

using boost::interprocess::offset_ptr;

// Capacities of the structures in the heap. Every tunable of the workload is
// here.
constexpr uint32_t kMaxWorkers = 64;
constexpr uint32_t kRingEntries = 8;     // per (sender, receiver) pair
constexpr uint32_t kOwnedEntries = 128;  // objects one worker owns
constexpr uint32_t kNamesPerWorker = 4;  // "soak.n.<slot>.<k>"
constexpr uint32_t kInDoubtEntries = 4096;
constexpr uint32_t kMaxAllocs = 6;  // per transaction
constexpr uint32_t kMaxFrees = 8;
constexpr uint32_t kMaxConsumes = 32;
constexpr uint32_t kMaxSends = 4;
constexpr uint32_t kMaxNameOps = 2;
constexpr uint32_t kMaxLargeOwned = 4;  // objects above 1 MiB a worker owns at once
constexpr uint64_t kLargeThreshold = uint64_t{1} << 20;  // above: a run of whole chunks
constexpr uint64_t kMaxObjectSize = uint64_t{6} << 20;
constexpr int kNameOpPercent = 12;    // transactions that bind or unbind a name
constexpr int kContainerPercent = 4;  // transactions that build a boost container

constexpr char kRegistryName[] = "soak.registry";

// ---- Object contents ------------------------------------------------------

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A key names one allocation for the whole run: the worker slot, its
// incarnation (process) and a sequence number in that process.
constexpr uint64_t kKeyTag = uint64_t{0x2b5} << 54;
constexpr uint64_t kContainerTag = uint64_t{0x2b6} << 54;
uint64_t MakeKey(uint32_t slot, uint64_t incarnation, uint64_t seq) {
  return kKeyTag | (uint64_t{slot} << 48) | ((incarnation & 0xffff) << 32) | (seq & 0xffffffff);
}
uint32_t SlotOfKey(uint64_t key) { return static_cast<uint32_t>((key >> 48) & 0x3f); }

// The stamp: word 0 is the key, word 1 the size, every other byte follows
// from the key. Verification compares every byte, which is stronger than a
// stored checksum and needs nothing but the key and size.
void Fill(char* p, uint64_t size, uint64_t key) {
  const uint64_t words = size / 8;
  uint64_t* w = reinterpret_cast<uint64_t*>(p);
  const uint64_t seed = Mix(key);
  if (words > 0) w[0] = key;
  if (words > 1) w[1] = size;
  for (uint64_t i = 2; i < words; ++i) w[i] = seed + i * 0x9e3779b97f4a7c15ull;
  const uint64_t tail = Mix(seed);
  for (uint64_t b = words * 8; b < size; ++b) p[b] = static_cast<char>(tail >> (8 * (b % 8)));
}

// The first byte offset where `p` differs from Fill(p, size, key), or -1.
int64_t FirstDifference(const char* p, uint64_t size, uint64_t key) {
  const uint64_t words = size / 8;
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  const uint64_t seed = Mix(key);
  if (words > 0 && w[0] != key) return 0;
  if (words > 1 && w[1] != size) return 8;
  for (uint64_t i = 2; i < words; ++i) {
    if (w[i] != seed + i * 0x9e3779b97f4a7c15ull) return static_cast<int64_t>(i * 8);
  }
  const uint64_t tail = Mix(seed);
  for (uint64_t b = words * 8; b < size; ++b) {
    if (p[b] != static_cast<char>(tail >> (8 * (b % 8)))) return static_cast<int64_t>(b);
  }
  return -1;
}

// ---- What lives in the heap -------------------------------------------------

// An object as the structures record it. Written with `key` last and
// cleared with `key` first: key 0 is an empty record.
struct StoredObject {
  offset_ptr<char> object;
  uint64_t size = 0;
  uint64_t key = 0;
};

// An object as a process handles it.
struct Obj {
  char* p = nullptr;
  uint64_t size = 0;
  uint64_t key = 0;
};

void Store(StoredObject& to, const Obj& from) {
  to.key = 0;
  to.object = from.p;
  to.size = from.size;
  std::atomic_thread_fence(std::memory_order_release);
  to.key = from.key;
}
void Clear(StoredObject& record) {
  record.key = 0;
  record.size = 0;
  record.object = nullptr;
}
Obj Load(const StoredObject& from) { return Obj{from.object.get(), from.size, from.key}; }

struct Counters {
  uint64_t transactions = 0;
  uint64_t allocated = 0;
  uint64_t allocated_bytes = 0;
  uint64_t large_allocated = 0;
  uint64_t freed_own = 0;
  uint64_t sent = 0;
  uint64_t received = 0;  // objects of other workers freed by this one
  uint64_t names_bound = 0;
  uint64_t names_unbound = 0;
  uint64_t containers = 0;
};

enum JournalState : uint64_t { kIdle = 0, kPerforming = 1, kSynced = 2, kRecovering = 3 };

// One transaction of a worker: written before it touches anything (kPerforming),
// marked kSynced once its sync() returned, applied to the slot's tables and
// made kIdle. Applying is idempotent, so a successor redoes a kSynced one; a
// kPerforming one may or may not have reached its sync, so a successor moves
// everything it touched to the in-doubt list (kRecovering while it does).
struct Journal {
  std::atomic<uint64_t> state{kIdle};
  uint64_t txn = 0;          // (incarnation << 32) | number
  uint64_t in_doubt_at = 0;  // kRecovering: where its in-doubt entries go
  // alloc[0, allocs) were allocated and stamped; alloc[0] is the witness: a
  // small object, live after a kill exactly when the sync was reached.
  std::atomic<uint32_t> allocs{0};
  uint32_t frees = 0;
  uint32_t sends = 0;
  uint32_t consumes = 0;
  uint32_t binds = 0;
  uint32_t unbinds = 0;
  struct Placed {
    StoredObject object;
    uint32_t index = 0;  // in Slot::owned
  };
  Placed alloc[kMaxAllocs];
  Placed free[kMaxFrees];
  Placed send[kMaxSends];
  StoredObject consume[kMaxConsumes];
  uint64_t consumed_from = 0;  // bit s: new_head[s] is the new head of inbox[s]
  uint64_t new_head[kMaxWorkers] = {};
  uint64_t sent_to = 0;  // bit r: new_tail[r] is the new tail of r's inbox[this]
  uint64_t new_tail[kMaxWorkers] = {};
  struct NameOp {
    uint32_t k = 0;
    StoredObject tag;
  };
  NameOp bind[kMaxNameOps];
  NameOp unbind[kMaxNameOps];
  Counters counters_after;
};

enum InDoubtKind : uint32_t {
  kWitness = 1,  // alloc[0] of a transaction cut short
  kAllocated,    // another allocation of it
  kFreeing,      // an own object it freed
  kConsuming,    // a received object it freed
  kUnbinding,    // a name's tag it unbound (then freed)
  kAdoptedBind,  // a name it bound: kept by the successor (counted only)
};

struct InDoubt {
  StoredObject object;
  uint64_t txn = 0;
  uint32_t kind = 0;
};

// Objects worker s hands to worker r: entries [head, tail) are r's. The
// sender writes entries past the tail before its sync and publishes them by
// moving the tail after it, so every published object is synced.
struct Ring {
  std::atomic<uint64_t> tail{0};  // written by the sender only
  std::atomic<uint64_t> head{0};  // written by the receiver only
  StoredObject entry[kRingEntries];
};

// Everything one worker role owns; bound to "soak.slot.<i>" and linked from
// the registry. Processes come and go; the slot stays.
struct Slot {
  static constexpr uint64_t kMagic = 0x534f414b534c4f54;  // "SOAKSLOT"
  uint64_t magic = kMagic;
  uint32_t index = 0;
  std::atomic<uint64_t> incarnation{0};        // processes that took the role
  std::atomic<uint64_t> daemon_generation{0};  // SoakControl's, at its last attach
  std::atomic<uint64_t> session{0};            // of its last attach
  std::atomic<uint64_t> done_sending{0};       // draining: it sends nothing more
  std::atomic<uint64_t> drained{0};
  // Objects and bytes whose contents were checked, by every incarnation
  // (added after each transaction: approximate by the last one of a killed
  // process, for the report only).
  std::atomic<uint64_t> verified_objects{0};
  std::atomic<uint64_t> verified_bytes{0};
  // Errors its processes accepted (sessions ended by a heapd restart), and
  // sessions they lost so, by every incarnation.
  std::atomic<uint64_t> expected_errors{0};
  std::atomic<uint64_t> session_losses{0};
  Counters counters;  // as of the last applied transaction
  Journal journal;
  StoredObject owned[kOwnedEntries];
  StoredObject names[kNamesPerWorker];  // the tag each name binds (empty: unbound)
  std::atomic<uint64_t> in_doubt_count{0};
  InDoubt in_doubt[kInDoubtEntries];
  Ring inbox[kMaxWorkers];  // inbox[s]: from worker s
};

struct Registry {
  static constexpr uint64_t kMagic = 0x534f414b52454731;  // "SOAKREG1"
  uint64_t magic = kMagic;
  uint32_t workers = 0;
  offset_ptr<Slot> slot[kMaxWorkers];
};

// What a name binds: a small stamped object.
struct NameTag {
  explicit NameTag(uint64_t key) { Fill(reinterpret_cast<char*>(words), sizeof(words), key); }
  uint64_t words[8];
};

std::string SlotName(uint32_t slot) { return absl::StrCat("soak.slot.", slot); }
std::string NameOf(uint32_t slot, uint32_t k) { return absl::StrCat("soak.n.", slot, ".", k); }

// A boost container in the heap, built and checked now and then.
using U64Allocator = allocator<uint64_t>;
using Vec = boost::container::vector<uint64_t, U64Allocator>;
using MapAllocator = allocator<std::pair<const uint64_t, Vec>>;
using Map = boost::container::map<uint64_t, Vec, std::less<uint64_t>, MapAllocator>;

}  // namespace soak
}  // namespace heapd

HEAPD_TYPE_NAME(heapd::soak::Registry, "soak::Registry/v1");
HEAPD_TYPE_NAME(heapd::soak::Slot, "soak::Slot/v1");
HEAPD_TYPE_NAME(heapd::soak::NameTag, "soak::NameTag/v1");

namespace heapd {
namespace soak {
namespace {

const char kSessionLost[] = "soak/session-lost";

// Errors that mean "your session is gone": heapd is down or restarting
// (UNAVAILABLE; CANCELLED for a call gRPC had queued but heapd had not
// started when it shut down), or the new heapd does not know the session.
bool LooksLikeSessionEnd(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled) {
    return true;
  }
  if (s.code() == absl::StatusCode::kNotFound ||
      s.code() == absl::StatusCode::kFailedPrecondition) {
    return absl::StrContains(s.message(), "no session") ||
           absl::StrContains(s.message(), "has ended") ||
           absl::StrContains(s.message(), "already ended");
  }
  return false;
}

bool IsSessionLost(const absl::Status& s) { return s.GetPayload(kSessionLost).has_value(); }

#define SOAK_RETURN_IF_ERROR(expr)       \
  do {                                   \
    const absl::Status _status = (expr); \
    if (!_status.ok()) return _status;   \
  } while (0)

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

class Worker {
 public:
  Worker(std::string socket, std::string heap_name, uint32_t slot, SoakControl* control, FILE* log,
         uint64_t seed)
      : socket_(std::move(socket)),
        heap_name_(std::move(heap_name)),
        slot_index_(slot),
        control_(control),
        log_(log),
        rng_(seed) {}

  int Run();

 private:
  void Log(const char* format, ...) __attribute__((format(printf, 2, 3)));
  // OK, or the error marked as an expected loss of the session (heapd
  // restarts: the control block says so), or an unexpected error.
  absl::Status Check(const absl::Status& status, const std::string& what);
  absl::Status Session();
  void DropSession();
  absl::Status WaitForSessionGone(uint64_t session);
  absl::Status Recover();
  // One transaction (Transact) and the count of what it verified.
  absl::Status Transaction(bool draining);
  absl::Status Transact(bool draining);
  void Apply();
  absl::Status Verify(const Obj& object, const std::string& what);
  absl::Status Container();
  bool DrainComplete() const;
  uint64_t NextKey() { return MakeKey(slot_index_, incarnation_, ++seq_); }
  uint64_t Random(uint64_t n) { return rng_() % n; }
  uint64_t Between(uint64_t lo, uint64_t hi) { return lo + rng_() % (hi - lo + 1); }
  uint64_t PickSize(bool large_allowed);
  Ring& InboxOf(uint32_t receiver) { return registry_->slot[receiver]->inbox[slot_index_]; }

  const std::string socket_;
  const std::string heap_name_;
  const uint32_t slot_index_;
  SoakControl* const control_;
  FILE* const log_;
  std::mt19937_64 rng_;

  uint64_t attach_generation_ = 0;
  uint64_t incarnation_ = 0;  // 0: no session yet
  uint64_t seq_ = 0;
  uint64_t txn_number_ = 0;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Heap> heap_;
  Registry* registry_ = nullptr;
  Slot* slot_ = nullptr;
  uint32_t workers_ = 0;

  // What this process saw.
  uint64_t session_losses_ = 0;
  uint64_t expected_errors_ = 0;
  uint64_t stale_detaches_ok_ = 0;
  uint64_t recoveries_ = 0;
  uint64_t verified_objects_ = 0;
  uint64_t verified_bytes_ = 0;
};

void Worker::Log(const char* format, ...) {
  char line[2048];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  std::fprintf(log_, "%s slot %u inc %" PRIu64 ": %s\n",
               absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()).c_str(),
               slot_index_, incarnation_, line);
  std::fflush(log_);
}

absl::Status Worker::Check(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  const uint64_t generation = control_->daemon_generation.load(std::memory_order_acquire);
  if (LooksLikeSessionEnd(status) && generation != attach_generation_) {
    ++expected_errors_;
    if (slot_ != nullptr) slot_->expected_errors.fetch_add(1);
    Log("expected (heapd restarts, generation %" PRIu64 " -> %" PRIu64 "): %s: %s",
        attach_generation_, generation, what.c_str(), status.ToString().c_str());
    absl::Status lost = absl::AbortedError(absl::StrCat(what, ": ", status.ToString()));
    lost.SetPayload(kSessionLost, absl::Cord("1"));
    return lost;
  }
  return absl::InternalError(absl::StrCat(what, ": ", status.ToString()));
}

absl::Status Worker::Verify(const Obj& object, const std::string& what) {
  const int64_t at = FirstDifference(object.p, object.size, object.key);
  if (at < 0) {
    ++verified_objects_;
    verified_bytes_ += object.size;
    return absl::OkStatus();
  }
  const uint64_t offset = heap_->offset_of(object.p);
  uint64_t actual = 0;
  std::memcpy(&actual, object.p + (at & ~int64_t{7}),
              std::min<uint64_t>(8, object.size - (at & ~int64_t{7})));
  return absl::DataLossError(absl::StrCat(
      "corrupt contents: ", what, " (key ", Hex(object.key), ", ", object.size, " bytes at offset ",
      offset, ") differs at byte ", at, " (word there: ", Hex(actual), ")"));
}

uint64_t Worker::PickSize(bool large_allowed) {
  const uint64_t r = Random(100);
  if (r < 40) return Between(8, 128);
  if (r < 70) return Between(129, 4096);
  if (r < 87) return Between(4097, 64 << 10);
  if (r < 95 || !large_allowed) return Between((64 << 10) + 1, kLargeThreshold);
  return Between(kLargeThreshold + 1, kMaxObjectSize);
}

int Worker::Run() {
  for (;;) {
    const absl::Status status = Session();
    if (status.ok()) break;
    if (!IsSessionLost(status)) {
      Log("error: %s", status.ToString().c_str());
      std::printf("error slot %u: %s\n", slot_index_, status.ToString().c_str());
      return 3;
    }
    ++session_losses_;
    if (slot_ != nullptr) slot_->session_losses.fetch_add(1);
    Log("session lost: %s", status.ToString().c_str());
    DropSession();
  }
  return 0;
}

// Ends a session heapd no longer serves: detach (which fails, the session
// being gone) and forget it.
void Worker::DropSession() {
  if (heap_ != nullptr) {
    const absl::Status detached = heap_->detach();
    if (detached.ok()) {
      ++stale_detaches_ok_;
      Log("the stale session detached without an error");
    } else {
      Log("stale detach: %s", detached.ToString().c_str());
    }
    heap_.reset();
  }
  client_.reset();
  registry_ = nullptr;
  slot_ = nullptr;
}

absl::Status Worker::WaitForSessionGone(uint64_t session) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    absl::StatusOr<v1::HeapStats> stats = StatHeap(*client_, heap_name_);
    SOAK_RETURN_IF_ERROR(Check(stats.status(), "stat while waiting for the predecessor's session"));
    bool present = false;
    for (const v1::ClientInfo& c : stats->clients()) present |= c.session() == session;
    if (!present) break;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("the killed predecessor's session ", session,
                                                      " was not reclaimed within 60 s"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // A call of the dead session that heapd took before it ended the session
  // finishes under the session's mutex before the reclaim: give it time.
  absl::SleepFor(absl::Milliseconds(100));
  return absl::OkStatus();
}

absl::Status Worker::Session() {
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  for (;;) {
    attach_generation_ = control_->daemon_generation.load(std::memory_order_acquire);
    if (attach_generation_ % 2 == 0) break;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("heapd did not come back");
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_, 10000);
  SOAK_RETURN_IF_ERROR(Check(client.status(), "connect"));
  client_ = *std::move(client);
  AttachOptions options;
  options.lease_batch = 1;
  options.prefetch_names = {kRegistryName};
  absl::StatusOr<std::unique_ptr<Heap>> heap = client_->Attach(heap_name_, options);
  SOAK_RETURN_IF_ERROR(Check(heap.status(), "attach"));
  heap_ = *std::move(heap);
  absl::StatusOr<Registry*> registry = heap_->find<Registry>(kRegistryName);
  SOAK_RETURN_IF_ERROR(Check(registry.status(), "find the registry"));
  registry_ = *registry;
  if (registry_->magic != Registry::kMagic || slot_index_ >= registry_->workers) {
    return absl::DataLossError(
        absl::StrCat("registry: magic ", Hex(registry_->magic), ", workers ", registry_->workers));
  }
  workers_ = registry_->workers;
  slot_ = registry_->slot[slot_index_].get();
  if (slot_->magic != Slot::kMagic || slot_->index != slot_index_) {
    return absl::DataLossError(absl::StrCat("slot ", slot_index_, ": magic ", Hex(slot_->magic)));
  }
  if (incarnation_ == 0) {
    // A new process takes the role. Its predecessor (killed) must be gone
    // from heapd before its journal is trusted: no call of it may land later.
    const uint64_t previous = slot_->session.load();
    if (previous != 0 && slot_->daemon_generation.load() == attach_generation_) {
      SOAK_RETURN_IF_ERROR(WaitForSessionGone(previous));
    }
    incarnation_ = slot_->incarnation.load() + 1;
    slot_->incarnation.store(incarnation_);
  }
  slot_->daemon_generation.store(attach_generation_);
  slot_->session.store(heap_->session());
  Log("attached: session %" PRIu64 ", heapd generation %" PRIu64, heap_->session(),
      attach_generation_);
  SOAK_RETURN_IF_ERROR(Recover());
  for (;;) {
    const bool draining = control_->phase.load(std::memory_order_acquire) == SoakControl::kDrain;
    if (draining && slot_->done_sending.load() == 0) {
      slot_->done_sending.store(1, std::memory_order_release);
      Log("draining");
    }
    if (draining && DrainComplete()) break;
    SOAK_RETURN_IF_ERROR(Transaction(draining));
  }
  slot_->drained.store(1, std::memory_order_release);
  const Counters c = slot_->counters;
  SOAK_RETURN_IF_ERROR(Check(heap_->detach(), "detach"));
  heap_.reset();
  client_.reset();
  Log("drained and detached");
  std::printf("drained slot=%u incarnation=%" PRIu64 " session_losses=%" PRIu64
              " expected_errors=%" PRIu64 " stale_detaches_ok=%" PRIu64 " recoveries=%" PRIu64
              " verified_objects=%" PRIu64 " verified_bytes=%" PRIu64 " slot_transactions=%" PRIu64
              " slot_allocated=%" PRIu64 "\n",
              slot_index_, incarnation_, session_losses_, expected_errors_, stale_detaches_ok_,
              recoveries_, verified_objects_, verified_bytes_, c.transactions, c.allocated);
  std::fflush(stdout);
  return absl::OkStatus();
}

bool Worker::DrainComplete() const {
  for (const StoredObject& o : slot_->owned) {
    if (o.key != 0) return false;
  }
  for (const StoredObject& n : slot_->names) {
    if (n.key != 0) return false;
  }
  for (uint32_t s = 0; s < workers_; ++s) {
    if (s != slot_index_ && registry_->slot[s]->done_sending.load(std::memory_order_acquire) == 0) {
      return false;
    }
  }
  for (uint32_t s = 0; s < workers_; ++s) {
    const Ring& ring = slot_->inbox[s];
    if (ring.head.load() != ring.tail.load(std::memory_order_acquire)) return false;
  }
  return true;
}

// Brings the slot's tables to a state this process can trust; see the
// journal's comment.
absl::Status Worker::Recover() {
  Journal& j = slot_->journal;
  const uint64_t state = j.state.load(std::memory_order_acquire);
  if (state == kIdle) return absl::OkStatus();
  ++recoveries_;
  if (state == kSynced) {
    Log("recovering: transaction %s had synced; applying it", Hex(j.txn).c_str());
    Apply();
    return absl::OkStatus();
  }
  if (state == kPerforming) {
    j.in_doubt_at = slot_->in_doubt_count.load();
    j.state.store(kRecovering, std::memory_order_release);
  }
  uint64_t at = j.in_doubt_at;
  auto put = [&](const StoredObject& object, InDoubtKind kind) {
    if (at >= kInDoubtEntries) return false;
    InDoubt& entry = slot_->in_doubt[at++];
    entry.object = object;
    entry.txn = j.txn;
    entry.kind = kind;
    return true;
  };
  bool full = false;
  const uint32_t allocs = j.allocs.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < allocs; ++i)
    full |= !put(j.alloc[i].object, i == 0 ? kWitness : kAllocated);
  for (uint32_t i = 0; i < j.frees; ++i) full |= !put(j.free[i].object, kFreeing);
  for (uint32_t i = 0; i < j.consumes; ++i) full |= !put(j.consume[i], kConsuming);
  for (uint32_t i = 0; i < j.binds; ++i) {
    const Journal::NameOp& op = j.bind[i];
    absl::StatusOr<NameTag*> tag = heap_->find<NameTag>(NameOf(slot_index_, op.k));
    if (tag.ok() && (*tag)->words[0] == op.tag.key) {
      // The bind reached heapd: the name keeps its tag live; adopt it.
      Obj adopted{reinterpret_cast<char*>(*tag), sizeof(NameTag), op.tag.key};
      SOAK_RETURN_IF_ERROR(Verify(adopted, "an adopted name's tag"));
      Store(slot_->names[op.k], adopted);
      StoredObject record;
      record.object = adopted.p;
      record.size = adopted.size;
      record.key = adopted.key;
      full |= !put(record, kAdoptedBind);
    } else if (tag.ok()) {
      return absl::InternalError(absl::StrCat("name ", NameOf(slot_index_, op.k), " binds key ",
                                              Hex((*tag)->words[0]), ", not ", Hex(op.tag.key)));
    } else if (tag.status().code() != absl::StatusCode::kNotFound) {
      return Check(tag.status(), "find a name bound by a cut-short transaction");
    }
    // Not bound: the bind never happened, the sync after it neither, and
    // the tag's allocation was rolled back.
  }
  for (uint32_t i = 0; i < j.unbinds; ++i) {
    const Journal::NameOp& op = j.unbind[i];
    absl::StatusOr<NameTag*> tag = heap_->find<NameTag>(NameOf(slot_index_, op.k));
    if (tag.ok() && (*tag)->words[0] == op.tag.key) continue;  // never unbound: keep it
    if (tag.ok()) {
      return absl::InternalError(absl::StrCat("name ", NameOf(slot_index_, op.k), " binds key ",
                                              Hex((*tag)->words[0]), ", not ", Hex(op.tag.key)));
    }
    if (tag.status().code() != absl::StatusCode::kNotFound) {
      return Check(tag.status(), "find a name unbound by a cut-short transaction");
    }
    full |= !put(op.tag, kUnbinding);
    Clear(slot_->names[op.k]);
  }
  if (full) return absl::ResourceExhaustedError("the slot's in-doubt list is full");
  for (uint32_t i = 0; i < j.frees; ++i) {
    StoredObject& owned = slot_->owned[j.free[i].index];
    if (owned.key == j.free[i].object.key) Clear(owned);
  }
  for (uint32_t s = 0; s < workers_; ++s) {
    if (j.consumed_from & (uint64_t{1} << s)) {
      slot_->inbox[s].head.store(j.new_head[s], std::memory_order_release);
    }
  }
  slot_->in_doubt_count.store(at, std::memory_order_release);
  Log("recovered transaction %s cut short: %" PRIu64
      " objects in doubt (allocs %u, frees %u, "
      "consumes %u, binds %u, unbinds %u)",
      Hex(j.txn).c_str(), at - j.in_doubt_at, allocs, j.frees, j.consumes, j.binds, j.unbinds);
  j.state.store(kIdle, std::memory_order_release);
  return absl::OkStatus();
}

void Worker::Apply() {
  Journal& j = slot_->journal;
  for (uint32_t i = 0; i < j.frees; ++i) {
    StoredObject& owned = slot_->owned[j.free[i].index];
    if (owned.key == j.free[i].object.key) Clear(owned);
  }
  for (uint32_t i = 0; i < j.sends; ++i) {
    StoredObject& owned = slot_->owned[j.send[i].index];
    if (owned.key == j.send[i].object.key) Clear(owned);
  }
  const uint32_t allocs = j.allocs.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < allocs; ++i)
    Store(slot_->owned[j.alloc[i].index], Load(j.alloc[i].object));
  for (uint32_t r = 0; r < workers_; ++r) {
    if (j.sent_to & (uint64_t{1} << r))
      InboxOf(r).tail.store(j.new_tail[r], std::memory_order_release);
  }
  for (uint32_t s = 0; s < workers_; ++s) {
    if (j.consumed_from & (uint64_t{1} << s)) {
      slot_->inbox[s].head.store(j.new_head[s], std::memory_order_release);
    }
  }
  for (uint32_t i = 0; i < j.binds; ++i) Store(slot_->names[j.bind[i].k], Load(j.bind[i].tag));
  for (uint32_t i = 0; i < j.unbinds; ++i) Clear(slot_->names[j.unbind[i].k]);
  slot_->counters = j.counters_after;
  j.state.store(kIdle, std::memory_order_release);
}

absl::Status Worker::Transaction(bool draining) {
  const uint64_t verified_objects = verified_objects_;
  const uint64_t verified_bytes = verified_bytes_;
  absl::Status status = Transact(draining);
  slot_->verified_objects.fetch_add(verified_objects_ - verified_objects);
  slot_->verified_bytes.fetch_add(verified_bytes_ - verified_bytes);
  return status;
}

absl::Status Worker::Transact(bool draining) {
  Journal& j = slot_->journal;
  // ---- Plan: only reads.
  std::vector<uint32_t> occupied, empty;
  uint32_t large_owned = 0;
  for (uint32_t i = 0; i < kOwnedEntries; ++i) {
    if (slot_->owned[i].key != 0) {
      occupied.push_back(i);
      large_owned += slot_->owned[i].size > kLargeThreshold;
    } else {
      empty.push_back(i);
    }
  }
  std::shuffle(occupied.begin(), occupied.end(), rng_);
  std::shuffle(empty.begin(), empty.end(), rng_);
  size_t frees;
  if (draining) {
    frees = kMaxFrees;
  } else {
    frees = Random(3);
    if (occupied.size() > 48) frees += 2;
    if (occupied.size() > 96 || empty.size() <= kMaxAllocs) frees = kMaxFrees;
  }
  frees = std::min(frees, occupied.size());
  std::vector<std::pair<uint32_t, uint32_t>> sends;  // (owned index, receiver)
  uint64_t planned_tail[kMaxWorkers];
  uint64_t sent_to = 0;
  if (!draining && workers_ > 1) {
    const size_t wanted = Random(kMaxSends + 1);
    for (size_t i = frees; i < occupied.size() && sends.size() < wanted; ++i) {
      uint32_t r = static_cast<uint32_t>(Random(workers_ - 1));
      if (r >= slot_index_) ++r;
      Ring& ring = InboxOf(r);
      const uint64_t tail =
          (sent_to & (uint64_t{1} << r)) != 0 ? planned_tail[r] : ring.tail.load();
      if (tail - ring.head.load(std::memory_order_acquire) >= kRingEntries) continue;  // full
      sends.emplace_back(occupied[i], r);
      planned_tail[r] = tail + 1;
      sent_to |= uint64_t{1} << r;
    }
  }
  std::vector<std::pair<Obj, uint32_t>> consumes;  // (object, sender)
  uint64_t consumed_from = 0;
  uint64_t new_head[kMaxWorkers];
  const uint32_t first = static_cast<uint32_t>(Random(workers_));
  for (uint32_t n = 0; n < workers_ && consumes.size() < kMaxConsumes; ++n) {
    const uint32_t s = (first + n) % workers_;
    Ring& ring = slot_->inbox[s];
    const uint64_t head = ring.head.load();
    const uint64_t tail = ring.tail.load(std::memory_order_acquire);
    uint64_t p = head;
    for (; p < tail && consumes.size() < kMaxConsumes; ++p) {
      consumes.emplace_back(Load(ring.entry[p % kRingEntries]), s);
    }
    if (p != head) {
      consumed_from |= uint64_t{1} << s;
      new_head[s] = p;
    }
  }
  const size_t allocs = draining ? 0 : std::min<size_t>(1 + Random(kMaxAllocs), empty.size());
  std::vector<uint32_t> bound, unbound;
  for (uint32_t k = 0; k < kNamesPerWorker; ++k) {
    (slot_->names[k].key != 0 ? bound : unbound).push_back(k);
  }
  std::vector<uint32_t> binds, unbinds;
  if (draining) {
    for (size_t i = 0; i < bound.size() && i < kMaxNameOps; ++i) unbinds.push_back(bound[i]);
  } else if (static_cast<int>(Random(100)) < kNameOpPercent) {
    const bool bind = !unbound.empty() && (bound.empty() || Random(2) == 0);
    if (bind) {
      binds.push_back(unbound[Random(unbound.size())]);
    } else {
      unbinds.push_back(bound[Random(bound.size())]);
    }
  }
  const bool container = !draining && static_cast<int>(Random(100)) < kContainerPercent;
  if (draining && frees == 0 && consumes.empty() && unbinds.empty()) {
    absl::SleepFor(absl::Milliseconds(5));  // waiting for other workers to hand over the rest
    return absl::OkStatus();
  }

  // ---- Verify what this transaction reads.
  for (size_t i = 0; i < frees; ++i) {
    SOAK_RETURN_IF_ERROR(Verify(Load(slot_->owned[occupied[i]]), "an own object to free"));
  }
  for (const auto& [index, r] : sends) {
    SOAK_RETURN_IF_ERROR(Verify(Load(slot_->owned[index]), "an own object to hand over"));
  }
  for (size_t i = frees + sends.size(); i < occupied.size() && i < frees + sends.size() + 2; ++i) {
    SOAK_RETURN_IF_ERROR(Verify(Load(slot_->owned[occupied[i]]), "an own object kept"));
  }
  for (const auto& [object, s] : consumes) {
    if (SlotOfKey(object.key) != s) {
      return absl::DataLossError(absl::StrCat("inbox of worker ", s, " holds key ", Hex(object.key),
                                              " of worker ", SlotOfKey(object.key)));
    }
    SOAK_RETURN_IF_ERROR(Verify(object, absl::StrCat("an object received from worker ", s)));
  }

  // ---- Journal, then act.
  Counters after = slot_->counters;
  ++after.transactions;
  j.txn = (incarnation_ << 32) | ++txn_number_;
  j.allocs.store(0, std::memory_order_relaxed);
  j.frees = static_cast<uint32_t>(frees);
  for (size_t i = 0; i < frees; ++i) {
    j.free[i].object = slot_->owned[occupied[i]];
    j.free[i].index = occupied[i];
  }
  after.freed_own += frees;
  j.sends = static_cast<uint32_t>(sends.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    j.send[i].object = slot_->owned[sends[i].first];
    j.send[i].index = sends[i].first;
  }
  after.sent += sends.size();
  j.sent_to = sent_to;
  for (uint32_t r = 0; r < workers_; ++r) {
    if (j.sent_to & (uint64_t{1} << r)) j.new_tail[r] = planned_tail[r];
  }
  j.consumes = static_cast<uint32_t>(consumes.size());
  for (size_t i = 0; i < consumes.size(); ++i) {
    j.consume[i].key = 0;
    j.consume[i].object = consumes[i].first.p;
    j.consume[i].size = consumes[i].first.size;
    j.consume[i].key = consumes[i].first.key;
  }
  after.received += consumes.size();
  j.consumed_from = consumed_from;
  for (uint32_t s = 0; s < workers_; ++s) {
    if (consumed_from & (uint64_t{1} << s)) j.new_head[s] = new_head[s];
  }
  j.binds = static_cast<uint32_t>(binds.size());
  for (size_t i = 0; i < binds.size(); ++i) {
    j.bind[i].k = binds[i];
    Clear(j.bind[i].tag);
    j.bind[i].tag.size = sizeof(NameTag);
    j.bind[i].tag.key = NextKey();
  }
  after.names_bound += binds.size();
  j.unbinds = static_cast<uint32_t>(unbinds.size());
  for (size_t i = 0; i < unbinds.size(); ++i) {
    j.unbind[i].k = unbinds[i];
    j.unbind[i].tag = slot_->names[unbinds[i]];
  }
  after.names_unbound += unbinds.size();
  after.containers += container;
  j.state.store(kPerforming, std::memory_order_release);

  for (size_t i = 0; i < allocs; ++i) {
    const uint64_t size = i == 0 ? Between(8, 64) : PickSize(large_owned < kMaxLargeOwned);
    absl::StatusOr<void*> p = heap_->allocate(size);
    SOAK_RETURN_IF_ERROR(Check(p.status(), absl::StrCat("allocate ", size, " bytes")));
    const Obj object{static_cast<char*>(*p), size, NextKey()};
    Fill(object.p, size, object.key);
    Store(j.alloc[i].object, object);
    j.alloc[i].index = empty[i];
    j.allocs.store(static_cast<uint32_t>(i + 1), std::memory_order_release);
    ++after.allocated;
    after.allocated_bytes += size;
    if (size > kLargeThreshold) {
      ++after.large_allocated;
      ++large_owned;
    }
  }
  j.counters_after = after;
  for (size_t i = 0; i < sends.size(); ++i) {
    // Past the receiver's tail: invisible until Apply publishes it.
    const uint32_t r = sends[i].second;
    Ring& ring = InboxOf(r);
    uint64_t position = ring.tail.load();
    for (size_t before = 0; before < i; ++before) position += sends[before].second == r;
    ring.entry[position % kRingEntries] = j.send[i].object;
  }
  for (size_t i = 0; i < binds.size(); ++i) {
    const std::string name = NameOf(slot_index_, binds[i]);
    absl::StatusOr<NameTag*> tag = heap_->construct<NameTag>(name)(j.bind[i].tag.key);
    SOAK_RETURN_IF_ERROR(Check(tag.status(), "bind " + name));
    j.bind[i].tag.object = reinterpret_cast<char*>(*tag);
  }
  if (container) SOAK_RETURN_IF_ERROR(Container());
  // Frees last: nothing this transaction allocates may reuse memory it
  // freed. If it did and the sync never landed, the free would roll back
  // and the object come back live holding another allocation's bytes,
  // indistinguishable from memory freed and reused by others.
  for (size_t i = 0; i < frees; ++i) {
    const Obj object = Load(j.free[i].object);
    SOAK_RETURN_IF_ERROR(Check(heap_->deallocate(object.p, object.size),
                               absl::StrCat("free own object ", Hex(object.key))));
  }
  for (size_t i = 0; i < consumes.size(); ++i) {
    const Obj& object = consumes[i].first;
    SOAK_RETURN_IF_ERROR(Check(heap_->deallocate(object.p, object.size),
                               absl::StrCat("free object ", Hex(object.key),
                                            " received from worker ", consumes[i].second)));
  }
  for (size_t i = 0; i < unbinds.size(); ++i) {
    const std::string name = NameOf(slot_index_, unbinds[i]);
    absl::StatusOr<NameTag*> tag = heap_->find<NameTag>(name);
    SOAK_RETURN_IF_ERROR(Check(tag.status(), "find " + name));
    const Obj expected = Load(j.unbind[i].tag);
    if (reinterpret_cast<char*>(*tag) != expected.p) {
      return absl::DataLossError(absl::StrCat("name ", name, " binds offset ",
                                              heap_->offset_of(*tag), ", not ",
                                              heap_->offset_of(expected.p)));
    }
    SOAK_RETURN_IF_ERROR(Verify(expected, "a name's tag"));
    SOAK_RETURN_IF_ERROR(Check(heap_->destroy<NameTag>(name), "unbind and free " + name));
  }
  SOAK_RETURN_IF_ERROR(Check(heap_->sync().status(), "sync"));
  j.state.store(kSynced, std::memory_order_release);
  Apply();
  return absl::OkStatus();
}

// Builds a map of vectors in the heap (one vector above 1 MiB now and then,
// grown by push_back), checks every element, destroys it. All of it happens
// between two syncs: a kill rolls all of it back.
absl::Status Worker::Container() {
  const uint64_t seed = rng_();
  const uint64_t keys = Between(50, 400);
  const bool big = Random(3) == 0;
  // Keys and each vector's first element name the transaction (so a leak
  // hunt can tell whose container memory it found); the rest follows from
  // the seed.
  const uint64_t tag = kContainerTag | (uint64_t{slot_index_} << 48) |
                       ((incarnation_ & 0xffff) << 32) | ((txn_number_ & 0xffff) << 16);
  auto value = [seed, tag](uint64_t key, uint64_t i) {
    return i == 0 ? tag | (key & 0xffff) : Mix(seed ^ (key * 1000003 + i));
  };
  Log("container in transaction %s: %" PRIu64 " keys%s", Hex(slot_->journal.txn).c_str(), keys,
      big ? ", one big vector" : "");
  absl::StatusOr<void*> memory = heap_->allocate(sizeof(Map), alignof(Map));
  SOAK_RETURN_IF_ERROR(Check(memory.status(), "allocate a container"));
  Map* map = nullptr;
  uint64_t elements = 0;
  try {
    map = new (*memory) Map(MapAllocator(*heap_));
    for (uint64_t k = 0; k < keys; ++k) {
      const uint64_t key = tag | k;
      const uint64_t length = big && k == 0 ? Between(150000, 400000) : Random(40);
      auto inserted = map->emplace(key, Vec(U64Allocator(*heap_)));
      Vec& vec = inserted.first->second;
      for (uint64_t i = 0; i < length; ++i) vec.push_back(value(key, i));
      elements += length;
    }
  } catch (const std::bad_alloc&) {
    // heapd::allocator reports no status: heapd refused an allocation. The
    // container is abandoned as it is (a lost session rolls it back).
    const absl::Status failed = absl::ResourceExhaustedError(
        absl::StrCat("heapd::allocator failed inside a container of ", keys, " keys"));
    return Check(control_->daemon_generation.load() != attach_generation_
                     ? absl::UnavailableError(failed.message())
                     : failed,
                 "build a container");
  }
  uint64_t checked = 0;
  for (uint64_t k = 0; k < keys; ++k) {
    const uint64_t key = tag | k;
    auto it = map->find(key);
    if (it == map->end()) return absl::DataLossError("a container lost a key");
    for (uint64_t i = 0; i < it->second.size(); ++i) {
      if (it->second[i] != value(key, i)) {
        return absl::DataLossError(absl::StrCat("container element ", i, " of key ", Hex(key),
                                                " is ", Hex(it->second[i])));
      }
    }
    checked += it->second.size();
  }
  if (checked != elements || map->size() != keys) {
    return absl::DataLossError(absl::StrCat("container holds ", checked, " elements in ",
                                            map->size(), " keys; built ", elements, " in ", keys));
  }
  map->~Map();
  return Check(heap_->deallocate(*memory, sizeof(Map)), "free a container");
}

// ---- setup and finish --------------------------------------------------------

int Fail(const std::string& what) {
  std::printf("error %s\n", what.c_str());
  return 3;
}

int Setup(Client& client, const std::string& heap_name, uint32_t workers, bool fixed_address) {
  if (workers < 2 || workers > kMaxWorkers) return Fail("workers must be 2..64");
  AttachOptions options;
  options.create_if_missing = true;
  options.fixed_address = fixed_address;
  options.max_size = uint64_t{64} << 30;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return Fail(heap.status().ToString());
  absl::StatusOr<Registry*> registry = (*heap)->construct<Registry>(kRegistryName)();
  if (!registry.ok()) return Fail(registry.status().ToString());
  (*registry)->workers = workers;
  for (uint32_t i = 0; i < workers; ++i) {
    absl::StatusOr<Slot*> slot = (*heap)->construct<Slot>(SlotName(i))();
    if (!slot.ok()) return Fail(slot.status().ToString());
    (*slot)->index = i;
    (*registry)->slot[i] = *slot;
  }
  if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok()) {
    return Fail(epoch.status().ToString());
  }
  if (absl::Status s = (*heap)->detach(); !s.ok()) return Fail(s.ToString());
  std::printf("ok %zu bytes per slot\n", sizeof(Slot));
  return 0;
}

class Finisher {
 public:
  Finisher(Client& client, Heap& heap) : client_(client), heap_(heap) {}
  int Run();

 private:
  enum class Liveness { kLive, kNotLive };
  // Whether `object` is live as itself; a live one is freed.
  absl::StatusOr<Liveness> ProbeAndFree(const Obj& object);
  void Error(std::string message) {
    std::printf("error %s\n", message.c_str());
    ++errors_;
  }

  // Nothing should be live now. If heapd counts live objects, find those
  // that still carry a stamp (every 8-byte word of the heap is looked at),
  // name them and free them, so the report says what leaked.
  void HuntLeaks();

  Client& client_;
  Heap& heap_;
  int errors_ = 0;
};

void Finisher::HuntLeaks() {
  absl::StatusOr<v1::HeapStats> stats = StatHeap(client_, heap_.name());
  if (!stats.ok()) {
    Error("stat: " + stats.status().ToString());
    return;
  }
  if (stats->info().live_objects() == 0) return;
  std::string classes;
  for (const v1::SizeClassStats& c : stats->size_classes()) {
    if (c.live_objects() != 0) {
      absl::StrAppend(&classes, " ", c.live_objects(), "x", c.slot_size(), "B");
    }
  }
  Error(absl::StrCat("heapd counts ", stats->info().live_objects(), " live objects (",
                     stats->large_objects(), " large;", classes, ") after everything was freed"));
  const uint64_t capacity = stats->info().capacity_bytes();
  const uint64_t* words = reinterpret_cast<const uint64_t*>(heap_.base());
  const uint64_t live = stats->info().live_objects();
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  uint64_t found = 0;
  for (uint64_t i = 0; i + 1 < capacity / 8 && found < live && absl::Now() < deadline; ++i) {
    if ((words[i] >> 54) != (kKeyTag >> 54)) continue;
    const uint64_t size = words[i + 1];
    if (size < 16 || size > kMaxObjectSize || i * 8 + size > capacity) continue;
    const Obj object{heap_.base() + i * 8, size, words[i]};
    absl::StatusOr<Liveness> live = ProbeAndFree(object);
    if (live.ok() && *live == Liveness::kLive) {
      ++found;
      Error(absl::StrCat("leaked: object ", Hex(object.key), " of worker ", SlotOfKey(object.key),
                         " incarnation ", (object.key >> 32) & 0xffff, " sequence ",
                         object.key & 0xffffffff, ", ", size, " bytes at offset ", i * 8));
    }
  }
  // Container memory: map keys and vectors' first elements carry the
  // container's tag. Probe the starts of the objects that may hold one.
  for (uint64_t i = 0; i < capacity / 8 && found < live && absl::Now() < deadline; ++i) {
    if ((words[i] >> 54) != (kContainerTag >> 54)) continue;
    for (uint64_t back = 0; back <= 8 && back <= i; ++back) {
      v1::FreeRequest request;
      request.set_session(heap_.session());
      request.add_objects()->set_offset((i - back) * 8);
      v1::FreeResponse response;
      grpc::ClientContext context;
      if (FromGrpc(StubOf(client_).Free(&context, request, &response)).ok()) {
        ++found;
        Error(absl::StrCat("leaked: container memory of worker ", (words[i] >> 48) & 0x3f,
                           " incarnation ", (words[i] >> 32) & 0xffff, " transaction number ",
                           (words[i] >> 16) & 0xffff, " (low 16 bits), object at offset ",
                           (i - back) * 8, " holding the tag at +", back * 8));
        break;
      }
    }
  }
  Error(absl::StrCat("the leak hunt found ", found, " of them",
                     absl::Now() < deadline ? "" : " (stopped after 120 s)"));
}

absl::StatusOr<Finisher::Liveness> Finisher::ProbeAndFree(const Obj& object) {
  // A live object is whole: no one writes an object in doubt. Contents that
  // differ mean the memory was freed and reused.
  if (FirstDifference(object.p, object.size, object.key) >= 0) return Liveness::kNotLive;
  v1::FreeRequest request;
  request.set_session(heap_.session());
  v1::ObjectRef* ref = request.add_objects();
  ref->set_offset(heap_.offset_of(object.p));
  ref->set_size(object.size);
  v1::FreeResponse response;
  grpc::ClientContext context;
  const absl::Status freed = FromGrpc(StubOf(client_).Free(&context, request, &response));
  if (freed.ok()) return Liveness::kLive;
  // Nothing is leased and nothing else runs: heapd's answer is exact. Any
  // INVALID_ARGUMENT (not live, not an object start, another size class)
  // says this object is not live.
  if (freed.code() == absl::StatusCode::kInvalidArgument) return Liveness::kNotLive;
  return freed;
}

int Finisher::Run() {
  absl::StatusOr<Registry*> registry = heap_.find<Registry>(kRegistryName);
  if (!registry.ok()) return Fail(registry.status().ToString());
  const uint32_t workers = (*registry)->workers;
  Counters total;
  std::map<uint32_t, uint64_t> kinds;
  // (slot, txn) -> entries.
  std::map<std::pair<uint32_t, uint64_t>, std::vector<const InDoubt*>> in_doubt;
  uint64_t incarnations = 0, verified_objects = 0, verified_bytes = 0, expected_errors = 0,
           session_losses = 0;
  for (uint32_t i = 0; i < workers; ++i) {
    const Slot& slot = *(*registry)->slot[i];
    incarnations += slot.incarnation.load();
    verified_objects += slot.verified_objects.load();
    verified_bytes += slot.verified_bytes.load();
    expected_errors += slot.expected_errors.load();
    session_losses += slot.session_losses.load();
    if (slot.journal.state.load() != kIdle) Error(absl::StrCat("slot ", i, ": journal not idle"));
    if (slot.drained.load() != 1) Error(absl::StrCat("slot ", i, ": not drained"));
    for (const StoredObject& o : slot.owned) {
      if (o.key != 0) Error(absl::StrCat("slot ", i, ": still owns ", Hex(o.key)));
    }
    for (const StoredObject& n : slot.names) {
      if (n.key != 0) Error(absl::StrCat("slot ", i, ": still binds a name"));
    }
    for (uint32_t s = 0; s < workers; ++s) {
      if (slot.inbox[s].head.load() != slot.inbox[s].tail.load()) {
        Error(absl::StrCat("slot ", i, ": inbox from ", s, " is not empty"));
      }
    }
    const Counters& c = slot.counters;
    total.transactions += c.transactions;
    total.allocated += c.allocated;
    total.allocated_bytes += c.allocated_bytes;
    total.large_allocated += c.large_allocated;
    total.freed_own += c.freed_own;
    total.sent += c.sent;
    total.received += c.received;
    total.names_bound += c.names_bound;
    total.names_unbound += c.names_unbound;
    total.containers += c.containers;
    for (uint64_t e = 0; e < slot.in_doubt_count.load(); ++e) {
      const InDoubt& entry = slot.in_doubt[e];
      ++kinds[entry.kind];
      in_doubt[{i, entry.txn}].push_back(&entry);
    }
  }
  uint64_t landed = 0, not_landed = 0, no_witness = 0, live_freed = 0, not_live = 0;
  for (const auto& [where, entries] : in_doubt) {
    const std::string txn = absl::StrCat("slot ", where.first, " transaction ", Hex(where.second));
    const InDoubt* witness = nullptr;
    for (const InDoubt* e : entries) {
      if (e->kind == kWitness) witness = e;
    }
    // kLive/kNotLive of the witness: did the transaction's sync land?
    std::optional<bool> synced;
    if (witness != nullptr) {
      absl::StatusOr<Liveness> live = ProbeAndFree(Load(witness->object));
      if (!live.ok()) return Fail(absl::StrCat(txn, ": ", live.status().ToString()));
      synced = *live == Liveness::kLive;
      ++(*synced ? landed : not_landed);
      ++(*synced ? live_freed : not_live);
    } else {
      ++no_witness;
    }
    for (const InDoubt* e : entries) {
      if (e == witness || e->kind == kAdoptedBind) continue;
      const Obj object = Load(e->object);
      absl::StatusOr<Liveness> live = ProbeAndFree(object);
      if (!live.ok()) return Fail(absl::StrCat(txn, ": ", live.status().ToString()));
      ++(*live == Liveness::kLive ? live_freed : not_live);
      const std::string what = absl::StrCat(txn, ": object ", Hex(object.key), " (", object.size,
                                            " bytes, kind ", e->kind, ")");
      if (e->kind == kAllocated) {
        if (!synced.has_value()) {
          Error(what + ": an allocation without a witness");
        } else if (*synced && *live != Liveness::kLive) {
          Error(what + ": allocated and synced, but not live now (lost)");
        } else if (!*synced && *live == Liveness::kLive) {
          Error(what + ": allocated, never synced, yet live after its process ended");
        }
      } else if (synced.value_or(false) && *live == Liveness::kLive) {
        Error(what + ": freed before a sync that landed, yet still live (leaked)");
      }
    }
  }
  // The bookkeeping adds up: every allocation is freed, handed over or in
  // doubt; every hand-over received or in doubt; every name unbound.
  if (total.allocated != total.freed_own + total.sent + kinds[kFreeing]) {
    Error(absl::StrCat("allocated ", total.allocated, " != freed ", total.freed_own, " + sent ",
                       total.sent, " + in doubt ", kinds[kFreeing]));
  }
  if (total.sent != total.received + kinds[kConsuming]) {
    Error(absl::StrCat("sent ", total.sent, " != received ", total.received, " + in doubt ",
                       kinds[kConsuming]));
  }
  if (total.names_bound + kinds[kAdoptedBind] != total.names_unbound + kinds[kUnbinding]) {
    Error(absl::StrCat("names bound ", total.names_bound, " + adopted ", kinds[kAdoptedBind],
                       " != unbound ", total.names_unbound, " + in doubt ", kinds[kUnbinding]));
  }
  for (uint32_t i = 0; i < workers; ++i) {
    if (absl::Status s = heap_.destroy<Slot>(SlotName(i)); !s.ok()) {
      return Fail(absl::StrCat("free slot ", i, ": ", s.ToString()));
    }
  }
  if (absl::Status s = heap_.destroy<Registry>(kRegistryName); !s.ok()) return Fail(s.ToString());
  if (absl::StatusOr<uint64_t> epoch = heap_.sync(); !epoch.ok()) {
    return Fail(epoch.status().ToString());
  }
  HuntLeaks();
  std::printf("finished workers=%u incarnations=%" PRIu64 " transactions=%" PRIu64
              " allocated=%" PRIu64 " allocated_bytes=%" PRIu64 " large_allocated=%" PRIu64
              " freed_own=%" PRIu64 " handed_over=%" PRIu64 " received_freed=%" PRIu64
              " names_bound=%" PRIu64 " names_unbound=%" PRIu64 " containers=%" PRIu64
              " in_doubt_txns=%zu landed=%" PRIu64 " not_landed=%" PRIu64 " no_witness=%" PRIu64
              " in_doubt_objects=%" PRIu64 " in_doubt_live_freed=%" PRIu64
              " in_doubt_not_live=%" PRIu64 " adopted_names=%" PRIu64 " verified_objects=%" PRIu64
              " verified_bytes=%" PRIu64 " session_losses=%" PRIu64 " expected_errors=%" PRIu64
              " errors=%d\n",
              workers, incarnations, total.transactions, total.allocated, total.allocated_bytes,
              total.large_allocated, total.freed_own, total.sent, total.received, total.names_bound,
              total.names_unbound, total.containers, in_doubt.size(), landed, not_landed,
              no_witness, live_freed + not_live, live_freed, not_live, kinds[kAdoptedBind],
              verified_objects, verified_bytes, session_losses, expected_errors, errors_);
  return errors_ == 0 ? 0 : 3;
}

int Finish(Client& client, const std::string& heap_name) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status().ToString());
  const int status = Finisher(client, **heap).Run();
  if (absl::Status s = (*heap)->detach(); !s.ok()) return Fail(s.ToString());
  return status;
}

int Main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: soak_worker SOCKET HEAP setup|run|finish ...\n");
    return 2;
  }
  const std::string socket = argv[1];
  const std::string heap = argv[2];
  const std::string mode = argv[3];
  if (mode == "run") {
    uint32_t slot = 0;
    uint64_t seed = 0;
    if (argc != 8 || !absl::SimpleAtoi(argv[4], &slot) || slot >= kMaxWorkers ||
        !absl::SimpleAtoi(argv[7], &seed)) {
      return 2;
    }
    SoakControl* control = MapSoakControl(argv[5], /*create=*/false);
    FILE* log = std::fopen(argv[6], "a");
    if (control == nullptr || log == nullptr) return Fail("cannot open the control block or log");
    return Worker(socket, heap, slot, control, log, seed).Run();
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) return Fail(client.status().ToString());
  if (mode == "setup") {
    uint32_t workers = 0;
    if (argc < 5 || argc > 6 || !absl::SimpleAtoi(argv[4], &workers)) return 2;
    if (argc == 6 && std::string(argv[5]) != "fixed") return 2;
    return Setup(**client, heap, workers, /*fixed_address=*/argc == 6);
  }
  if (mode == "finish") return Finish(**client, heap);
  return 2;
}

}  // namespace
}  // namespace soak
}  // namespace heapd

int main(int argc, char** argv) { return heapd::soak::Main(argc, argv); }
