// HeapdService in process, its snapshot backends replaced by fakes that
// record what reaches them: who may do what to a heap, create_if_missing
// against a squatter, which backend a snapshot call goes to, and restores
// that must leave the heap they would replace. (tests/ runs the real
// backends through a real heapd.)
#include "daemon/heapd_service.h"

#include <grpcpp/server_context.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "heap/heap_dir.h"
#include "heap/test_dir.h"
#include "prometheus/metric_family.h"

namespace heapd {
namespace {

const Caller kAlice{1000, 1000, 11, {}};
const Caller kBob{1001, 1001, 12, {}};
const Caller kCarol{1002, 1002, 13, {1000}};  // in Alice's group
const Caller kRoot{0, 0, 14, {}};

// Records the calls that reach it; answers `answer` (and, for a restore
// that succeeds, an empty heap directory owned as RestoreOptions say).
class FakeBackend final : public SnapshotBackend {
 public:
  absl::StatusOr<v1::SnapshotManifest> Create(const SnapshotCaller&, const Caller&,
                                              ServedHeap& heap, const v1::HeapInfo&,
                                              const v1::CreateSnapshotRequest& request,
                                              absl::Time) override {
    ++creates;
    if (!answer.ok()) return answer;
    v1::SnapshotManifest manifest;
    manifest.set_name(request.name());
    manifest.set_heap(heap.name);
    return manifest;
  }
  void CountCreate(const absl::Status&, double, const v1::SnapshotManifest&) override {
    ++counted_creates;
  }
  absl::Status List(const SnapshotCaller&, const v1::ListSnapshotsRequest&,
                    v1::ListSnapshotsResponse*) override {
    ++lists;
    return answer;
  }
  absl::StatusOr<v1::SnapshotManifest> Verify(const SnapshotCaller&, const v1::SnapshotRef&,
                                              uint64_t) override {
    ++verifies;
    if (!answer.ok()) return answer;
    return v1::SnapshotManifest();
  }
  absl::Status Remove(const SnapshotCaller&, const Caller&, const v1::SnapshotRef&,
                      v1::RemoveSnapshotResponse*) override {
    ++removes;
    return answer;
  }
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> Restore(
      const SnapshotCaller&, const v1::RestoreSnapshotRequest&, const std::string& heaps_dir,
      const std::string& heap_name, const RestoreOptions& options,
      v1::SnapshotManifest* manifest) override {
    ++restores;
    if (!answer.ok()) return answer;
    absl::StatusOr<std::unique_ptr<HeapDirBuilder>> dir =
        HeapDirBuilder::Start(heaps_dir, heap_name, HiddenPurpose::kRestoring);
    if (!dir.ok()) return dir.status();
    HeapConfig config;
    config.max_size = 64 << 20;
    config.owner_uid = options.owner_uid;
    config.owner_gid = options.owner_gid;
    config.mode = 0600;
    manifest->set_heap(heap_name);
    return std::make_unique<RestoredHeapDir>(*std::move(dir), config);
  }
  void LogRestored(const std::string&, const Caller&, const v1::RestoreSnapshotRequest&,
                   const v1::SnapshotManifest&, const v1::HeapInfo&) override {}

  absl::Status answer;
  int creates = 0, counted_creates = 0, lists = 0, verifies = 0, removes = 0, restores = 0;
};

class HeapdServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry = HeapRegistry::Open(dir_.path());
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    ServiceOptions options;
    options.default_max_size = 64 << 20;
    service_ = std::make_unique<HeapdService>(
        registry_.get(), &sessions_,
        HeapdService::SnapshotParts{&directories_, &stores_, nullptr, nullptr}, &metrics_,
        [this](const std::string&) -> absl::StatusOr<Caller> { return caller_; }, options);
    // Alice's heap h, readable by her group.
    caller_ = kAlice;
    ASSERT_TRUE(CreateHeap("h", 0640).ok());
  }

  // Creates heap `name` with `mode` as caller_.
  grpc::Status CreateHeap(const std::string& name, uint32_t mode) {
    v1::CreateHeapRequest create;
    create.set_name(name);
    create.set_mode(mode);
    v1::HeapInfo info;
    return Call(&HeapdService::CreateHeap, create, &info);
  }

