// Every heapd.v1 call against a real daemon with bad input: the right
// status, a message naming what is wrong, and no change to the heap.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "client/client_channel.h"
#include "gtest/gtest.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

using absl::StatusCode;

class RpcValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.Start();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    v1::CreateHeapRequest create;
    create.set_name("h");
    create.set_max_size(64 << 20);
    v1::HeapInfo info;
    ASSERT_TRUE(Call(&v1::Heapd::Stub::CreateHeap, create, &info).ok());
  }

  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (v1::Heapd::Stub::*method)(grpc::ClientContext*, const Request&,
                                                            Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext context;
    return FromGrpc((StubOf(*client_).*method)(&context, request, response));
  }

  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (v1::Heapd::Stub::*method)(grpc::ClientContext*, const Request&,
                                                            Response*),
                    const Request& request) {
    Response response;
    return Call(method, request, &response);
  }

  v1::HeapStats Stat() {
    absl::StatusOr<v1::HeapStats> got = StatHeap(*client_, "h");
    EXPECT_TRUE(got.ok()) << got.status();
    v1::HeapStats stats = got.ok() ? *got : v1::HeapStats();
    stats.mutable_info()->clear_last_sync_unix_ns();
    stats.mutable_info()->clear_epoch();
    return stats;
  }

  // Attaches heap "h" read-write through the raw API; returns the response.
  v1::AttachResponse RawAttach(int lease_class = -1) {
    v1::AttachRequest request;
    request.set_heap("h");
    if (lease_class >= 0) {
      v1::LeaseWant* want = request.add_leases();
      want->set_size_class(lease_class);
      want->set_count(1);
    }
    v1::AttachResponse response;
    EXPECT_TRUE(Call(&v1::Heapd::Stub::Attach, request, &response).ok());
    return response;
  }

  // Sessions attached, once the daemon has had up to 6 s to end those
  // whose connection closed or whose token expired.
  int ClientsAfterAWhile() {
    v1::ListClientsResponse clients;
    for (int i = 0; i < 60; ++i) {
      clients.Clear();
      EXPECT_TRUE(Call(&v1::Heapd::Stub::ListClients, v1::ListClientsRequest(), &clients).ok());
      if (clients.clients_size() == 0) break;
      usleep(100 * 1000);
    }
    return clients.clients_size();
  }

  ChildResult Redeem(const std::string& token) {
    return RunChild({Runfile("tests/heap_worker"), daemon_.socket(), "-", "redeem", token});
  }

  static void ExpectError(const absl::Status& status, StatusCode code, const std::string& says) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(status.message().find(says), absl::string_view::npos) << status;
  }

  // Heaps without content rollback (clients map the data file): a free of
  // another session's object applies at once (on heaps that roll contents
  // back it waits for the next sync; content_rollback_test covers those).
  TestDaemon daemon_{{"--attach_token_seconds=1", "--working_images=false"}};
  std::unique_ptr<Client> client_;
};

TEST_F(RpcValidationTest, HeapCalls) {
  v1::CreateHeapRequest create;
  create.set_name("../etc");
  ExpectError(Call(&v1::Heapd::Stub::CreateHeap, create), StatusCode::kInvalidArgument, "../etc");
  create.set_name("h");
  ExpectError(Call(&v1::Heapd::Stub::CreateHeap, create), StatusCode::kAlreadyExists, "h");
  create.set_name("big");
  create.set_max_size(uint64_t{1} << 60);
  ExpectError(Call(&v1::Heapd::Stub::CreateHeap, create), StatusCode::kInvalidArgument,
              "maximum size");
  create.set_max_size(0);
  create.set_mode(01777);
  ExpectError(Call(&v1::Heapd::Stub::CreateHeap, create), StatusCode::kInvalidArgument, "mode");
  create.set_mode(0);
  create.set_image(static_cast<v1::ImageKind>(7));
  ExpectError(Call(&v1::Heapd::Stub::CreateHeap, create), StatusCode::kInvalidArgument,
              "image kind 7");
  // Asked for, a heap gets a working image even where heapd's default
  // (--working_images=false here) would not give one.
  create.set_name("working");
  create.set_image(v1::IMAGE_WORKING);
  v1::HeapInfo made;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::CreateHeap, create, &made).ok());
  EXPECT_EQ(made.image(), v1::IMAGE_WORKING);
  EXPECT_TRUE(made.content_rollback()) << made.content_rollback_note();
  v1::RemoveHeapRequest remove_made;
  remove_made.set_heap("working");
  ASSERT_TRUE(Call(&v1::Heapd::Stub::RemoveHeap, remove_made).ok());
  v1::StatHeapRequest stat;
  stat.set_heap("missing");
  ExpectError(Call(&v1::Heapd::Stub::StatHeap, stat), StatusCode::kNotFound, "missing");
  v1::RemoveHeapRequest remove;
  remove.set_heap("");
  ExpectError(Call(&v1::Heapd::Stub::RemoveHeap, remove), StatusCode::kInvalidArgument, "empty");
  v1::ListHeapsResponse heaps;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::ListHeaps, v1::ListHeapsRequest(), &heaps).ok());
  ASSERT_EQ(heaps.heaps_size(), 1);  // nothing was created by the failed calls
}

