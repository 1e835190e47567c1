#include "client/client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "client/heap.h"
#include "daemon/default_paths.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "heap/data_file.h"

namespace heapd {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;

// Connects to heapd.fd.sock, redeems `token` and returns the connection and
// the heap's data fd.
absl::Status FetchDataFd(const std::string& path, const std::string& token, int* connection,
                         int* data_fd) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd socket path ", path, " is too long"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "create a Unix socket");
  auto fail = [fd](absl::Status status) {
    close(fd);
    return status;
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return fail(ErrnoStatus(errno, absl::StrCat("connect to ", path)));
  }
  if (send(fd, token.data(), token.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(token.size())) {
    return fail(ErrnoStatus(errno, absl::StrCat("send the fd token on ", path)));
  }
  char reply[512];
  iovec iov{reply, sizeof(reply)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
  if (n <= 0) {
    return fail(absl::UnavailableError(absl::StrCat("heapd closed ", path, " without an answer")));
  }
  const cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (reply[0] != 'K' || header == nullptr || header->cmsg_type != SCM_RIGHTS) {
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "heapd refused the fd token: ", std::string(reply + 1, static_cast<size_t>(n - 1)))));
  }
  std::memcpy(data_fd, CMSG_DATA(header), sizeof(int));
  *connection = fd;
  return absl::OkStatus();
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

Client::Client(std::string socket_path, std::shared_ptr<grpc::Channel> channel)
    : socket_path_(std::move(socket_path)),
      channel_(std::move(channel)),
      stub_(v1::Heapd::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                        int timeout_ms) {
  const std::string path = socket_path.empty() ? DefaultSocketPath() : socket_path;
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat("no heapd socket at ", path,
                                               " (is heapd running? see --socket, HEAPD_SOCKET)"));
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  arguments.SetMaxSendMessageSize(kMaxMessageBytes);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      "unix:" + path, grpc::InsecureChannelCredentials(), arguments);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(timeout_ms))) {
    return absl::UnavailableError(absl::StrCat("no heapd answers on ", path));
  }
  return std::unique_ptr<Client>(new Client(path, std::move(channel)));
}

absl::StatusOr<v1::HeapStats> Client::Stat(const std::string& name) {
  v1::StatHeapRequest request;
  request.set_heap(name);
  v1::HeapStats stats;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(stub_->StatHeap(&context, request, &stats)); !s.ok()) return s;
  return stats;
}

absl::StatusOr<std::unique_ptr<Heap>> Client::Attach(const std::string& name,
                                                     const AttachOptions& options) {
  v1::AttachRequest request;
  request.set_heap(name);
  request.set_read_only(options.read_only);
  request.set_create_if_missing(options.create_if_missing);
  request.set_create_max_size(options.max_size);
  request.set_create_mode(options.mode);
  for (const std::string& lookup : options.prefetch_names) request.add_lookup(lookup);
  request.set_snapshot(options.snapshot);
  request.set_snapshot_dir(options.snapshot_dir);
  v1::AttachResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(stub_->Attach(&context, request, &response)); !s.ok()) return s;
  std::unique_ptr<Heap> heap(
      new Heap(this, name, options.read_only, response.session(), options.lease_batch));
  absl::Status status = FetchDataFd(FdSocketBeside(socket_path_), response.fd_token(),
                                    &heap->fd_connection_, &heap->data_fd_);
  if (status.ok()) status = heap->Start(response);
  if (!status.ok()) {
    // The daemon ends the session when the connection closes (with the
    // heap) or the token expires.
    heap->detached_ = true;
    return status;
  }
  return heap;
}

}  // namespace heapd
