// Fuzzes ValidateRequest (daemon/request_validation.h), the first thing
// heapd runs on every RPC a local user sends.
//
// Input: one byte picks the request message (kTypes), the rest is parsed
// as that message's protobuf encoding, as gRPC would; inputs that do not
// parse are skipped (gRPC refuses them before any handler runs).
//
// Beyond not crashing, checked on every request:
//   - ValidateRequest accepts exactly the requests an independent model of
//     the documented rules accepts (names per name_table.h and
//     heap_name.h, counts, sizes, wait_ms, snapshot names and directories,
//     labels, session 0), so every accepted request is within the bounds;
//   - a refusal is INVALID_ARGUMENT and its message starts with a field of
//     that message ("leases[2].count: ...");
//   - the fuzzed types are every request type of the Heapd service (checked
//     when the seeds are made, so a new RPC cannot go unfuzzed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "allocator/size_class.h"
#include "daemon/request_validation.h"
#include "google/protobuf/descriptor.h"
#include "proto/heapd.pb.h"
#include "tools/fuzz/fuzz_seeds.h"

namespace heapd {
namespace {

void Check(bool ok, const char* property) {
  if (ok) return;
  std::fprintf(stderr, "request_validation_fuzz: property violated: %s\n", property);
  std::abort();
}

// The rules, written from the documentation, not from the code.
constexpr size_t kPathMax = 4096;

bool HeapNameOk(absl::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool OptionalHeapNameOk(absl::string_view name) { return name.empty() || HeapNameOk(name); }

bool NameOk(absl::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

bool SnapshotDirOk(absl::string_view dir) {
  return dir.empty() ||
         (dir[0] == '/' && dir.size() < kPathMax && dir.find('\0') == absl::string_view::npos);
}

bool CreateSettingsOk(uint64_t max_size, uint32_t mode) {
  return max_size <= (uint64_t{1} << 46) && mode <= 0777;
}

bool WantsOk(const google::protobuf::RepeatedPtrField<v1::LeaseWant>& wants) {
  if (wants.size() > 64) return false;
  size_t reuse = 0;
  std::set<uint32_t> offered;
  for (const v1::LeaseWant& want : wants) {
    if (want.size_class() >= 64 || want.count() < 1 || want.count() > 64) return false;
    // Chunks offered back for reuse: at most as many as asked, none twice
    // in the whole call.
    if (static_cast<uint32_t>(want.reuse_size()) > want.count()) return false;
    offered.insert(want.reuse().begin(), want.reuse().end());
    reuse += want.reuse_size();
  }
  return offered.size() == reuse;
}

// A report that names its class: a class that exists (0..63), and one
// bitmap word per 64 of that class's slots in a chunk.
bool ReportsOk(const google::protobuf::RepeatedPtrField<v1::LeaseReport>& reports) {
  for (const v1::LeaseReport& report : reports) {
    if (!report.has_size_class()) continue;
    if (report.size_class() >= 64) return false;
    const uint32_t words = (SlotsPerChunk(report.size_class()) + 63) / 64;
    if (static_cast<uint32_t>(report.words_size()) != words) return false;
  }
  return true;
}

bool LabelsOk(const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.size() > 32) return false;
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > 256 || value.size() > 256) return false;
  }
  return true;
}

// An image kind: IMAGE_UNKNOWN (heapd's default), IMAGE_DIRECT or
// IMAGE_WORKING.
bool ImageOk(int image) { return image >= 0 && image <= 2; }
// A storage tier: empty (the default) or spelled as a heap name.
bool StorageOk(const std::string& storage) { return OptionalHeapNameOk(storage); }
bool Model(const v1::CreateHeapRequest& r) {
  return HeapNameOk(r.name()) && ImageOk(r.image()) && StorageOk(r.storage()) &&
         CreateSettingsOk(r.max_size(), r.mode());
}
bool Model(const v1::ListHeapsRequest&) { return true; }
bool Model(const v1::StatHeapRequest& r) { return HeapNameOk(r.heap()); }
bool Model(const v1::RemoveHeapRequest& r) { return HeapNameOk(r.heap()); }
bool Model(const v1::AttachRequest& r) {
  const bool snapshot = !r.snapshot().empty();
  if (!snapshot && !HeapNameOk(r.heap())) return false;
  if (!WantsOk(r.leases()) || (r.read_only() && r.leases_size() > 0)) return false;
  if (!ImageOk(r.create_image()) || !StorageOk(r.create_storage())) return false;
  if (r.lookup_size() > 64) return false;
  for (const std::string& name : r.lookup()) {
    if (!NameOk(name)) return false;
  }
  if (snapshot && (!HeapNameOk(r.snapshot()) || !SnapshotDirOk(r.snapshot_dir()) ||
                   !r.read_only() || r.create_if_missing())) {
    return false;
  }
  return !r.create_if_missing() || CreateSettingsOk(r.create_max_size(), r.create_mode());
}
// Large objects or runs of whole chunks, within the largest heap (2^46
// bytes: 2^25 chunks of 2 MiB).
bool RunsOk(const google::protobuf::RepeatedPtrField<v1::LargePlacement>& runs) {
  if (runs.size() > 65536) return false;
  for (const v1::LargePlacement& run : runs) {
    if (run.offset() % (uint64_t{1} << 21) != 0 || run.chunks() == 0 ||
        (run.offset() >> 21) + run.chunks() > (uint64_t{1} << 25)) {
      return false;
    }
  }
  return true;
}
bool Model(const v1::DetachRequest& r) {
  return r.session() != 0 && ReportsOk(r.reports()) && RunsOk(r.placed());
}
bool Model(const v1::ListClientsRequest& r) { return OptionalHeapNameOk(r.heap()); }
bool Model(const v1::LeaseChunksRequest& r) { return r.session() != 0 && WantsOk(r.wants()); }
bool Model(const v1::AllocateLargeRequest& r) {
  return r.session() != 0 && r.size() != 0 && r.size() <= (uint64_t{1} << 46) &&
         (r.min_size() == 0 || r.reserve()) && r.min_size() <= r.size();
}
bool Model(const v1::FreeRequest& r) { return r.session() != 0 && r.objects_size() <= 65536; }
bool Model(const v1::SyncRequest& r) {
  bool again = false;
  for (const v1::LargePlacement& run : r.released()) again |= run.again();
  return r.session() != 0 && (!r.more() || r.generation() == 0) && ReportsOk(r.reports()) &&
         RunsOk(r.placed()) && RunsOk(r.released()) && !again;
}
bool Model(const v1::BindRequest& r) {
  return r.session() != 0 && NameOk(r.name()) && NameOk(r.type_name()) && r.size() != 0;
}
bool Model(const v1::LookupRequest& r) { return HeapNameOk(r.heap()) && NameOk(r.name()); }
bool Model(const v1::UnbindRequest& r) {
  return (r.heap().empty() ? r.session() != 0 : r.session() == 0 && HeapNameOk(r.heap())) &&
         NameOk(r.name());
}
bool Model(const v1::ListNamesRequest& r) { return HeapNameOk(r.heap()); }
// A store, if named: absolute, and no snapshot directory beside it.
bool StoreOk(const std::string& store, const std::string& target) {
  return store.empty() || (target.empty() && SnapshotDirOk(store));
}
// Part selectors: names, and only with a store.
bool SelectorOk(const std::string& store, const std::string& a, const std::string& b) {
  return OptionalHeapNameOk(a) && OptionalHeapNameOk(b) &&
         (!store.empty() || (a.empty() && b.empty()));
}
bool Model(const v1::CreateSnapshotRequest& r) {
  return HeapNameOk(r.heap()) && HeapNameOk(r.name()) && SnapshotDirOk(r.target_dir()) &&
         LabelsOk(r.labels()) && r.wait_ms() <= 600000 && StoreOk(r.store_dir(), r.target_dir());
}
bool Model(const v1::ListSnapshotsRequest& r) {
  return SnapshotDirOk(r.target_dir()) && StoreOk(r.store_dir(), r.target_dir());
}
bool Model(const v1::SnapshotRef& r) {
  return HeapNameOk(r.name()) && SnapshotDirOk(r.target_dir()) &&
         SelectorOk(r.store_dir(), r.node(), r.heap()) && StoreOk(r.store_dir(), r.target_dir());
}
bool Model(const v1::RestoreSnapshotRequest& r) {
  return HeapNameOk(r.name()) && SnapshotDirOk(r.target_dir()) && OptionalHeapNameOk(r.heap()) &&
         StorageOk(r.storage()) && SelectorOk(r.store_dir(), r.from_node(), r.from_heap()) &&
         StoreOk(r.store_dir(), r.target_dir());
}
bool Model(const v1::GcStoreRequest& r) {
  return !r.store_dir().empty() && SnapshotDirOk(r.store_dir()) &&
         (!r.has_grace_s() || (r.grace_s() >= 60 && r.grace_s() <= 30 * 24 * 3600));
}
bool Model(const v1::StoreUsageRequest& r) {
  return !r.store_dir().empty() && SnapshotDirOk(r.store_dir());
}

// Whether `path` ("leases[2].count") names a field of `message`.
bool NamesField(const google::protobuf::Descriptor* message, absl::string_view path) {
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (message == nullptr) return false;
    absl::string_view name = part;
    const size_t bracket = part.find('[');
    if (bracket != absl::string_view::npos) {
      uint32_t index;
      if (part.back() != ']' ||
          !absl::SimpleAtoi(part.substr(bracket + 1, part.size() - bracket - 2), &index)) {
        return false;
      }
      name = part.substr(0, bracket);
    }
    const google::protobuf::FieldDescriptor* field = message->FindFieldByName(std::string(name));
    if (field == nullptr || (bracket != absl::string_view::npos && !field->is_repeated())) {
      return false;
    }
    message = field->message_type();
  }
  return true;
}

