// What one local user may make heapd hold. heapd runs as root on shared
// nodes and every user may be hostile: each of these bounds what one user
// can consume, so no user can exhaust the daemon for the others. Root is
// not limited. Each is a flag of heapd (heapd_main.cc, docs/operations.md);
// a refusal is RESOURCE_EXHAUSTED naming the flag, and is counted in
// heapd_limit_refusals_total{limit}.
#ifndef HEAPD_DAEMON_LIMITS_H_
#define HEAPD_DAEMON_LIMITS_H_

#include <cstdint>

namespace heapd {

struct UserLimits {
  // Heaps a user owns.
  uint32_t heaps = 64;
  // Sum of the maximum sizes of a user's heaps (a restore counts too).
  uint64_t heap_bytes = uint64_t{1} << 40;
  // Bytes of the node's fixed-address window (heap/fixed_address.h, 25
  // TiB) a user's fixed-address heaps hold: their ranges, guards included.
  // The window is one budget for every user: at this default, 100 users'
  // full shares fit in it.
  uint64_t fixed_address_bytes = uint64_t{256} << 30;
  // Names bound in one heap (by anyone).
  uint64_t names_per_heap = uint64_t{1} << 20;
  // Sessions a user has attached at once.
  uint32_t sessions = 1024;
  // Connections a user holds open on each of heapd.sock and heapd.fd.sock.
  uint32_t connections = 2048;
  // gRPC calls of a user in flight at once (each holds one of heapd's
  // threads; heapd has --max_threads in all).
  uint32_t calls = 256;
  // Bytes of snapshots (their data files) a user keeps in heapd's own
  // snapshot directory.
  uint64_t snapshot_bytes = uint64_t{1} << 40;
  // Snapshot calls (create, list, verify, remove, restore, attach in
  // place) a user runs at once: each may spawn a helper.
  uint32_t snapshot_calls = 4;
};

// The limit names of heapd_limit_refusals_total, as the flags without
// their "max_" prefix.
inline constexpr const char* kLimitNames[] = {
    "heaps_per_user",          "heap_bytes_per_user",  "names_per_heap",
    "sessions_per_user",       "connections_per_user", "snapshot_bytes_per_user",
    "snapshot_calls_per_user", "calls_per_user",       "fixed_address_bytes_per_user"};

}  // namespace heapd

#endif  // HEAPD_DAEMON_LIMITS_H_
