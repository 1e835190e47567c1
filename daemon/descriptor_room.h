// Descriptor room: whether heapd may open another heap without running out
// of file descriptors (RLIMIT_NOFILE). An open heap holds about 7
// descriptors (its directory, lock, data file, metadata log and undo
// journals; a working image a few more), a session 2 or 3, so at 10^4 heaps
// heapd needs a limit well above systemd's 1024 or the unit's old 65536.
// Checked before a heap is made or restored, so a node short of
// descriptors refuses the new heap with a clear error instead of failing
// half-way through opening it.
#ifndef HEAPD_DAEMON_DESCRIPTOR_ROOM_H_
#define HEAPD_DAEMON_DESCRIPTOR_ROOM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heapd {

// Descriptors an open heap may hold, with room for its working image.
inline constexpr int kDescriptorsPerHeap = 12;
// Kept free for sessions, connections and snapshots (an eighth of a limit
// below 2048).
inline constexpr int kDescriptorReserve = 256;

// The descriptors this process holds; RESOURCE_EXHAUSTED if none is left
// to count them with, another error if /proc cannot say.
absl::StatusOr<uint64_t> DescriptorsHeld();

// OK if this process may open kDescriptorsPerHeap more descriptors below
// its limit and keep the reserve free; RESOURCE_EXHAUSTED naming the limit
// and `heap` otherwise.
absl::Status CheckDescriptorRoom(absl::string_view heap);

}  // namespace heapd

#endif  // HEAPD_DAEMON_DESCRIPTOR_ROOM_H_
