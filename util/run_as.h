// RunAs: work done with a local user's rights, not root's.
//
// heapd runs as root, and a path that a user names (a snapshot directory on
// the parallel file system, say) is under that user's control: any
// component may be swapped for a symlink between a check and a use. So heapd
// never resolves such a path itself. It forks a short-lived child, switches
// the child to the user's uid, gid and supplementary groups, and lets the
// child do the work: the kernel then grants exactly what the user could do
// (symlinks, permissions, sticky directories, ACLs, quotas) and nothing
// more. The child sends back bytes and file descriptors over a socket; the
// parent trusts neither beyond what it checks itself (an fd's type and
// size, every byte parsed with bounds).
//
// The child is a fork of a multi-threaded process: `work` may allocate
// (glibc keeps malloc usable across fork) and make system calls, but must
// not take a lock another thread could have held at the fork (no logging,
// no absl::Mutex, no protobuf reflection or JSON, no gRPC). It sees only the
// descriptors in `keep_fds` (and 0-2); every other descriptor of the daemon
// is closed before the credentials change, and the child is not dumpable, so
// the user can neither trace it nor reach the daemon's files through it; the
// user can only kill it, which fails the operation.
#ifndef HEAPD_UTIL_RUN_AS_H_
#define HEAPD_UTIL_RUN_AS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "util/unique_fd.h"

namespace heapd {

// Who a child acts as: exactly these ids and supplementary groups.
struct Credentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;
};

// One message from the child: bytes and at most one descriptor.
struct ChildMessage {
  std::string bytes;
  UniqueFd fd;
};

// Where work sends what it found: bytes and, with them, at most one fd
// (the sink takes a copy of it; the sender keeps its own).
class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual absl::Status Send(absl::string_view bytes, int fd = -1) = 0;
};

// The child's end of the channel: sends `bytes` (any size, split in parts
// on the wire) and, with the last part, `fd`.
class ChildChannel final : public MessageSink {
 public:
  explicit ChildChannel(int socket) : socket_(socket) {}
  absl::Status Send(absl::string_view bytes, int fd = -1) override;

 private:
  int socket_;
};

// Collects messages in this process: the same work run without a child.
class MessageList final : public MessageSink {
 public:
  absl::Status Send(absl::string_view bytes, int fd = -1) override;
  std::vector<ChildMessage>& messages() { return messages_; }

 private:
  std::vector<ChildMessage> messages_;
};

struct RunAsOptions {
  // The child is killed at this deadline: DEADLINE_EXCEEDED.
  absl::Duration timeout = absl::Minutes(10);
  // When this descriptor becomes readable (the daemon is stopping), the
  // child is killed: UNAVAILABLE. -1: none.
  int cancel_fd = -1;
  // Asked every 100 ms; when it returns true (the caller went away), the
  // child is killed: CANCELLED. Empty: never.
  std::function<bool()> cancelled;
  // Bytes received by all RunAs calls sharing this budget, and its limit:
  // a call that would pass it fails with RESOURCE_EXHAUSTED (heapd-wide
  // memory bound). Null: none.
  struct Budget {
    std::atomic<uint64_t> used{0};
    uint64_t limit = 0;
  };
  Budget* budget = nullptr;
  // Total bytes the child may send; beyond them it is killed:
  // RESOURCE_EXHAUSTED.
  uint64_t max_reply_bytes = uint64_t{64} << 20;
  // Names the operation in errors ("create snapshot /x/y").
  std::string what;
};

// Runs `work` in a child process with credentials `who`, which sees only
// `keep_fds` (by the same numbers) besides stdin, stdout and stderr.
// Returns what the child sent, or the status `work` returned (its code and
// message), or an error if the child died, timed out or was cancelled.
absl::StatusOr<std::vector<ChildMessage>> RunAs(
    const Credentials& who, const std::vector<int>& keep_fds, const RunAsOptions& options,
    const std::function<absl::Status(MessageSink& channel)>& work);

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_AS_H_