template <typename Request>
void FuzzAs(absl::string_view bytes) {
  Request request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  const absl::Status status = ValidateRequest(request);
  Check(status.ok() == Model(request), "ValidateRequest disagrees with the documented rules");
  if (status.ok()) return;
  Check(status.code() == absl::StatusCode::kInvalidArgument,
        "a request was refused without INVALID_ARGUMENT");
  const absl::string_view message = status.message();
  const size_t colon = message.find(": ");
  Check(colon != absl::string_view::npos &&
            NamesField(Request::descriptor(), message.substr(0, colon)),
        "a refusal does not start with a field of the request");
}

using FuzzFn = void (*)(absl::string_view);

struct Type {
  const google::protobuf::Descriptor* descriptor;
  FuzzFn fuzz;
};

template <typename Request>
Type TypeOf() {
  return {Request::descriptor(), &FuzzAs<Request>};
}

// The input's first byte picks one of these (modulo their number).
const std::vector<Type>& Types() {
  static const std::vector<Type>* const types = new std::vector<Type>{
      TypeOf<v1::CreateHeapRequest>(),
      TypeOf<v1::ListHeapsRequest>(),
      TypeOf<v1::StatHeapRequest>(),
      TypeOf<v1::RemoveHeapRequest>(),
      TypeOf<v1::AttachRequest>(),
      TypeOf<v1::DetachRequest>(),
      TypeOf<v1::ListClientsRequest>(),
      TypeOf<v1::LeaseChunksRequest>(),
      TypeOf<v1::AllocateLargeRequest>(),
      TypeOf<v1::FreeRequest>(),
      TypeOf<v1::SyncRequest>(),
      TypeOf<v1::BindRequest>(),
      TypeOf<v1::LookupRequest>(),
      TypeOf<v1::UnbindRequest>(),
      TypeOf<v1::ListNamesRequest>(),
      TypeOf<v1::CreateSnapshotRequest>(),
      TypeOf<v1::ListSnapshotsRequest>(),
      TypeOf<v1::SnapshotRef>(),
      TypeOf<v1::RestoreSnapshotRequest>(),
      TypeOf<v1::GcStoreRequest>(),
      TypeOf<v1::StoreUsageRequest>(),
  };
  return *types;
}

