#include "daemon/request_validation.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/size_class.h"
#include "heap/heap_name.h"
#include "heap/metadata_format.h"
#include "heap/name_table.h"
#include "snapshot/snapshot_format.h"

namespace heapd {
namespace {

using google::protobuf::RepeatedPtrField;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A check's error, with the field it was about named first.
absl::Status InField(absl::string_view field, const absl::Status& status) {
  return status.ok() ? status : Invalid(field, status.message());
}

absl::Status CheckSession(uint64_t session) {
  // Session ids start at 1: 0 is what a client that never attached sends.
  if (session == 0) return Invalid("session", "session 0 does not exist; attach first");
  return absl::OkStatus();
}

absl::Status CheckHeapName(absl::string_view field, absl::string_view name) {
  return InField(field, ValidateHeapName(name));
}

// An empty heap name means "every heap" or "the snapshot's own".
absl::Status CheckOptionalHeapName(absl::string_view field, absl::string_view name) {
  return name.empty() ? absl::OkStatus() : CheckHeapName(field, name);
}

absl::Status CheckSnapshotRef(absl::string_view name_field, absl::string_view name,
                              absl::string_view dir_field, absl::string_view dir) {
  if (absl::Status s = InField(name_field, ValidateHeapName(name, "snapshot")); !s.ok()) return s;
  return InField(dir_field, ValidateSnapshotDir(dir));
}

// A snapshot store: an absolute directory (there is no default store), and
// never together with a snapshot directory.
absl::Status CheckStoreDir(absl::string_view field, absl::string_view dir,
                           absl::string_view target_dir) {
  if (dir.empty()) return Invalid(field, absl::StrCat(field, " is empty"));
  if (!target_dir.empty()) {
    return Invalid(field, absl::StrCat(field, " and target_dir cannot both be given"));
  }
  return InField(field, ValidateSnapshotDir(dir));
}

// Fields that only a snapshot store gives meaning to.
absl::Status CheckStoreOnly(
    absl::string_view store_dir,
    std::initializer_list<std::pair<absl::string_view, absl::string_view>> fields) {
  for (const auto& [field, value] : fields) {
    if (store_dir.empty() && !value.empty()) {
      return Invalid(field, absl::StrCat(field, " is for snapshot stores; store_dir is empty"));
    }
    if (absl::Status s = CheckOptionalHeapName(field, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Settings of a heap to create; 0 means the default for each.
absl::Status CheckCreateSettings(absl::string_view size_field, uint64_t max_size,
                                 absl::string_view mode_field, uint32_t mode) {
  if (max_size > kMaxHeapBytes) {
    return Invalid(size_field, absl::StrCat("heap maximum size ", max_size,
                                            " is above the limit of ", kMaxHeapBytes));
  }
  if (mode > 0777) {
    return Invalid(mode_field, absl::StrFormat("heap mode 0%o has bits beyond 0777", mode));
  }
  return absl::OkStatus();
}

absl::Status CheckImage(absl::string_view field, int image) {
  if (!v1::ImageKind_IsValid(image)) {
    return Invalid(field, absl::StrCat("image kind ", image,
                                       " is none of IMAGE_UNKNOWN, IMAGE_DIRECT, IMAGE_WORKING"));
  }
  return absl::OkStatus();
}

// A storage tier's name (spelled as a heap name), or empty: the default.
absl::Status CheckStorage(absl::string_view field, absl::string_view storage) {
  if (storage.empty()) return absl::OkStatus();
  return InField(field, ValidateHeapName(storage, "storage tier"));
}

absl::Status CheckWants(absl::string_view field, const RepeatedPtrField<v1::LeaseWant>& wants) {
  if (wants.size() > static_cast<int>(kNumSizeClasses)) {
    return Invalid(field, absl::StrCat(wants.size(), " lease requests in one call; at most ",
                                       kNumSizeClasses));
  }
  std::set<uint32_t> offered;  // by the wants so far
  for (int i = 0; i < wants.size(); ++i) {
    const v1::LeaseWant& want = wants[i];
    if (want.size_class() >= kNumSizeClasses) {
      return Invalid(absl::StrCat(field, "[", i, "].size_class"),
                     absl::StrCat("size class ", want.size_class(), " does not exist (0..",
                                  kNumSizeClasses - 1, ")"));
    }
    if (want.count() == 0 || want.count() > kMaxLeasesPerWant) {
      return Invalid(
          absl::StrCat(field, "[", i, "].count"),
          absl::StrCat("lease count ", want.count(), " is not in 1..", kMaxLeasesPerWant));
    }
    if (static_cast<uint32_t>(want.reuse_size()) > want.count()) {
      return Invalid(absl::StrCat(field, "[", i, "].reuse"),
                     absl::StrCat(want.reuse_size(), " chunks offered for a lease of ",
                                  want.count(), "; at most as many as it asks for"));
    }
    for (uint32_t chunk : want.reuse()) {
      if (!offered.insert(chunk).second) {
        return Invalid(absl::StrCat(field, "[", i, "].reuse"),
                       absl::StrCat("chunk ", chunk, " is offered twice"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRequest(const v1::CreateHeapRequest& request) {
  if (absl::Status s = CheckHeapName("name", request.name()); !s.ok()) return s;
  if (absl::Status s = CheckImage("image", request.image()); !s.ok()) return s;
  if (absl::Status s = CheckStorage("storage", request.storage()); !s.ok()) return s;
  return CheckCreateSettings("max_size", request.max_size(), "mode", request.mode());
}

absl::Status ValidateRequest(const v1::ListHeapsRequest&) { return absl::OkStatus(); }

absl::Status ValidateRequest(const v1::StatHeapRequest& request) {
  return CheckHeapName("heap", request.heap());
}

absl::Status ValidateRequest(const v1::RemoveHeapRequest& request) {
  return CheckHeapName("heap", request.heap());
}

absl::Status ValidateRequest(const v1::AttachRequest& request) {
  const bool snapshot = !request.snapshot().empty();
  // Attaching a snapshot in place, `heap` is not used.
  if (!snapshot) {
    if (absl::Status s = CheckHeapName("heap", request.heap()); !s.ok()) return s;
  }
  if (absl::Status s = CheckWants("leases", request.leases()); !s.ok()) return s;
  if (absl::Status s = CheckImage("create_image", request.create_image()); !s.ok()) return s;
  if (absl::Status s = CheckStorage("create_storage", request.create_storage()); !s.ok()) return s;
  if (request.read_only() && request.leases_size() != 0) {
    return Invalid("leases", "a read-only attach cannot lease chunks");
  }
  if (request.lookup_size() > kMaxLookupsPerAttach) {
    return Invalid("lookup", absl::StrCat(request.lookup_size(), " names to look up; at most ",
                                          kMaxLookupsPerAttach));
  }
  for (int i = 0; i < request.lookup_size(); ++i) {
    if (absl::Status s = InField(absl::StrCat("lookup[", i, "]"), ValidateName(request.lookup(i)));
        !s.ok()) {
      return s;
    }
  }
  if (snapshot) {
    if (absl::Status s = CheckSnapshotRef("snapshot", request.snapshot(), "snapshot_dir",
                                          request.snapshot_dir());
        !s.ok()) {
      return s;
    }
    if (!request.read_only() || request.create_if_missing()) {
      return Invalid("snapshot", absl::StrCat("snapshot ", request.snapshot(),
                                              " can only be attached read-only"));
    }
  }
  if (request.create_if_missing()) {
    return CheckCreateSettings("create_max_size", request.create_max_size(), "create_mode",
                               request.create_mode());
  }
  return absl::OkStatus();
}

// Large objects carved from reserved chunks, or runs of them released:
// whole chunks within the largest heap. Whether they lie in the session's
// reserve is the heap's check (ChunkDirectory::TellReserve).
absl::Status CheckPlacements(absl::string_view field,
                             const RepeatedPtrField<v1::LargePlacement>& placed) {
  if (placed.size() > kMaxPlacementsPerCall) {
    return Invalid(field, absl::StrCat(placed.size(), " large objects in one call; at most ",
                                       kMaxPlacementsPerCall));
  }
  constexpr uint64_t kMaxChunks = kMaxHeapBytes / kChunkSize;
  for (int i = 0; i < placed.size(); ++i) {
    const v1::LargePlacement& p = placed[i];
    if (p.offset() % kChunkSize != 0) {
      return Invalid(absl::StrCat(field, "[", i, "].offset"),
                     absl::StrCat("offset ", p.offset(), " is not a multiple of the ", kChunkSize,
                                  "-byte chunk"));
    }
    if (p.chunks() == 0 || p.offset() / kChunkSize + p.chunks() > kMaxChunks) {
      return Invalid(
          absl::StrCat(field, "[", i, "].chunks"),
          absl::StrCat("a large object of ", p.chunks(), " chunks at offset ", p.offset(),
                       " is empty or beyond the largest heap (", kMaxHeapBytes, " bytes)"));
    }
  }
  return absl::OkStatus();
}

// A report that says its class has a bitmap of that class's size (one
// that says another class than its chunk's is skipped by the heap, after
// this check: its size is bounded all the same).
absl::Status CheckReports(absl::string_view field,
                          const RepeatedPtrField<v1::LeaseReport>& reports) {
  for (int i = 0; i < reports.size(); ++i) {
    const v1::LeaseReport& report = reports[i];
    if (!report.has_size_class()) continue;
    if (report.size_class() >= kNumSizeClasses) {
      return Invalid(absl::StrCat(field, "[", i, "].size_class"),
                     absl::StrCat("size class ", report.size_class(), " does not exist (0..",
                                  kNumSizeClasses - 1, ")"));
    }
    const uint32_t words = (SlotsPerChunk(report.size_class()) + 63) / 64;
    if (static_cast<uint32_t>(report.words_size()) != words) {
      return Invalid(absl::StrCat(field, "[", i, "].words"),
                     absl::StrCat(report.words_size(), " bitmap words; size class ",
                                  report.size_class(), " has ", words));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const v1::DetachRequest& request) {
  if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  if (absl::Status s = CheckReports("reports", request.reports()); !s.ok()) return s;
  return CheckPlacements("placed", request.placed());
}

absl::Status ValidateRequest(const v1::ListClientsRequest& request) {
  return CheckOptionalHeapName("heap", request.heap());
}

absl::Status ValidateRequest(const v1::LeaseChunksRequest& request) {
  if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  return CheckWants("wants", request.wants());
}

absl::Status ValidateRequest(const v1::AllocateLargeRequest& request) {
  if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  if (request.size() == 0) return Invalid("size", "cannot allocate 0 bytes");
  if (request.size() > kMaxHeapBytes) {
    return Invalid("size", absl::StrCat("cannot allocate ", request.size(),
                                        " bytes: no heap's maximum size is above ", kMaxHeapBytes));
  }
  if (request.min_size() != 0 && !request.reserve()) {
    return Invalid("min_size", "only a reserve has one");
  }
  if (request.min_size() > request.size()) {
    return Invalid("min_size", absl::StrCat("min_size ", request.min_size(), " is above size ",
                                            request.size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const v1::FreeRequest& request) {
  if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  if (request.objects_size() > kMaxFreesPerCall) {
    return Invalid("objects", absl::StrCat(request.objects_size(), " objects in one free; at most ",
                                           kMaxFreesPerCall));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const v1::SyncRequest& request) {
  if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  if (request.more() && request.generation() != 0) {
    return Invalid("generation", "only the last part of a sync (more=false) carries one");
  }
  if (absl::Status s = CheckReports("reports", request.reports()); !s.ok()) return s;
  if (absl::Status s = CheckPlacements("placed", request.placed()); !s.ok()) return s;
  if (absl::Status s = CheckPlacements("released", request.released()); !s.ok()) return s;
  for (int i = 0; i < request.released_size(); ++i) {
    if (request.released(i).again()) {
      return Invalid(absl::StrCat("released[", i, "].again"), "a released run is never sent again");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const v1::BindRequest& request) {
  if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  if (absl::Status s = InField("name", ValidateName(request.name())); !s.ok()) return s;
  if (absl::Status s = InField("type_name", ValidateName(request.type_name(), "type name"));
      !s.ok()) {
    return s;
  }
  if (request.size() == 0) {
    return Invalid("size", absl::StrCat("name '", request.name(), "' binds 0 bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const v1::LookupRequest& request) {
  if (absl::Status s = CheckHeapName("heap", request.heap()); !s.ok()) return s;
  return InField("name", ValidateName(request.name()));
}

absl::Status ValidateRequest(const v1::UnbindRequest& request) {
  if (request.heap().empty()) {
    if (absl::Status s = CheckSession(request.session()); !s.ok()) return s;
  } else if (request.session() != 0) {
    return Invalid("heap", "name a session or a heap, not both");
  } else if (absl::Status s = CheckHeapName("heap", request.heap()); !s.ok()) {
    return s;
  }
  return InField("name", ValidateName(request.name()));
}

absl::Status ValidateRequest(const v1::ListNamesRequest& request) {
  return CheckHeapName("heap", request.heap());
}

absl::Status ValidateRequest(const v1::CreateSnapshotRequest& request) {
  if (absl::Status s = CheckHeapName("heap", request.heap()); !s.ok()) return s;
  if (absl::Status s = CheckSnapshotRef("name", request.name(), "target_dir", request.target_dir());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = InField("labels", ValidateLabels(std::map<std::string, std::string>(
                                             request.labels().begin(), request.labels().end())));
      !s.ok()) {
    return s;
  }
  if (request.wait_ms() > kMaxSnapshotWaitMs) {
    return Invalid("wait_ms", absl::StrCat("wait_ms ", request.wait_ms(), " is above the limit of ",
                                           kMaxSnapshotWaitMs));
  }
  if (request.store_dir().empty()) return absl::OkStatus();
  return CheckStoreDir("store_dir", request.store_dir(), request.target_dir());
}

absl::Status ValidateRequest(const v1::ListSnapshotsRequest& request) {
  if (absl::Status s = InField("target_dir", ValidateSnapshotDir(request.target_dir())); !s.ok()) {
    return s;
  }
  if (request.store_dir().empty()) return absl::OkStatus();
  return CheckStoreDir("store_dir", request.store_dir(), request.target_dir());
}

absl::Status ValidateRequest(const v1::SnapshotRef& request) {
  if (absl::Status s = CheckSnapshotRef("name", request.name(), "target_dir", request.target_dir());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckStoreOnly(request.store_dir(), {{"node", request.node()}, {"heap", request.heap()}});
      !s.ok()) {
    return s;
  }
  if (request.store_dir().empty()) return absl::OkStatus();
  return CheckStoreDir("store_dir", request.store_dir(), request.target_dir());
}

absl::Status ValidateRequest(const v1::RestoreSnapshotRequest& request) {
  if (absl::Status s = CheckSnapshotRef("name", request.name(), "target_dir", request.target_dir());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckOptionalHeapName("heap", request.heap()); !s.ok()) return s;
  if (absl::Status s = CheckStorage("storage", request.storage()); !s.ok()) return s;
  if (absl::Status s = CheckStoreOnly(request.store_dir(), {{"from_node", request.from_node()},
                                                            {"from_heap", request.from_heap()}});
      !s.ok()) {
    return s;
  }
  if (request.store_dir().empty()) return absl::OkStatus();
  return CheckStoreDir("store_dir", request.store_dir(), request.target_dir());
}

absl::Status ValidateRequest(const v1::GcStoreRequest& request) {
  if (request.has_grace_s() &&
      (request.grace_s() < kMinGraceSeconds || request.grace_s() > kMaxGraceSeconds)) {
    return Invalid("grace_s", absl::StrCat("grace_s ", request.grace_s(), " is outside ",
                                           kMinGraceSeconds, "..", kMaxGraceSeconds,
                                           " (clocks of nodes sharing a store differ)"));
  }
  return CheckStoreDir("store_dir", request.store_dir(), "");
}

absl::Status ValidateRequest(const v1::StoreUsageRequest& request) {
  return CheckStoreDir("store_dir", request.store_dir(), "");
}

}  // namespace heapd
