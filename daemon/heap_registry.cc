#include "daemon/heap_registry.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/descriptor_room.h"
#include "heap/data_file.h"
#include "heap/heap_dir.h"
#include "heap/metadata_store.h"
#include "snapshot/block_store.h"
#include "snapshot/snapshot_store.h"
#include "spdlog/spdlog.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/own_directory.h"
#include "util/random_name.h"
#include "util/unique_fd.h"

namespace heapd {

std::shared_ptr<ServedHeap> MakeServedHeap(const std::string& name, const std::string& storage,
                                           std::unique_ptr<PersistentHeap> heap) {
  const bool reflink = ReflinkSupported(heap->dir());
  auto served = std::make_shared<ServedHeap>();
  served->name = name;
  served->storage = storage;
  served->heap = std::move(heap);
  served->reflink = reflink;
  served->incarnation = RandomName();
  return served;
}

void ServedHeap::WriterStarts() {
  ++writers_;
  ++content_generation_;
}

void ServedHeap::WriterDidNotStart() { --writers_; }

void ServedHeap::WriterEnded() {
  ++content_generation_;
  --writers_;
}

std::string ServedHeap::UnchangedToken() const {
  const uint64_t generation = content_generation_.load();
  if (writers_.load() != 0) return "";
  return absl::StrCat(incarnation, "/", generation);
}

void ServedHeap::Progressed() {
  absl::MutexLock lock(&progress_mu_);
  ++progress_;
}

uint64_t ServedHeap::progress() const {
  absl::MutexLock lock(&progress_mu_);
  return progress_;
}

void ServedHeap::AwaitProgress(uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&progress_mu_);
  auto moved = [this, seen]()
                   ABSL_SHARED_LOCKS_REQUIRED(progress_mu_) { return progress_ != seen; };
  progress_mu_.AwaitWithDeadline(absl::Condition(&moved), deadline);
}

HeapRegistry::Reservation::~Reservation() {
  if (registry_ != nullptr) registry_->Release(name_);
}

HeapRegistry::Reservation::Reservation(Reservation&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)),
      name_(std::move(other.name_)),
      storage_(std::move(other.storage_)),
      fixed_base_(other.fixed_base_) {}

namespace {

// The fixed address range the heap directory `dir` records, if its
// checkpoint reads and records one (heapd's own directory: trusted as far
// as ValidateFixedBase).
std::optional<HeldRange> RecordedFixedRange(const std::string& dir) {
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return std::nullopt;
  absl::StatusOr<std::string> bytes = ReadFileAt(fd.get(), kCheckpointFileName, uint64_t{1} << 30);
  if (!bytes.ok()) return std::nullopt;
  absl::StatusOr<Checkpoint> checkpoint = DecodeCheckpointFile(*bytes, dir);
  if (!checkpoint.ok() || checkpoint->config.fixed_base == 0 ||
      !ValidateFixedBase(checkpoint->config.fixed_base, checkpoint->config.max_size).ok()) {
    return std::nullopt;
  }
  return HeldRange{FixedRangeOf(checkpoint->config.fixed_base, checkpoint->config.max_size),
                   checkpoint->config.owner_uid};
}

}  // namespace

absl::StatusOr<std::unique_ptr<HeapRegistry>> HeapRegistry::Open(const std::string& state_dir,
                                                                 HeapOptions options,
                                                                 UserLimits limits) {
  return Open(std::vector<StorageTier>{{kDefaultTierName, state_dir}}, options, limits);
}

