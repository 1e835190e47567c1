#include "daemon/request_validation.h"

#include <string>

#include "allocator/size_class.h"
#include "gtest/gtest.h"
#include "heap/metadata_format.h"
#include "heap/name_table.h"

namespace heapd {
namespace {

// INVALID_ARGUMENT whose message starts with `field` and says `says`.
void ExpectInvalid(const absl::Status& status, const std::string& field, const std::string& says) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().substr(0, field.size() + 2), field + ": ") << status;
  EXPECT_NE(status.message().find(says), absl::string_view::npos) << status;
}

TEST(RequestValidationTest, CreateHeap) {
  v1::CreateHeapRequest request;
  request.set_name("graph");
  EXPECT_TRUE(ValidateRequest(request).ok());  // size and mode 0: the defaults
  request.set_max_size(kMaxHeapBytes);
  request.set_mode(0777);
  EXPECT_TRUE(ValidateRequest(request).ok());
  request.set_max_size(kMaxHeapBytes + 1);
  ExpectInvalid(ValidateRequest(request), "max_size", "maximum size");
  request.set_max_size(0);
  request.set_mode(01777);
  ExpectInvalid(ValidateRequest(request), "mode", "01777");
  request.set_mode(0);
  request.set_name("../etc");
  ExpectInvalid(ValidateRequest(request), "name", "../etc");
  request.set_name("");
  ExpectInvalid(ValidateRequest(request), "name", "empty");
}

TEST(RequestValidationTest, HeapByName) {
  EXPECT_TRUE(ValidateRequest(v1::ListHeapsRequest()).ok());
  v1::StatHeapRequest stat;
  ExpectInvalid(ValidateRequest(stat), "heap", "empty");
  stat.set_heap("h");
  EXPECT_TRUE(ValidateRequest(stat).ok());
  v1::RemoveHeapRequest remove;
  remove.set_heap(".hidden");
  ExpectInvalid(ValidateRequest(remove), "heap", "starts with '.'");
  remove.set_heap("h");
  EXPECT_TRUE(ValidateRequest(remove).ok());
  v1::ListClientsRequest clients;
  EXPECT_TRUE(ValidateRequest(clients).ok());  // every heap
  clients.set_heap("a/b");
  ExpectInvalid(ValidateRequest(clients), "heap", "a/b");
  v1::ListNamesRequest names;
  names.set_heap("h");
  names.set_prefix("any\nprefix");  // matches nothing, harms nothing
  EXPECT_TRUE(ValidateRequest(names).ok());
  names.set_heap(std::string(65, 'h'));
  ExpectInvalid(ValidateRequest(names), "heap", "longer than 64");
}

TEST(RequestValidationTest, Attach) {
  v1::AttachRequest request;
  request.set_heap("h");
  v1::LeaseWant* want = request.add_leases();
  want->set_size_class(kNumSizeClasses - 1);
  want->set_count(kMaxLeasesPerWant);
  request.add_lookup("root");
  EXPECT_TRUE(ValidateRequest(request).ok());

  want->set_size_class(kNumSizeClasses);
  ExpectInvalid(ValidateRequest(request), "leases[0].size_class", "size class 64");
  want->set_size_class(3);
  want->set_count(0);
  ExpectInvalid(ValidateRequest(request), "leases[0].count", "lease count 0");
  want->set_count(1);
  request.set_read_only(true);
  ExpectInvalid(ValidateRequest(request), "leases", "read-only");
  request.clear_leases();
  EXPECT_TRUE(ValidateRequest(request).ok());
  for (int i = 0; i < kMaxLookupsPerAttach; ++i) request.add_lookup("n");
  ExpectInvalid(ValidateRequest(request), "lookup", "at most 64");
  request.clear_lookup();
  request.add_lookup("ok");
  request.add_lookup(std::string("bad\nname"));
  ExpectInvalid(ValidateRequest(request), "lookup[1]", "control character");
  request.clear_lookup();

  // Creating: the settings are checked; otherwise they are not used.
  request.set_create_mode(07777);
  EXPECT_TRUE(ValidateRequest(request).ok());
  request.set_create_if_missing(true);
  ExpectInvalid(ValidateRequest(request), "create_mode", "07777");
  request.set_create_mode(0640);
  request.set_create_max_size(kMaxHeapBytes + 1);
  ExpectInvalid(ValidateRequest(request), "create_max_size", "maximum size");
  request.set_create_max_size(64 << 20);
  EXPECT_TRUE(ValidateRequest(request).ok());
  request.set_heap("");
  ExpectInvalid(ValidateRequest(request), "heap", "empty");
}

