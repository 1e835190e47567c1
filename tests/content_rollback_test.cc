// Object contents go back to the last sync, end to end: a real heapd with
// its heaps on tmpfs (clients map the data file), and on a block file
// system (the test directory, ext4 here: clients map a working image and
// the data file changes only at syncs), real client processes
// (heap_worker) killed after storing into an object they synced before,
// heapd killed under a writer. And where contents cannot roll back
// (--track_contents=false, --working_images=false on ext4), attach and
// StatHeap say so.
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "client/client_channel.h"
#include "gtest/gtest.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

const std::string kWorker = "tests/heap_worker";

ChildResult Work(const TestDaemon& daemon, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile(kWorker), daemon.socket(), "h"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunChild(argv);
}

// The value bound to `name`, as a read-only attach finds it.
std::string Value(const TestDaemon& daemon, const std::string& name) {
  const ChildResult got = Work(daemon, {"get", name});
  EXPECT_TRUE(got.Exited(0)) << got.output;
  return got.output;
}

v1::HeapStats Stats(const TestDaemon& daemon) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon.socket());
  EXPECT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::HeapStats> stats = StatHeap(**client, "h");
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? *stats : v1::HeapStats();
}

// The parent of heapd's state directory: /dev/shm (tmpfs), or "" (the
// test directory).
class ContentRollbackOn : public testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Storage, ContentRollbackOn, testing::Values("/dev/shm", ""),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? "TestDir" : "Tmpfs";
                         });

TEST_P(ContentRollbackOn, AStoreAfterTheLastSyncGoesBackWhenItsWriterDies) {
  TestDaemon daemon({}, GetParam());
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  const ChildResult died = Work(daemon, {"store-and-die", "x", "22"});
  ASSERT_TRUE(died.KilledBy(SIGKILL)) << died.output;
  ASSERT_TRUE(absl::StrContains(died.output, "stored tracked")) << died.output;
  EXPECT_EQ(Value(daemon, "x"), "value 11\n");
  const v1::HeapStats stats = Stats(daemon);
  EXPECT_TRUE(stats.info().content_rollback());
  EXPECT_GE(stats.undo_pages_restored(), 1u);
}

// Stores the kernel makes into a tracked heap (read(2) into a heap buffer,
// another process's process_vm_writev as MPI's cross-process copies) wait
// for their page's pre-image like the process's own (this test's client
// runs as root: its userfaultfd covers kernel-mode faults), and go back
// with them.
TEST_P(ContentRollbackOn, KernelStoresWorkAndGoBackWhenTheirWriterDies) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root: without privilege the kernel's stores into a tracked heap fail "
                    "with EFAULT (docs/api.md, prepare_write)";
  }
  TestDaemon daemon({}, GetParam());
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  for (const std::string how : {"read", "vm-write"}) {
    SCOPED_TRACE(how);
    const ChildResult died = Work(daemon, {"kernel-store-and-die", "x", "22", how});
    ASSERT_TRUE(died.KilledBy(SIGKILL)) << died.output;
    EXPECT_TRUE(absl::StrContains(died.output, "stored tracked")) << died.output;
    EXPECT_TRUE(absl::StrContains(died.output, "read back 22")) << died.output;
    EXPECT_EQ(Value(daemon, "x"), "value 11\n");
  }
  EXPECT_GE(Stats(daemon).undo_pages_restored(), 2u);
}

// A sync too big for one message goes in parts; one killed between them
// commits none: not the free of the object its stores unlinked (the store
// goes back, so the object must stay live), nor the allocations.
TEST(ContentRollbackTest, ASyncKilledBetweenItsPartsCommitsNothing) {
  struct statvfs shm;
  if (statvfs("/dev/shm", &shm) != 0 || uint64_t{shm.f_bavail} * shm.f_frsize < (3ull << 30)) {
    GTEST_SKIP() << "needs 3 GiB free on /dev/shm (a sync of more than one message)";
  }
  TestDaemon daemon({}, "/dev/shm");
  daemon.Start();
  const ChildResult died = Work(daemon, {"relink-and-die"});
  ASSERT_TRUE(died.KilledBy(SIGKILL)) << died.output;
  ASSERT_TRUE(absl::StrContains(died.output, "relinked")) << died.output;
  const ChildResult checked = Work(daemon, {"check-relinked"});
  ASSERT_TRUE(checked.Exited(0)) << checked.output;
  EXPECT_TRUE(absl::StrContains(checked.output, "value 11\n")) << checked.output;
  EXPECT_TRUE(absl::StrContains(checked.output, "free OK")) << checked.output;
  const v1::HeapStats stats = Stats(daemon);
  for (const v1::SizeClassStats& c : stats.size_classes()) {
    EXPECT_LT(c.live_objects(), 2u) << "class of " << c.slot_size() << " bytes";
  }
}

TEST_P(ContentRollbackOn, HeapdKilledUnderAWriterRecoversAndFencesIt) {
  TestDaemon daemon({}, GetParam());
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  Child writer({Runfile(kWorker), daemon.socket(), "h", "store-and-wait", "x", "22"});
  ASSERT_TRUE(writer.WaitForOutput("stored tracked")) << writer.output();
  daemon.Crash();
  daemon.Start();
  // Recovery put the page back before the heap was served again.
  EXPECT_EQ(Value(daemon, "x"), "value 11\n");
  // The writer lost its session: its mapping was fenced (made private), so
  // a later store stays in its process and the recovered heap is unchanged.
  writer.Kill(SIGUSR1);
  ASSERT_TRUE(writer.WaitForOutput("stored again")) << writer.output();
  EXPECT_EQ(Value(daemon, "x"), "value 11\n");
  writer.Kill(SIGKILL);
  writer.Wait();
}