TEST_F(RpcValidationTest, AttachAndSessionCalls) {
  const v1::HeapStats before = Stat();
  v1::AttachRequest attach;
  attach.set_heap("nope");
  ExpectError(Call(&v1::Heapd::Stub::Attach, attach), StatusCode::kNotFound, "nope");
  attach.set_heap("h");
  attach.add_leases()->set_size_class(64);
  attach.mutable_leases(0)->set_count(1);
  ExpectError(Call(&v1::Heapd::Stub::Attach, attach), StatusCode::kInvalidArgument,
              "size class 64");
  attach.mutable_leases(0)->set_size_class(3);
  attach.mutable_leases(0)->set_count(0);
  ExpectError(Call(&v1::Heapd::Stub::Attach, attach), StatusCode::kInvalidArgument,
              "lease count 0");
  attach.mutable_leases(0)->set_count(1);
  attach.set_read_only(true);
  ExpectError(Call(&v1::Heapd::Stub::Attach, attach), StatusCode::kInvalidArgument, "read-only");

  v1::LeaseChunksRequest lease;
  lease.set_session(0);
  ExpectError(Call(&v1::Heapd::Stub::LeaseChunks, lease), StatusCode::kInvalidArgument,
              "session 0");
  lease.set_session(12345);
  ExpectError(Call(&v1::Heapd::Stub::LeaseChunks, lease), StatusCode::kNotFound, "12345");
  v1::ListClientsResponse clients;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::ListClients, v1::ListClientsRequest(), &clients).ok());
  EXPECT_EQ(clients.clients_size(), 0);  // no failed attach left a session
  EXPECT_EQ(Stat().DebugString(), before.DebugString());
}

