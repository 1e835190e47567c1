// heapd's release, one place for every program and the metrics
// (heapd_build_info). The wire protocol is versioned by its package
// (heapd.v1), not by this.
#ifndef HEAPD_PROTOCOL_VERSION_H_
#define HEAPD_PROTOCOL_VERSION_H_

namespace heapd {

inline constexpr char kHeapdVersion[] = "0.4.0";

}  // namespace heapd

#endif  // HEAPD_PROTOCOL_VERSION_H_
