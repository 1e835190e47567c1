// Caller: who is on the other end of a Unix socket, as the kernel says
// (SO_PEERCRED), and what a caller may do with a heap.
//
// Heap permissions work like a file's: the owner's bits apply to the owner,
// the group's to members of the heap's group (primary or supplementary),
// the others' to everyone else; root may do anything. Read permission lets
// a caller attach read-only, look up and list names and stat the heap;
// write permission lets it attach read-write. Admins (root, or members of
// the configured admin group) may remove any heap and list every client.
#ifndef HEAPD_DAEMON_CALLER_H_
#define HEAPD_DAEMON_CALLER_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "heap/metadata_format.h"
#include "util/run_as.h"

namespace heapd {

// Who is calling, as the kernel recorded it when the connection was made
// (SO_PEERCRED, SO_PEERGROUPS). Taken once, at accept: nothing later (a
// reused pid, a process that changed its groups) can alter it.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  pid_t pid = 0;                 // for logs and client lists only, never for decisions
  std::vector<uint32_t> groups;  // supplementary groups

  std::string ToString() const;
  // The credentials a helper acting for this caller takes (util/run_as.h).
  Credentials credentials() const { return {uid, gid, groups}; }
};

// Credentials of the peer of the connected Unix socket `fd`.
absl::StatusOr<Caller> PeerOf(int fd);

// True if `caller` is in group `gid`: its primary or a supplementary group.
bool InGroup(const Caller& caller, uint32_t gid);

enum class Access { kRead = 4, kWrite = 2, kSearch = 1 };

// True if `caller` may `access` a heap with `config`'s owner and mode.
bool MayAccess(const Caller& caller, const HeapConfig& config, Access access);

// True if `caller` is root or in `admin_gid`.
bool IsAdmin(const Caller& caller, std::optional<uint32_t> admin_gid);

}  // namespace heapd

#endif  // HEAPD_DAEMON_CALLER_H_
