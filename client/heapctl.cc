// heapctl: administer the node's heapd. Commands and flags are in
// client/heapctl_args.cc (`heapctl --help`); each command here is one
// function that makes its call and prints the answer.
//
// Output is a table for people, or the answer as JSON (protobuf's JSON
// mapping of heapd.v1, every field printed) with --json. On error: one line
// on stderr naming the reason, exit status 1; a usage error exits 2 with the
// command's usage.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client_channel.h"
#include "client/heapctl_args.h"
#include "google/protobuf/util/json_util.h"
#include "heapd/client.h"
#include "protocol/version.h"

namespace heapd {
namespace {

const char* BackingName(v1::BackingKind kind) {
  switch (kind) {
    case v1::BACKING_DAX:
      return "dax";
    case v1::BACKING_TMPFS:
      return "tmpfs";
    case v1::BACKING_FILE:
      return "file";
    default:
      return "?";
  }
}

std::string Time(int64_t unix_ns) {
  if (unix_ns == 0) return "-";
  const time_t seconds = static_cast<time_t>(unix_ns / 1000000000);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", std::localtime(&seconds));
  return text;
}

std::string Bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, units[unit]);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "heapctl: %s\n", status.ToString().c_str());
  return 1;
}

// Prints `message` as JSON, every field included (a uid 0 or an empty list
// is said, not left out); returns 0.
int PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::fputs(json.c_str(), stdout);
  if (json.empty() || json.back() != '\n') std::fputc('\n', stdout);
  return 0;
}

// What a command works with: its parsed arguments and heapd.
struct Call {
  const Invocation& args;
  v1::Heapd::Stub& stub;
  bool json;
  const std::string& operand(size_t i) const { return args.operands[i]; }
};

// Runs `rpc` (a blocking call). On a terminal, without --json, a line on
// stderr says what runs and for how long until it returns: snapshots of
// big heaps take a while.
absl::Status WithProgress(const Call& call, const std::string& what,
                          const std::function<grpc::Status()>& rpc) {
  if (call.json || !isatty(STDERR_FILENO)) return FromGrpc(rpc());
  std::atomic<bool> done{false};
  grpc::Status status;
  std::thread worker([&] {
    status = rpc();
    done = true;
  });
  const auto start = std::chrono::steady_clock::now();
  bool shown = false;
  while (!done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!done && seconds >= 1) {
      std::fprintf(stderr, "\r%s: %.0f s", what.c_str(), seconds);
      shown = true;
    }
  }
  worker.join();
  if (shown) std::fprintf(stderr, "\r\033[K");  // the line goes; the answer follows
  return FromGrpc(status);
}

void PrintHeapRow(const v1::HeapInfo& heap) {
  std::printf("%-24s %10s %10s %10s %8llu %7u %6u %5u %04o %-5s %-8s %s\n", heap.name().c_str(),
              Bytes(heap.max_size()).c_str(), Bytes(heap.capacity_bytes()).c_str(),
              Bytes(heap.allocated_bytes()).c_str(), static_cast<unsigned long long>(heap.epoch()),
              heap.clients(), heap.names(), heap.owner_uid(), heap.mode(),
              BackingName(heap.backing()), heap.storage().c_str(),
              Time(heap.last_sync_unix_ns()).c_str());
}

// ", at the fixed address 0x..." for a fixed-address heap, else empty.
std::string FixedAddress(const v1::HeapInfo& heap) {
  if (heap.fixed_address() == 0) return "";
  return absl::StrCat(", at the fixed address 0x", absl::Hex(heap.fixed_address()));
}

void PrintHeapHeader() {
  std::printf("%-24s %10s %10s %10s %8s %7s %6s %5s %4s %-5s %-8s %s\n", "HEAP", "MAX", "RESERVED",
              "ALLOCATED", "EPOCH", "CLIENTS", "NAMES", "UID", "MODE", "KIND", "STORAGE",
              "LAST SYNC");
}

void PrintClients(const google::protobuf::RepeatedPtrField<v1::ClientInfo>& clients) {
  std::printf("%-20s %-24s %6s %6s %8s %-3s %7s %s\n", "SESSION", "HEAP", "UID", "GID", "PID", "RW",
              "LEASED", "ATTACHED");
  for (const v1::ClientInfo& c : clients) {
    std::printf("%-20llu %-24s %6u %6u %8d %-3s %7u %s%s\n",
                static_cast<unsigned long long>(c.session()), c.heap().c_str(), c.uid(), c.gid(),
                c.pid(), c.read_only() ? "ro" : "rw", c.leased_chunks(),
                Time(c.attached_unix_ns()).c_str(), c.connected() ? "" : " (no fd yet)");
  }
}

