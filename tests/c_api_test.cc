// The C API (include/heapd/heapd.h) against a real heapd: objects, names,
// links by offset, arrays, errors with errno and heapd_last_error, and what
// a second process sees.
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "heap/fixed_address.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "heapd/heapd.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.Start();
    heapd_attach_options_init(&options_);
    socket_ = daemon_.socket();
    options_.socket = socket_.c_str();
    options_.create_if_missing = 1;
    options_.max_size = 64 << 20;
    heap_ = heapd_attach("c", &options_);
    ASSERT_NE(heap_, nullptr) << heapd_last_error();
  }
  void TearDown() override {
    if (heap_ != nullptr) EXPECT_EQ(heapd_detach(heap_), 0) << heapd_last_error();
  }

  TestDaemon daemon_;
  std::string socket_;
  heapd_attach_options options_;
  heapd_heap* heap_ = nullptr;
};

// A new heap's image: a kind the API does not know is refused, naming the
// field; HEAPD_IMAGE_DIRECT makes a heap whose clients map its data file.
TEST_F(CApiTest, ANewHeapChoosesItsImage) {
  heapd_attach_options options = options_;
  options.image = 9;
  EXPECT_EQ(heapd_attach("c-bad-image", &options), nullptr);
  EXPECT_NE(std::string(heapd_last_error()).find("heapd_attach_options.image 9"), std::string::npos)
      << heapd_last_error();
  options.image = HEAPD_IMAGE_DIRECT;
  heapd_heap* direct = heapd_attach("c-direct", &options);
  ASSERT_NE(direct, nullptr) << heapd_last_error();
  heapd_heap_stats stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(heapd_stats(direct, &stats), 0) << heapd_last_error();
  // On a file system its contents do not roll back (on tmpfs they would).
  struct statfs fs;
  ASSERT_EQ(statfs(daemon_.socket().c_str(), &fs), 0);
  if (fs.f_type != TMPFS_MAGIC) EXPECT_EQ(stats.content_rollback, 0);
  EXPECT_EQ(heapd_detach(direct), 0) << heapd_last_error();
}

// The function programs built against 0.4.0's header call (the
// parentheses keep the macro of today's header out).
extern "C" void(heapd_attach_options_init)(heapd_attach_options* options);

// A program built against 0.4.0's header: its struct ends at `mode`. The
// library it loads now writes nothing past that, and reads nothing past
// what the struct says it holds.
TEST_F(CApiTest, AnOlderCallersStructIsNeverOverrun) {
  constexpr size_t kOldSize = offsetof(heapd_attach_options, image);
  alignas(heapd_attach_options) unsigned char bytes[sizeof(heapd_attach_options) + 16];
  std::memset(bytes, 0xAB, sizeof(bytes));
  auto* old = reinterpret_cast<heapd_attach_options*>(bytes);
  (heapd_attach_options_init)(old);
  EXPECT_EQ(old->struct_size, kOldSize);
  for (size_t i = kOldSize; i < sizeof(bytes); ++i) {
    ASSERT_EQ(bytes[i], 0xAB) << "byte " << i << " written past the old struct";
  }
  old->socket = socket_.c_str();
  old->create_if_missing = 1;
  old->max_size = 64 << 20;
  heapd_heap* heap = heapd_attach("c-old-caller", old);  // image and storage not read
  ASSERT_NE(heap, nullptr) << heapd_last_error();
  EXPECT_EQ(heapd_detach(heap), 0) << heapd_last_error();
  // Today's macro passes the caller's own size.
  std::memset(bytes, 0xAB, sizeof(bytes));
  heapd_attach_options_init_sized(old, kOldSize);
  EXPECT_EQ(old->struct_size, kOldSize);
  EXPECT_EQ(bytes[kOldSize], 0xAB);
  heapd_attach_options now;
  heapd_attach_options_init(&now);
  EXPECT_EQ(now.struct_size, sizeof(now));
  EXPECT_EQ(now.storage, nullptr);
}

TEST_F(CApiTest, ANewHeapGoesOnTheStorageTierAsked) {
  heapd_attach_options options = options_;
  options.storage = "nvme";  // this heapd has only its default tier
  EXPECT_EQ(heapd_attach("c-bad-tier", &options), nullptr);
  EXPECT_NE(std::string(heapd_last_error()).find("no tier named 'nvme'; its tiers are default"),
            std::string::npos)
      << heapd_last_error();
  options.storage = "default";
  heapd_heap* heap = heapd_attach("c-default-tier", &options);
  ASSERT_NE(heap, nullptr) << heapd_last_error();
  EXPECT_EQ(heapd_detach(heap), 0) << heapd_last_error();
}

