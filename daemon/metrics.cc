#include "daemon/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/size_class.h"
#include "daemon/heap_registry.h"
#include "daemon/limits.h"
#include "daemon/sessions.h"
#include "heap/fixed_address.h"
#include "prometheus/collectable.h"
#include "prometheus/gauge.h"
#include "prometheus/metric_family.h"
#include "protocol/version.h"

namespace heapd {
namespace {

// Latency buckets from 20 µs to 10 s, about three per decade.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3,
      20e-3, 50e-3, 100e-3, 200e-3, 500e-3, 1,    2,    5,    10};
  return *buckets;
}

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

// Gauges of every heap's state, read when Prometheus scrapes.
class HeapStateCollector : public prometheus::Collectable {
 public:
  HeapStateCollector(const HeapRegistry* heaps, const Sessions* sessions, MetricsOptions options)
      : heaps_(heaps), sessions_(sessions), options_(std::move(options)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    Families f;
    const std::vector<std::shared_ptr<ServedHeap>> served_heaps = heaps_->List();
    Add(f.Gauge("heapd_heaps_open", "Heaps the daemon serves."), {},
        static_cast<double>(served_heaps.size()));
    size_t broken_open = 0;
    for (const std::shared_ptr<ServedHeap>& served : served_heaps) {
      broken_open += !served->heap->broken().ok();
    }
    auto& broken = f.Gauge("heapd_heaps_broken",
                           "Heaps that failed to open (corrupt metadata) or broke while open "
                           "(a failed flush of their data).");
    Add(broken, {}, static_cast<double>(heaps_->Broken().size() + broken_open));
    auto& max_size = f.Gauge("heapd_heap_max_size_bytes", "Maximum size of the heap (max_size).");
    auto& reserved =
        f.Gauge("heapd_heap_reserved_bytes",
                "Bytes of the data file reserved on disk (fallocate; capacity_bytes in "
                "heapctl's JSON).");
    auto& allocated =
        f.Gauge("heapd_heap_allocated_bytes", "Bytes in live objects (slot sizes and large runs).");
    auto& live = f.Gauge("heapd_heap_live_objects", "Live objects, small and large.");
    auto& chunks = f.Gauge("heapd_heap_chunks",
                           "2 MiB chunks by state: free, leased (small, leased to a client), "
                           "small (not leased), large.");
    auto& clients = f.Gauge("heapd_heap_clients", "Client sessions attached to the heap.");
    auto& names = f.Gauge("heapd_heap_names", "Names bound in the heap.");
    auto& epoch = f.Gauge("heapd_heap_epoch", "Last persisted metadata epoch.");
    auto& last_sync = f.Gauge("heapd_heap_last_sync_timestamp_seconds",
                              "Unix time of the heap's last committed epoch (a sync, or its "
                              "creation; after a restart, its metadata file's modification time).");
    auto& repairs = f.Gauge("heapd_heap_data_file_repairs",
                            "Times heapd put the heap's data file back to its size after a "
                            "client holding it writable truncated or extended it.");
    auto& content_rollback =
        f.Gauge("heapd_heap_content_rollback",
                "1 if the heap's object contents go back to the last sync after a crash; 0 if "
                "only allocations and names do (the backing cannot, or --track_contents=false).");
    auto& working_image =
        f.Gauge("heapd_heap_working_image",
                "1 if the heap's clients map a working image in memory and its data file "
                "changes only at syncs (through its redo log); 0 if they map the data file.");
    auto& undo_pages = f.Gauge("heapd_heap_undo_pages",
                               "Pages of the heap put back to their last commit (restored) or "
                               "left to a live session that wrote them too (handed_over) since "
                               "heapd opened it.");
    auto& backing = f.Gauge("heapd_heap_backing_info",
                            "The heap's storage tier (storage), its kind (dax, tmpfs, file) and "
                            "whether its file system can clone files (reflink); always 1.");
    auto& class_chunks = f.Gauge("heapd_size_class_chunks", "Small-object chunks of a size class.");
    auto& class_live = f.Gauge("heapd_size_class_live_objects", "Live objects of a size class.");
    auto& class_occupancy =
        f.Gauge("heapd_size_class_occupancy_ratio",
                "Live slots over all slots in the chunks of a size class (1 - fragmentation).");
    // Node totals over every heap; per-heap series for at most
    // options_.max_heaps heaps: first those the alerts watch (clients
    // attached, or over 90% full), then the most reserved, ties by name
    // (the same heaps scrape after scrape).
    struct Listed {
      const ServedHeap* served;
      HeapStats stats;
      bool watched;
    };
    std::vector<Listed> listed;
    listed.reserve(served_heaps.size());
    double reserved_total = 0;
    double allocated_total = 0;
    for (const std::shared_ptr<ServedHeap>& served : served_heaps) {
      HeapStats stats = served->heap->Stats();
      reserved_total += static_cast<double>(stats.capacity_bytes);
      allocated_total += static_cast<double>(stats.directory.allocated_bytes);
      const bool watched = sessions_->CountOn(served->name) > 0 ||
                           stats.directory.allocated_bytes > stats.max_size / 10 * 9;
      listed.push_back({served.get(), std::move(stats), watched});
    }
    if (listed.size() > options_.max_heaps) {
      std::partial_sort(listed.begin(), listed.begin() + options_.max_heaps, listed.end(),
                        [](const Listed& a, const Listed& b) {
                          if (a.watched != b.watched) return a.watched;
                          if (a.stats.capacity_bytes != b.stats.capacity_bytes) {
                            return a.stats.capacity_bytes > b.stats.capacity_bytes;
                          }
                          return a.served->name < b.served->name;
                        });
      listed.resize(options_.max_heaps);
    }
    Add(f.Gauge("heapd_heaps_reserved_bytes", "Bytes reserved by every heap's data file."), {},
        reserved_total);
    Add(f.Gauge("heapd_heaps_allocated_bytes", "Bytes in live objects of every heap."), {},
        allocated_total);
    Add(f.Gauge("heapd_fixed_address_window_bytes",
                "Size of the node-wide window fixed-address heaps are mapped in."),
        {}, static_cast<double>(kFixedWindowEnd - kFixedWindowBegin));
    Add(f.Gauge("heapd_fixed_address_window_held_bytes",
                "Bytes of that window fixed-address heaps hold (maximum sizes and guards; heaps "
                "being made and heaps that failed to open too)."),
        {}, static_cast<double>(heaps_->FixedBytesHeld()));
    Add(f.Gauge("heapd_heaps_unlisted",
                "Heaps without per-heap series: beyond --metrics_heaps, those without clients, "
                "under 90% full and with the least reserved bytes."),
        {}, static_cast<double>(served_heaps.size() - listed.size()));
    for (const Listed& each : listed) {
      const ServedHeap* served = each.served;
      const HeapStats& stats = each.stats;
      const DirectoryStats& d = stats.directory;
      const std::string& h = served->name;
      Add(max_size, {{"heap", h}}, static_cast<double>(stats.max_size));
      Add(reserved, {{"heap", h}}, static_cast<double>(stats.capacity_bytes));
      Add(allocated, {{"heap", h}}, static_cast<double>(d.allocated_bytes));
      Add(live, {{"heap", h}}, static_cast<double>(d.live_objects));
      Add(chunks, {{"heap", h}, {"state", "free"}}, d.free_chunks);
      Add(chunks, {{"heap", h}, {"state", "leased"}}, d.leased_chunks);
      Add(chunks, {{"heap", h}, {"state", "small"}}, d.small_chunks - d.leased_chunks);
      Add(chunks, {{"heap", h}, {"state", "large"}}, d.large_chunks);
      Add(chunks, {{"heap", h}, {"state", "large_reserve"}}, d.large_reserve_chunks);
      Add(clients, {{"heap", h}}, static_cast<double>(sessions_->CountOn(h)));
      Add(names, {{"heap", h}}, static_cast<double>(stats.names));
      Add(epoch, {{"heap", h}}, static_cast<double>(stats.epoch));
      Add(last_sync, {{"heap", h}}, stats.last_sync_unix_ns / 1e9);
      Add(repairs, {{"heap", h}}, static_cast<double>(stats.data_file_repairs));
      Add(content_rollback, {{"heap", h}}, stats.content_rollback ? 1 : 0);
      Add(working_image, {{"heap", h}}, stats.image == ImageMode::kWorkingImage ? 1 : 0);
      Add(undo_pages, {{"heap", h}, {"kind", "restored"}},
          static_cast<double>(stats.undo.pages_restored));
      Add(undo_pages, {{"heap", h}, {"kind", "handed_over"}},
          static_cast<double>(stats.undo.pages_handed_over));
      Add(backing,
          {{"heap", h},
           {"storage", served->storage},
           {"kind", BackingKindName(stats.backing)},
           {"reflink", served->reflink ? "true" : "false"}},
          1);
      if (!options_.size_classes_of_every_heap && options_.size_classes_of.count(h) == 0) {
        continue;
      }
      for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
        const SizeClassUsage& usage = d.by_class[c];
        if (usage.chunks == 0) continue;
        const std::vector<prometheus::ClientMetric::Label> labels = {
            {"heap", h}, {"size_class", std::to_string(ClassSize(c))}};
        Add(class_chunks, labels, usage.chunks);
        Add(class_live, labels, static_cast<double>(usage.live_objects));
        Add(class_occupancy, labels,
            static_cast<double>(usage.live_objects) /
                (static_cast<double>(usage.chunks) * SlotsPerChunk(c)));
      }
    }
    CollectTiers(served_heaps, f);
    return std::move(f.families);
  }

 private:
  struct Families {
    Families() { families.reserve(32); }  // more than Collect makes: references stay valid
    std::vector<prometheus::MetricFamily> families;
    prometheus::MetricFamily& Gauge(const char* name, const char* help) {
      families.push_back({name, help, prometheus::MetricType::Gauge, {}});
      return families.back();
    }
  };
  // Per storage tier: its heaps, and its file system's size and room.
  void CollectTiers(const std::vector<std::shared_ptr<ServedHeap>>& served_heaps,
                    Families& f) const {
    auto& heaps = f.Gauge("heapd_storage_heaps", "Heaps served from the storage tier.");
    auto& size =
        f.Gauge("heapd_storage_size_bytes", "Size of the file system holding the storage tier.");
    auto& free = f.Gauge("heapd_storage_available_bytes",
                         "Bytes of the storage tier's file system available to heapd.");
    for (const StorageTier& tier : heaps_->tiers()) {
      const std::vector<prometheus::ClientMetric::Label> labels = {{"storage", tier.name}};
      double count = 0;
      for (const std::shared_ptr<ServedHeap>& served : served_heaps) {
        count += served->storage == tier.name;
      }
      Add(heaps, labels, count);
      struct statvfs fs;
      if (statvfs(tier.root.c_str(), &fs) != 0) continue;
      Add(size, labels, static_cast<double>(fs.f_blocks) * static_cast<double>(fs.f_frsize));
      Add(free, labels, static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize));
    }
  }
  static void Add(prometheus::MetricFamily& family,
                  std::vector<prometheus::ClientMetric::Label> labels, double value) {
    prometheus::ClientMetric metric;
    metric.label = std::move(labels);
    metric.gauge.value = value;
    family.metric.push_back(std::move(metric));
  }

  const HeapRegistry* heaps_;
  const Sessions* sessions_;
  const MetricsOptions options_;
};

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      calls_(prometheus::BuildCounter()
                 .Name("heapd_rpc_calls_total")
                 .Help("gRPC calls served, by method and status code.")
                 .Register(*registry_)),
      call_seconds_(prometheus::BuildHistogram()
                        .Name("heapd_rpc_duration_seconds")
                        .Help("Time to serve a gRPC call, by method.")
                        .Register(*registry_)),
      sync_seconds_(prometheus::BuildHistogram()
                        .Name("heapd_sync_duration_seconds")
                        .Help("Time to persist an epoch of any heap (client syncs and "
                              "detaches; node-wide: one series per heap would not stay bounded "
                              "at 10^4 heaps).")
                        .Register(*registry_)),
      sync_failures_(prometheus::BuildCounter()
                         .Name("heapd_sync_failures_total")
                         .Help("Syncs of a heap that failed (I/O errors, full disks).")
                         .Register(*registry_)),
      sessions_reclaimed_(prometheus::BuildCounter()
                              .Name("heapd_sessions_reclaimed_total")
                              .Help("Client sessions ended without a detach, by reason.")
                              .Register(*registry_)),
      chunks_reclaimed_(prometheus::BuildCounter()
                            .Name("heapd_leases_reclaimed_total")
                            .Help("Leased chunks taken back from clients that ended "
                                  "without detaching.")
                            .Register(*registry_)),
      large_objects_reclaimed_(prometheus::BuildCounter()
                                   .Name("heapd_large_objects_reclaimed_total")
                                   .Help("Uncommitted large objects freed when their client "
                                         "ended without detaching.")
                                   .Register(*registry_)),
      frees_rejected_(prometheus::BuildCounter()
                          .Name("heapd_frees_rejected_total")
                          .Help("Frees the daemon refused, by status code (INVALID_ARGUMENT: "
                                "double free, interior or outside pointer; "
                                "FAILED_PRECONDITION: bound or uncommitted object).")
                          .Register(*registry_)),
      snapshots_(prometheus::BuildCounter()
                     .Name("heapd_snapshots_total")
                     .Help("Snapshots attempted, by outcome (ok, failed).")
                     .Register(*registry_)),
      snapshot_seconds_(prometheus::BuildHistogram()
                            .Name("heapd_snapshot_duration_seconds")
                            .Help("Time to take a snapshot, waiting for writers included.")
                            .Register(*registry_)),
      snapshot_bytes_(prometheus::BuildCounter()
                          .Name("heapd_snapshot_bytes_written_total")
                          .Help("Data bytes copied by snapshots (0 for a reflink clone).")
                          .Register(*registry_)),
      store_snapshots_(prometheus::BuildCounter()
                           .Name("heapd_store_snapshots_total")
                           .Help("Snapshots into snapshot stores attempted, by outcome.")
                           .Register(*registry_)),
      store_snapshot_seconds_(prometheus::BuildHistogram()
                                  .Name("heapd_store_snapshot_duration_seconds")
                                  .Help("Time to store a heap's part in a snapshot store.")
                                  .Register(*registry_)),
      store_bytes_(prometheus::BuildCounter()
                       .Name("heapd_store_snapshot_bytes_total")
                       .Help("Bytes of parts stored in snapshot stores, by kind: logical (data "
                             "and metadata), hashed (read and hashed), stored (compressed "
                             "bytes of new blocks).")
                       .Register(*registry_)),
      store_blocks_(prometheus::BuildCounter()
                        .Name("heapd_store_snapshot_blocks_total")
                        .Help("Blocks of parts stored, by kind: new (written) or deduplicated "
                              "(the store had them).")
                        .Register(*registry_)),
      store_restores_(prometheus::BuildCounter()
                          .Name("heapd_store_restores_total")
                          .Help("Restores from snapshot stores attempted, by outcome.")
                          .Register(*registry_)),
      store_restore_seconds_(prometheus::BuildHistogram()
                                 .Name("heapd_store_restore_duration_seconds")
                                 .Help("Time to restore a heap from a snapshot store.")
                                 .Register(*registry_)),
      store_blocks_fetched_(prometheus::BuildCounter()
                                .Name("heapd_store_restore_blocks_fetched_total")
                                .Help("Blocks restores read from snapshot stores (not found in "
                                      "the node's block cache).")
                                .Register(*registry_)),
      limit_refusals_(prometheus::BuildCounter()
                          .Name("heapd_limit_refusals_total")
                          .Help("Requests and connections refused by a per-user limit.")
                          .Register(*registry_)) {
  prometheus::BuildGauge()
      .Name("heapd_build_info")
      .Help("heapd's version; always 1.")
      .Register(*registry_)
      .Add({{"version", kHeapdVersion}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("heapd_start_time_seconds")
      .Help("Unix time the daemon started.")
      .Register(*registry_)
      .Add({})
      .Set(absl::ToUnixNanos(absl::Now()) / 1e9);
  // Series that alerts and dashboards read exist from the start, at 0.
  chunks_reclaimed_.Add({});
  snapshots_.Add({{"outcome", "ok"}});
  snapshots_.Add({{"outcome", "failed"}});
  snapshot_seconds_.Add({}, LatencyBuckets());
  snapshot_bytes_.Add({});
  large_objects_reclaimed_.Add({});
  for (const char* outcome : {"ok", "failed"}) {
    store_snapshots_.Add({{"outcome", outcome}});
    store_restores_.Add({{"outcome", outcome}});
  }
  store_snapshot_seconds_.Add({}, LatencyBuckets());
  store_restore_seconds_.Add({}, LatencyBuckets());
  for (const char* kind : {"logical", "hashed", "stored"}) store_bytes_.Add({{"kind", kind}});
  for (const char* kind : {"new", "deduplicated"}) store_blocks_.Add({{"kind", kind}});
  store_blocks_fetched_.Add({});
  for (const char* reason : kReclaimReasons) sessions_reclaimed_.Add({{"reason", reason}});
  for (const char* limit : kLimitNames) limit_refusals_.Add({{"limit", limit}});
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition}) {
    frees_rejected_.Add({{"code", CodeName(code)}});
  }
}

