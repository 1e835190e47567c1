#include "daemon/caller.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "heap/data_file.h"

namespace heapd {

std::string Caller::ToString() const {
  return absl::StrCat("uid ", uid, " gid ", gid, " pid ", pid);
}

absl::StatusOr<Caller> PeerOf(int fd) {
  struct ucred cred;
  socklen_t length = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return ErrnoStatus(errno, "read the peer credentials of a connection (SO_PEERCRED)");
  }
  return Caller{cred.uid, cred.gid, cred.pid};
}

bool InGroup(const Caller& caller, uint32_t gid) {
  if (caller.gid == gid) return true;
  std::ifstream status(absl::StrCat("/proc/", caller.pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    for (absl::string_view field :
         absl::StrSplit(absl::string_view(line).substr(7), absl::ByAnyChar(" \t"),
                        absl::SkipEmpty())) {
      uint32_t group;
      if (absl::SimpleAtoi(field, &group) && group == gid) return true;
    }
    return false;
  }
  return false;
}

bool MayAccess(const Caller& caller, const HeapConfig& config, Access access) {
  if (caller.uid == 0) return true;
  const uint32_t bit = static_cast<uint32_t>(access);
  if (caller.uid == config.owner_uid) return (config.mode & (bit << 6)) != 0;
  if (InGroup(caller, config.owner_gid)) return (config.mode & (bit << 3)) != 0;
  return (config.mode & bit) != 0;
}

bool MayAccessPath(const Caller& caller, const std::string& path, Access access) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  HeapConfig as_file;
  as_file.owner_uid = st.st_uid;
  as_file.owner_gid = st.st_gid;
  as_file.mode = st.st_mode & 0777;
  return MayAccess(caller, as_file, access);
}

bool IsAdmin(const Caller& caller, std::optional<uint32_t> admin_gid) {
  return caller.uid == 0 || (admin_gid.has_value() && InGroup(caller, *admin_gid));
}

}  // namespace heapd
