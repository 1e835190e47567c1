// HeapdService: the heapd.v1.Heapd gRPC service, a thin layer. Each call
// learns its caller from the connection (GrpcListener), validates the whole
// request before it changes anything, checks the caller's permission on the
// heap, then calls the component that does the work (HeapRegistry,
// Sessions, a SnapshotBackend) and converts the result.
#ifndef HEAPD_DAEMON_HEAPD_SERVICE_H_
#define HEAPD_DAEMON_HEAPD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/caller.h"
#include "daemon/heap_registry.h"
#include "daemon/limits.h"
#include "daemon/metrics.h"
#include "daemon/request_validation.h"
#include "daemon/sessions.h"
#include "daemon/snapshot_backends.h"
#include "proto/heapd.grpc.pb.h"
#include "snapshot/snapshot_store.h"
#include "snapshot/store_snapshots.h"

namespace heapd {

struct ServiceOptions {
  std::optional<uint32_t> admin_gid;
  uint64_t default_max_size = uint64_t{16} << 30;
  UserLimits limits;
  // Readable once heapd is stopping: waits end, snapshot workers are killed.
  int stop_fd = -1;
};

class HeapdService final : public v1::Heapd::Service {
 public:
  using CallerLookup = std::function<absl::StatusOr<Caller>(const std::string& peer)>;

  // Snapshot calls go to `directory_snapshots` or, for a request that
  // names a store, `store_versions`; in-place attaches to `snapshots`, a
  // store's gc and usage to `store_snapshots`. None is owned.
  struct SnapshotParts {
    SnapshotBackend* directory_snapshots = nullptr;
    SnapshotBackend* store_versions = nullptr;
    SnapshotStore* snapshots = nullptr;
    StoreSnapshots* store_snapshots = nullptr;
  };

  HeapdService(HeapRegistry* heaps, Sessions* sessions, SnapshotParts snapshot_parts,
               Metrics* metrics, CallerLookup caller_of, ServiceOptions options)
      : heaps_(heaps),
        sessions_(sessions),
        snapshots_(snapshot_parts.snapshots),
        store_snapshots_(snapshot_parts.store_snapshots),
        metrics_(metrics),
        directory_snapshots_(*snapshot_parts.directory_snapshots),
        store_versions_(*snapshot_parts.store_versions),
        caller_of_(std::move(caller_of)),
        options_(options) {}

  grpc::Status CreateHeap(grpc::ServerContext*, const v1::CreateHeapRequest*,
                          v1::HeapInfo*) override;
  grpc::Status ListHeaps(grpc::ServerContext*, const v1::ListHeapsRequest*,
                         v1::ListHeapsResponse*) override;
  grpc::Status StatHeap(grpc::ServerContext*, const v1::StatHeapRequest*, v1::HeapStats*) override;
  grpc::Status RemoveHeap(grpc::ServerContext*, const v1::RemoveHeapRequest*,
                          v1::RemoveHeapResponse*) override;
  grpc::Status Attach(grpc::ServerContext*, const v1::AttachRequest*, v1::AttachResponse*) override;
  grpc::Status Detach(grpc::ServerContext*, const v1::DetachRequest*, v1::DetachResponse*) override;
  grpc::Status ListClients(grpc::ServerContext*, const v1::ListClientsRequest*,
                           v1::ListClientsResponse*) override;
  grpc::Status LeaseChunks(grpc::ServerContext*, const v1::LeaseChunksRequest*,
                           v1::LeaseChunksResponse*) override;
  grpc::Status AllocateLarge(grpc::ServerContext*, const v1::AllocateLargeRequest*,
                             v1::AllocateLargeResponse*) override;
  grpc::Status Free(grpc::ServerContext*, const v1::FreeRequest*, v1::FreeResponse*) override;
  grpc::Status Sync(grpc::ServerContext*, const v1::SyncRequest*, v1::SyncResponse*) override;
  grpc::Status Bind(grpc::ServerContext*, const v1::BindRequest*, v1::BindResponse*) override;
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest*, v1::NameEntry*) override;
  grpc::Status Unbind(grpc::ServerContext*, const v1::UnbindRequest*, v1::NameEntry*) override;
  grpc::Status ListNames(grpc::ServerContext*, const v1::ListNamesRequest*,
                         v1::ListNamesResponse*) override;
  grpc::Status CreateSnapshot(grpc::ServerContext*, const v1::CreateSnapshotRequest*,
                              v1::SnapshotManifest*) override;
  grpc::Status ListSnapshots(grpc::ServerContext*, const v1::ListSnapshotsRequest*,
                             v1::ListSnapshotsResponse*) override;
  grpc::Status VerifySnapshot(grpc::ServerContext*, const v1::SnapshotRef*,
                              v1::SnapshotManifest*) override;
  grpc::Status RemoveSnapshot(grpc::ServerContext*, const v1::SnapshotRef*,
                              v1::RemoveSnapshotResponse*) override;
  grpc::Status GcStore(grpc::ServerContext*, const v1::GcStoreRequest*,
                       v1::GcStoreResponse*) override;
  grpc::Status StoreUsage(grpc::ServerContext*, const v1::StoreUsageRequest*,
                          v1::StoreUsageResponse*) override;
  grpc::Status RestoreSnapshot(grpc::ServerContext*, const v1::RestoreSnapshotRequest*,
                               v1::HeapInfo*) override;

