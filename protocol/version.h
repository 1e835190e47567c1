// heapd's release, one place for every program and the metrics
// (heapd_build_info). The wire protocol is versioned by its package
// (heapd.v1), not by this.
#ifndef HEAPD_PROTOCOL_VERSION_H_
#define HEAPD_PROTOCOL_VERSION_H_

#include <cstdint>

namespace heapd {

inline constexpr char kHeapdVersion[] = "0.4.0";

// The revision of the heapd.v1 wire protocol heapd speaks: a heapd answers
// it at attach, and a client library refuses a heapd below the revision it
// needs. Raised when heapd.v1 gains a message or field a client relies on;
// heapd.v2 would be a new package. 1: 0.4.0 (Unbind by heap, removed store
// parts, skipped snapshots; arrays). 2: undo journals start with a
// control page, the guard that replaces the per-pre-image lock, and take
// records checked with XXH3 (heap/undo_record.h). 3: fixed-address heaps;
// clients say their revision at attach.
inline constexpr uint32_t kProtocolRevision = 3;
inline constexpr uint32_t kMinProtocolRevision = 1;
// A client uses its journal's guard and checks records with XXH3 only when
// heapd speaks this revision; with an older heapd it takes the OFD lock for
// every pre-image and checks with CRC-32 (what that heapd reads).
inline constexpr uint32_t kGuardedJournalsRevision = 2;
// heapd serves fixed-address heaps only to clients of this revision or
// later, which map them at their address (or fail).
inline constexpr uint32_t kFixedAddressRevision = 3;

}  // namespace heapd

#endif  // HEAPD_PROTOCOL_VERSION_H_
