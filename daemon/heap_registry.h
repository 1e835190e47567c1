// HeapRegistry: the heaps on heapd's storage tiers (daemon/storage_tiers.h),
// by name: one name space over every tier. Every heap is opened when the
// daemon starts and stays open until it is removed or the daemon stops; a
// heap that cannot be opened (corrupt metadata, or its name found on two
// tiers) is reported with its error and left alone on disk.
//
// Layout: TIER_ROOT/heaps/NAME/ is one heap (heap/heap_dir.h). Heaps are
// built under hidden names and removed through one; a hidden name is never
// a heap name, so a crash midway leaves nothing that is served, and Open
// sweeps such leftovers away.
//
// The registry owns the per-user heap limits (daemon/limits.h): a name is
// reserved, with its owner's heap count and bytes, before the heap is
// built, so concurrent creations cannot pass a limit together, and no lock
// is held while a heap is built on disk.
// Thread-safe.
#ifndef HEAPD_DAEMON_HEAP_REGISTRY_H_
#define HEAPD_DAEMON_HEAP_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/limits.h"
#include "daemon/storage_tiers.h"
#include "heap/fixed_address.h"
#include "heap/heap.h"
#include "heap/heap_name.h"

namespace heapd {

class RestoredHeapDir;

// A heap the daemon serves. Shared by the registry and the sessions on it.
class ServedHeap {
 public:
  std::string name;
  std::string storage;  // its tier's name
  std::unique_ptr<PersistentHeap> heap;
  bool reflink = false;  // its file system can clone files (cheap snapshots)
  // Which heap this is in this heapd's life (random: a heap removed and
  // made again, or heapd restarted, is another).
  std::string incarnation;

  // The writers' protocol, by which heapd knows the data file unchanged
  // (snapshot stores reuse a part then). A read-write session calls
  // WriterStarts before it can write (then WriterDidNotStart if it did not
  // start after all) and WriterEnded once it has ended and heapd put its
  // pages back. A process that keeps a writable descriptor after it
  // detached is not seen.
  void WriterStarts();
  void WriterDidNotStart();
  void WriterEnded();
  // "incarnation/generation", the same while no write can have happened;
  // empty while a writer is attached (or not done ending).
  std::string UnchangedToken() const;

  // A session on this heap synced or was taken out of service: wakes
  // AwaitProgress. progress() counts these.
  void Progressed() ABSL_LOCKS_EXCLUDED(progress_mu_);
  uint64_t progress() const ABSL_LOCKS_EXCLUDED(progress_mu_);
  // Returns once progress() is past `seen`, or at `deadline`.
  void AwaitProgress(uint64_t seen, absl::Time deadline) const ABSL_LOCKS_EXCLUDED(progress_mu_);

 private:
  // Bumped by WriterStarts and WriterEnded. Read before writers_, so that
  // a writer starting after the read makes the token stale.
  std::atomic<uint64_t> content_generation_{0};
  // Writers started and not yet ended (counted before the bump at their
  // start, uncounted after the bump at their end).
  std::atomic<int> writers_{0};
  mutable absl::Mutex progress_mu_;
  uint64_t progress_ ABSL_GUARDED_BY(progress_mu_) = 0;
};

// `heap` served as `name` from tier `storage`, with its file system's
// reflink support probed.
std::shared_ptr<ServedHeap> MakeServedHeap(const std::string& name, const std::string& storage,
                                           std::unique_ptr<PersistentHeap> heap);

// A fixed address range a heap that failed to open holds, and whose heap it
// was.
struct HeldRange {
  AddressRange range;
  uint32_t owner_uid = 0;
};

// Where a new heap maps (heap/fixed_address.h).
struct FixedPlacement {
  bool fixed = false;
  // With `fixed`: the base a restored heap recorded, kept; 0: heapd picks
  // the lowest free range of its window.
  uint64_t base = 0;
};

class HeapRegistry {
 public:
  // A name held for a heap being built, with its owner's share of the
  // limits and its fixed address range if it has one; released when it
  // goes unless the heap was added.
  class Reservation {
   public:
    ~Reservation();
    Reservation(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    const std::string& name() const { return name_; }
    const std::string& storage() const { return storage_; }
    uint64_t fixed_base() const { return fixed_base_; }  // 0: not fixed

   private:
    friend class HeapRegistry;
    Reservation(HeapRegistry* registry, std::string name, std::string storage, uint64_t fixed_base)
        : registry_(registry),
          name_(std::move(name)),
          storage_(std::move(storage)),
          fixed_base_(fixed_base) {}
    HeapRegistry* registry_;
    std::string name_;
    std::string storage_;  // the tier it is made on
    uint64_t fixed_base_;
  };