absl::StatusOr<std::unique_ptr<HeapRegistry>> HeapRegistry::Open(std::vector<StorageTier> tiers,
                                                                 HeapOptions options,
                                                                 UserLimits limits) {
  if (tiers.empty()) return absl::InvalidArgumentError("no storage tier to keep heaps on");
  for (const StorageTier& tier : tiers) {
    const std::string what = absl::StrCat("storage tier ", tier.name);
    if (absl::Status s = MakeOwnDirectory(tier.root, 0700, what).status(); !s.ok()) return s;
    if (absl::Status s = MakeOwnDirectory(HeapsDirOf(tier), 0700, what).status(); !s.ok()) {
      return s;
    }
  }
  // One directory given as two tiers (a symlink, a bind mount) would show
  // every heap twice.
  for (size_t i = 0; i < tiers.size(); ++i) {
    struct stat one;
    if (stat(tiers[i].root.c_str(), &one) != 0) {
      return ErrnoStatus(errno, absl::StrCat("stat storage tier ", tiers[i].name));
    }
    for (size_t j = 0; j < i; ++j) {
      struct stat other;
      if (stat(tiers[j].root.c_str(), &other) == 0 && other.st_dev == one.st_dev &&
          other.st_ino == one.st_ino) {
        return absl::InvalidArgumentError(absl::StrCat("storage tiers ", tiers[j].name, " and ",
                                                       tiers[i].name, " are the same directory"));
      }
    }
  }
  std::unique_ptr<HeapRegistry> registry(new HeapRegistry(std::move(tiers), options, limits));
  absl::MutexLock lock(&registry->mu_);
  // Every tier's heap directories first: a name found on two tiers is
  // opened on neither.
  std::map<std::string, std::vector<const StorageTier*>> found;
  for (const StorageTier& tier : registry->tiers_) {
    const std::string heaps_dir = HeapsDirOf(tier);
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(heaps_dir, error)) {
      const std::string name = entry.path().filename();
      if (IsHiddenHeapDirName(name)) {
        // Left by a creation, restore or removal that a crash interrupted.
        std::error_code ignored;
        std::filesystem::remove_all(entry.path(), ignored);
        spdlog::warn("removed {}, left by an interrupted creation, restore or removal",
                     entry.path().string());
        continue;
      }
      if (!entry.is_symlink() && !entry.is_directory()) continue;
      if (entry.is_symlink() || !ValidateHeapName(name).ok()) {
        spdlog::warn("{} is not a heap; left alone", entry.path().string());
        continue;
      }
      found[name].push_back(&tier);
    }
    if (error) return ErrnoStatus(error.value(), absl::StrCat("list ", heaps_dir));
  }
  for (const auto& [name, on] : found) {
    if (on.size() > 1) {
      std::vector<std::string> names;
      for (const StorageTier* tier : on) names.push_back(tier->name);
      const absl::Status twice = absl::FailedPreconditionError(
          absl::StrCat("a heap of this name is on tiers ", absl::StrJoin(names, " and "),
                       "; none is served until all but one are moved or removed"));
      spdlog::error("heap {}: {}", name, std::string(twice.message()));
      registry->broken_.emplace(name, twice);
      continue;
    }
    const StorageTier& tier = *on.front();
    absl::StatusOr<std::unique_ptr<PersistentHeap>> heap =
        PersistentHeap::Open(absl::StrCat(HeapsDirOf(tier), "/", name), options);
    if (!heap.ok()) {
      spdlog::error("heap {} cannot be opened and is left as it is: {}", name,
                    heap.status().ToString());
      registry->broken_.emplace(name, heap.status());
      if (std::optional<HeldRange> range =
              RecordedFixedRange(absl::StrCat(HeapsDirOf(tier), "/", name))) {
        registry->broken_ranges_.emplace(name, *range);
      }
      continue;
    }
    spdlog::info("opened heap {} on tier {} at epoch {}", name, tier.name, (*heap)->epoch());
    registry->heaps_.emplace(name, MakeServedHeap(name, tier.name, *std::move(heap)));
  }
  registry->RefuseOverlappingRangesLocked();
  return registry;
}