// Parts of store versions: listed (what each create stored) or with du's
// usage in the store (the bytes of the blocks each names, and of those no
// other part names).
void PrintStoreParts(const google::protobuf::RepeatedPtrField<v1::SnapshotManifest>& parts,
                     bool with_exclusive) {
  std::printf("%-24s %-16s %-24s %8s %10s %10s %10s %-19s\n", "VERSION", "NODE", "HEAP", "EPOCH",
              "LOGICAL", "STORED", with_exclusive ? "EXCLUSIVE" : "NEW", "CREATED");
  for (const v1::SnapshotManifest& m : parts) {
    const v1::StoreUsage& usage = m.store();
    std::printf("%-24s %-16s %-24s %8llu %10s %10s %10s %-19s\n", m.name().c_str(),
                m.node().c_str(), m.heap().c_str(), static_cast<unsigned long long>(m.epoch()),
                Bytes(usage.logical_bytes()).c_str(), Bytes(usage.stored_bytes()).c_str(),
                with_exclusive ? Bytes(usage.exclusive_bytes()).c_str()
                               : absl::StrCat(usage.blocks_written(), "/", usage.blocks()).c_str(),
                Time(m.created_unix_ns()).c_str());
  }
}

int HeapCreate(const Call& call) {
  v1::CreateHeapRequest request;
  request.set_name(call.operand(0));
  request.set_max_size(call.args.Number("max_size"));
  request.set_mode(static_cast<uint32_t>(call.args.Number("mode")));
  const std::string image = call.args.String("image");
  if (image == "direct") request.set_image(v1::IMAGE_DIRECT);
  if (image == "working") request.set_image(v1::IMAGE_WORKING);
  request.set_storage(call.args.String("storage"));
  request.set_fixed_address(call.args.Bool("fixed_address"));
  v1::HeapInfo info;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.CreateHeap(&context, request, &info)); !s.ok()) {
    return Fail(s);
  }
  if (request.fixed_address() && info.fixed_address() == 0) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("heapd made heap ", info.name(),
                     " but not at a fixed address: it predates fixed-address heaps; remove the "
                     "heap, upgrade heapd and create it again")));
  }
  if (call.json) return PrintJson(info);
  std::printf("created heap %s (maximum %s, mode %04o) on storage tier %s%s\n", info.name().c_str(),
              Bytes(info.max_size()).c_str(), info.mode(), info.storage().c_str(),
              FixedAddress(info).c_str());
  return 0;
}

int HeapLs(const Call& call) {
  v1::ListHeapsResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.ListHeaps(&context, {}, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.args.Has("owner")) {
    const uint64_t owner = call.args.Number("owner");
    auto* heaps = response.mutable_heaps();
    heaps->erase(std::remove_if(heaps->begin(), heaps->end(),
                                [owner](const v1::HeapInfo& h) { return h.owner_uid() != owner; }),
                 heaps->end());
  }
  if (call.json) return PrintJson(response);
  if (call.args.Bool("quiet")) {
    for (const v1::HeapInfo& heap : response.heaps()) std::printf("%s\n", heap.name().c_str());
    return 0;
  }
  PrintHeapHeader();
  for (const v1::HeapInfo& heap : response.heaps()) PrintHeapRow(heap);
  return 0;
}

