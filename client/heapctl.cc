// heapctl: administer the node's heapd.
//
//   heapctl [--socket=PATH] [--json] heap create NAME [--max_size=BYTES] [--mode=0640]
//   heapctl heap ls [--owner=UID] [--quiet] | heap stat NAME | heap rm NAME
//   heapctl names ls HEAP [--prefix=P]
//   heapctl clients ls [--heap=NAME]
//   heapctl snapshot create HEAP NAME [--to=DIR] [--label=KEY=VALUE,...] [--wait_ms=N]
//   heapctl snapshot ls [--to=DIR] | snapshot verify NAME [--to=DIR] | snapshot rm NAME [--to=DIR]
//   heapctl snapshot restore NAME [--to=DIR] [--heap=NEW] [--replace] [--keep_owner]
//   heapctl snapshot create|ls|verify|rm|restore ... --store=DIR [--from_node=N] [--from_heap=H]
//   heapctl snapshot gc --store=DIR [--grace_s=N] [--dry_run] | snapshot du --store=DIR
//
// Output is a table for people, or the response as JSON (protobuf's JSON
// mapping of heapd.v1) with --json. On error: one line on stderr naming the
// reason, exit status 1 (2 for a usage error).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, socket, "", "heapd's socket (default: $HEAPD_SOCKET or heapd's default)");
ABSL_FLAG(bool, json, false, "print the response as JSON");
ABSL_FLAG(bool, quiet, false,
          "heap ls: names only; snapshot ls: 'SNAPSHOT HEAP' pairs (for scripts)");
ABSL_FLAG(int64_t, owner, -1, "heap ls: only heaps of this uid");
ABSL_FLAG(uint64_t, max_size, 0, "heap create: maximum size in bytes (0: the daemon's default)");
ABSL_FLAG(std::string, mode, "0600", "heap create: permission bits, octal");
ABSL_FLAG(std::string, prefix, "", "names ls: only names starting with this");
ABSL_FLAG(std::string, heap, "",
          "clients ls: only clients of this heap; snapshot restore: the heap to make");
ABSL_FLAG(bool, replace, false, "snapshot restore: replace the heap if it exists (no clients)");
ABSL_FLAG(bool, keep_owner, false,
          "snapshot restore (admins): the heap keeps the snapshot's owner, group and mode "
          "instead of belonging to the caller");
ABSL_FLAG(std::string, to, "", "snapshot: target directory (default: heapd's own)");
ABSL_FLAG(std::string, store, "",
          "snapshot: a snapshot store (incremental, deduplicated versions) instead of --to");
ABSL_FLAG(std::string, from_node, "",
          "snapshot verify/rm/restore --store: the part of this node (default: every part; "
          "restore: the only one, or this node's)");
ABSL_FLAG(std::string, from_heap, "", "snapshot verify/rm/restore --store: the part of this heap");
ABSL_FLAG(int64_t, grace_s, -1,
          "snapshot gc: keep blocks younger than this many seconds (default: heapd's, 600)");
ABSL_FLAG(bool, dry_run, false, "snapshot gc: count what would be removed, remove nothing");
ABSL_FLAG(std::vector<std::string>, label, {}, "snapshot create: KEY=VALUE labels");
ABSL_FLAG(uint32_t, wait_ms, 10000, "snapshot create: how long to wait for writers to sync");