void Metrics::CountLimitRefusal(const char* limit) {
  limit_refusals_.Add({{"limit", limit}}).Increment();
}

std::string MetricsBindAddress(const std::string& address) {
  return absl::StartsWith(address, ":") ? absl::StrCat("127.0.0.1", address) : address;
}

absl::Status CheckMetricsAddress(const std::string& address) {
  const std::string bind = MetricsBindAddress(address);
  const size_t colon = bind.rfind(':');
  uint32_t port;
  if (colon == std::string::npos || !absl::SimpleAtoi(bind.substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_address=", address, ": want HOST:PORT or :PORT (loopback), e.g. :9464"));
  }
  std::string host = bind.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  // Only a name the resolver knows is wrong; a resolver that cannot answer
  // now (no network yet at boot) is left to the retries.
  const int resolved = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (resolved == 0) freeaddrinfo(found);
  if (resolved == EAI_NONAME) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_address=", address, ": host '", host,
                                                   "' does not resolve: ", gai_strerror(resolved)));
  }
  return absl::OkStatus();
}

absl::Status Metrics::Serve(const std::string& flag_address, const HeapRegistry* heaps,
                            const Sessions* sessions, MetricsOptions options) {
  const std::string address = MetricsBindAddress(flag_address);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  heap_state_ = std::make_shared<HeapStateCollector>(heaps, sessions, std::move(options));
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(heap_state_);
  return absl::OkStatus();
}