  // Calls `method` as caller_.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (HeapdService::*method)(grpc::ServerContext*, const Request*,
                                                         Response*),
                    const Request& request, Response* response) {
    grpc::ServerContext context;
    return (service_.get()->*method)(&context, &request, response);
  }

  grpc::StatusCode Stat(const std::string& heap) {
    v1::StatHeapRequest request;
    request.set_heap(heap);
    v1::HeapStats stats;
    return Call(&HeapdService::StatHeap, request, &stats).error_code();
  }

  grpc::StatusCode Snapshot(const std::string& store_dir) {
    v1::CreateSnapshotRequest request;
    request.set_heap("h");
    request.set_name("s");
    request.set_store_dir(store_dir);
    v1::SnapshotManifest manifest;
    return Call(&HeapdService::CreateSnapshot, request, &manifest).error_code();
  }

  TestDir dir_;
  std::unique_ptr<HeapRegistry> registry_;
  Metrics metrics_;
  Sessions sessions_{absl::Seconds(10), 4, &metrics_};
  FakeBackend directories_;
  FakeBackend stores_;
  Caller caller_;
  std::unique_ptr<HeapdService> service_;
};

// A refusal counts once, under its own limit's label, whatever the heap's
// name says (names may hold "--max_...").
TEST_F(HeapdServiceTest, ARefusalCountsUnderItsOwnLimitOnly) {
  auto refusals = [this](const std::string& limit) {
    for (const prometheus::MetricFamily& family : metrics_.registry().Collect()) {
      if (family.name != "heapd_limit_refusals_total") continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          if (label.value == limit) return metric.counter.value;
        }
      }
    }
    return -1.0;
  };
  v1::CreateHeapRequest create;
  create.set_name("x--max_heaps_per_user--max_calls_per_user");
  create.set_max_size(uint64_t{2} << 40);  // past Alice's 1 TiB
  v1::HeapInfo info;
  const grpc::Status refused = Call(&HeapdService::CreateHeap, create, &info);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_EQ(refusals("heap_bytes_per_user"), 1.0);
  EXPECT_EQ(refusals("heaps_per_user"), 0.0);
  EXPECT_EQ(refusals("calls_per_user"), 0.0);
}

