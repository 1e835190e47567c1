// Metrics: heapd's Prometheus metrics and their HTTP endpoint.
//
// Counters and histograms are updated by the daemon as things happen (calls,
// syncs, reclaimed sessions, rejected frees). Per-heap and per-size-class
// state is read from the heaps at scrape time (HeapStateCollector), so it is
// never stale and costs nothing between scrapes.
//
// Labels are bounded: method and status code, heap name, size class, reason
// and kind. Never object names, uids or pids. Series stay bounded with many
// heaps: per-heap gauges for at most MetricsOptions::max_heaps heaps (node
// totals cover the rest), size-class series only for heaps asked for, and
// one sync histogram for the node.
#ifndef HEAPD_DAEMON_METRICS_H_
#define HEAPD_DAEMON_METRICS_H_

#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/heapd.pb.h"

namespace heapd {

// Why a session ended without a detach (label of heapd_sessions_reclaimed_total).
inline constexpr const char* kReclaimReasons[] = {"connection_closed", "token_expired",
                                                  "attach_failed",     "detach_failed",
                                                  "no_data_fd",        "no_undo_journal"};

class HeapRegistry;
class Sessions;

struct MetricsOptions {
  // Heaps with per-heap gauges: those with the most reserved bytes.
  size_t max_heaps = 1000;
  // Heaps with size-class series (three per size class in use, up to 64
  // classes): the ones named here, or every heap.
  std::set<std::string> size_classes_of;
  bool size_classes_of_every_heap = false;
};

class Metrics {
 public:
  Metrics();

  // Serves the metrics, with the heaps' state, on `address` (HOST:PORT, or
  // :PORT for the loopback address only; port 0 picks one). UNAVAILABLE if
  // it cannot bind.
  absl::Status Serve(const std::string& address, const HeapRegistry* heaps,
                     const Sessions* sessions, MetricsOptions options = {});
  // The port served on (after Serve).
  int port() const;

  // One gRPC call of `method` that ended with `status` after `seconds`.
  void CountCall(const char* method, const absl::Status& status, double seconds);
  // A sync of `heap` (by a client, a detach or at shutdown).
  void CountSync(const std::string& heap, const absl::Status& status, double seconds);
  // Drops the series of `heap`, removed: names of heaps long gone do not
  // pile up in the exposition.
  void ForgetHeap(const std::string& heap);
  // A session that ended without detaching (`reason` one of
  // kReclaimReasons); what was taken back.
  void CountReclaim(const char* reason, uint32_t chunks, uint32_t large_objects);
  // A free the daemon refused.
  void CountRejectedFree(const absl::Status& status);
  // A snapshot attempt; what it wrote.
  void CountSnapshot(const absl::Status& status, double seconds, uint64_t bytes_written);
  // A snapshot into a snapshot store, and what it took; a restore from one.
  void CountStoreSnapshot(const absl::Status& status, double seconds, const v1::StoreUsage& usage);
  void CountStoreRestore(const absl::Status& status, double seconds, uint64_t blocks_fetched);
  // A request or connection refused by the per-user limit `limit` (one of
  // kLimitNames, daemon/limits.h).
  void CountLimitRefusal(const char* limit);

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> heap_state_;
  prometheus::Family<prometheus::Counter>& calls_;
  prometheus::Family<prometheus::Histogram>& call_seconds_;
  prometheus::Family<prometheus::Histogram>& sync_seconds_;
  prometheus::Family<prometheus::Counter>& sync_failures_;
  prometheus::Family<prometheus::Counter>& sessions_reclaimed_;
  prometheus::Family<prometheus::Counter>& chunks_reclaimed_;
  prometheus::Family<prometheus::Counter>& large_objects_reclaimed_;
  prometheus::Family<prometheus::Counter>& frees_rejected_;
  prometheus::Family<prometheus::Counter>& snapshots_;
  prometheus::Family<prometheus::Histogram>& snapshot_seconds_;
  prometheus::Family<prometheus::Counter>& snapshot_bytes_;
  prometheus::Family<prometheus::Counter>& store_snapshots_;
  prometheus::Family<prometheus::Histogram>& store_snapshot_seconds_;
  prometheus::Family<prometheus::Counter>& store_bytes_;
  prometheus::Family<prometheus::Counter>& store_blocks_;
  prometheus::Family<prometheus::Counter>& store_restores_;
  prometheus::Family<prometheus::Histogram>& store_restore_seconds_;
  prometheus::Family<prometheus::Counter>& store_blocks_fetched_;
  prometheus::Family<prometheus::Counter>& limit_refusals_;
};

// The address the metrics endpoint binds for the flag value `address`:
// ":PORT" means the loopback address (heap names must not reach the
// network unless an admin says so).
std::string MetricsBindAddress(const std::string& address);

// OK if the flag value `address` is HOST:PORT or :PORT with a port number
// and a host the resolver does not refuse outright; INVALID_ARGUMENT saying
// what is wrong. (A port another process holds, or a resolver that cannot
// answer yet, is not an error: heapd serves without metrics and tries again,
// so no local user and no late network keeps heapd down.)
absl::Status CheckMetricsAddress(const std::string& address);

}  // namespace heapd

#endif  // HEAPD_DAEMON_METRICS_H_
