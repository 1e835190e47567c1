#include "daemon/caller.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// A process has at most NGROUPS_MAX (65536) supplementary groups.
constexpr size_t kMaxGroups = 65536;

}  // namespace

std::string Caller::ToString() const {
  return absl::StrCat("uid ", uid, " gid ", gid, " pid ", pid);
}

absl::StatusOr<Caller> PeerOf(int fd) {
  struct ucred cred;
  socklen_t length = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return ErrnoStatus(errno, "read the peer credentials of a connection (SO_PEERCRED)");
  }
  Caller caller{cred.uid, cred.gid, cred.pid, {}};
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      break;
    }
    if (errno != ERANGE || bytes / sizeof(gid_t) > kMaxGroups) {
      return ErrnoStatus(errno, "read the peer's groups of a connection (SO_PEERGROUPS)");
    }
    groups.resize(bytes / sizeof(gid_t));
  }
  caller.groups.assign(groups.begin(), groups.end());
  return caller;
}

bool InGroup(const Caller& caller, uint32_t gid) {
  return caller.gid == gid ||
         std::find(caller.groups.begin(), caller.groups.end(), gid) != caller.groups.end();
}

bool MayAccess(const Caller& caller, const HeapConfig& config, Access access) {
  if (caller.uid == 0) return true;
  const uint32_t bit = static_cast<uint32_t>(access);
  if (caller.uid == config.owner_uid) return (config.mode & (bit << 6)) != 0;
  if (InGroup(caller, config.owner_gid)) return (config.mode & (bit << 3)) != 0;
  return (config.mode & bit) != 0;
}

bool IsAdmin(const Caller& caller, std::optional<uint32_t> admin_gid) {
  return caller.uid == 0 || (admin_gid.has_value() && InGroup(caller, *admin_gid));
}

}  // namespace heapd