 private:
  // Counts a caller's snapshot calls in flight (limits.snapshot_calls).
  class SnapshotCallSlot;

  // Runs `body` for the caller of `context` once `request` passed its
  // ValidateRequest; absl errors become gRPC ones.
  template <typename Request>
  grpc::Status Serve(grpc::ServerContext* context, const char* method, const Request& request,
                     const std::function<absl::Status(const Caller&)>& body) {
    return Serve(context, method, [&](const Caller& caller) -> absl::Status {
      if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
      return body(caller);
    });
  }
  grpc::Status Serve(grpc::ServerContext* context, const char* method,
                     const std::function<absl::Status(const Caller&)>& body);
  // Heap `name` if `caller` may `access` it.
  absl::StatusOr<std::shared_ptr<ServedHeap>> HeapFor(const std::string& name, const Caller& caller,
                                                      Access access);
  // Unbinds `name` in heap `heap` for `caller` (write access) without a
  // session, and persists it.
  absl::StatusOr<NameEntry> UnbindAndPersist(const std::string& heap, const Caller& caller,
                                             const std::string& name);
  // Creates heap `name` owned by `caller` (max_size 0: the default; mode 0:
  // 0600; image IMAGE_UNKNOWN: the default, HeapRegistry::ChooseImage) on
  // tier `storage` (empty: the default), at a fixed address if
  // `fixed_address`. ALREADY_EXISTS if it exists; RESOURCE_EXHAUSTED at a
  // limit or with the fixed-address window full.
  absl::StatusOr<std::shared_ptr<ServedHeap>> NewHeap(const std::string& name, uint64_t max_size,
                                                      uint32_t mode, v1::ImageKind image,
                                                      const std::string& storage,
                                                      bool fixed_address, const Caller& caller);
  // Takes heap `name` out of service for `caller` (owner or admin, no
  // clients), for HeapRegistry::DeleteRemoved to close and delete with no
  // lock held (closing waits for a growth in progress).
  absl::StatusOr<HeapRegistry::Removed> RemoveHeapLocked(const std::string& name,
                                                         const Caller& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu_);
  // Waits until every read-write session on `heap` synced after `since`,
  // up to `deadline`, while the call is not cancelled and heapd not
  // stopping; FAILED_PRECONDITION naming those that did not.
  absl::Status WaitForWriters(const ServedHeap& heap, absl::Time since, absl::Time deadline,
                              grpc::ServerContext* context) const;
  // Counts `status` in heapd_limit_refusals_total if a limit refused it.
  absl::Status CountIfLimited(absl::Status status) const;
  // `context`'s caller as the snapshot store knows it; its work stops when
  // the call is cancelled.
  SnapshotCaller SnapshotCallerOf(const Caller& caller, grpc::ServerContext* context) const {
    return {caller.credentials(), IsAdmin(caller), [context] { return context->IsCancelled(); }};
  }
  // Where a snapshot call with `store_dir` goes (empty: directory
  // snapshots).
  SnapshotBackend& BackendFor(const std::string& store_dir);
  // The largest heap a restore or in-place attach may bring for `caller`.
  uint64_t SnapshotBytesAllowed(const Caller& caller) const;
  void FillClient(const Session& session, v1::ClientInfo* info) const;
  void FillInfo(const ServedHeap& served, bool with_usage, v1::HeapInfo* info) const;
  bool IsAdmin(const Caller& caller) const { return heapd::IsAdmin(caller, options_.admin_gid); }
  bool Stopping() const;

  HeapRegistry* const heaps_;
  Sessions* const sessions_;
  SnapshotStore* const snapshots_;
  StoreSnapshots* const store_snapshots_;
  Metrics* const metrics_;
  SnapshotBackend& directory_snapshots_;
  SnapshotBackend& store_versions_;
  const CallerLookup caller_of_;
  const ServiceOptions options_;

  // Held by Attach while it starts a session and by RemoveHeap: no session
  // starts on a heap being removed. Never held across I/O.
  absl::Mutex attach_mu_;

  absl::Mutex calls_mu_;
  std::map<uint32_t, uint32_t> calls_in_flight_ ABSL_GUARDED_BY(calls_mu_);  // by uid

  mutable absl::Mutex snapshot_calls_mu_;
  std::map<uint32_t, uint32_t> snapshot_calls_ ABSL_GUARDED_BY(snapshot_calls_mu_);
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_HEAPD_SERVICE_H_