  // Opens every heap on `tiers` (the first is the default; each root and
  // its heaps/ are created 0700 if missing, and must belong to this
  // process's user and be writable by no one else), after removing
  // leftovers of interrupted creations, restores and removals.
  static absl::StatusOr<std::unique_ptr<HeapRegistry>> Open(std::vector<StorageTier> tiers,
                                                            HeapOptions options = {},
                                                            UserLimits limits = {});
  // Open with `state_dir` as the only tier (kDefaultTierName).
  static absl::StatusOr<std::unique_ptr<HeapRegistry>> Open(const std::string& state_dir,
                                                            HeapOptions options = {},
                                                            UserLimits limits = {});

  // The tier a new heap `name` goes on: `asked`, else the tier of the heap
  // of that name it replaces (if `replacing`), else the default tier.
  // INVALID_ARGUMENT naming the tiers heapd has for an unknown one.
  absl::StatusOr<std::string> ChooseStorage(const std::string& name, absl::string_view asked,
                                            bool replacing = false) const;

  // Reserves `name` for a new heap of `owner_uid` with `max_size` on tier
  // `storage` (as ChooseStorage said). ALREADY_EXISTS if a heap has that
  // name on any tier (or one is being made), unless `replacing` it: then the
  // existing heap does not count against the limits (the caller removes it
  // before adding the new one). RESOURCE_EXHAUSTED naming the limit the
  // owner would pass (limits count heaps on every tier together).
  // A `fixed` heap also holds its address range from here on: the one
  // `fixed` recorded (FAILED_PRECONDITION naming the heap that holds it;
  // the heap replaced does not), else the lowest free one
  // (RESOURCE_EXHAUSTED when the window is full).
  absl::StatusOr<Reservation> Reserve(const std::string& name, uint32_t owner_uid,
                                      uint64_t max_size, bool replacing = false,
                                      const std::string& storage = "", FixedPlacement fixed = {});

  // What a new heap `name` of at most `max_size` bytes on tier `storage`
  // maps: `asked`, else the default (ImageModeFor the tier and size).
  // FAILED_PRECONDITION, saying why, for a working image where heapd
  // cannot keep one: content tracking off, a tier on tmpfs (a working
  // image would hold the heap in memory twice), or a heap above the
  // per-heap budget (--working_image_max_bytes).
  absl::StatusOr<ImageMode> ChooseImage(const std::string& name, std::optional<ImageMode> asked,
                                        const std::string& storage = "",
                                        uint64_t max_size = 0) const;

  // Creates the reserved heap on its tier (config.image as ChooseImage
  // said, at the reservation's fixed address if it has one).
  absl::StatusOr<std::shared_ptr<ServedHeap>> Create(Reservation reservation,
                                                     const HeapConfig& config);

  // Renames the restored heap directory (built in the reservation's tier's
  // heaps_dir) into place as the reserved heap and opens it. One that then
  // fails to open stays as a heap that failed to open (Get says why, Remove
  // removes it), holding its fixed address range.
  absl::StatusOr<std::shared_ptr<ServedHeap>> AddRestored(Reservation reservation,
                                                          RestoredHeapDir& restored);

  // Bytes of maximum size `uid` may still give new heaps (root: no limit).
  uint64_t HeapBytesLeft(uint32_t uid) const;

  // The heap `name`; NOT_FOUND if there is none, or the error it failed to
  // open with; UNAVAILABLE while it is being made.
  absl::StatusOr<std::shared_ptr<ServedHeap>> Get(absl::string_view name) const;
  // Get, after waiting up to `wait` for a heap being made under that name.
  absl::StatusOr<std::shared_ptr<ServedHeap>> GetMade(absl::string_view name,
                                                      absl::Duration wait) const;