TEST_F(CApiTest, ObjectsNamesAndLinksOutliveTheProcess) {
  struct Node {
    uint64_t next;  // offset of the next node; 0: none
    int64_t value;
  };
  Node* first = static_cast<Node*>(heapd_named_malloc(heap_, "list", sizeof(Node)));
  ASSERT_NE(first, nullptr) << heapd_last_error();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 16, 0u);
  Node* second = static_cast<Node*>(heapd_malloc(heap_, sizeof(Node)));
  ASSERT_NE(second, nullptr);
  *second = Node{0, 2};
  *first = Node{heapd_offset(heap_, second), 1};
  EXPECT_NE(heapd_offset(heap_, first), 0u);  // 0 is the null link, whatever the offset
  EXPECT_EQ(heapd_pointer(heap_, heapd_offset(heap_, first)), first);
  EXPECT_EQ(heapd_pointer(heap_, first->next), second);
  EXPECT_EQ(heapd_offset(heap_, nullptr), 0u);
  EXPECT_EQ(heapd_pointer(heap_, 0), nullptr);
  ASSERT_EQ(heapd_sync(heap_), 0) << heapd_last_error();
  ASSERT_EQ(heapd_detach(heap_), 0);
  heap_ = nullptr;

  // Another process attaches and walks the list.
  const pid_t child = fork();
  if (child == 0) {
    heapd_attach_options options;
    heapd_attach_options_init(&options);
    options.socket = socket_.c_str();
    heapd_heap* heap = heapd_attach("c", &options);
    if (heap == nullptr) _exit(10);
    size_t size = 0;
    const Node* node = static_cast<const Node*>(heapd_find(heap, "list", &size));
    if (node == nullptr || size != sizeof(Node) || node->value != 1) _exit(11);
    node = static_cast<const Node*>(heapd_pointer(heap, node->next));
    if (node == nullptr || node->value != 2 || node->next != 0) _exit(12);
    _exit(heapd_detach(heap) == 0 ? 0 : 13);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  heap_ = heapd_attach("c", &options_);
  ASSERT_NE(heap_, nullptr);
  EXPECT_EQ(heapd_named_free(heap_, "list"), 0) << heapd_last_error();
  EXPECT_EQ(heapd_find(heap_, "list", nullptr), nullptr);
  EXPECT_EQ(errno, ENOENT);
}

// A fixed-address heap: C structs hold plain pointers, and another process
// follows them as they are.
struct CNode {
  uint64_t value;
  struct CNode* next;
};