template <typename Request>
std::pair<std::string, std::string> Seed(const std::string& name, const Request& request) {
  const std::vector<Type>& types = Types();
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i].descriptor == Request::descriptor()) {
      return {name, std::string(1, static_cast<char>(i)) + request.SerializeAsString()};
    }
  }
  Check(false, "a seed's request type is not fuzzed");
  return {};
}

}  // namespace

namespace fuzz {

Seeds MakeSeeds() {
  // Every request type of the service has a validator and is fuzzed.
  std::set<const google::protobuf::Descriptor*> fuzzed;
  for (const Type& type : Types()) fuzzed.insert(type.descriptor);
  const google::protobuf::ServiceDescriptor* service =
      v1::AttachRequest::descriptor()->file()->FindServiceByName("Heapd");
  Check(service != nullptr, "no Heapd service");
  for (int i = 0; i < service->method_count(); ++i) {
    Check(fuzzed.count(service->method(i)->input_type()) == 1,
          "a request type of the Heapd service is not fuzzed");
  }

  v1::CreateHeapRequest create;
  create.set_name("graph");
  create.set_max_size(64 << 20);
  create.set_mode(0640);
  v1::AttachRequest attach;
  attach.set_heap("graph");
  attach.set_create_if_missing(true);
  attach.set_create_max_size(64 << 20);
  v1::LeaseWant* want = attach.add_leases();
  want->set_size_class(40);
  want->set_count(4);
  attach.add_lookup("root");
  attach.add_lookup("index");
  v1::AttachRequest in_place;
  in_place.set_snapshot("nightly.1");
  in_place.set_snapshot_dir("/pfs/me/snaps");
  in_place.set_read_only(true);
  v1::LeaseChunksRequest lease;
  lease.set_session(7);
  *lease.add_wants() = *want;
  lease.mutable_wants(0)->add_reuse(9);
  *lease.add_wants() = lease.wants(0);  // chunk 9 offered in two wants
  v1::FreeRequest free;
  free.set_session(7);
  free.add_objects()->set_offset(4 << 20);
  v1::SyncRequest sync;
  sync.set_session(7);
  v1::LeaseReport* report = sync.add_reports();
  report->set_chunk(3);
  report->add_words(0x5);
  v1::LeaseReport* said = sync.add_reports();
  said->set_chunk(4);
  said->set_size_class(63);
  said->add_words(0x1);
  v1::LargePlacement* placed = sync.add_placed();
  placed->set_offset(uint64_t{5} << 21);
  placed->set_chunks(2);
  *sync.add_released() = *placed;
  v1::AllocateLargeRequest large;
  large.set_session(7);
  large.set_size(3 << 20);
  large.set_reserve(true);
  v1::BindRequest bind;
  bind.set_session(7);
  bind.set_name("root");
  bind.set_offset(4 << 20);
  bind.set_size(64);
  bind.set_type_name("app::Graph");
  v1::LookupRequest lookup;
  lookup.set_heap("graph");
  lookup.set_name("root");
  v1::CreateSnapshotRequest snapshot;
  snapshot.set_heap("graph");
  snapshot.set_name("nightly.1");
  snapshot.set_target_dir("/pfs/me/snaps");
  (*snapshot.mutable_labels())["slurm_job_id"] = "4242";
  snapshot.set_wait_ms(10000);
  v1::SnapshotRef ref;
  ref.set_name("nightly.1");
  ref.set_target_dir("/pfs/me/snaps");
  v1::SnapshotRef part;
  part.set_name("job-42");
  part.set_store_dir("/pfs/me/store");
  part.set_node("node-7");
  part.set_heap("graph");
  v1::GcStoreRequest gc;
  gc.set_store_dir("/pfs/me/store");
  gc.set_grace_s(600);
  v1::RestoreSnapshotRequest restore;
  restore.set_name("nightly.1");
  restore.set_heap("graph-copy");
  restore.set_replace(true);
  v1::StatHeapRequest stat;
  stat.set_heap("graph");
  v1::UnbindRequest unbind;
  unbind.set_session(7);
  unbind.set_name("root");
  v1::UnbindRequest unbind_in_heap;  // heapctl names rm: no session
  unbind_in_heap.set_heap("graph");
  unbind_in_heap.set_name("root");
  v1::ListNamesRequest names;
  names.set_heap("graph");
  names.set_prefix("r");
  names.set_limit(10);
  return {Seed("create_heap", create),
          Seed("attach", attach),
          Seed("attach_snapshot", in_place),
          Seed("lease_chunks", lease),
          Seed("free", free),
          Seed("sync", sync),
          Seed("allocate_large", large),
          Seed("bind", bind),
          Seed("lookup", lookup),
          Seed("create_snapshot", snapshot),
          Seed("snapshot_ref", ref),
          Seed("store_part", part),
          Seed("gc_store", gc),
          Seed("restore_snapshot", restore),
          Seed("stat_heap", stat),
          Seed("list_names", names),
          Seed("unbind", unbind),
          Seed("unbind_in_heap", unbind_in_heap),
          {"empty", ""}};
}

}  // namespace fuzz
}  // namespace heapd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::vector<heapd::Type>& types = heapd::Types();
  types[data[0] % types.size()].fuzz(
      absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}
