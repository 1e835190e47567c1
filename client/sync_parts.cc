#include "client/sync_parts.h"

#include <algorithm>

#include "heap/fault_point.h"

namespace heapd {

absl::Status SyncParts::SendEarlier(SessionCalls& calls, uint64_t session) {
  while (reports_.size() - reports_sent_ > kReportsPerSync ||
         placed_.size() - placed_sent_ > kPlacementsPerPart) {
    v1::SyncRequest request;
    request.set_session(session);
    request.set_more(true);
    for (const size_t end = std::min(reports_.size(), reports_sent_ + kReportsPerSync);
         reports_sent_ < end; ++reports_sent_) {
      ToProto(reports_[reports_sent_], request.add_reports());
    }
    for (const size_t end = std::min(placed_.size(), placed_sent_ + kPlacementsPerPart);
         placed_sent_ < end; ++placed_sent_) {
      ToProto(placed_[placed_sent_], request.add_placed());
    }
    v1::SyncResponse response;
    if (absl::Status s = calls.Sync(request, &response); !s.ok()) return s;
    FaultPoint("client.sync.between_parts");
  }
  return absl::OkStatus();
}

}  // namespace heapd
