// FdServer on a real Unix socket: tokens redeemed for descriptors, errors
// that close the connection, requests answered in order, the session ended
// when its connection closes, frames beyond the protocol refused.
#include "daemon/fd_server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "daemon/unix_listener.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"
#include "protocol/fd_protocol.h"

namespace heapd {
namespace {

constexpr ClientId kSession = 42;
const std::string kGoodToken(kTokenLength, 'g');

// What one recvmsg brought: bytes and a descriptor (or -1).
struct Received {
  std::string bytes;
  int fd = -1;
};

Received Receive(int socket) {
  char bytes[4096];
  iovec iov{bytes, sizeof(bytes)};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  Received received;
  const ssize_t n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
  if (n <= 0) return received;
  received.bytes.assign(bytes, static_cast<size_t>(n));
  const cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (header != nullptr && header->cmsg_type == SCM_RIGHTS) {
    std::memcpy(&received.fd, CMSG_DATA(header), sizeof(int));
  }
  return received;
}

class FdServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Sub("data")) << "the heap's bytes";
    absl::StatusOr<ListeningSocket> listening = ListenUnix(dir_.Sub("fd.sock"));
    ASSERT_TRUE(listening.ok()) << listening.status();
    socket_path_ = listening->path;
    FdServer::Callbacks callbacks;
    callbacks.redeem = [this](const std::string& token,
                              const Caller& caller) -> absl::StatusOr<FdServer::Grant> {
      redeemed_by_uid_ = static_cast<int>(caller.uid);
      if (token != kGoodToken) return absl::NotFoundError("unknown token");
      FdServer::Grant grant;
      grant.session = kSession;
      grant.fd = open(dir_.Sub("data").c_str(), O_RDONLY | O_CLOEXEC);
      return grant;
    };
    callbacks.closed = [this](ClientId session) {
      absl::MutexLock lock(&mu_);
      closed_ = session;
    };
    callbacks.tick = [this] { ++ticks_; };
    callbacks.request = [](ClientId session, absl::string_view request) {
      return std::to_string(session) + ":" + std::string(request);
    };
    callbacks.refused = [] {};
    server_ = std::make_unique<FdServer>(listening->fd, 1, std::move(callbacks));
  }

  int Connect() {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, socket_path_.c_str(), sizeof(address.sun_path) - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  }

  // The session the server reported closed, waiting up to 10 s (0: none).
  ClientId WaitForClosed() {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](ClientId* closed) { return *closed != 0; }, &closed_),
                         absl::Seconds(10));
    return closed_;
  }

  TestDir dir_{"/tmp"};  // socket paths must fit 107 bytes
  std::string socket_path_;
  std::atomic<int> redeemed_by_uid_{-1};
  std::atomic<int> ticks_{0};
  absl::Mutex mu_;
  ClientId closed_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<FdServer> server_;
};

TEST_F(FdServerTest, ATokenInPiecesGetsTheDataFileAndTheConnectionCarriesTheSession) {
  const int client = Connect();
  ASSERT_EQ(send(client, kGoodToken.data(), 10, 0), 10);
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(send(client, kGoodToken.data() + 10, kTokenLength - 10, 0),
            static_cast<ssize_t>(kTokenLength - 10));
  const Received granted = Receive(client);
  ASSERT_EQ(granted.bytes.substr(0, 1), "K");
  ASSERT_GE(granted.fd, 0) << "no descriptor came with the answer";
  struct stat sent, data;
  ASSERT_EQ(fstat(granted.fd, &sent), 0);
  ASSERT_EQ(stat(dir_.Sub("data").c_str(), &data), 0);
  EXPECT_EQ(sent.st_ino, data.st_ino);
  close(granted.fd);
  EXPECT_EQ(redeemed_by_uid_, static_cast<int>(getuid())) << "the caller is the peer's uid";

  // Two requests in one send: answered in order, one frame each.
  const std::string requests = EncodeFrame("first") + EncodeFrame("second");
  ASSERT_EQ(send(client, requests.data(), requests.size(), 0),
            static_cast<ssize_t>(requests.size()));
  FrameSplitter answers(kMaxFdAnswerBytes);
  std::vector<std::string> got;
  while (got.size() < 2) {
    const Received more = Receive(client);
    ASSERT_FALSE(more.bytes.empty()) << "the connection closed";
    answers.Append(more.bytes);
    for (;;) {
      absl::StatusOr<std::optional<absl::string_view>> next = answers.Next();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      got.emplace_back(**next);
    }
  }
  EXPECT_EQ(got, (std::vector<std::string>{"42:first", "42:second"}));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(closed_, 0u) << "the session ended while its connection was open";
  }
  close(client);
  EXPECT_EQ(WaitForClosed(), kSession);
}

TEST_F(FdServerTest, AnUnknownTokenGetsAnErrorAndTheConnectionCloses) {
  const int client = Connect();
  const std::string bad(kTokenLength, 'x');
  ASSERT_EQ(send(client, bad.data(), bad.size(), 0), static_cast<ssize_t>(bad.size()));
  const Received refused = Receive(client);
  ASSERT_FALSE(refused.bytes.empty());
  EXPECT_EQ(refused.bytes[0], 'E');
  EXPECT_NE(refused.bytes.find("unknown token"), std::string::npos) << refused.bytes;
  EXPECT_EQ(refused.fd, -1);
  EXPECT_TRUE(Receive(client).bytes.empty()) << "the connection stayed open";
  close(client);
  absl::SleepFor(absl::Milliseconds(100));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(closed_, 0u) << "a session that never started was reported closed";
}

TEST_F(FdServerTest, AFrameBeyondTheProtocolEndsTheConnectionAndItsSession) {
  const int client = Connect();
  ASSERT_EQ(send(client, kGoodToken.data(), kTokenLength, 0), static_cast<ssize_t>(kTokenLength));
  const Received granted = Receive(client);
  ASSERT_EQ(granted.bytes.substr(0, 1), "K");
  close(granted.fd);
  // A header announcing a request longer than any the protocol allows.
  const uint32_t huge = kMaxFdRequestBytes + 1;
  std::string header(kFdFrameHeaderBytes, '\0');
  std::memcpy(header.data(), &huge, sizeof(huge));
  ASSERT_EQ(send(client, header.data(), header.size(), 0), static_cast<ssize_t>(header.size()));
  EXPECT_TRUE(Receive(client).bytes.empty()) << "the connection stayed open";
  EXPECT_EQ(WaitForClosed(), kSession);
  close(client);
}

TEST_F(FdServerTest, TicksAboutOnceASecond) {
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_GE(ticks_, 1);
}

}  // namespace
}  // namespace heapd