int Metrics::port() const {
  if (exposer_ == nullptr) return 0;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

void Metrics::CountCall(const char* method, const absl::Status& status, double seconds) {
  calls_.Add({{"method", method}, {"code", CodeName(status.code())}}).Increment();
  call_seconds_.Add({{"method", method}}, LatencyBuckets()).Observe(seconds);
}

void Metrics::CountSync(const std::string& heap, const absl::Status& status, double seconds) {
  prometheus::Counter& failures = sync_failures_.Add({{"heap", heap}});  // exists at 0
  if (!status.ok()) {
    failures.Increment();
    return;
  }
  sync_seconds_.Add({}, LatencyBuckets()).Observe(seconds);
}

void Metrics::ForgetHeap(const std::string& heap) {
  const prometheus::Labels labels = {{"heap", heap}};
  if (sync_failures_.Has(labels)) sync_failures_.Remove(&sync_failures_.Add(labels));
}

void Metrics::CountReclaim(const char* reason, uint32_t chunks, uint32_t large_objects) {
  sessions_reclaimed_.Add({{"reason", reason}}).Increment();
  chunks_reclaimed_.Add({}).Increment(chunks);
  large_objects_reclaimed_.Add({}).Increment(large_objects);
}

void Metrics::CountSnapshot(const absl::Status& status, double seconds, uint64_t bytes_written) {
  snapshots_.Add({{"outcome", status.ok() ? "ok" : "failed"}}).Increment();
  if (!status.ok()) return;
  snapshot_seconds_.Add({}, LatencyBuckets()).Observe(seconds);
  snapshot_bytes_.Add({}).Increment(static_cast<double>(bytes_written));
}

void Metrics::CountStoreSnapshot(const absl::Status& status, double seconds,
                                 const v1::StoreUsage& usage) {
  store_snapshots_.Add({{"outcome", status.ok() ? "ok" : "failed"}}).Increment();
  if (!status.ok()) return;
  store_snapshot_seconds_.Add({}, LatencyBuckets()).Observe(seconds);
  store_bytes_.Add({{"kind", "logical"}}).Increment(static_cast<double>(usage.logical_bytes()));
  store_bytes_.Add({{"kind", "hashed"}}).Increment(static_cast<double>(usage.hashed_bytes()));
  store_bytes_.Add({{"kind", "stored"}}).Increment(static_cast<double>(usage.stored_bytes()));
  store_blocks_.Add({{"kind", "new"}}).Increment(static_cast<double>(usage.blocks_written()));
  store_blocks_.Add({{"kind", "deduplicated"}})
      .Increment(static_cast<double>(usage.blocks() - usage.blocks_written()));
}

void Metrics::CountStoreRestore(const absl::Status& status, double seconds,
                                uint64_t blocks_fetched) {
  store_restores_.Add({{"outcome", status.ok() ? "ok" : "failed"}}).Increment();
  if (!status.ok()) return;
  store_restore_seconds_.Add({}, LatencyBuckets()).Observe(seconds);
  store_blocks_fetched_.Add({}).Increment(static_cast<double>(blocks_fetched));
}

void Metrics::CountRejectedFree(const absl::Status& status) {
  frees_rejected_.Add({{"code", CodeName(status.code())}}).Increment();
}

}  // namespace heapd