void HeapRegistry::RefuseOverlappingRangesLocked() {
  // Two heaps recording overlapping ranges (a heap directory copied by
  // hand; a heap that failed to open holds its range too): no served one
  // of them stays served, since which is the rightful owner cannot be
  // known (a restored heap's records come from its snapshot).
  const std::vector<std::pair<std::string, AddressRange>> ranges = FixedRangesLocked("");
  std::map<std::string, std::string> clashes;  // heap -> one it overlaps
  for (size_t i = 0; i < ranges.size(); ++i) {
    for (size_t j = i + 1; j < ranges.size(); ++j) {
      if (!ranges[i].second.Overlaps(ranges[j].second)) continue;
      clashes.emplace(ranges[i].first, ranges[j].first);
      clashes.emplace(ranges[j].first, ranges[i].first);
    }
  }
  for (const auto& [name, other] : clashes) {
    auto it = heaps_.find(name);
    if (it == heaps_.end()) continue;  // a heap that failed to open already
    const AddressRange range =
        FixedRangeOf(it->second->heap->config().fixed_base, it->second->heap->config().max_size);
    const absl::Status clash = absl::FailedPreconditionError(
        absl::StrCat("its fixed address range ", RangeString(range), " overlaps heap ", other,
                     "'s; neither is served until one is removed"));
    spdlog::error("heap {}: {}", name, std::string(clash.message()));
    // Still held: no third heap takes it.
    broken_ranges_.emplace(name, HeldRange{range, it->second->heap->config().owner_uid});
    heaps_.erase(it);
    broken_.emplace(name, clash);
  }
}

bool HeapRegistry::HasDirectoryOn(const StorageTier& tier, absl::string_view name) {
  std::error_code error;
  return std::filesystem::symlink_status(absl::StrCat(HeapsDirOf(tier), "/", name), error).type() !=
             std::filesystem::file_type::not_found &&
         !error;
}

const StorageTier* HeapRegistry::FindTier(absl::string_view storage) const {
  if (storage.empty()) return &tiers_.front();
  for (const StorageTier& tier : tiers_) {
    if (tier.name == storage) return &tier;
  }
  return nullptr;
}

absl::StatusOr<std::string> HeapRegistry::HeapsDir(absl::string_view storage) const {
  const StorageTier* tier = FindTier(storage);
  if (tier == nullptr) return ChooseStorage("", storage).status();
  return HeapsDirOf(*tier);
}

absl::StatusOr<std::string> HeapRegistry::ChooseStorage(const std::string& name,
                                                        absl::string_view asked,
                                                        bool replacing) const {
  if (asked.empty()) {
    if (replacing) {
      absl::MutexLock lock(&mu_);
      if (auto it = heaps_.find(name); it != heaps_.end()) return it->second->storage;
    }
    return tiers_.front().name;
  }
  if (FindTier(asked) != nullptr) return std::string(asked);
  std::vector<std::string> names;
  for (const StorageTier& tier : tiers_) names.push_back(tier.name);
  return absl::InvalidArgumentError(absl::StrCat("storage: heapd has no tier named '",
                                                 absl::CHexEscape(asked), "'; its tiers are ",
                                                 absl::StrJoin(names, ", ")));
}

HeapRegistry::Usage HeapRegistry::UsageOfLocked(uint32_t uid) const {
  Usage usage;
  auto add = [&usage](uint64_t max_size, uint64_t fixed_base) {
    ++usage.heaps;
    usage.bytes += max_size;
    if (fixed_base != 0) usage.fixed_bytes += FixedRangeBytes(max_size);
  };
  for (const auto& [name, served] : heaps_) {
    const HeapConfig& config = served->heap->config();
    if (config.owner_uid == uid) add(config.max_size, config.fixed_base);
  }
  for (const auto& [name, reserved] : reserved_) {
    if (reserved.owner_uid == uid) add(reserved.max_size, reserved.fixed_base);
  }
  // Heaps that failed to open still hold their ranges (only the share of
  // the window counts them: they are not served).
  for (const auto& [name, held] : broken_ranges_) {
    if (held.owner_uid == uid) usage.fixed_bytes += held.range.end - held.range.begin;
  }
  return usage;
}