TEST_F(CApiTest, AFixedAddressHeapKeepsPlainPointers) {
  if (!kFixedAddressesMappable) {
    GTEST_SKIP() << "ThreadSanitizer keeps heapd's fixed-address window for its shadow";
  }
  heapd_attach_options options = options_;
  options.fixed_address = 1;
  heapd_heap* fixed = heapd_attach("c-fixed", &options);
  ASSERT_NE(fixed, nullptr) << heapd_last_error();
  heapd_heap_stats stats;
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(heapd_stats(fixed, &stats), 0) << heapd_last_error();
  ASSERT_NE(stats.fixed_address, 0u);
  CNode** head = static_cast<CNode**>(heapd_named_malloc(fixed, "head", sizeof(CNode*)));
  ASSERT_NE(head, nullptr) << heapd_last_error();
  *head = nullptr;
  for (uint64_t i = 0; i < 100; ++i) {
    CNode* node = static_cast<CNode*>(heapd_malloc(fixed, sizeof(CNode)));
    ASSERT_NE(node, nullptr) << heapd_last_error();
    *node = CNode{i, *head};
    *head = node;
  }
  ASSERT_EQ(heapd_detach(fixed), 0) << heapd_last_error();

  // Another process (this binary, running only the reader below) follows
  // the same plain pointers.
  setenv("HEAPD_TEST_SOCKET", socket_.c_str(), 1);
  setenv("HEAPD_TEST_HEAD", std::to_string(reinterpret_cast<uintptr_t>(head)).c_str(), 1);
  const ChildResult read = RunChild({"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                     "--gtest_filter=CApiFixedReader.DISABLED_FollowsPointers"});
  EXPECT_TRUE(read.Exited(0)) << read.output;
  EXPECT_NE(read.output.find("[  PASSED  ] 1 test"), std::string::npos) << read.output;

  // A heap that is not fixed-address, asked for as one: refused.
  EXPECT_EQ(heapd_attach("c", &options), nullptr);
  EXPECT_NE(std::string(heapd_last_error()).find("not a fixed-address heap"), std::string::npos)
      << heapd_last_error();
}

// A forked child of a process with a fixed-address heap attached attaches
// that heap itself: at once if it did not keep the parent's mapping, after
// detaching it if it did (until then the range is taken).
TEST_F(CApiTest, AForkedChildAttachesAFixedAddressHeapItself) {
  if (!kFixedAddressesMappable) {
    GTEST_SKIP() << "ThreadSanitizer keeps heapd's fixed-address window for its shadow";
  }
  heapd_attach_options options = options_;
  options.fixed_address = 1;
  heapd_heap* fixed = heapd_attach("c-forked", &options);
  ASSERT_NE(fixed, nullptr) << heapd_last_error();
  // Another fixed-address heap the children inherit: attaching the first
  // gives back only that one's range.
  heapd_heap* other = heapd_attach("c-other", &options);
  ASSERT_NE(other, nullptr) << heapd_last_error();
  heapd_heap_stats other_stats;
  other_stats.struct_size = sizeof(other_stats);
  ASSERT_EQ(heapd_stats(other, &other_stats), 0) << heapd_last_error();
  char* const other_header = reinterpret_cast<char*>(other_stats.fixed_address) - 4096;
  auto* value = static_cast<uint64_t*>(heapd_named_malloc(fixed, "v", sizeof(uint64_t)));
  ASSERT_NE(value, nullptr) << heapd_last_error();
  *value = 41;
  ASSERT_EQ(heapd_sync(fixed), 0) << heapd_last_error();
  for (bool kept : {false, true}) {
    const uint64_t before = *value;
    const pid_t child = fork();
    if (child == 0) {
      if (kept) {
        if (heapd_forked_child(fixed) != 0) _exit(10);
        if (*value != before) _exit(11);  // the parent's mapping, kept
        if (heapd_attach("c-forked", &options) != nullptr || errno != EPERM) _exit(12);
        if (heapd_detach(fixed) != 0) _exit(13);
      }
      heapd_heap* own = heapd_attach("c-forked", &options);
      if (own == nullptr) _exit(14);
      // c-other's inherited mapping is still there (its header page).
      void* probe = mmap(other_header, 4096, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (probe != MAP_FAILED || errno != EEXIST) _exit(17);
      auto* seen = static_cast<uint64_t*>(heapd_find(own, "v", nullptr));
      if (seen != value || *seen != before) _exit(15);  // the same address, the heap's contents
      *seen = kept ? 43 : 42;
      _exit(heapd_detach(own) == 0 ? 0 : 16);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "kept " << kept << ": " << status;
    EXPECT_EQ(*value, kept ? 43u : 42u) << "the child's own session wrote the heap";
  }
  EXPECT_EQ(heapd_detach(fixed), 0) << heapd_last_error();
  EXPECT_EQ(heapd_detach(other), 0) << heapd_last_error();
}

// The reader AFixedAddressHeapKeepsPlainPointers runs in another process.
TEST(CApiFixedReader, DISABLED_FollowsPointers) {
  heapd_attach_options reader;
  heapd_attach_options_init(&reader);
  reader.socket = getenv("HEAPD_TEST_SOCKET");
  reader.read_only = 1;
  reader.fixed_address = 1;
  ASSERT_NE(reader.socket, nullptr);
  heapd_heap* seen = heapd_attach("c-fixed", &reader);
  ASSERT_NE(seen, nullptr) << heapd_last_error();
  CNode** found = static_cast<CNode**>(heapd_find(seen, "head", nullptr));
  ASSERT_NE(found, nullptr) << heapd_last_error();
  EXPECT_EQ(std::to_string(reinterpret_cast<uintptr_t>(found)), getenv("HEAPD_TEST_HEAD"));
  uint64_t expected = 100;
  for (const CNode* node = *found; node != nullptr; node = node->next) {
    ASSERT_EQ(node->value, --expected);
  }
  EXPECT_EQ(expected, 0u);
  EXPECT_EQ(heapd_detach(seen), 0) << heapd_last_error();
}

// The first object of a new heap may start at its first byte: its link is
// still not the null link.
TEST_F(CApiTest, TheFirstObjectOfANewHeapHasALink) {
  heapd_attach_options options = options_;
  heapd_heap* fresh = heapd_attach("fresh", &options);
  ASSERT_NE(fresh, nullptr) << heapd_last_error();
  for (size_t size : {size_t{64}, size_t{3} << 20}) {
    void* p = heapd_malloc(fresh, size);
    ASSERT_NE(p, nullptr) << heapd_last_error();
    const uint64_t link = heapd_offset(fresh, p);
    EXPECT_NE(link, 0u);
    EXPECT_EQ(heapd_pointer(fresh, link), p);
  }
  EXPECT_EQ(heapd_detach(fresh), 0);
}

// A child made by fork() inherits the heap but not the session: its calls
// fail (EPERM), links still resolve, its detach forgets the heap, and the
// parent's session goes on.
TEST_F(CApiTest, AForkedChildUsesNotTheParentsSession) {
  auto* value = static_cast<int64_t*>(heapd_named_malloc(heap_, "v", sizeof(int64_t)));
  ASSERT_NE(value, nullptr);
  *value = 41;
  ASSERT_EQ(heapd_sync(heap_), 0);
  for (bool told : {false, true}) {
    const pid_t child = fork();
    if (child == 0) {
      if (told && heapd_forked_child(heap_) != 0) _exit(10);
      if (heapd_sync(heap_) != -1 || errno != EPERM) _exit(11);
      if (heapd_malloc(heap_, 8) != nullptr || errno != EPERM) _exit(12);
      const uint64_t link = heapd_offset(heap_, value);
      if (link == UINT64_MAX || heapd_pointer(heap_, link) != value) _exit(13);
      if (told && *value != 41) _exit(14);  // the private view reads the heap
      if (told) *value = 7;                 // ... and keeps this write to itself
      _exit(heapd_detach(heap_) == 0 ? 0 : 15);
    }
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "told " << told << ": " << status;
  }
  EXPECT_EQ(*value, 41);
  EXPECT_EQ(heapd_sync(heap_), 0) << heapd_last_error();  // the session is the parent's still
  ASSERT_NE(heapd_malloc(heap_, 8), nullptr) << heapd_last_error();
}

// The exit code of `child`, waited for up to `seconds`; a child still
// running then is killed, with its process group if it leads one (its own
// children), and -1 returned: a hang fails the test, not the run.
int ExitCodeOf(pid_t child, int seconds) {
  for (int waited_ms = 0; waited_ms < seconds * 1000; waited_ms += 10) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(10'000);
  }
  kill(-child, SIGKILL);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return -1;
}

// A child forked just after its parent's heapd call, while gRPC's threads
// may still be at work, attaches the heap itself, every time: gRPC stops
// its threads for the fork (before, a lock one of them held at the fork
// could hang the child's attach: about once in ten runs under ASan).
TEST_F(CApiTest, ForkedChildrenConnectThemselves) {
  for (int round = 0; round < 32; ++round) {
    ASSERT_EQ(heapd_sync(heap_), 0) << heapd_last_error();
    const pid_t child = fork();
    if (child == 0) {
      heapd_heap* own = heapd_attach("c", &options_);
      if (own == nullptr) _exit(10);
      if (heapd_malloc(own, 8) == nullptr) _exit(11);
      _exit(heapd_detach(own) == 0 ? 0 : 12);
    }
    ASSERT_EQ(ExitCodeOf(child, 30), 0) << "round " << round << " (-1: hung, killed)";
  }
}

// A forked child's children attach the heap themselves too, whether the
// child forks them before it connects itself or after.
TEST_F(CApiTest, AForkedChildsChildrenConnectToo) {
  ASSERT_EQ(heapd_sync(heap_), 0) << heapd_last_error();
  const pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);  // its children go with it if it is killed
    for (bool connected : {false, true}) {
      heapd_heap* own = nullptr;
      if (connected && (own = heapd_attach("c", &options_)) == nullptr) _exit(10);
      const pid_t grandchild = fork();
      if (grandchild == 0) {
        heapd_heap* its_own = heapd_attach("c", &options_);
        _exit(its_own != nullptr && heapd_detach(its_own) == 0 ? 0 : 11);
      }
      if (ExitCodeOf(grandchild, 30) != 0) _exit(connected ? 13 : 12);
      if (own != nullptr && heapd_detach(own) != 0) _exit(14);
    }
    _exit(0);
  }
  EXPECT_EQ(ExitCodeOf(child, 90), 0) << "(-1: hung, killed)";
}

// Two threads forking at once each pass gRPC's fork handlers alone (they
// share state: interleaved, they could leave gRPC blocked in the parent).
// The race runs in a child of the test, whose hang is killed.
TEST_F(CApiTest, ThreadsForkingAtOnceLeaveGrpcWorking) {
  ASSERT_EQ(heapd_sync(heap_), 0) << heapd_last_error();
  const pid_t racer = fork();
  if (racer == 0) {
    setpgid(0, 0);  // its children go with it if it is killed
    heapd_heap* own = heapd_attach("c", &options_);
    if (own == nullptr) _exit(10);
    std::atomic<int> failed{0};
    auto fork_often = [&failed] {
      for (int i = 0; i < 100; ++i) {
        const pid_t child = fork();
        if (child == 0) _exit(0);
        if (child < 0 || waitpid(child, nullptr, 0) != child) ++failed;
      }
    };
    std::thread one(fork_often);
    std::thread two(fork_often);
    one.join();
    two.join();
    if (failed != 0) _exit(11);
    _exit(heapd_sync(own) == 0 && heapd_detach(own) == 0 ? 0 : 12);
  }
  EXPECT_EQ(ExitCodeOf(racer, 120), 0) << "(-1: hung, killed)";
}

// A forked child's calls run on gRPC's threads, started again in the
// child: a call to a server that never answers ends at its deadline
// (without them, the child waited for ever).
TEST_F(CApiTest, AForkedChildsCallsKeepTheirDeadlines) {
  char dir[] = "/tmp/heapd-silent-XXXXXX";  // TEST_TMPDIR is too long for a socket path
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string silent = std::string(dir) + "/heapd.sock";
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0) << strerror(errno);
  absl::Cleanup gone = [&] {
    close(listener);
    unlink(silent.c_str());
    rmdir(dir);
  };
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, silent.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 8), 0);                      // connections wait; none is accepted
  ASSERT_EQ(heapd_sync(heap_), 0) << heapd_last_error();  // gRPC at work here
  const pid_t child = fork();
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(silent, 200);
    if (!client.ok()) _exit(10);
    const absl::StatusOr<std::unique_ptr<Heap>> heap = (*client)->Attach("c", AttachOptions{});
    _exit(heap.status().code() == absl::StatusCode::kDeadlineExceeded ? 0 : 11);
  }
  EXPECT_EQ(ExitCodeOf(child, 30), 0) << "(-1: hung, killed)";
}