  // A heap Remove took out of service, for DeleteRemoved.
  struct Removed {
    std::string dir;                      // its directory's hidden name, whole
    std::string heaps_dir;                // the tier's directory it was in
    std::shared_ptr<ServedHeap> closing;  // null for a heap that failed to open
    // The name, held until the heap is marked removed (null if the caller
    // holds it already: a restore replacing the heap).
    std::unique_ptr<Reservation> name_held;
  };
  // Takes heap `name` out of service: its directory is renamed to a hidden
  // name, and the name stays reserved (no heap can be made under it) until
  // DeleteRemoved. No I/O but the rename; the heap is not closed yet.
  // REQUIRES: no session uses it (the caller checks).
  absl::StatusOr<Removed> Remove(absl::string_view name);
  // Marks a removed heap removed (waiting for a snapshot or growth under
  // way), lets its name go, closes it, makes the rename durable and deletes
  // the directory. Slow for a big heap: call it with no lock held.
  void DeleteRemoved(Removed removed);

  std::vector<std::shared_ptr<ServedHeap>> List() const;

  // Bytes of the fixed-address window held (heap/fixed_address.h): by
  // served heaps, reservations and heaps that failed to open.
  uint64_t FixedBytesHeld() const;

  // Heaps that failed to open, with why.
  std::map<std::string, absl::Status> Broken() const;

  // Persists an epoch of every heap (at shutdown); returns the first error.
  absl::Status SyncAll();

  // The heaps directory of tier `storage` (empty: the default tier), or
  // INVALID_ARGUMENT as ChooseStorage.
  absl::StatusOr<std::string> HeapsDir(absl::string_view storage = "") const;
  // The tiers, the default first.
  const std::vector<StorageTier>& tiers() const { return tiers_; }

 private:
  struct Usage {
    uint32_t heaps = 0;
    uint64_t bytes = 0;        // of maximum size
    uint64_t fixed_bytes = 0;  // of the fixed-address window
  };
  HeapRegistry(std::vector<StorageTier> tiers, HeapOptions options, UserLimits limits)
      : tiers_(std::move(tiers)), options_(options), limits_(limits) {}
  // The tier named `storage` (empty: the default), or null.
  const StorageTier* FindTier(absl::string_view storage) const;
  static std::string HeapsDirOf(const StorageTier& tier) { return tier.root + "/heaps"; }
  // Whether `tier`'s heaps directory has an entry `name` (of any kind).
  static bool HasDirectoryOn(const StorageTier& tier, absl::string_view name);
  void Release(const std::string& name);
  absl::StatusOr<std::shared_ptr<ServedHeap>> Add(Reservation reservation,
                                                  std::unique_ptr<PersistentHeap> heap);
  // The reserved heap's directory is in place but failed to open (`why`,
  // returned): it is listed as a heap that failed to open, holding its
  // fixed address range, until removed.
  absl::Status AddBroken(Reservation reservation, absl::Status why);
  Usage UsageOfLocked(uint32_t uid) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The fixed address ranges held, by heap name, except `except`'s.
  std::vector<std::pair<std::string, AddressRange>> FixedRangesLocked(
      absl::string_view except) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // At Open: served heaps whose fixed address ranges overlap another's go
  // to broken_.
  void RefuseOverlappingRangesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The base `fixed` gives heap `name` of `max_size` bytes (0: none).
  absl::StatusOr<uint64_t> PlaceLocked(const std::string& name, uint64_t max_size,
                                       FixedPlacement fixed, bool replacing) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::vector<StorageTier> tiers_;  // never empty
  const HeapOptions options_;
  const UserLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServedHeap>, std::less<>> heaps_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status, std::less<>> broken_ ABSL_GUARDED_BY(mu_);
  // The fixed address ranges heaps in broken_ record (those whose
  // checkpoint could be read): held, so no other heap takes them.
  std::map<std::string, HeldRange, std::less<>> broken_ranges_ ABSL_GUARDED_BY(mu_);
  // Names being built.
  struct Reserved {
    uint32_t owner_uid;
    uint64_t max_size;
    uint64_t fixed_base;  // 0: not fixed
  };
  std::map<std::string, Reserved, std::less<>> reserved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_HEAP_REGISTRY_H_