int HeapStat(const Call& call) {
  v1::StatHeapRequest request;
  request.set_heap(call.operand(0));
  v1::HeapStats stats;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.StatHeap(&context, request, &stats)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(stats);
  PrintHeapHeader();
  PrintHeapRow(stats.info());
  std::printf("\nstorage tier: %s\n", stats.info().storage().c_str());
  if (stats.info().fixed_address() == 0) {
    std::printf("mapped at: an address of each process's choosing (offset pointers)\n");
  } else {
    std::printf("mapped at: 0x%llx in every process (plain pointers)\n",
                static_cast<unsigned long long>(stats.info().fixed_address()));
  }
  std::printf("reflink (snapshots share extents): %s\n", stats.info().reflink() ? "yes" : "no");
  std::printf("clients map: %s\n", stats.info().image() == v1::IMAGE_WORKING
                                       ? "a working image in memory (the data file changes "
                                         "only at syncs)"
                                       : "the data file");
  if (stats.info().content_rollback()) {
    std::printf("after a crash: object contents go back to the last sync\n");
  } else {
    std::printf(
        "after a crash: allocations and names go back to the last sync; object "
        "contents do not: %s\n",
        stats.info().content_rollback_note().c_str());
  }
  std::printf(
      "chunks: %u reserved, %u free, %u small (%u leased), %u in %llu large objects, %u held "
      "for sessions' large objects; %llu live objects; metadata log %s\n",
      stats.capacity_chunks(), stats.free_chunks(), stats.small_chunks(), stats.leased_chunks(),
      stats.large_chunks(), static_cast<unsigned long long>(stats.large_objects()),
      stats.large_reserve_chunks(), static_cast<unsigned long long>(stats.info().live_objects()),
      Bytes(stats.metadata_log_bytes()).c_str());
  if (stats.size_classes_size() != 0) {
    std::printf("\n%-6s %9s %7s %12s %9s\n", "CLASS", "SLOT", "CHUNKS", "LIVE", "OCCUPIED");
    for (const v1::SizeClassStats& c : stats.size_classes()) {
      const double slots = static_cast<double>(c.chunks()) * (2 << 20) / c.slot_size();
      std::printf("%-6u %9llu %7u %12llu %8.1f%%\n", c.size_class(),
                  static_cast<unsigned long long>(c.slot_size()), c.chunks(),
                  static_cast<unsigned long long>(c.live_objects()),
                  100.0 * c.live_objects() / slots);
    }
  }
  if (stats.clients_size() != 0) {
    std::printf("\n");
    PrintClients(stats.clients());
  }
  return 0;
}