TEST(RequestValidationTest, AttachSnapshotInPlace) {
  v1::AttachRequest request;
  request.set_snapshot("nightly");
  request.set_read_only(true);
  EXPECT_TRUE(ValidateRequest(request).ok());  // no heap name needed
  request.set_snapshot_dir("/pfs/me/snaps");
  EXPECT_TRUE(ValidateRequest(request).ok());
  request.set_snapshot_dir("relative/dir");
  ExpectInvalid(ValidateRequest(request), "snapshot_dir", "not an absolute path");
  request.set_snapshot_dir(std::string("/a\0b", 4));
  ExpectInvalid(ValidateRequest(request), "snapshot_dir", "not an absolute path");
  request.clear_snapshot_dir();
  request.set_snapshot("..");
  ExpectInvalid(ValidateRequest(request), "snapshot", "starts with '.'");
  request.set_snapshot("nightly");
  request.set_read_only(false);
  ExpectInvalid(ValidateRequest(request), "snapshot", "read-only");
  request.set_read_only(true);
  request.set_create_if_missing(true);
  ExpectInvalid(ValidateRequest(request), "snapshot", "read-only");
}

TEST(RequestValidationTest, SessionCalls) {
  v1::DetachRequest detach;
  ExpectInvalid(ValidateRequest(detach), "session", "session 0");
  detach.set_session(7);
  detach.add_reports()->set_chunk(3);  // whether it is leased is the heap's to say
  EXPECT_TRUE(ValidateRequest(detach).ok());
  // A report naming its class has that class's bitmap size.
  detach.mutable_reports(0)->set_size_class(kNumSizeClasses);
  ExpectInvalid(ValidateRequest(detach), "reports[0].size_class", "does not exist");
  detach.mutable_reports(0)->set_size_class(0);
  ExpectInvalid(ValidateRequest(detach), "reports[0].words", "size class 0 has");
  for (uint32_t w = 0; w < (SlotsPerChunk(0) + 63) / 64; ++w)
    detach.mutable_reports(0)->add_words(0);
  EXPECT_TRUE(ValidateRequest(detach).ok());
  v1::SyncRequest sync;
  ExpectInvalid(ValidateRequest(sync), "session", "session 0");
  sync.set_session(7);
  EXPECT_TRUE(ValidateRequest(sync).ok());
  sync.set_generation(3);
  EXPECT_TRUE(ValidateRequest(sync).ok());
  sync.set_more(true);
  ExpectInvalid(ValidateRequest(sync), "generation", "last part");
  sync.set_generation(0);
  v1::LargePlacement* placed = sync.add_placed();
  placed->set_offset(3 << 21);
  placed->set_chunks(2);
  EXPECT_TRUE(ValidateRequest(sync).ok());
  placed->set_offset((3 << 21) + 4096);
  ExpectInvalid(ValidateRequest(sync), "placed[0].offset", "multiple of the 2097152-byte chunk");
  placed->set_offset(kMaxHeapBytes - (1 << 21));
  ExpectInvalid(ValidateRequest(sync), "placed[0].chunks", "beyond the largest heap");
  placed->set_chunks(0);
  placed->set_offset(0);
  ExpectInvalid(ValidateRequest(sync), "placed[0].chunks", "0 chunks");
  sync.clear_placed();
  sync.add_released()->set_offset(1);
  ExpectInvalid(ValidateRequest(sync), "released[0].offset", "multiple");
  v1::DetachRequest ending;
  ending.set_session(7);
  ending.add_placed()->set_chunks(0);
  ExpectInvalid(ValidateRequest(ending), "placed[0].chunks", "empty");

  v1::LeaseChunksRequest lease;
  lease.set_session(7);
  EXPECT_TRUE(ValidateRequest(lease).ok());
  for (uint32_t c = 0; c <= kNumSizeClasses; ++c) {
    v1::LeaseWant* want = lease.add_wants();
    want->set_size_class(c % kNumSizeClasses);
    want->set_count(1);
  }
  ExpectInvalid(ValidateRequest(lease), "wants", "65 lease requests");
  lease.mutable_wants()->RemoveLast();
  EXPECT_TRUE(ValidateRequest(lease).ok());
  // A chunk offered back twice, in one want or across two.
  lease.mutable_wants(1)->add_reuse(9);
  EXPECT_TRUE(ValidateRequest(lease).ok());
  lease.mutable_wants(3)->add_reuse(9);
  ExpectInvalid(ValidateRequest(lease), "wants[3].reuse", "chunk 9 is offered twice");
  lease.mutable_wants(3)->clear_reuse();
  lease.mutable_wants(1)->set_count(2);
  lease.mutable_wants(1)->add_reuse(9);
  ExpectInvalid(ValidateRequest(lease), "wants[1].reuse", "chunk 9 is offered twice");
  lease.mutable_wants(1)->clear_reuse();
  lease.mutable_wants(5)->set_count(kMaxLeasesPerWant + 1);
  ExpectInvalid(ValidateRequest(lease), "wants[5].count", "65");
  lease.set_session(0);
  ExpectInvalid(ValidateRequest(lease), "session", "attach first");
}

