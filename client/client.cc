#include "heapd/client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "client/client_channel.h"
#include "client/grpc_fork.h"
#include "client/grpc_session_calls.h"
#include "client/heap_impl.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/security/credentials.h"
#include "protocol/default_paths.h"
#include "protocol/limits.h"
#include "protocol/version.h"
#include "util/errno_status.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr char kRefusedToken[] = "heapd refused the fd token: ";

bool IsRefusedToken(const absl::Status& status) {
  return status.code() == absl::StatusCode::kPermissionDenied &&
         absl::StartsWith(status.message(), kRefusedToken);
}

// Connects to the heapd socket `path` and checks who serves it: root (the
// system daemon) or this process's own user (a daemon of its own). Nothing
// is sent to anyone else: another user could have bound a fake heapd there.
absl::StatusOr<UniqueFd> ConnectToHeapd(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is not 1 to ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "create a Unix socket");
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrCat("no heapd answers on ", path, ": ",
                                               std::strerror(errno),
                                               " (is heapd running? see --socket, HEAPD_SOCKET)"));
  }
  struct ucred server;
  socklen_t length = sizeof(server);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &server, &length) != 0) {
    return ErrnoStatus(errno, absl::StrCat("read who serves ", path));
  }
  if (server.uid != 0 && server.uid != geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, " is served by uid ", server.uid, " (pid ", server.pid,
                     "), neither root nor this user: not heapd's; nothing was sent"));
  }
  return fd;
}

// Connects to heapd.fd.sock, redeems `token` and returns the connection and
// the heap's data fd.
absl::Status FetchDataFd(const std::string& path, const std::string& token, int* connection,
                         int* data_fd, int* journal_fd) {
  absl::StatusOr<UniqueFd> connected = ConnectToHeapd(path);
  if (!connected.ok()) return connected.status();
  const int fd = connected->release();
  auto fail = [fd](absl::Status status) {
    close(fd);
    return status;
  };
  if (send(fd, token.data(), token.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(token.size())) {
    return fail(ErrnoStatus(errno, absl::StrCat("send the fd token on ", path)));
  }
  char reply[512];
  iovec iov{reply, sizeof(reply)};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
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
  // The data fd, and the session's undo journal when heapd tracks contents.
  const bool fds_ok =
      header != nullptr && header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS &&
      (header->cmsg_len == CMSG_LEN(sizeof(int)) || header->cmsg_len == CMSG_LEN(2 * sizeof(int)));
  UniqueFd received[2];
  if (fds_ok) {
    int raw[2] = {-1, -1};
    std::memcpy(raw, CMSG_DATA(header), header->cmsg_len - CMSG_LEN(0));
    received[0].reset(raw[0]);
    received[1].reset(raw[1]);
  }
  if (reply[0] != 'K' || !fds_ok || (message.msg_flags & MSG_CTRUNC) != 0) {
    return fail(absl::PermissionDeniedError(
        absl::StrCat(kRefusedToken, std::string(reply + 1, static_cast<size_t>(n - 1)))));
  }
  for (const UniqueFd& fd : received) {
    struct stat st;
    if (fd.valid() && (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))) {
      return fail(absl::InternalError("heapd sent a descriptor that is not a regular file"));
    }
  }
  *data_fd = received[0].release();
  *journal_fd = received[1].release();
  *connection = fd;
  return absl::OkStatus();
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void ClientChannel::Prepare(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options.call_timeout));
}

ClientChannel& ChannelOf(Client& client) { return *client.channel_; }

Client::Client(std::unique_ptr<ClientChannel> channel) : channel_(std::move(channel)) {}

Client::~Client() = default;