std::vector<std::pair<std::string, AddressRange>> HeapRegistry::FixedRangesLocked(
    absl::string_view except) const {
  std::vector<std::pair<std::string, AddressRange>> ranges;
  for (const auto& [name, served] : heaps_) {
    const HeapConfig& config = served->heap->config();
    if (config.fixed_base == 0 || name == except) continue;
    ranges.emplace_back(name, FixedRangeOf(config.fixed_base, config.max_size));
  }
  for (const auto& [name, reserved] : reserved_) {
    if (reserved.fixed_base == 0 || name == except) continue;
    ranges.emplace_back(name, FixedRangeOf(reserved.fixed_base, reserved.max_size));
  }
  for (const auto& [name, held] : broken_ranges_) {
    if (name != except) ranges.emplace_back(name, held.range);
  }
  return ranges;
}

uint64_t HeapRegistry::FixedBytesHeld() const {
  absl::MutexLock lock(&mu_);
  uint64_t held = 0;
  for (const auto& [name, range] : FixedRangesLocked("")) held += range.end - range.begin;
  return held;
}

absl::StatusOr<uint64_t> HeapRegistry::PlaceLocked(const std::string& name, uint64_t max_size,
                                                   FixedPlacement fixed, bool replacing) const {
  if (!fixed.fixed) return 0;
  // A replaced heap gives its range to its replacement.
  const std::vector<std::pair<std::string, AddressRange>> held =
      FixedRangesLocked(replacing ? absl::string_view(name) : absl::string_view());
  if (fixed.base == 0) {
    std::vector<AddressRange> taken;
    for (const auto& [holder, range] : held) taken.push_back(range);
    absl::StatusOr<uint64_t> base = FindFixedBase(std::move(taken), max_size);
    if (!base.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("heap ", name, ": ", base.status().message()));
    }
    return base;
  }
  if (absl::Status s = ValidateFixedBase(fixed.base, max_size); !s.ok()) return s;
  const AddressRange wanted = FixedRangeOf(fixed.base, max_size);
  for (const auto& [holder, range] : held) {
    if (range.Overlaps(wanted)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "heap ", name, " maps at the fixed address range ", RangeString(wanted),
          " recorded with it, and heap ", holder, " holds ", RangeString(range),
          " on this node; remove or move heap ", holder, " first, or restore over it (replace)"));
    }
  }
  return fixed.base;
}

uint64_t HeapRegistry::HeapBytesLeft(uint32_t uid) const {
  if (uid == 0) return UINT64_MAX;
  absl::MutexLock lock(&mu_);
  const Usage usage = UsageOfLocked(uid);
  return usage.bytes >= limits_.heap_bytes ? 0 : limits_.heap_bytes - usage.bytes;
}

