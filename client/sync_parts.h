// SyncParts: what one sync or detach tells heapd, in parts small enough
// for a call. heapd holds the earlier parts (sent with more=true) and
// commits them with the last, with the contents: one sync, one epoch. If
// an earlier part fails, nothing of it commits (a sync is retried whole; a
// detach ends the session at its last sync).
#ifndef HEAPD_CLIENT_SYNC_PARTS_H_
#define HEAPD_CLIENT_SYNC_PARTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "allocator/large_reserve.h"
#include "allocator/lease_pool.h"
#include "client/session_calls.h"
#include "protocol/proto_convert.h"

namespace heapd {

// Lease reports per part (a report of a chunk of 8-byte objects is
// 32 KiB; this keeps a call well under the message limit).
constexpr size_t kReportsPerSync = 1024;
// Placements of large objects per part (well under heapd's
// kMaxPlacementsPerCall).
constexpr size_t kPlacementsPerPart = 16384;

class SyncParts {
 public:
  // The leases' reports and the large objects placed since the last sync;
  // both outlive this object.
  SyncParts(const std::vector<LeaseReport>& reports, const std::vector<LargePlacement>& placed)
      : reports_(reports), placed_(placed) {}

  // Sends all but what fits the last part, as parts heapd holds.
  absl::Status SendEarlier(SessionCalls& calls, uint64_t session);

  // Puts what is left into `last` (a SyncRequest or DetachRequest).
  template <typename LastRequest>
  void FillLast(LastRequest* last) {
    for (; reports_sent_ < reports_.size(); ++reports_sent_) {
      ToProto(reports_[reports_sent_], last->add_reports());
    }
    for (; placed_sent_ < placed_.size(); ++placed_sent_) {
      ToProto(placed_[placed_sent_], last->add_placed());
    }
  }

 private:
  const std::vector<LeaseReport>& reports_;
  const std::vector<LargePlacement>& placed_;
  size_t reports_sent_ = 0;
  size_t placed_sent_ = 0;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_SYNC_PARTS_H_