const std::string& Client::socket_path() const { return channel_->socket_path; }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                        int call_timeout_ms) {
  ClientOptions options;
  options.call_timeout = absl::Milliseconds(call_timeout_ms);
  return Connect(socket_path, options);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                        const ClientOptions& options) {
  const std::string path = socket_path.empty() ? DefaultSocketPath() : socket_path;
  RegisterGrpcForkHandlers();  // before this process's first channel
  // The connection is made and its server checked here, then handed to
  // gRPC: a channel by path would connect (and reconnect) to whoever
  // serves the path at that moment.
  absl::StatusOr<UniqueFd> fd = ConnectToHeapd(path);
  if (!fd.ok()) return fd.status();
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  arguments.SetMaxSendMessageSize(kMaxMessageBytes);
  // Connected already: a channel made from a descriptor has no
  // connectivity state to wait for. A daemon that accepted but does not
  // answer shows at the first call, at its deadline.
  auto channel = std::make_unique<ClientChannel>();
  channel->socket_path = path;
  channel->options = options;
  channel->channel = grpc::CreateCustomInsecureChannelFromFd("heapd", fd->release(), arguments);
  channel->stub = v1::Heapd::NewStub(channel->channel);
  return std::unique_ptr<Client>(new Client(std::move(channel)));
}

absl::StatusOr<v1::HeapStats> StatHeap(Client& client, const std::string& name) {
  const ClientChannel& channel = ChannelOf(client);
  v1::StatHeapRequest request;
  request.set_heap(name);
  v1::HeapStats stats;
  grpc::ClientContext context;
  channel.Prepare(&context);
  if (absl::Status s = FromGrpc(channel.stub->StatHeap(&context, request, &stats)); !s.ok()) {
    return s;
  }
  return stats;
}

namespace {

// One attach: the call, the fds, the mapping.
absl::StatusOr<std::unique_ptr<Heap>> AttachOnce(const ClientChannel& channel,
                                                 const v1::AttachRequest& request,
                                                 const std::string& name,
                                                 const AttachOptions& options) {
  v1::AttachResponse response;
  grpc::ClientContext context;
  channel.Prepare(&context);
  if (absl::Status s = FromGrpc(channel.stub->Attach(&context, request, &response)); !s.ok()) {
    return s;
  }
  // Without the fds, the daemon ends the session when the token expires;
  // with them, when the connection closes (the Heap's calls own it).
  int connection = -1, data_fd = -1, journal_fd = -1;
  if (absl::Status s = FetchDataFd(FdSocketBeside(channel.socket_path), response.fd_token(),
                                   &connection, &data_fd, &journal_fd);
      !s.ok()) {
    return s;
  }
  return HeapImpl::Start(std::make_unique<GrpcSessionCalls>(&channel, name, connection), name,
                         options, response, data_fd, UniqueFd(journal_fd));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Heap>> Client::Attach(const std::string& name,
                                                     const AttachOptions& options) {
  v1::AttachRequest request;
  request.set_heap(name);
  request.set_read_only(options.read_only);
  request.set_create_if_missing(options.create_if_missing);
  request.set_create_max_size(options.max_size);
  request.set_create_mode(options.mode);
  if (options.image == HeapImage::kDirect) request.set_create_image(v1::IMAGE_DIRECT);
  if (options.image == HeapImage::kWorking) request.set_create_image(v1::IMAGE_WORKING);
  request.set_create_storage(options.storage);
  request.set_fixed_address(options.fixed_address);
  request.set_client_revision(kProtocolRevision);
  for (const std::string& lookup : options.prefetch_names) request.add_lookup(lookup);
  request.set_snapshot(options.snapshot);
  request.set_snapshot_dir(options.snapshot_dir);
  absl::StatusOr<std::unique_ptr<Heap>> heap;
  for (int attempt = 1;; ++attempt) {
    heap = AttachOnce(*channel_, request, name, options);
    // A refused token: its session is gone (expired while this process was
    // not scheduled, say). A new attach gets a new one.
    if (heap.ok() || !IsRefusedToken(heap.status()) ||
        attempt >= channel_->options.attach_attempts) {
      return heap;
    }
    request.set_create_if_missing(false);  // made by the first attempt if it was missing
  }
}

}  // namespace heapd