namespace heapd {
namespace {

constexpr char kUsage[] =
    "usage: heapctl [--socket=PATH] [--json] COMMAND\n"
    "  heap create NAME [--max_size=BYTES] [--mode=0600]\n"
    "  heap ls [--owner=UID] [--quiet]\n"
    "  heap stat NAME\n"
    "  heap rm NAME\n"
    "  names ls HEAP [--prefix=P]\n"
    "  clients ls [--heap=NAME]\n"
    "  snapshot create HEAP NAME [--to=DIR] [--label=KEY=VALUE,...] [--wait_ms=N]\n"
    "  snapshot ls [--to=DIR] [--quiet]\n"
    "  snapshot verify NAME [--to=DIR]\n"
    "  snapshot rm NAME [--to=DIR]\n"
    "  snapshot restore NAME [--to=DIR] [--heap=NEW] [--replace] [--keep_owner]\n"
    "  snapshot create|ls|verify|rm|restore ... --store=DIR [--from_node=NODE] [--from_heap=HEAP]\n"
    "  snapshot gc --store=DIR [--grace_s=N] [--dry_run]\n"
    "  snapshot du --store=DIR";

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

int Usage(const std::string& why) {
  std::fprintf(stderr, "heapctl: %s\n%s\n", why.c_str(), kUsage);
  return 2;
}

// Prints `message` as JSON; returns 0.
int PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::fputs(json.c_str(), stdout);
  if (json.empty() || json.back() != '\n') std::fputc('\n', stdout);
  return 0;
}

void PrintHeapRow(const v1::HeapInfo& heap) {
  std::printf("%-24s %10s %10s %10s %8llu %7u %6u %5u %04o %-5s %s\n", heap.name().c_str(),
              Bytes(heap.max_size()).c_str(), Bytes(heap.capacity_bytes()).c_str(),
              Bytes(heap.allocated_bytes()).c_str(), static_cast<unsigned long long>(heap.epoch()),
              heap.clients(), heap.names(), heap.owner_uid(), heap.mode(),
              BackingName(heap.backing()), Time(heap.last_sync_unix_ns()).c_str());
}

void PrintHeapHeader() {
  std::printf("%-24s %10s %10s %10s %8s %7s %6s %5s %4s %-5s %s\n", "HEAP", "MAX", "RESERVED",
              "ALLOCATED", "EPOCH", "CLIENTS", "NAMES", "UID", "MODE", "KIND", "LAST SYNC");
}

void PrintClients(const google::protobuf::RepeatedPtrField<v1::ClientInfo>& clients) {
  std::printf("%-8s %-24s %6s %6s %8s %-3s %7s %s\n", "SESSION", "HEAP", "UID", "GID", "PID", "RW",
              "LEASED", "ATTACHED");
  for (const v1::ClientInfo& c : clients) {
    std::printf("%-8llu %-24s %6u %6u %8d %-3s %7u %s%s\n",
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

int Run(const std::vector<std::string>& args) {
  if (args.size() < 2) return Usage("missing command");
  const std::string what = args[0] + " " + args[1];
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Fail(client.status());
  v1::Heapd::Stub& stub = (*client)->stub();
  grpc::ClientContext context;
  const bool json = absl::GetFlag(FLAGS_json);
  auto need_name = [&](const char* which) { return args.size() == 3 ? "" : which; };

  if (what == "heap create") {
    if (*need_name("heap create needs NAME")) return Usage(need_name("heap create needs NAME"));
    uint32_t mode;
    if (!absl::numbers_internal::safe_strtou32_base(absl::GetFlag(FLAGS_mode), &mode, 8) ||
        mode > 0777) {
      return Usage("--mode must be octal permission bits, e.g. 0640");
    }
    v1::CreateHeapRequest request;
    request.set_name(args[2]);
    request.set_max_size(absl::GetFlag(FLAGS_max_size));
    request.set_mode(mode);
    v1::HeapInfo info;
    if (absl::Status s = FromGrpc(stub.CreateHeap(&context, request, &info)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(info);
    std::printf("created heap %s (maximum %s, mode %04o)\n", info.name().c_str(),
                Bytes(info.max_size()).c_str(), info.mode());
    return 0;
  }
  if (what == "heap ls") {
    v1::ListHeapsResponse response;
    if (absl::Status s = FromGrpc(stub.ListHeaps(&context, {}, &response)); !s.ok()) {
      return Fail(s);
    }
    const int64_t owner = absl::GetFlag(FLAGS_owner);
    if (owner >= 0) {
      auto* heaps = response.mutable_heaps();
      heaps->erase(
          std::remove_if(heaps->begin(), heaps->end(),
                         [owner](const v1::HeapInfo& h) { return h.owner_uid() != owner; }),
          heaps->end());
    }
    if (json) return PrintJson(response);
    if (absl::GetFlag(FLAGS_quiet)) {
      for (const v1::HeapInfo& heap : response.heaps()) std::printf("%s\n", heap.name().c_str());
      return 0;
    }
    PrintHeapHeader();
    for (const v1::HeapInfo& heap : response.heaps()) PrintHeapRow(heap);
    return 0;
  }
  if (what == "heap stat") {
    if (*need_name("x")) return Usage("heap stat needs NAME");
    v1::StatHeapRequest request;
    request.set_heap(args[2]);
    v1::HeapStats stats;
    if (absl::Status s = FromGrpc(stub.StatHeap(&context, request, &stats)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(stats);
    PrintHeapHeader();
    PrintHeapRow(stats.info());
    std::printf("\nreflink (snapshots share extents): %s\n", stats.info().reflink() ? "yes" : "no");
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
  if (what == "heap rm") {
    if (*need_name("x")) return Usage("heap rm needs NAME");
    v1::RemoveHeapRequest request;
    request.set_heap(args[2]);
    v1::RemoveHeapResponse response;
    if (absl::Status s = FromGrpc(stub.RemoveHeap(&context, request, &response)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(response);
    std::printf("removed heap %s\n", args[2].c_str());
    return 0;
  }
  if (what == "names ls") {
    if (*need_name("x")) return Usage("names ls needs HEAP");
    v1::ListNamesRequest request;
    request.set_heap(args[2]);
    request.set_prefix(absl::GetFlag(FLAGS_prefix));
    v1::ListNamesResponse response;
    if (absl::Status s = FromGrpc(stub.ListNames(&context, request, &response)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(response);
    std::printf("%-32s %14s %12s %6s %-19s %s\n", "NAME", "OFFSET", "SIZE", "UID", "CREATED",
                "TYPE");
    for (const v1::NameEntry& e : response.names()) {
      std::printf("%-32s %14llu %12llu %6u %-19s %s\n", e.name().c_str(),
                  static_cast<unsigned long long>(e.offset()),
                  static_cast<unsigned long long>(e.size()), e.owner_uid(),
                  Time(e.created_unix_ns()).c_str(), e.type_name().c_str());
    }
    return 0;
  }
  if (what == "clients ls") {
    v1::ListClientsRequest request;
    request.set_heap(absl::GetFlag(FLAGS_heap));
    v1::ListClientsResponse response;
    if (absl::Status s = FromGrpc(stub.ListClients(&context, request, &response)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(response);
    PrintClients(response.clients());
    return 0;
  }
  if (what == "snapshot create") {
    if (args.size() != 4) return Usage("snapshot create needs HEAP and NAME");
    v1::CreateSnapshotRequest request;
    request.set_heap(args[2]);
    request.set_name(args[3]);
    request.set_target_dir(absl::GetFlag(FLAGS_to));
    request.set_store_dir(absl::GetFlag(FLAGS_store));
    request.set_wait_ms(absl::GetFlag(FLAGS_wait_ms));
    for (const std::string& label : absl::GetFlag(FLAGS_label)) {
      const size_t equals = label.find('=');
      if (equals == std::string::npos) return Usage("--label takes KEY=VALUE");
      (*request.mutable_labels())[label.substr(0, equals)] = label.substr(equals + 1);
    }
    v1::SnapshotManifest manifest;
    if (absl::Status s = FromGrpc(stub.CreateSnapshot(&context, request, &manifest)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(manifest);
    if (!request.store_dir().empty()) {
      const v1::StoreUsage& usage = manifest.store();
      std::printf(
          "part %s/%s/%s at epoch %llu: %s logical, %s hashed, %llu of %llu blocks new, %s "
          "stored, %.3f s\n",
          manifest.name().c_str(), manifest.node().c_str(), manifest.heap().c_str(),
          static_cast<unsigned long long>(manifest.epoch()), Bytes(usage.logical_bytes()).c_str(),
          Bytes(usage.hashed_bytes()).c_str(),
          static_cast<unsigned long long>(usage.blocks_written()),
          static_cast<unsigned long long>(usage.blocks()), Bytes(usage.stored_bytes()).c_str(),
          usage.duration_us() / 1e6);
      return 0;
    }
    std::printf("snapshot %s of heap %s at epoch %llu (%s, %s copied, %.1f ms)\n",
                manifest.name().c_str(), manifest.heap().c_str(),
                static_cast<unsigned long long>(manifest.epoch()), manifest.copy_method().c_str(),
                Bytes(manifest.bytes_written()).c_str(), manifest.duration_us() / 1e3);
    return 0;
  }
  if (what == "snapshot ls") {
    v1::ListSnapshotsRequest request;
    request.set_target_dir(absl::GetFlag(FLAGS_to));
    request.set_store_dir(absl::GetFlag(FLAGS_store));
    v1::ListSnapshotsResponse response;
    if (absl::Status s = FromGrpc(stub.ListSnapshots(&context, request, &response)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(response);
    if (absl::GetFlag(FLAGS_quiet)) {
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
    std::printf("%-24s %-24s %8s %10s %-8s %-19s %s\n", "SNAPSHOT", "HEAP", "EPOCH", "SIZE",
                "METHOD", "CREATED", "LABELS");
    for (const v1::SnapshotManifest& m : response.snapshots()) {
      std::string labels;
      for (const auto& [key, value] : m.labels()) {
        absl::StrAppend(&labels, labels.empty() ? "" : ",", key, "=", value);
      }
      std::printf("%-24s %-24s %8llu %10s %-8s %-19s %s\n", m.name().c_str(), m.heap().c_str(),
                  static_cast<unsigned long long>(m.epoch()), Bytes(m.data_bytes()).c_str(),
                  m.copy_method().c_str(), Time(m.created_unix_ns()).c_str(), labels.c_str());
    }
    return 0;
  }
  if (what == "snapshot restore") {
    if (args.size() != 3) return Usage("snapshot restore needs NAME");
    v1::RestoreSnapshotRequest request;
    request.set_target_dir(absl::GetFlag(FLAGS_to));
    request.set_name(args[2]);
    request.set_heap(absl::GetFlag(FLAGS_heap));
    request.set_replace(absl::GetFlag(FLAGS_replace));
    request.set_keep_owner(absl::GetFlag(FLAGS_keep_owner));
    request.set_store_dir(absl::GetFlag(FLAGS_store));
    request.set_from_node(absl::GetFlag(FLAGS_from_node));
    request.set_from_heap(absl::GetFlag(FLAGS_from_heap));
    v1::HeapInfo info;
    if (absl::Status s = FromGrpc(stub.RestoreSnapshot(&context, request, &info)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(info);
    std::printf("restored heap %s from snapshot %s at epoch %llu\n", info.name().c_str(),
                args[2].c_str(), static_cast<unsigned long long>(info.epoch()));
    return 0;
  }
  if (what == "snapshot verify" || what == "snapshot rm") {
    if (args.size() != 3) return Usage(what + " needs NAME");
    v1::SnapshotRef ref;
    ref.set_target_dir(absl::GetFlag(FLAGS_to));
    ref.set_name(args[2]);
    ref.set_store_dir(absl::GetFlag(FLAGS_store));
    ref.set_node(absl::GetFlag(FLAGS_from_node));
    ref.set_heap(absl::GetFlag(FLAGS_from_heap));
    if (what == "snapshot rm") {
      v1::RemoveSnapshotResponse response;
      if (absl::Status s = FromGrpc(stub.RemoveSnapshot(&context, ref, &response)); !s.ok()) {
        return Fail(s);
      }
      if (json) return PrintJson(response);
      std::printf("removed snapshot %s\n", args[2].c_str());
      return 0;
    }
    v1::SnapshotManifest manifest;
    if (absl::Status s = FromGrpc(stub.VerifySnapshot(&context, ref, &manifest)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(manifest);
    if (!ref.store_dir().empty()) {
      std::printf("version %s verified: every block's hash, the metadata and the sizes match\n",
                  args[2].c_str());
      return 0;
    }
    std::printf("snapshot %s verified: metadata checksums and data size match\n", args[2].c_str());
    return 0;
  }
  if (what == "snapshot gc") {
    v1::GcStoreRequest request;
    request.set_store_dir(absl::GetFlag(FLAGS_store));
    if (const int64_t grace = absl::GetFlag(FLAGS_grace_s); grace >= 0) {
      request.set_grace_s(static_cast<uint32_t>(std::min<int64_t>(grace, UINT32_MAX)));
    }
    request.set_dry_run(absl::GetFlag(FLAGS_dry_run));
    v1::GcStoreResponse response;
    if (absl::Status s = FromGrpc(stub.GcStore(&context, request, &response)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(response);
    std::printf("%s %llu blocks (%s); kept %llu named by %llu parts and %llu young\n",
                request.dry_run() ? "would remove" : "removed",
                static_cast<unsigned long long>(response.blocks_removed()),
                Bytes(response.bytes_removed()).c_str(),
                static_cast<unsigned long long>(response.blocks_kept()),
                static_cast<unsigned long long>(response.versions()),
                static_cast<unsigned long long>(response.blocks_young()));
    return 0;
  }
  if (what == "snapshot du") {
    v1::StoreUsageRequest request;
    request.set_store_dir(absl::GetFlag(FLAGS_store));
    v1::StoreUsageResponse response;
    if (absl::Status s = FromGrpc(stub.StoreUsage(&context, request, &response)); !s.ok()) {
      return Fail(s);
    }
    if (json) return PrintJson(response);
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
  return Usage("unknown command '" + what + "'");
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(heapd::kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  return heapd::Run(std::vector<std::string>(positional.begin() + 1, positional.end()));
}