// Journals left by a crash are recovered by a heapd started with tracking
// off, too.
TEST_P(ContentRollbackOn, TurningTrackingOffAcrossACrashStillRecovers) {
  TestDaemon daemon({}, GetParam());
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  Child writer({Runfile(kWorker), daemon.socket(), "h", "store-and-wait", "x", "22"});
  ASSERT_TRUE(writer.WaitForOutput("stored tracked")) << writer.output();
  daemon.Crash();
  writer.Kill(SIGKILL);
  writer.Wait();
  daemon.set_extra_flags({"--track_contents=false"});
  daemon.Start();
  EXPECT_EQ(Value(daemon, "x"), "value 11\n");
  EXPECT_FALSE(Stats(daemon).info().content_rollback());
}

TEST_P(ContentRollbackOn, ASyncCommitsTheStore) {
  TestDaemon daemon({}, GetParam());
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  Child writer({Runfile(kWorker), daemon.socket(), "h", "hold", "1"});
  ASSERT_TRUE(writer.WaitForOutput("synced")) << writer.output();
  // "hold" bound pre-1 = 1 and synced; a second writer stores into x after
  // its sync and dies: x goes back, pre-1 (synced by the first) stays.
  ASSERT_TRUE(Work(daemon, {"store-and-die", "x", "33"}).KilledBy(SIGKILL));
  EXPECT_EQ(Value(daemon, "x"), "value 11\n");
  EXPECT_EQ(Value(daemon, "pre-1"), "value 1\n");
}

TEST(ContentRollbackTest, TurnedOffItSaysSo) {
  TestDaemon daemon({"--track_contents=false"}, "/dev/shm");
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  const ChildResult died = Work(daemon, {"store-and-die", "x", "22"});
  ASSERT_TRUE(absl::StrContains(died.output, "stored untracked")) << died.output;
  EXPECT_EQ(Value(daemon, "x"), "value 22\n");  // what the old model did
  const v1::HeapStats stats = Stats(daemon);
  EXPECT_FALSE(stats.info().content_rollback());
  EXPECT_TRUE(absl::StrContains(stats.info().content_rollback_note(), "--track_contents"))
      << stats.info().content_rollback_note();
}

TEST(ContentRollbackTest, AFileSystemHeapGetsAWorkingImage) {
  TestDaemon daemon;  // state in the test directory: not tmpfs here
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  const v1::HeapStats stats = Stats(daemon);
  if (stats.info().backing() == v1::BACKING_TMPFS) GTEST_SKIP() << "the test directory is tmpfs";
  EXPECT_EQ(stats.info().image(), v1::IMAGE_WORKING);
  EXPECT_TRUE(stats.info().content_rollback()) << stats.info().content_rollback_note();
}

// The image is chosen per heap when it is made: direct on a file system
// (contents do not roll back, and the heap says why); a working image on
// tmpfs is refused, saying why.
TEST(ContentRollbackTest, EachHeapChoosesItsImage) {
  TestDaemon daemon;
  daemon.Start();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok()) << client.status();
  AttachOptions direct;
  direct.create_if_missing = true;
  direct.image = HeapImage::kDirect;
  absl::StatusOr<std::unique_ptr<Heap>> heap = (*client)->Attach("h", direct);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const v1::HeapStats stats = Stats(daemon);
  if (stats.info().backing() == v1::BACKING_TMPFS) GTEST_SKIP() << "the test directory is tmpfs";
  EXPECT_EQ(stats.info().image(), v1::IMAGE_DIRECT);
  EXPECT_FALSE((*heap)->content_rollback());
  EXPECT_TRUE(absl::StrContains((*heap)->content_rollback_note(), "--image=working"))
      << (*heap)->content_rollback_note();
  ASSERT_TRUE((*heap)->detach().ok());

  TestDaemon on_tmpfs({}, "/dev/shm");
  on_tmpfs.Start();
  absl::StatusOr<std::unique_ptr<Client>> tmpfs_client = Client::Connect(on_tmpfs.socket());
  ASSERT_TRUE(tmpfs_client.ok()) << tmpfs_client.status();
  AttachOptions working;
  working.create_if_missing = true;
  working.image = HeapImage::kWorking;
  const absl::Status refused = (*tmpfs_client)->Attach("w", working).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "tmpfs")) << refused;
}

TEST(ContentRollbackTest, AFileSystemHeapWithoutAWorkingImageSaysWhyNot) {
  TestDaemon daemon({"--working_images=false"});
  daemon.Start();
  ASSERT_TRUE(Work(daemon, {"put", "x", "11"}).Exited(0));
  const v1::HeapStats stats = Stats(daemon);
  if (stats.info().backing() == v1::BACKING_TMPFS) GTEST_SKIP() << "the test directory is tmpfs";
  EXPECT_EQ(stats.info().image(), v1::IMAGE_DIRECT);
  EXPECT_FALSE(stats.info().content_rollback());
  EXPECT_TRUE(absl::StrContains(stats.info().content_rollback_note(), "contents do not"))
      << stats.info().content_rollback_note();
}

}  // namespace
}  // namespace heapd