int HeapRm(const Call& call) {
  v1::RemoveHeapRequest request;
  request.set_heap(call.operand(0));
  v1::RemoveHeapResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.RemoveHeap(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  std::printf("removed heap %s\n", call.operand(0).c_str());
  return 0;
}

int NamesLs(const Call& call) {
  v1::ListNamesRequest request;
  request.set_heap(call.operand(0));
  request.set_prefix(call.args.String("prefix"));
  v1::ListNamesResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.ListNames(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  std::printf("%-32s %14s %12s %6s %-19s %s\n", "NAME", "OFFSET", "SIZE", "UID", "CREATED", "TYPE");
  for (const v1::NameEntry& e : response.names()) {
    std::printf("%-32s %14llu %12llu %6u %-19s %s\n", e.name().c_str(),
                static_cast<unsigned long long>(e.offset()),
                static_cast<unsigned long long>(e.size()), e.owner_uid(),
                Time(e.created_unix_ns()).c_str(), e.type_name().c_str());
  }
  return 0;
}

int NamesRm(const Call& call) {
  v1::UnbindRequest request;
  request.set_heap(call.operand(0));
  request.set_name(call.operand(1));
  v1::NameEntry entry;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.Unbind(&context, request, &entry)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(entry);
  std::printf("unbound '%s' of heap %s (a %s of %s at offset %llu; it stays allocated)\n",
              entry.name().c_str(), call.operand(0).c_str(),
              entry.type_name().empty() ? "object" : entry.type_name().c_str(),
              Bytes(entry.size()).c_str(), static_cast<unsigned long long>(entry.offset()));
  return 0;
}

int ClientsLs(const Call& call) {
  v1::ListClientsRequest request;
  if (!call.args.operands.empty()) request.set_heap(call.operand(0));
  v1::ListClientsResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.ListClients(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  PrintClients(response.clients());
  return 0;
}

int SnapshotCreate(const Call& call) {
  v1::CreateSnapshotRequest request;
  request.set_heap(call.operand(0));
  request.set_name(call.operand(1));
  request.set_target_dir(call.args.String("to"));
  request.set_store_dir(call.args.String("store"));
  request.set_wait_ms(call.args.Has("wait_ms") ? static_cast<uint32_t>(std::min<uint64_t>(
                                                     call.args.Number("wait_ms"), UINT32_MAX))
                                               : 10000);
  for (const std::string& label : call.args.labels) {
    const size_t equals = label.find('=');
    (*request.mutable_labels())[label.substr(0, equals)] = label.substr(equals + 1);
  }
  v1::SnapshotManifest manifest;
  grpc::ClientContext context;
  if (absl::Status s =
          WithProgress(call, absl::StrCat("snapshot create ", request.heap(), " ", request.name()),
                       [&] { return call.stub.CreateSnapshot(&context, request, &manifest); });
      !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(manifest);
  if (!request.store_dir().empty()) {
    const v1::StoreUsage& usage = manifest.store();
    std::printf(
        "part %s/%s/%s at epoch %llu: %s logical, %s hashed, %llu of %llu blocks new (%llu as "
        "deltas), %s stored, %.3f s\n",
        manifest.name().c_str(), manifest.node().c_str(), manifest.heap().c_str(),
        static_cast<unsigned long long>(manifest.epoch()), Bytes(usage.logical_bytes()).c_str(),
        Bytes(usage.hashed_bytes()).c_str(),
        static_cast<unsigned long long>(usage.blocks_written()),
        static_cast<unsigned long long>(usage.blocks()),
        static_cast<unsigned long long>(usage.delta_blocks()), Bytes(usage.stored_bytes()).c_str(),
        usage.duration_us() / 1e6);
    return 0;
  }
  std::printf("snapshot %s of heap %s at epoch %llu (%s, %s copied, %.1f ms)\n",
              manifest.name().c_str(), manifest.heap().c_str(),
              static_cast<unsigned long long>(manifest.epoch()), manifest.copy_method().c_str(),
              Bytes(manifest.bytes_written()).c_str(), manifest.duration_us() / 1e3);
  return 0;
}

int SnapshotLs(const Call& call) {
  v1::ListSnapshotsRequest request;
  request.set_target_dir(call.args.String("to"));
  request.set_store_dir(call.args.String("store"));
  v1::ListSnapshotsResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.ListSnapshots(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  for (const std::string& skipped : response.skipped()) {
    // Quotes what a manifest says: shown escaped, never as terminal codes.
    std::fprintf(stderr, "heapctl: not listed: %s\n", absl::CHexEscape(skipped).c_str());
  }
  if (call.args.Bool("quiet")) {
    for (const v1::SnapshotManifest& m : response.snapshots()) {
      if (request.store_dir().empty()) {
        std::printf("%s %s\n", m.name().c_str(), m.heap().c_str());
      } else {
        std::printf("%s %s %s\n", m.name().c_str(), m.node().c_str(), m.heap().c_str());
      }
    }
    return 0;
  }
  if (!request.store_dir().empty()) {
    PrintStoreParts(response.snapshots(), /*with_exclusive=*/false);
    return 0;
  }
  std::printf("%-24s %-24s %8s %10s %-19s %s\n", "SNAPSHOT", "HEAP", "EPOCH", "SIZE", "CREATED",
              "LABELS");
  for (const v1::SnapshotManifest& m : response.snapshots()) {
    std::string labels;
    for (const auto& [key, value] : m.labels()) {
      absl::StrAppend(&labels, labels.empty() ? "" : ",", key, "=", value);
    }
    std::printf("%-24s %-24s %8llu %10s %-19s %s\n", m.name().c_str(), m.heap().c_str(),
                static_cast<unsigned long long>(m.epoch()), Bytes(m.data_bytes()).c_str(),
                Time(m.created_unix_ns()).c_str(), labels.c_str());
  }
  return 0;
}

int SnapshotRestore(const Call& call) {
  v1::RestoreSnapshotRequest request;
  request.set_target_dir(call.args.String("to"));
  request.set_name(call.operand(0));
  request.set_heap(call.args.String("heap"));
  request.set_replace(call.args.Bool("replace"));
  request.set_keep_owner(call.args.Bool("keep_owner"));
  request.set_storage(call.args.String("storage"));
  request.set_store_dir(call.args.String("store"));
  request.set_from_node(call.args.String("from_node"));
  request.set_from_heap(call.args.String("from_heap"));
  v1::HeapInfo info;
  grpc::ClientContext context;
  if (absl::Status s =
          WithProgress(call, absl::StrCat("snapshot restore ", request.name()),
                       [&] { return call.stub.RestoreSnapshot(&context, request, &info); });
      !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(info);
  std::printf("restored heap %s from snapshot %s at epoch %llu on storage tier %s\n",
              info.name().c_str(), request.name().c_str(),
              static_cast<unsigned long long>(info.epoch()), info.storage().c_str());
  return 0;
}

v1::SnapshotRef RefOf(const Call& call) {
  v1::SnapshotRef ref;
  ref.set_target_dir(call.args.String("to"));
  ref.set_name(call.operand(0));
  ref.set_store_dir(call.args.String("store"));
  ref.set_node(call.args.String("from_node"));
  ref.set_heap(call.args.String("from_heap"));
  return ref;
}

int SnapshotVerify(const Call& call) {
  const v1::SnapshotRef ref = RefOf(call);
  v1::SnapshotManifest manifest;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.VerifySnapshot(&context, ref, &manifest)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(manifest);
  if (!ref.store_dir().empty()) {
    std::printf("version %s verified: every block's hash, the metadata and the sizes match\n",
                ref.name().c_str());
    return 0;
  }
  std::printf("snapshot %s verified: metadata checksums and data size match\n", ref.name().c_str());
  return 0;
}

int SnapshotRm(const Call& call) {
  const v1::SnapshotRef ref = RefOf(call);
  v1::RemoveSnapshotResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.RemoveSnapshot(&context, ref, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  if (ref.store_dir().empty()) {
    std::printf("removed snapshot %s\n", ref.name().c_str());
    return 0;
  }
  for (const std::string& part : response.removed_parts()) {
    std::printf("removed part %s\n", part.c_str());
  }
  if (response.remaining_parts() == 0) {
    std::printf("version %s is gone (no parts left)\n", ref.name().c_str());
  } else {
    std::printf("version %s keeps %u part%s\n", ref.name().c_str(), response.remaining_parts(),
                response.remaining_parts() == 1 ? "" : "s");
  }
  return 0;
}

int SnapshotGc(const Call& call) {
  v1::GcStoreRequest request;
  request.set_store_dir(call.args.String("store"));
  if (call.args.Has("grace_s")) {
    request.set_grace_s(
        static_cast<uint32_t>(std::min<uint64_t>(call.args.Number("grace_s"), UINT32_MAX)));
  }
  request.set_dry_run(call.args.Bool("dry_run"));
  v1::GcStoreResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.GcStore(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  std::printf("%s %llu blocks (%s); kept %llu named by %llu parts and %llu young\n",
              request.dry_run() ? "would remove" : "removed",
              static_cast<unsigned long long>(response.blocks_removed()),
              Bytes(response.bytes_removed()).c_str(),
              static_cast<unsigned long long>(response.blocks_kept()),
              static_cast<unsigned long long>(response.versions()),
              static_cast<unsigned long long>(response.blocks_young()));
  return 0;
}

int SnapshotDu(const Call& call) {
  v1::StoreUsageRequest request;
  request.set_store_dir(call.args.String("store"));
  v1::StoreUsageResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(call.stub.StoreUsage(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  if (call.json) return PrintJson(response);
  PrintStoreParts(response.parts(), /*with_exclusive=*/true);
  std::printf("total: %s logical in %zu parts, %s stored in %llu blocks (%.1fx)\n",
              Bytes(response.logical_bytes()).c_str(), static_cast<size_t>(response.parts_size()),
              Bytes(response.stored_bytes()).c_str(),
              static_cast<unsigned long long>(response.blocks()),
              response.stored_bytes() == 0
                  ? 0.0
                  : static_cast<double>(response.logical_bytes()) / response.stored_bytes());
  return 0;
}

int RunCommand(const Call& call) {
  switch (call.args.command->id) {
    case Command::kHeapCreate:
      return HeapCreate(call);
    case Command::kHeapLs:
      return HeapLs(call);
    case Command::kHeapStat:
      return HeapStat(call);
    case Command::kHeapRm:
      return HeapRm(call);
    case Command::kNamesLs:
      return NamesLs(call);
    case Command::kNamesRm:
      return NamesRm(call);
    case Command::kClientsLs:
      return ClientsLs(call);
    case Command::kSnapshotCreate:
      return SnapshotCreate(call);
    case Command::kSnapshotLs:
      return SnapshotLs(call);
    case Command::kSnapshotVerify:
      return SnapshotVerify(call);
    case Command::kSnapshotRm:
      return SnapshotRm(call);
    case Command::kSnapshotRestore:
      return SnapshotRestore(call);
    case Command::kSnapshotGc:
      return SnapshotGc(call);
    case Command::kSnapshotDu:
      return SnapshotDu(call);
  }
  return Fail(absl::InternalError("no such command"));
}

int Run(const std::vector<std::string>& args) {
  Invocation invocation;
  UsageError error;
  if (!ParseHeapctlArgs(args, &invocation, &error)) {
    std::fprintf(stderr, "heapctl: %s\n%s\n", error.message.c_str(),
                 HeapctlUsage(error.command).c_str());
    return 2;
  }
  if (invocation.Bool("version")) {
    std::printf("heapctl %s\n", kHeapdVersion);
    return 0;
  }
  if (invocation.Bool("help")) {
    std::printf("%s\n", HeapctlUsage(invocation.command).c_str());
    return 0;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(invocation.String("socket"));
  if (!client.ok()) return Fail(client.status());
  return RunCommand(Call{invocation, StubOf(**client), invocation.Bool("json")});
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  return heapd::Run(std::vector<std::string>(argv + 1, argv + argc));
}