absl::StatusOr<HeapRegistry::Reservation> HeapRegistry::Reserve(const std::string& name,
                                                                uint32_t owner_uid,
                                                                uint64_t max_size, bool replacing,
                                                                const std::string& storage,
                                                                FixedPlacement fixed) {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  const StorageTier* tier = FindTier(storage);
  if (tier == nullptr) return ChooseStorage(name, storage).status();
  // Something heapd does not serve (left alone at start) may hold the
  // name on a tier: a heap made on another would be a second copy. Looked
  // up before the lock, which Get and attaches wait for; only heapd makes
  // entries there, under a reservation.
  const StorageTier* held_on = nullptr;
  for (const StorageTier& t : tiers_) {
    if (replacing) break;
    if (HasDirectoryOn(t, name)) {
      held_on = &t;
      break;
    }
  }
  // Counting descriptors takes a few ms at 10^4 heaps: before the lock. A
  // replaced heap gives back what its replacement takes.
  if (!replacing) {
    if (absl::Status s = CheckDescriptorRoom(name); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  auto existing = heaps_.find(name);
  if (reserved_.count(name) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("heap ", name, " is being made, restored or removed by another call"));
  }
  if (!replacing && (existing != heaps_.end() || broken_.count(name) != 0)) {
    return absl::AlreadyExistsError(absl::StrCat("heap ", name, " already exists"));
  }
  if (held_on != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("heap ", name, ": storage tier ", held_on->name,
                                                 " holds an entry of that name"));
  }
  if (owner_uid != 0) {
    Usage usage = UsageOfLocked(owner_uid);
    if (replacing && existing != heaps_.end() &&
        existing->second->heap->config().owner_uid == owner_uid) {
      const HeapConfig& replaced = existing->second->heap->config();
      --usage.heaps;
      usage.bytes -= replaced.max_size;
      if (replaced.fixed_base != 0) usage.fixed_bytes -= FixedRangeBytes(replaced.max_size);
    }
    if (usage.heaps >= limits_.heaps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("uid ", owner_uid, " owns ", usage.heaps,
                       " heaps, its limit (--max_heaps_per_user); heap ", name, " not made"));
    }
    if (usage.bytes + max_size > limits_.heap_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", owner_uid, "'s heaps have ", usage.bytes, " bytes of maximum size; heap ", name,
          " of ", max_size, " more would pass its limit of ", limits_.heap_bytes,
          " (--max_heap_bytes_per_user)"));
    }
    if (fixed.fixed &&
        usage.fixed_bytes + FixedRangeBytes(max_size) > limits_.fixed_address_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", owner_uid, "'s fixed-address heaps hold ", usage.fixed_bytes,
          " bytes of the node's fixed-address window; heap ", name, " would take ",
          FixedRangeBytes(max_size), " more (its maximum size and a guard), past the limit of ",
          limits_.fixed_address_bytes, " (--max_fixed_address_bytes_per_user)"));
    }
  }
  absl::StatusOr<uint64_t> fixed_base = PlaceLocked(name, max_size, fixed, replacing);
  if (!fixed_base.ok()) return fixed_base.status();
  reserved_[name] = {owner_uid, max_size, *fixed_base};
  return Reservation(this, name, tier->name, *fixed_base);
}

