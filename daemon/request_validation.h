// The checks of a heapd.v1.Heapd request that need nothing but the request:
// no state, no caller. HeapdService runs the one for each request before
// anything else (HeapdService::Serve), so a malformed request is
// INVALID_ARGUMENT whatever the state of the daemon (docs/api.md), before
// any lookup, permission check, lock or child process.
//
// Each error names the field at fault first ("leases[2].count: lease count
// 0 is not in 1..64"), then what is wrong with it. What depends on state
// (a session is the caller's, a heap exists, an offset is a live object, a
// size fits the heap's maximum, a report matches its chunk) is checked
// later by the component that holds that state.
#ifndef HEAPD_DAEMON_REQUEST_VALIDATION_H_
#define HEAPD_DAEMON_REQUEST_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "allocator/lease_types.h"
#include "proto/heapd.pb.h"

namespace heapd {

// Bounds on one request, so that a hostile client cannot make the daemon
// do unbounded work in one call.
inline constexpr uint32_t kMaxLeasesPerWant = kMaxLeaseBatch;   // LeaseWant.count: 1..this
inline constexpr int kMaxFreesPerCall = 1 << 16;                // FreeRequest.objects
inline constexpr int kMaxPlacementsPerCall = 1 << 16;           // Sync/DetachRequest.placed
inline constexpr int kMaxLookupsPerAttach = 64;                 // AttachRequest.lookup
inline constexpr uint32_t kMaxSnapshotWaitMs = 10 * 60 * 1000;  // wait_ms
inline constexpr uint32_t kMinGraceSeconds = 60;                // GcStoreRequest.grace_s
inline constexpr uint32_t kMaxGraceSeconds = 30 * 24 * 3600;

// One per request message of the service (SnapshotRef serves
// VerifySnapshot and RemoveSnapshot). OK, or INVALID_ARGUMENT.
absl::Status ValidateRequest(const v1::CreateHeapRequest& request);
absl::Status ValidateRequest(const v1::ListHeapsRequest& request);
absl::Status ValidateRequest(const v1::StatHeapRequest& request);
absl::Status ValidateRequest(const v1::RemoveHeapRequest& request);
absl::Status ValidateRequest(const v1::AttachRequest& request);
absl::Status ValidateRequest(const v1::DetachRequest& request);
absl::Status ValidateRequest(const v1::ListClientsRequest& request);
absl::Status ValidateRequest(const v1::LeaseChunksRequest& request);
absl::Status ValidateRequest(const v1::AllocateLargeRequest& request);
absl::Status ValidateRequest(const v1::FreeRequest& request);
absl::Status ValidateRequest(const v1::SyncRequest& request);
absl::Status ValidateRequest(const v1::BindRequest& request);
absl::Status ValidateRequest(const v1::LookupRequest& request);
absl::Status ValidateRequest(const v1::UnbindRequest& request);
absl::Status ValidateRequest(const v1::ListNamesRequest& request);
absl::Status ValidateRequest(const v1::CreateSnapshotRequest& request);
absl::Status ValidateRequest(const v1::ListSnapshotsRequest& request);
absl::Status ValidateRequest(const v1::SnapshotRef& request);
absl::Status ValidateRequest(const v1::RestoreSnapshotRequest& request);
absl::Status ValidateRequest(const v1::GcStoreRequest& request);
absl::Status ValidateRequest(const v1::StoreUsageRequest& request);

}  // namespace heapd

#endif  // HEAPD_DAEMON_REQUEST_VALIDATION_H_