TEST_F(RpcValidationTest, AllocationCallsRejectBadInputAndChangeNothing) {
  const v1::AttachResponse session = RawAttach(/*lease_class=*/0);
  ASSERT_EQ(session.grants_size(), 1);
  const uint32_t leased = session.grants(0).chunk();
  // One live large object to free twice.
  v1::AllocateLargeRequest large;
  large.set_session(session.session());
  large.set_size(0);
  ExpectError(Call(&v1::Heapd::Stub::AllocateLarge, large), StatusCode::kInvalidArgument,
              "0 bytes");
  large.set_size(uint64_t{1} << 40);
  ExpectError(Call(&v1::Heapd::Stub::AllocateLarge, large), StatusCode::kInvalidArgument,
              "maximum size");
  large.set_size(3 << 20);
  v1::AllocateLargeResponse allocated;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::AllocateLarge, large, &allocated).ok());
  v1::SyncRequest sync;
  sync.set_session(session.session());
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Sync, sync).ok());
  const v1::HeapStats before = Stat();

  v1::FreeRequest free;
  free.set_session(session.session());
  free.add_objects()->set_offset(uint64_t{1} << 40);
  ExpectError(Call(&v1::Heapd::Stub::Free, free), StatusCode::kInvalidArgument, "outside");
  free.mutable_objects(0)->set_offset(allocated.offset() + 8);
  ExpectError(Call(&v1::Heapd::Stub::Free, free), StatusCode::kInvalidArgument,
              std::to_string(allocated.offset() + 8));
  // A batch with one bad object frees none of it.
  free.mutable_objects(0)->set_offset(allocated.offset());
  free.add_objects()->set_offset(allocated.offset() + 4096);
  EXPECT_EQ(Call(&v1::Heapd::Stub::Free, free).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Stat().DebugString(), before.DebugString());

  // Reports for a chunk the session does not lease, or of the wrong size.
  v1::LeaseReport* report = sync.add_reports();
  report->set_chunk(leased + 7);
  report->mutable_words()->Add(session.grants(0).words().begin(), session.grants(0).words().end());
  ExpectError(Call(&v1::Heapd::Stub::Sync, sync), StatusCode::kFailedPrecondition,
              std::to_string(leased + 7));
  report->set_chunk(leased);
  report->mutable_words()->RemoveLast();
  EXPECT_EQ(Call(&v1::Heapd::Stub::Sync, sync).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Stat().DebugString(), before.DebugString());

  // Names.
  v1::BindRequest bind;
  bind.set_session(session.session());
  bind.set_name(std::string("bad\nname"));
  bind.set_offset(allocated.offset());
  bind.set_size(3 << 20);
  bind.set_type_name("blob");
  EXPECT_EQ(Call(&v1::Heapd::Stub::Bind, bind).code(), StatusCode::kInvalidArgument);
  bind.set_name("blob");
  bind.set_offset(allocated.offset() + (4 << 20));  // free memory
  EXPECT_EQ(Call(&v1::Heapd::Stub::Bind, bind).code(), StatusCode::kFailedPrecondition);
  bind.set_offset(allocated.offset());
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Bind, bind).ok());
  ExpectError(Call(&v1::Heapd::Stub::Bind, bind), StatusCode::kAlreadyExists, "blob");
  // A bound object cannot be freed.
  free.clear_objects();
  free.add_objects()->set_offset(allocated.offset());
  EXPECT_EQ(Call(&v1::Heapd::Stub::Free, free).code(), StatusCode::kFailedPrecondition);
  v1::LookupRequest lookup;
  lookup.set_heap("h");
  lookup.set_name("nothing");
  ExpectError(Call(&v1::Heapd::Stub::Lookup, lookup), StatusCode::kNotFound, "nothing");
  v1::UnbindRequest unbind;
  unbind.set_session(session.session());
  unbind.set_name("blob");
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Unbind, unbind).ok());
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Free, free).ok());
  ExpectError(Call(&v1::Heapd::Stub::Free, free), StatusCode::kInvalidArgument,
              std::to_string(allocated.offset()));
  // Removing a heap with a client attached.
  v1::RemoveHeapRequest remove;
  remove.set_heap("h");
  ExpectError(Call(&v1::Heapd::Stub::RemoveHeap, remove), StatusCode::kFailedPrecondition,
              "has 1 client attached; detach it first");
}

// A sync's earlier parts are checked and held: they change nothing until
// its last part commits them with its own, in one epoch.
TEST_F(RpcValidationTest, ASyncsEarlierPartsCommitWithItsLast) {
  const v1::AttachResponse session = RawAttach(/*lease_class=*/2);
  ASSERT_EQ(session.grants_size(), 1);
  auto live = [&] {
    uint64_t objects = 0;
    const v1::HeapStats stats = Stat();
    for (const v1::SizeClassStats& c : stats.size_classes()) objects += c.live_objects();
    return objects;
  };
  v1::SyncRequest part;
  part.set_session(session.session());
  part.set_more(true);
  v1::LeaseReport* report = part.add_reports();
  report->set_chunk(session.grants(0).chunk());
  report->mutable_words()->Add(session.grants(0).words().begin(), session.grants(0).words().end());
  ASSERT_GT(report->words_size(), 0);
  report->set_words(0, report->words(0) | 1);  // one object allocated
  v1::SyncResponse response;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Sync, part, &response).ok());
  EXPECT_EQ(response.epoch(), 0u);
  EXPECT_EQ(live(), 0u);
  // A part is checked as a whole sync is.
  v1::SyncRequest stranger = part;
  stranger.mutable_reports(0)->set_chunk(session.grants(0).chunk() + 1);
  ExpectError(Call(&v1::Heapd::Stub::Sync, stranger), StatusCode::kFailedPrecondition,
              "is not leased");
  v1::SyncRequest with_generation = part;
  with_generation.set_generation(1);
  ExpectError(Call(&v1::Heapd::Stub::Sync, with_generation), StatusCode::kInvalidArgument,
              "last part");
  EXPECT_EQ(live(), 0u);
  // The last part commits the held one.
  v1::SyncRequest last;
  last.set_session(session.session());
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Sync, last, &response).ok());
  EXPECT_GT(response.epoch(), 0u);
  EXPECT_EQ(live(), 1u);
}

