#include "bench/heapd_process.h"

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/client_channel.h"

extern char** environ;

namespace heapd {

absl::StatusOr<std::unique_ptr<HeapdProcess>> HeapdProcess::Start(
    const std::string& binary, const std::vector<std::string>& flags, bool huge_pages,
    const std::string& parent) {
  std::unique_ptr<HeapdProcess> process(new HeapdProcess());
  std::string pattern = parent + "/heapd-bench-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", parent, ": ", std::strerror(errno)));
  }
  process->dir_ = pattern;
  if (huge_pages) {
    if (mount("tmpfs", pattern.c_str(), "tmpfs", 0, "huge=within_size,size=16g,mode=0700") != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("mount a huge-page tmpfs on ", pattern, ": ", std::strerror(errno)));
    }
    process->mounted_ = true;
  }
  process->argv_ = {binary, "--state_dir=" + process->state_dir(),
                    "--runtime_dir=" + process->dir_ + "/run", "--log_level=warn"};
  process->argv_.insert(process->argv_.end(), flags.begin(), flags.end());
  if (absl::Status s = process->Spawn(4); !s.ok()) return s;
  return process;
}

absl::Status HeapdProcess::Spawn(int wait_s) {
  const std::string& binary = argv_[0];
  std::vector<std::string> argv = argv_;
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  if (const int err = posix_spawn(&pid_, raw[0], nullptr, nullptr, raw.data(), environ); err != 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(err)));
  }
  for (int i = 0; i < wait_s * 50 && client_ == nullptr; ++i) {
    usleep(20000);
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat(binary, " exited at start"));
    }
    if (auto c = Client::Connect(socket(), 1000); c.ok()) client_ = *std::move(c);
  }
  if (client_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(binary, " does not answer on ", socket()));
  }
  // It answers: from now on, calls get the client's usual deadline (a sync
  // logging a GiB to a working image's redo log takes seconds).
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket());
  if (!client.ok()) return client.status();
  client_ = *std::move(client);
  return absl::OkStatus();
}

absl::Status HeapdProcess::Restart(const std::function<void()>& while_down, int wait_s) {
  client_.reset();
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  if (while_down) while_down();
  return Spawn(wait_s);
}

HeapdProcess::~HeapdProcess() {
  client_.reset();
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  if (dir_.empty()) return;
  std::filesystem::remove_all(dir_, ignored);  // its contents, if mounted
  if (mounted_) {
    umount2(dir_.c_str(), MNT_DETACH);
    std::filesystem::remove(dir_, ignored);
  }
}

void RemoveHeap(Client& client, const std::string& name) {
  v1::RemoveHeapRequest request;
  request.set_heap(name);
  v1::RemoveHeapResponse response;
  grpc::ClientContext context;
  ChannelOf(client).Prepare(&context);
  (void)StubOf(client).RemoveHeap(&context, request, &response);
}

double Median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace heapd
