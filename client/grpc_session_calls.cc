#include "client/grpc_session_calls.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "protocol/fd_protocol.h"
#include "protocol/proto_convert.h"

namespace heapd {

namespace {

// One unary call with the client's deadline.
template <typename Request, typename Response>
absl::Status Call(const ClientChannel* client,
                  grpc::Status (v1::Heapd::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          Response*),
                  const Request& request, Response* response) {
  grpc::ClientContext context;
  client->Prepare(&context);
  return FromGrpc(((*client->stub).*method)(&context, request, response));
}

}  // namespace

absl::Status GrpcSessionCalls::LeaseChunks(const v1::LeaseChunksRequest& request,
                                           v1::LeaseChunksResponse* response) {
  return Call(client_, &v1::Heapd::Stub::LeaseChunks, request, response);
}

absl::Status GrpcSessionCalls::AllocateLarge(const v1::AllocateLargeRequest& request,
                                             v1::AllocateLargeResponse* response) {
  return Call(client_, &v1::Heapd::Stub::AllocateLarge, request, response);
}

absl::Status GrpcSessionCalls::Free(const v1::FreeRequest& request) {
  v1::FreeResponse response;
  return Call(client_, &v1::Heapd::Stub::Free, request, &response);
}

absl::Status GrpcSessionCalls::Sync(const v1::SyncRequest& request, v1::SyncResponse* response) {
  return Call(client_, &v1::Heapd::Stub::Sync, request, response);
}

absl::Status GrpcSessionCalls::Detach(const v1::DetachRequest& request) {
  v1::DetachResponse response;
  return Call(client_, &v1::Heapd::Stub::Detach, request, &response);
}

absl::Status GrpcSessionCalls::Bind(const v1::BindRequest& request) {
  v1::BindResponse response;
  return Call(client_, &v1::Heapd::Stub::Bind, request, &response);
}

absl::StatusOr<NameEntry> GrpcSessionCalls::Unbind(const v1::UnbindRequest& request) {
  v1::NameEntry response;
  if (absl::Status s = Call(client_, &v1::Heapd::Stub::Unbind, request, &response); !s.ok()) {
    return s;
  }
  return FromProto(response);
}

absl::StatusOr<NameEntry> GrpcSessionCalls::LookupWithGrpc(const std::string& name) {
  v1::LookupRequest lookup;
  lookup.set_heap(heap_);
  lookup.set_name(name);
  v1::NameEntry entry;
  if (absl::Status s = Call(client_, &v1::Heapd::Stub::Lookup, lookup, &entry); !s.ok()) return s;
  return FromProto(entry);
}

absl::StatusOr<NameEntry> GrpcSessionCalls::Lookup(const std::string& name) {
  absl::StatusOr<std::string> request = EncodeLookupRequest(name);
  if (!request.ok()) return request.status();
  const std::string frame = EncodeFrame(*request);
  absl::MutexLock lock(&fd_mu_);
  if (fd_connection_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat("the session of heap ", heap_, " has ended"));
  }
  if (fd_broken_) return LookupWithGrpc(name);
  auto io_error = [this](const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fd_mu_) {
    fd_broken_ = true;
    return absl::UnavailableError(absl::StrCat(what, " heapd's connection of heap ", heap_,
                                               " failed: ", std::strerror(errno)));
  };
  for (size_t sent = 0; sent < frame.size();) {
    const ssize_t n = send(fd_connection_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error("writing to");
    sent += static_cast<size_t>(n);
  }
  auto read_exactly = [this](char* into, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fd_mu_) {
    for (size_t got = 0; got < bytes;) {
      const ssize_t n = recv(fd_connection_, into + got, bytes - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  };
  char header[kFdFrameHeaderBytes];
  if (!read_exactly(header, sizeof(header))) return io_error("reading from");
  absl::StatusOr<uint32_t> length =
      DecodeFrameLength(absl::string_view(header, sizeof(header)), kMaxFdAnswerBytes);
  if (!length.ok()) {
    fd_broken_ = true;
    return absl::UnavailableError(
        absl::StrCat("heapd's connection of heap ", heap_, ": ", length.status().message()));
  }
  std::string answer(*length, '\0');
  if (!read_exactly(answer.data(), answer.size())) return io_error("reading from");
  absl::StatusOr<v1::NameEntry> entry = ParseLookupAnswer(answer);
  if (!entry.ok()) return entry.status();
  return FromProto(*entry);
}

int GrpcSessionCalls::lifeline() {
  absl::MutexLock lock(&fd_mu_);
  return fd_connection_;
}

void GrpcSessionCalls::Close() {
  absl::MutexLock lock(&fd_mu_);
  if (fd_connection_ >= 0) close(fd_connection_);
  fd_connection_ = -1;
}

}  // namespace heapd