TEST_F(HeapdServiceTest, AHeapIsReadAndWrittenAsItsOwnerAndModeAllow) {
  caller_ = kBob;  // neither owner nor in the group
  EXPECT_EQ(Stat("h"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Snapshot(""), grpc::StatusCode::PERMISSION_DENIED);
  caller_ = kCarol;  // the group may read, not write
  EXPECT_EQ(Stat("h"), grpc::StatusCode::OK);
  EXPECT_EQ(Snapshot(""), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(directories_.creates, 0) << "a refused snapshot reached the backend";
  caller_ = kAlice;
  EXPECT_EQ(Snapshot(""), grpc::StatusCode::OK);
  caller_ = kRoot;
  EXPECT_EQ(Snapshot(""), grpc::StatusCode::OK);
  EXPECT_EQ(directories_.creates, 2);
  // Every call was counted, refused ones too.
  EXPECT_EQ(directories_.counted_creates, 4);
}

TEST_F(HeapdServiceTest, OnlyTheOwnerOrAnAdminRemovesAHeap) {
  v1::RemoveHeapRequest request;
  request.set_heap("h");
  v1::RemoveHeapResponse response;
  caller_ = kCarol;
  EXPECT_EQ(Call(&HeapdService::RemoveHeap, request, &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Stat("h"), grpc::StatusCode::OK);
  caller_ = kAlice;
  EXPECT_TRUE(Call(&HeapdService::RemoveHeap, request, &response).ok());
  EXPECT_EQ(Stat("h"), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HeapdServiceTest, CreateIfMissingNeverHandsOverAnotherUsersHeap) {
  // Bob squats the name Carol means to create, mode 0666 so she could
  // write to it; with create_if_missing she must not get it.
  caller_ = kBob;
  ASSERT_TRUE(CreateHeap("results", 0666).ok());
  caller_ = kCarol;
  v1::AttachRequest attach;
  attach.set_heap("results");
  attach.set_create_if_missing(true);
  v1::AttachResponse response;
  const grpc::Status status = Call(&HeapdService::Attach, attach, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "belongs to uid 1001"))
      << status.error_message();
  EXPECT_EQ(sessions_.CountOn("results"), 0u);
  // The same name missing: Carol makes it, and it is hers.
  attach.set_heap("carols");
  ASSERT_TRUE(Call(&HeapdService::Attach, attach, &response).ok());
  v1::StatHeapRequest stat;
  stat.set_heap("carols");
  v1::HeapStats stats;
  ASSERT_TRUE(Call(&HeapdService::StatHeap, stat, &stats).ok());
  EXPECT_EQ(stats.info().owner_uid(), kCarol.uid);
}

TEST_F(HeapdServiceTest, SnapshotCallsGoToTheBackendTheRequestNames) {
  EXPECT_EQ(Snapshot(""), grpc::StatusCode::OK);
  EXPECT_EQ(Snapshot("/some/store"), grpc::StatusCode::OK);
  EXPECT_EQ(Snapshot("/some/store"), grpc::StatusCode::OK);
  EXPECT_EQ(directories_.creates, 1);
  EXPECT_EQ(stores_.creates, 2);

  v1::ListSnapshotsRequest list;
  v1::ListSnapshotsResponse listed;
  EXPECT_TRUE(Call(&HeapdService::ListSnapshots, list, &listed).ok());
  list.set_store_dir("/some/store");
  EXPECT_TRUE(Call(&HeapdService::ListSnapshots, list, &listed).ok());
  v1::SnapshotRef ref;
  ref.set_name("s");
  ref.set_store_dir("/some/store");
  v1::SnapshotManifest manifest;
  EXPECT_TRUE(Call(&HeapdService::VerifySnapshot, ref, &manifest).ok());
  v1::RemoveSnapshotResponse removed;
  EXPECT_TRUE(Call(&HeapdService::RemoveSnapshot, ref, &removed).ok());
  EXPECT_EQ(directories_.lists, 1);
  EXPECT_EQ(stores_.lists, 1);
  EXPECT_EQ(stores_.verifies, 1);
  EXPECT_EQ(stores_.removes, 1);
  EXPECT_EQ(directories_.verifies + directories_.removes, 0);

  // A backend's error reaches the caller as it is.
  stores_.answer = absl::DataLossError("block 7 is damaged");
  const grpc::Status status = Call(&HeapdService::VerifySnapshot, ref, &manifest);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(status.error_message(), "block 7 is damaged");
}

TEST_F(HeapdServiceTest, AFailedRestoreLeavesTheHeapItWouldReplace) {
  v1::RestoreSnapshotRequest restore;
  restore.set_name("s");
  restore.set_heap("h");
  restore.set_replace(true);
  v1::HeapInfo info;
  directories_.answer = absl::DataLossError("the snapshot's data file is short");
  EXPECT_EQ(Call(&HeapdService::RestoreSnapshot, restore, &info).error_code(),
            grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(directories_.restores, 1);
  EXPECT_EQ(Stat("h"), grpc::StatusCode::OK);
}

TEST_F(HeapdServiceTest, ARestoreNeverReplacesAnotherUsersHeap) {
  v1::RestoreSnapshotRequest restore;
  restore.set_name("s");
  restore.set_heap("h");
  v1::HeapInfo info;
  caller_ = kBob;
  // Without replace: the name is taken.
  EXPECT_EQ(Call(&HeapdService::RestoreSnapshot, restore, &info).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  // With replace: Alice's heap is not Bob's to replace.
  restore.set_replace(true);
  EXPECT_EQ(Call(&HeapdService::RestoreSnapshot, restore, &info).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(directories_.restores, 2);
  caller_ = kAlice;
  v1::StatHeapRequest stat;
  stat.set_heap("h");
  v1::HeapStats stats;
  ASSERT_TRUE(Call(&HeapdService::StatHeap, stat, &stats).ok());
  EXPECT_EQ(stats.info().owner_uid(), kAlice.uid);
  // Nothing of the refused restores is left in the heaps directory: only h.
  size_t entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(*registry_->HeapsDir())) {
    EXPECT_EQ(entry.path().filename(), "h");
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

TEST_F(HeapdServiceTest, KeepingTheSnapshotsOwnerIsForAdminsOnly) {
  v1::RestoreSnapshotRequest restore;
  restore.set_name("s");
  restore.set_heap("new");
  restore.set_keep_owner(true);
  v1::HeapInfo info;
  EXPECT_EQ(Call(&HeapdService::RestoreSnapshot, restore, &info).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(directories_.restores, 0);
}

}  // namespace
}  // namespace heapd
