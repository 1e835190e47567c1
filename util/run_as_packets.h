// Packets on RunAs's SOCK_SEQPACKET sockets (heapd and a helper, heapd and
// the spawner): each packet is one message, its first byte the message's
// kind, and may carry descriptors. A message too large for a packet
// travels as a sealed memfd lent in one (SealedBytes, ReadSealedBytes):
// one copy in and one out, however large, instead of a packet round trip
// per 32 KiB.
#ifndef HEAPD_UTIL_RUN_AS_PACKETS_H_
#define HEAPD_UTIL_RUN_AS_PACKETS_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

// A helper's end of its channel to heapd, as the helper sees it.
constexpr int kHelperChannelFd = 3;

// The kinds of packet on a helper's channel, both ways.
constexpr char kInlineMessage = 'M';  // a message in the packet (may lend one fd)
constexpr char kSealedMessage = 'S';  // a message in a sealed memfd, lent first (one fd may follow)
constexpr char kJobError = 'E';       // the job failed: status code byte, message
constexpr char kLentFds = 'F';        // heapd to helper, after the request: the lent fds

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

// A memfd holding `pieces` one after another, sealed against any change
// (write, grow, shrink, further seals). Invalid with errno set on failure.
UniqueFd SealedBytes(const std::vector<absl::string_view>& pieces);

// The size of `fd` if it is sealed as SealedBytes seals (its bytes can no
// longer change); FAILED_PRECONDITION naming `what` otherwise. A receiver
// checks the size against what it accepts before reading.
absl::StatusOr<uint64_t> SealedSize(int fd, absl::string_view what);
// Reads the first `size` bytes of `fd` (checked by SealedSize) into `bytes`.
absl::Status ReadSealedBytes(int fd, uint64_t size, absl::string_view what, std::string* bytes);

// The first `size` bytes of `fd` (checked by SealedSize) mapped read-only
// and populated at once: a helper reads its request in place, instead of
// copying megabytes into memory it would fault in page by page (~6 us a
// fault in a VM).
class SealedMapping {
 public:
  static absl::StatusOr<SealedMapping> Map(int fd, uint64_t size, absl::string_view what);
  SealedMapping() = default;
  SealedMapping(SealedMapping&& other) noexcept;
  SealedMapping& operator=(SealedMapping&& other) noexcept;
  ~SealedMapping() { Unmap(); }

  absl::string_view bytes() const { return absl::string_view(data_, size_); }

 private:
  void Unmap();

  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_AS_PACKETS_H_
