// Bounds heapd and its clients both keep.
#ifndef HEAPD_PROTOCOL_LIMITS_H_
#define HEAPD_PROTOCOL_LIMITS_H_

namespace heapd {

// The largest gRPC message either side sends or takes (a sync's reports
// come in parts well below it).
inline constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace heapd

#endif  // HEAPD_PROTOCOL_LIMITS_H_