void HeapRegistry::Release(const std::string& name) {
  absl::MutexLock lock(&mu_);
  reserved_.erase(name);
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::Add(
    Reservation reservation, std::unique_ptr<PersistentHeap> heap) {
  std::shared_ptr<ServedHeap> served =
      MakeServedHeap(reservation.name(), reservation.storage(), std::move(heap));
  absl::MutexLock lock(&mu_);
  reserved_.erase(reservation.name());
  reservation.registry_ = nullptr;
  heaps_.emplace(served->name, served);
  return served;
}

absl::StatusOr<ImageMode> HeapRegistry::ChooseImage(const std::string& name,
                                                    std::optional<ImageMode> asked,
                                                    const std::string& storage,
                                                    uint64_t max_size) const {
  const StorageTier* tier = FindTier(storage);
  if (tier == nullptr) return ChooseStorage(name, storage).status();
  const std::string heaps_dir = HeapsDirOf(*tier);
  if (!asked.has_value()) return ImageModeFor(heaps_dir, options_, max_size);
  if (*asked == ImageMode::kDirect) return ImageMode::kDirect;
  if (!options_.track_contents) {
    return absl::FailedPreconditionError(
        absl::StrCat("heap ", name,
                     ": a working image needs content tracking, and heapd runs "
                     "with --track_contents=false"));
  }
  if (options_.working_image_max_bytes != 0 && max_size > options_.working_image_max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heap ", name, ": its maximum size, ", max_size,
        " bytes, is above heapd's per-heap working-image budget of ",
        options_.working_image_max_bytes,
        " (--working_image_max_bytes): its working image could outgrow memory; make it direct "
        "or smaller"));
  }
  HeapOptions forced = options_;
  forced.working_images = true;
  if (ImageModeFor(heaps_dir, forced) != ImageMode::kWorkingImage) {
    return absl::FailedPreconditionError(
        absl::StrCat("heap ", name, ": storage tier ", tier->name,
                     " is on tmpfs, where contents roll back without a working image; one would "
                     "hold the heap in memory twice"));
  }
  return ImageMode::kWorkingImage;
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::Create(Reservation reservation,
                                                                 const HeapConfig& config) {
  // Built on disk with no lock held: Get and List go on meanwhile.
  absl::StatusOr<std::string> heaps_dir = HeapsDir(reservation.storage());
  if (!heaps_dir.ok()) return heaps_dir.status();
  HeapConfig placed = config;
  placed.fixed_base = reservation.fixed_base();
  absl::StatusOr<std::unique_ptr<PersistentHeap>> heap =
      PersistentHeap::Create(absl::StrCat(*heaps_dir, "/", reservation.name()), placed, options_);
  if (!heap.ok()) return heap.status();
  return Add(std::move(reservation), *std::move(heap));
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::AddRestored(Reservation reservation,
                                                                      RestoredHeapDir& restored) {
  absl::StatusOr<std::string> heaps_dir = HeapsDir(reservation.storage());
  if (!heaps_dir.ok()) return heaps_dir.status();
  if (absl::Status s = restored.Commit(reservation.name()); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<PersistentHeap>> heap =
      PersistentHeap::Open(absl::StrCat(*heaps_dir, "/", reservation.name()), options_);
  if (!heap.ok()) return AddBroken(std::move(reservation), heap.status());
  if ((*heap)->config().fixed_base != reservation.fixed_base()) {
    absl::Status moved =
        absl::InternalError(absl::StrCat("restored heap ", reservation.name(),
                                         " opened at another fixed address than was reserved"));
    return AddBroken(std::move(reservation), std::move(moved));
  }
  return Add(std::move(reservation), *std::move(heap));
}

absl::Status HeapRegistry::AddBroken(Reservation reservation, absl::Status why) {
  spdlog::error("heap {} cannot be opened and is left as it is: {}", reservation.name(),
                why.ToString());
  absl::MutexLock lock(&mu_);
  auto reserved = reserved_.find(reservation.name());
  if (reserved != reserved_.end()) {
    if (reserved->second.fixed_base != 0) {
      broken_ranges_.emplace(reservation.name(), HeldRange{FixedRangeOf(reserved->second.fixed_base,
                                                                        reserved->second.max_size),
                                                           reserved->second.owner_uid});
    }
    reserved_.erase(reserved);
  }
  reservation.registry_ = nullptr;
  broken_.emplace(reservation.name(), why);
  return why;
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::Get(absl::string_view name) const {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (auto it = heaps_.find(name); it != heaps_.end()) return it->second;
  if (auto it = broken_.find(name); it != broken_.end()) {
    return absl::Status(it->second.code(),
                        absl::StrCat("heap ", name, " failed to open: ", it->second.message()));
  }
  if (reserved_.count(name) != 0) {
    return absl::UnavailableError(
        absl::StrCat("heap ", name, " is being made or removed; try again"));
  }
  return absl::NotFoundError(absl::StrCat("no heap named ", name));
}

absl::StatusOr<HeapRegistry::Removed> HeapRegistry::Remove(absl::string_view name) {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  Removed removed;
  absl::MutexLock lock(&mu_);
  auto it = heaps_.find(name);
  auto broken = broken_.find(name);
  if (it == heaps_.end() && broken == broken_.end()) {
    return absl::NotFoundError(absl::StrCat("no heap named ", name));
  }
  // A heap that failed to open: the first tier holding its name (one
  // found on several tiers is removed from them one at a time).
  const StorageTier* tier = nullptr;
  for (const StorageTier& t : tiers_) {
    if (it != heaps_.end() ? t.name == it->second->storage
                           : std::filesystem::is_directory(std::filesystem::symlink_status(
                                 HeapsDirOf(t) + "/" + std::string(name)))) {
      tier = &t;
      break;
    }
  }
  if (tier == nullptr) return absl::NotFoundError(absl::StrCat("no heap named ", name));
  removed.heaps_dir = HeapsDirOf(*tier);
  const std::string dir = absl::StrCat(removed.heaps_dir, "/", name);
  removed.dir =
      absl::StrCat(removed.heaps_dir, "/", HiddenHeapDirName(HiddenPurpose::kRemoving, name));
  // Renamed first, so a crash while deleting leaves no heap behind (Open
  // sweeps names starting with '.').
  if (rename(dir.c_str(), removed.dir.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", dir, " to ", removed.dir));
  }
  if (it != heaps_.end()) {
    removed.closing = std::move(it->second);
    heaps_.erase(it);
  }
  if (broken != broken_.end()) {
    broken_.erase(broken);
    broken_ranges_.erase(std::string(name));
    // A copy left on another tier: not served before heapd restarts, and
    // its name not free meanwhile.
    for (const StorageTier& t : tiers_) {
      if (&t != tier && HasDirectoryOn(t, name)) {
        broken_.emplace(std::string(name),
                        absl::FailedPreconditionError(absl::StrCat(
                            "its copy on tier ", tier->name, " was removed; the one on tier ",
                            t.name, " is served once heapd restarts")));
        break;
      }
    }
  }
  // Until the heap is marked removed (no snapshot of it under way, none
  // to come), no other heap may take the name: a snapshot's manifest
  // would name the new heap for the old one's files.
  if (reserved_.count(name) == 0) {
    reserved_[std::string(name)] = {0, 0, 0};  // counts against no user, holds no range
    removed.name_held.reset(new Reservation(this, std::string(name), tier->name, 0));
  }
  return removed;
}

void HeapRegistry::DeleteRemoved(Removed removed) {
  // Before its name can go to another heap: a snapshot of it under way ends
  // first, none starts, and its growth ahead stops.
  if (removed.closing != nullptr) removed.closing->heap->MarkRemoved();
  removed.name_held.reset();
  // Closed here, with no lock held, unless a call still using it (a stat, a
  // lookup on the fd server) holds it: then that call closes it, which no
  // longer waits for anything.
  removed.closing.reset();
  // The rename made durable first: a crash now leaves the heap removed.
  if (absl::Status s = SyncDirectory(removed.heaps_dir); !s.ok()) {
    spdlog::warn("removing {}: {}", removed.dir, s.ToString());
  }
  std::error_code error;
  std::filesystem::remove_all(removed.dir, error);
  if (error) spdlog::warn("removing {}: {}", removed.dir, error.message());
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::GetMade(absl::string_view name,
                                                                  absl::Duration wait) const {
  {
    absl::MutexLock lock(&mu_);
    auto made = [this, name]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return reserved_.find(name) == reserved_.end();
    };
    mu_.AwaitWithTimeout(absl::Condition(&made), wait);
  }
  return Get(name);
}

std::vector<std::shared_ptr<ServedHeap>> HeapRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<ServedHeap>> heaps;
  for (const auto& [name, heap] : heaps_) heaps.push_back(heap);
  return heaps;
}

std::map<std::string, absl::Status> HeapRegistry::Broken() const {
  absl::MutexLock lock(&mu_);
  return {broken_.begin(), broken_.end()};
}

absl::Status HeapRegistry::SyncAll() {
  absl::Status first;
  for (const std::shared_ptr<ServedHeap>& served : List()) {
    absl::StatusOr<SyncResult> result = served->heap->Sync(/*client=*/0, {});
    if (!result.ok()) {
      spdlog::error("sync of heap {} failed: {}", served->name, result.status().ToString());
      first.Update(result.status());
    }
  }
  return first;
}

}  // namespace heapd