// An object of 40 bytes (aligned to 16: in the 48-byte class) freed by
// name from another session: its size said with the free fits its slot.
TEST_F(CApiTest, ANamedObjectIsFreedByAnotherSession) {
  ASSERT_NE(heapd_named_malloc(heap_, "odd", 40), nullptr) << heapd_last_error();
  ASSERT_EQ(heapd_sync(heap_), 0) << heapd_last_error();
  ASSERT_EQ(heapd_detach(heap_), 0) << heapd_last_error();
  heap_ = heapd_attach("c", &options_);
  ASSERT_NE(heap_, nullptr) << heapd_last_error();
  EXPECT_EQ(heapd_named_free(heap_, "odd"), 0) << heapd_last_error();
  EXPECT_EQ(heapd_sync(heap_), 0) << heapd_last_error();
}

TEST_F(CApiTest, FailuresSetErrnoAndSayWhat) {
  ASSERT_NE(heapd_named_malloc(heap_, "x", 8), nullptr);
  EXPECT_EQ(heapd_named_malloc(heap_, "x", 8), nullptr);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_NE(std::string(heapd_last_error()).find("ALREADY_EXISTS"), std::string::npos)
      << heapd_last_error();
  int outside = 0;
  EXPECT_EQ(heapd_free(heap_, &outside), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(heapd_offset(heap_, &outside), UINT64_MAX);
  EXPECT_EQ(heapd_free(heap_, nullptr), 0);
  // Beyond the heap's maximum size: EINVAL (sizes near 2^64 too, which
  // must not wrap around); more than is left: ENOMEM.
  EXPECT_EQ(heapd_malloc(heap_, size_t{1} << 30), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(heapd_malloc(heap_, SIZE_MAX), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(heapd_malloc(heap_, SIZE_MAX - (size_t{1} << 20)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_NE(heapd_malloc(heap_, size_t{40} << 20), nullptr) << heapd_last_error();
  EXPECT_EQ(heapd_malloc(heap_, size_t{40} << 20), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_NE(std::string(heapd_last_error()).find("RESOURCE_EXHAUSTED"), std::string::npos)
      << heapd_last_error();
  EXPECT_EQ(heapd_attach("nosuch", nullptr), nullptr);  // the default socket: none here
  EXPECT_TRUE(errno == ECONNREFUSED || errno == ENOENT) << errno;
  heapd_attach_options options = options_;
  options.create_if_missing = 0;
  EXPECT_EQ(heapd_attach("nosuch", &options), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_NE(std::string(heapd_last_error()).find("nosuch"), std::string::npos);
  heapd_attach_options unset;
  std::memset(&unset, 0, sizeof(unset));  // not filled by heapd_attach_options_init
  EXPECT_EQ(heapd_attach("c", &unset), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Read-only: no allocation.
  options.read_only = 1;
  heapd_heap* reader = heapd_attach("c", &options);
  ASSERT_NE(reader, nullptr) << heapd_last_error();
  EXPECT_EQ(heapd_malloc(reader, 8), nullptr);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(heapd_detach(reader), 0);
}

TEST_F(CApiTest, ArraysCarryTheirRecord) {
  heapd_array_info info{};
  info.dtype = HEAPD_FLOAT64;
  info.rank = 2;
  info.fortran_order = 1;
  info.shape[0] = 30;
  info.shape[1] = 20;
  EXPECT_EQ(heapd_array(heap_, "u", &info, /*create=*/0), nullptr);
  EXPECT_EQ(errno, ENOENT);
  auto* u = static_cast<double*>(heapd_array(heap_, "u", &info, /*create=*/1));
  ASSERT_NE(u, nullptr) << heapd_last_error();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(u) % 64, 0u);
  for (int i = 0; i < 600; ++i) ASSERT_EQ(u[i], 0.0);  // new arrays are zero-filled
  u[599] = 6.5;
  EXPECT_EQ(heapd_array(heap_, "u", &info, 1), u);  // found, not made again
  heapd_array_info found{};
  EXPECT_EQ(heapd_find_array(heap_, "u", &found), u);
  EXPECT_EQ(found.dtype, HEAPD_FLOAT64);
  EXPECT_EQ(found.rank, 2);
  EXPECT_EQ(found.fortran_order, 1);
  EXPECT_EQ(found.shape[1], 20u);
  heapd_array_info other = info;
  other.shape[1] = 21;
  EXPECT_EQ(heapd_array(heap_, "u", &other, 1), nullptr);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(std::string(heapd_last_error())
                .find("float64[30,20] (Fortran order), not "
                      "float64[30,21]"),
            std::string::npos)
      << heapd_last_error();
  ASSERT_NE(heapd_named_malloc(heap_, "bytes", 16), nullptr);
  EXPECT_EQ(heapd_find_array(heap_, "bytes", &found), nullptr);
  EXPECT_EQ(errno, EPERM);
  other.rank = 0;
  EXPECT_EQ(heapd_array(heap_, "v", &other, 1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Names, with their records, and the heap's usage.
  std::string listed;
  EXPECT_EQ(heapd_list_names(
                heap_, nullptr,
                [](const char* name, uint64_t size, const char* type_name, void* arg) {
                  *static_cast<std::string*>(arg) +=
                      std::string(name) + "=" + std::to_string(size) + ":" + type_name + ";";
                },
                &listed),
            2);
  EXPECT_EQ(listed, "bytes=16:heapd::bytes/v1;u=4800:heapd::array/v1 f8 F 30,20;");
  EXPECT_EQ(heapd_list_names(heap_, "u", nullptr, nullptr), 1);
  heapd_heap_stats stats{};
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(heapd_stats(heap_, &stats), 0) << heapd_last_error();
  EXPECT_EQ(stats.max_size, uint64_t{64} << 20);
  EXPECT_EQ(stats.names, 2u);
  EXPECT_EQ(stats.clients, 1u);
  stats.struct_size = 0;
  EXPECT_EQ(heapd_stats(heap_, &stats), -1);
  // One dimension has no order: made in Fortran's, found in C's.
  heapd_array_info line{};
  line.dtype = HEAPD_INT32;
  line.rank = 1;
  line.fortran_order = 1;
  line.shape[0] = 10;
  void* made = heapd_array(heap_, "line", &line, 1);
  ASSERT_NE(made, nullptr) << heapd_last_error();
  line.fortran_order = 0;
  EXPECT_EQ(heapd_array(heap_, "line", &line, 1), made) << heapd_last_error();
  EXPECT_EQ(heapd_dtype_size(HEAPD_COMPLEX128), 16u);
  EXPECT_EQ(heapd_dtype_size(0), 0u);
}

}  // namespace
}  // namespace heapd
