// Packets on RunAs's SOCK_SEQPACKET sockets (heapd and a helper, heapd and
// the spawner): each packet is one part, its first byte the part's kind,
// and may carry descriptors.
#ifndef HEAPD_UTIL_RUN_AS_PACKETS_H_
#define HEAPD_UTIL_RUN_AS_PACKETS_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

// The largest packet body, and the most descriptors one packet carries.
constexpr size_t kPacketBodyBytes = 32 << 10;
constexpr size_t kMaxFdsPerPacket = 16;

// Sends `kind` then `bytes` (at most kPacketBodyBytes) with `fds` (at most
// kMaxFdsPerPacket) as one packet; never raises SIGPIPE. False with errno
// set on failure.
bool SendPacket(int socket, char kind, absl::string_view bytes, const std::vector<int>& fds,
                int flags);

// Reads one packet into `packet`, appending its descriptors (close-on-exec)
// to `fds`. Returns the number of bytes, 0 at the end, -1 on error (errno
// set; EPROTO for a truncated packet).
ssize_t ReceivePacket(int socket, std::string* packet, std::vector<UniqueFd>* fds, int flags);

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_AS_PACKETS_H_