// The session's fd-socket connection answers framed requests; junk gets an
// error, a frame that is not the protocol ends the connection and session.
TEST_F(RpcValidationTest, FdSocketRequestsAreValidated) {
  const v1::AttachResponse session = RawAttach();
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, daemon_.fd_socket().c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(write(fd, session.fd_token().data(), 32), 32);
  char status = 0;
  ASSERT_EQ(read(fd, &status, 1), 1);  // the fd itself is discarded with the message
  ASSERT_EQ(status, 'K');
  auto ask = [fd](const std::string& body) {
    const uint32_t length = static_cast<uint32_t>(body.size());
    std::string frame(reinterpret_cast<const char*>(&length), 4);
    frame += body;
    EXPECT_EQ(write(fd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
    uint32_t reply_length = 0;
    if (read(fd, &reply_length, 4) != 4) return std::string("(closed)");
    std::string reply(reply_length, '\0');
    EXPECT_EQ(read(fd, reply.data(), reply_length), static_cast<ssize_t>(reply_length));
    return reply;
  };
  std::string reply = ask("X");
  EXPECT_EQ(reply[0], static_cast<char>(StatusCode::kInvalidArgument)) << reply;
  reply = ask("Lno such name");
  EXPECT_EQ(reply[0], static_cast<char>(StatusCode::kNotFound)) << reply;
  EXPECT_NE(reply.find("no such name"), std::string::npos) << reply;
  reply = ask(std::string("Lbad\nname"));
  EXPECT_EQ(reply[0], static_cast<char>(StatusCode::kInvalidArgument)) << reply;
  // A length beyond the protocol's limit: the daemon hangs up.
  const uint32_t huge = 1 << 30;
  ASSERT_EQ(write(fd, &huge, 4), 4);
  char byte;
  EXPECT_EQ(read(fd, &byte, 1), 0);
  close(fd);
  EXPECT_EQ(ClientsAfterAWhile(), 0);
}

// Chunks reserved for one session's large objects: no other session can
// place objects in them or release them, bad placements change nothing,
// and a free of a reserved chunk no object was placed at is rejected.
TEST_F(RpcValidationTest, ASessionPlacesAndReleasesOnlyItsOwnReservedChunks) {
  const v1::AttachResponse owner = RawAttach();
  const v1::AttachResponse other = RawAttach();
  v1::AllocateLargeRequest reserve;
  reserve.set_session(owner.session());
  reserve.set_size(4 << 21);
  reserve.set_reserve(true);
  v1::AllocateLargeResponse reserved;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::AllocateLarge, reserve, &reserved).ok());
  const uint64_t first = reserved.offset();
  const v1::HeapStats before = Stat();
  EXPECT_EQ(before.large_reserve_chunks(), 4u);

  v1::LargePlacement run;
  run.set_offset(first);
  run.set_chunks(1);
  v1::SyncRequest steal;
  steal.set_session(other.session());
  *steal.add_placed() = run;
  ExpectError(Call(&v1::Heapd::Stub::Sync, steal), StatusCode::kInvalidArgument,
              "not reserved for client");
  steal.set_more(true);
  ExpectError(Call(&v1::Heapd::Stub::Sync, steal), StatusCode::kInvalidArgument,
              "not reserved for client");
  steal.clear_placed();
  steal.set_more(false);
  *steal.add_released() = run;
  ExpectError(Call(&v1::Heapd::Stub::Sync, steal), StatusCode::kInvalidArgument,
              "not reserved for client");
  v1::SyncRequest bad;
  bad.set_session(owner.session());
  bad.add_placed()->set_offset(first + 4096);
  bad.mutable_placed(0)->set_chunks(1);
  ExpectError(Call(&v1::Heapd::Stub::Sync, bad), StatusCode::kInvalidArgument, "placed[0].offset");
  bad.mutable_placed(0)->set_offset(first);
  bad.mutable_placed(0)->set_chunks(5);  // beyond the reserve
  ExpectError(Call(&v1::Heapd::Stub::Sync, bad), StatusCode::kInvalidArgument, "not reserved");
  bad.mutable_placed(0)->set_chunks(2);
  *bad.add_released() = bad.placed(0);  // placed and released at once
  ExpectError(Call(&v1::Heapd::Stub::Sync, bad), StatusCode::kInvalidArgument, "overlaps");
  EXPECT_EQ(Stat().DebugString(), before.DebugString());

  // Another session frees a reserved chunk no object was placed at: taken
  // for now (the owner may have carved one), rejected after the owner's
  // second sync that does not place it.
  v1::FreeRequest free;
  free.set_session(other.session());
  free.add_objects()->set_offset(first + (3 << 21));
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Free, free).ok());
  ExpectError(Call(&v1::Heapd::Stub::Free, free), StatusCode::kInvalidArgument, "double free");
  v1::SyncRequest sync;
  sync.set_session(owner.session());
  v1::LargePlacement* object = sync.add_placed();
  object->set_offset(first);
  object->set_chunks(2);
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Sync, sync).ok());
  sync.clear_placed();
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Sync, sync).ok());
  v1::SyncRequest told;
  told.set_session(other.session());
  v1::SyncResponse answer;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Sync, told, &answer).ok());
  ASSERT_EQ(answer.rejected_frees_size(), 1) << answer.DebugString();
  EXPECT_NE(answer.rejected_frees(0).find("placed no large object"), std::string::npos);
  const v1::HeapStats after = Stat();
  EXPECT_EQ(after.large_objects(), before.large_objects() + 1);
  EXPECT_EQ(after.large_reserve_chunks(), 2u);  // the rest of the reserve
}