TEST(RequestValidationTest, AllocateAndFree) {
  v1::AllocateLargeRequest large;
  large.set_session(1);
  ExpectInvalid(ValidateRequest(large), "size", "0 bytes");
  large.set_size(kMaxHeapBytes + 1);
  ExpectInvalid(ValidateRequest(large), "size", "cannot allocate");
  large.set_size(3 << 20);
  EXPECT_TRUE(ValidateRequest(large).ok());

  v1::FreeRequest free;
  free.set_session(1);
  free.add_objects()->set_offset(uint64_t{1} << 60);  // outside: the heap says so
  EXPECT_TRUE(ValidateRequest(free).ok());
  for (int i = 0; i < kMaxFreesPerCall; ++i) free.add_objects();
  ExpectInvalid(ValidateRequest(free), "objects", "at most 65536");
}

TEST(RequestValidationTest, Names) {
  v1::BindRequest bind;
  bind.set_session(2);
  bind.set_name("root");
  bind.set_type_name("app::Graph");
  bind.set_size(64);
  EXPECT_TRUE(ValidateRequest(bind).ok());
  bind.set_size(0);
  ExpectInvalid(ValidateRequest(bind), "size", "binds 0 bytes");
  bind.set_size(64);
  bind.set_type_name("");
  ExpectInvalid(ValidateRequest(bind), "type_name", "type name is empty");
  bind.set_type_name("app::Graph");
  bind.set_name(std::string(kMaxNameLength + 1, 'n'));
  ExpectInvalid(ValidateRequest(bind), "name", "at most 255");

  v1::LookupRequest lookup;
  lookup.set_heap("h");
  lookup.set_name("root");
  EXPECT_TRUE(ValidateRequest(lookup).ok());
  lookup.set_name(std::string("a\x7f", 2));
  ExpectInvalid(ValidateRequest(lookup), "name", "control character");
  lookup.set_name("root");
  lookup.set_heap("");
  ExpectInvalid(ValidateRequest(lookup), "heap", "empty");

  v1::UnbindRequest unbind;
  unbind.set_session(2);
  unbind.set_name("root");
  EXPECT_TRUE(ValidateRequest(unbind).ok());
  unbind.set_name("");
  ExpectInvalid(ValidateRequest(unbind), "name", "empty");
  unbind.set_name("root");
  unbind.set_heap("graph");  // both a session and a heap
  ExpectInvalid(ValidateRequest(unbind), "heap", "not both");
  unbind.set_session(0);  // heapctl names rm: a heap, no session
  EXPECT_TRUE(ValidateRequest(unbind).ok());
  unbind.set_heap("a/b");
  ExpectInvalid(ValidateRequest(unbind), "heap", "a/b");
  unbind.set_heap("");  // neither
  EXPECT_EQ(ValidateRequest(unbind).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestValidationTest, Snapshots) {
  v1::CreateSnapshotRequest create;
  create.set_heap("h");
  create.set_name("nightly.1");
  create.set_target_dir("/pfs/me");
  (*create.mutable_labels())["slurm_job_id"] = "42";
  create.set_wait_ms(kMaxSnapshotWaitMs);
  EXPECT_TRUE(ValidateRequest(create).ok());
  create.set_wait_ms(kMaxSnapshotWaitMs + 1);
  ExpectInvalid(ValidateRequest(create), "wait_ms", "above the limit");
  create.set_wait_ms(0);
  (*create.mutable_labels())[""] = "x";
  ExpectInvalid(ValidateRequest(create), "labels", "empty");
  create.clear_labels();
  create.set_target_dir("pfs");
  ExpectInvalid(ValidateRequest(create), "target_dir", "absolute");
  create.set_target_dir("");
  create.set_name("a b");
  ExpectInvalid(ValidateRequest(create), "name", "snapshot name");
  create.set_name("n");
  create.set_heap("");
  ExpectInvalid(ValidateRequest(create), "heap", "empty");

  v1::ListSnapshotsRequest list;
  EXPECT_TRUE(ValidateRequest(list).ok());  // heapd's own directory
  list.set_target_dir("/" + std::string(5000, 'd'));
  ExpectInvalid(ValidateRequest(list), "target_dir", "absolute");

  v1::SnapshotRef ref;
  ExpectInvalid(ValidateRequest(ref), "name", "snapshot name is empty");
  ref.set_name("nightly.1");
  EXPECT_TRUE(ValidateRequest(ref).ok());

  v1::RestoreSnapshotRequest restore;
  restore.set_name("nightly.1");
  EXPECT_TRUE(ValidateRequest(restore).ok());  // the snapshot's own heap name
  restore.set_heap("copy");
  restore.set_target_dir("/pfs/me");
  EXPECT_TRUE(ValidateRequest(restore).ok());
  restore.set_heap(".creating.copy");
  ExpectInvalid(ValidateRequest(restore), "heap", "starts with '.'");
}

}  // namespace
}  // namespace heapd