TEST_F(RpcValidationTest, ReadOnlySessionsCannotWrite) {
  v1::AttachRequest attach;
  attach.set_heap("h");
  attach.set_read_only(true);
  v1::AttachResponse session;
  ASSERT_TRUE(Call(&v1::Heapd::Stub::Attach, attach, &session).ok());
  v1::AllocateLargeRequest large;
  large.set_session(session.session());
  large.set_size(1 << 21);
  ExpectError(Call(&v1::Heapd::Stub::AllocateLarge, large), StatusCode::kFailedPrecondition,
              "read-only");
  v1::LeaseChunksRequest lease;
  lease.set_session(session.session());
  ExpectError(Call(&v1::Heapd::Stub::LeaseChunks, lease), StatusCode::kFailedPrecondition,
              "read-only");
}

TEST_F(RpcValidationTest, TokensAreOneTimeAndExpire) {
  const v1::AttachResponse first = RawAttach();
  EXPECT_TRUE(Redeem(first.fd_token()).Exited(0));
  const ChildResult reused = Redeem(first.fd_token());
  EXPECT_TRUE(reused.Exited(4)) << reused.output;
  EXPECT_NE(reused.output.find("unknown, used or expired"), std::string::npos);
  // The redeeming process exited: its connection closed and the session ended.
  // A token never redeemed expires (1 s here) and its session ends too.
  const v1::AttachResponse second = RawAttach(/*lease_class=*/5);
  ASSERT_EQ(second.grants_size(), 1);
  EXPECT_EQ(ClientsAfterAWhile(), 0);
  EXPECT_FALSE(Redeem(second.fd_token()).Exited(0));
  EXPECT_EQ(Stat().leased_chunks(), 0u);
  EXPECT_NE(daemon_.Log().find("did not fetch its fd in time"), std::string::npos);
}

}  // namespace
}  // namespace heapd
