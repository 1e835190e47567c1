// heap_worker: a client process for the multi-process tests. Each mode does
// one thing a real job step would and prints "ok ..." on success, or the
// error and exits 3.
//
//   heap_worker SOCKET HEAP alloc ID COUNT      allocate COUNT objects (2 threads),
//                                               fill them, bind "worker-ID", detach
//   heap_worker SOCKET HEAP verify ID           read-only: check worker ID's objects
//   heap_worker SOCKET HEAP free-half ID        free every other object of worker ID
//                                               (another process's), then free one twice
//   heap_worker SOCKET HEAP alloc-forever ID    allocate 1000, bind, sync, print
//                                               "synced", then allocate ~100 MB more,
//                                               print "allocated" and wait to be killed
//   heap_worker SOCKET HEAP hold ID             allocate 1000, bind "pre-ID", sync, print
//                                               "synced", then stay attached, idle,
//                                               syncing again at each SIGUSR1
//   heap_worker SOCKET HEAP put NAME VALUE      bind NAME to a new uint64_t VALUE
//   heap_worker SOCKET HEAP get NAME            read-only: print "value V" of NAME
//   heap_worker SOCKET HEAP store-and-die NAME VALUE   sync, store VALUE into NAME's
//                                               uint64_t, print "stored tracked|untracked",
//                                               die of SIGKILL before syncing
//   heap_worker SOCKET HEAP kernel-store-and-die NAME VALUE HOW   the same, the
//                                               kernel storing: HOW is read (read(2)
//                                               from a pipe into the object) or vm-write
//                                               (a child process's process_vm_writev, as
//                                               MPI's cross-process copies); print "read
//                                               back VALUE" before dying
//   heap_worker SOCKET HEAP scribble-and-die NAME VALUE   the same without the
//                                               sync first: no epoch passes
//   heap_worker SOCKET HEAP store-and-wait NAME VALUE  the same, but stay attached;
//                                               at each SIGUSR1 store VALUE+1 and print
//                                               "stored again"
//   heap_worker SOCKET HEAP relink-and-die      bind "root" to the offset of an object
//                                               holding 11, sync; then relink "root" to a
//                                               new object holding 22, free the first,
//                                               allocate 2100 MiB-sized objects (a sync
//                                               of several parts), print "relinked", and
//                                               die of SIGKILL between the sync's parts
//   heap_worker SOCKET HEAP check-relinked      print "value V" of the object "root"
//                                               points to, free it, sync, print the status
//   heap_worker SOCKET HEAP append COUNT        COUNT steps: allocate object I (PowerLossSize),
//                                               fill it with PowerLossStamp words, bind
//                                               "obj-I", unbind and free "obj-(I-2)" when I
//                                               is a multiple of 3, sync; print "step I
//                                               epoch E" after each
//   heap_worker SOCKET HEAP ro-write NAME       read-only: store into NAME's uint64_t
//   heap_worker SOCKET HEAP ro-reopen NAME      read-only: open the heap's descriptor
//                                               again writable (/proc/self/fd) and
//                                               store into NAME's uint64_t through it;
//                                               print "refused ..." or "reopened"
//   heap_worker SOCKET HEAP attach ro|rw        attach, print "ok" or the status
//   heap_worker SOCKET HEAP raw-attach          Attach only; print the fd token,
//                                               hold the session until stdin closes
//   heap_worker SOCKET - redeem TOKEN           present TOKEN on heapd.fd.sock
//   heap_worker SOCKET - attach-snapshot DIR NAME   attach snapshot NAME of DIR ("-":
//                                               heapd's own) read-only in place; print
//                                               "ok N names" or the status
//   heap_worker SOCKET HEAP bind-many COUNT     bind COUNT names ("n-0"...) to new
//                                               objects; print "ok" or "error ... at I"
//   heap_worker SOCKET HEAP produce COUNT       allocate COUNT objects (8 B to 3 MiB),
//                                               stamp them, hand their offsets over in
//                                               the array bound to "handoff", print
//                                               "produced" without syncing them; at
//                                               SIGUSR1 sync, detach, print "detached"
//   heap_worker SOCKET HEAP consume             free every object of "handoff" (checking
//                                               its stamp), unbind and free the array,
//                                               sync; print "consumed N" or the error
//   heap_worker SOCKET HEAP truncate-data       attach read-write, allocate, sync, cut
//                                               the data file it holds to 0 bytes,
//                                               allocate and sync again; print each
//                                               step's status
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "boost/interprocess/offset_ptr.hpp"
#include "client/client_channel.h"
#include "heap/fault_point.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "protocol/default_paths.h"
#include "tests/power_loss_model.h"

namespace heapd {
namespace {

// What a worker leaves in the heap: its objects' offsets.
struct WorkerRecord {
  uint64_t id;
  uint64_t count;
  boost::interprocess::offset_ptr<uint64_t> offsets;
};

uint64_t SizeOf(uint64_t index) {
  if (index % 997 == 0) return (3 << 20) + index;  // a large object now and then
  return 8 + (index * 37) % 2000;
}

uint64_t Stamp(uint64_t id, uint64_t index) { return (id << 40) | index; }

int Fail(const absl::Status& status) {
  std::printf("error %s\n", status.ToString().c_str());
  return 3;
}

std::unique_ptr<Client> ConnectOrDie(const std::string& socket) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) {
    Fail(client.status());
    std::exit(3);
  }
  return *std::move(client);
}

int Alloc(Client& client, const std::string& heap_name, uint64_t id, uint64_t count) {
  AttachOptions options;
  options.create_if_missing = true;
  options.max_size = uint64_t{4} << 30;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<void*> table = (*heap)->allocate(count * sizeof(uint64_t));
  if (!table.ok()) return Fail(table.status());
  uint64_t* offsets = static_cast<uint64_t*>(*table);
  // Two threads allocate halves; the second frees the scratch objects the
  // first made (cross-thread frees in one process).
  std::vector<void*> scratch(count / 2 / 10);
  absl::Status errors[2];
  auto work = [&](int thread) {
    for (uint64_t i = thread; i < count; i += 2) {
      absl::StatusOr<void*> object = (*heap)->allocate(SizeOf(i));
      if (!object.ok()) {
        errors[thread] = object.status();
        return;
      }
      uint64_t* words = static_cast<uint64_t*>(*object);
      words[0] = Stamp(id, i);
      words[SizeOf(i) / 8 - 1] = Stamp(id, i);
      offsets[i] = (*heap)->offset_of(*object);
      if (thread == 0 && i / 2 % 10 == 0 && i / 20 < scratch.size()) {
        absl::StatusOr<void*> extra = (*heap)->allocate(48);
        if (extra.ok()) scratch[i / 20] = *extra;
      }
    }
  };
  std::thread second(work, 1);
  work(0);
  second.join();
  for (const absl::Status& error : errors) {
    if (!error.ok()) return Fail(error);
  }
  std::thread freer([&] {
    for (void* p : scratch) {
      if (p == nullptr) continue;
      if (absl::Status s = (*heap)->deallocate(p); !s.ok()) errors[1] = s;
    }
  });
  freer.join();
  if (!errors[1].ok()) return Fail(errors[1]);
  absl::StatusOr<WorkerRecord*> record = (*heap)->construct<WorkerRecord>(
      "worker-" + std::to_string(id))(WorkerRecord{id, count, offsets});
  if (!record.ok()) return Fail(record.status());
  if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok()) return Fail(epoch.status());
  if (absl::Status s = (*heap)->detach(); !s.ok()) return Fail(s);
  std::printf("ok allocated %llu\n", static_cast<unsigned long long>(count));
  return 0;
}

int Verify(Client& client, const std::string& heap_name, uint64_t id) {
  AttachOptions options;
  options.read_only = true;
  options.prefetch_names = {"worker-" + std::to_string(id)};
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<WorkerRecord*> record =
      (*heap)->find<WorkerRecord>("worker-" + std::to_string(id));
  if (!record.ok()) return Fail(record.status());
  uint64_t checked = 0;
  for (uint64_t i = 0; i < (*record)->count; ++i) {
    const uint64_t offset = (*record)->offsets[i];
    if (offset == 0) continue;  // freed by free-half
    const uint64_t* words = (*heap)->at<uint64_t>(offset);
    if (words[0] != Stamp(id, i) || words[SizeOf(i) / 8 - 1] != Stamp(id, i)) {
      std::printf("error object %llu of worker %llu at %llu is corrupt\n",
                  static_cast<unsigned long long>(i), static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(offset));
      return 3;
    }
    ++checked;
  }
  std::printf("ok verified %llu\n", static_cast<unsigned long long>(checked));
  return 0;
}

int FreeHalf(Client& client, const std::string& heap_name, uint64_t id) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<WorkerRecord*> record =
      (*heap)->find<WorkerRecord>("worker-" + std::to_string(id));
  if (!record.ok()) return Fail(record.status());
  uint64_t freed = 0;
  uint64_t last = 0;
  for (uint64_t i = 0; i < (*record)->count; i += 2) {
    last = (*record)->offsets[i];
    if (absl::Status s = (*heap)->deallocate((*heap)->at(last), SizeOf(i)); !s.ok()) {
      return Fail(s);
    }
    (*record)->offsets[i] = 0;
    ++freed;
  }
  if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok()) return Fail(epoch.status());
  // A double free of another process's object: rejected by the daemon.
  absl::Status again = (*heap)->deallocate((*heap)->at(last));
  if (again.ok()) again = (*heap)->sync().status();
  std::printf("ok freed %llu; double free: %s\n", static_cast<unsigned long long>(freed),
              again.ToString().c_str());
  return 0;
}

std::atomic<bool> sync_requested{false};

int AllocForever(Client& client, const std::string& heap_name, uint64_t id, bool idle = false) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  for (int i = 0; i < 1000; ++i) {
    if (absl::StatusOr<void*> p = (*heap)->allocate(64); !p.ok()) return Fail(p.status());
  }
  absl::StatusOr<uint64_t*> marker = (*heap)->construct<uint64_t>("pre-" + std::to_string(id))(id);
  if (!marker.ok()) return Fail(marker.status());
  if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok()) return Fail(epoch.status());
  std::printf("synced\n");
  std::fflush(stdout);
  // Idle: sync again at each SIGUSR1 (a writer finishing a phase).
  while (idle) {
    if (sync_requested.exchange(false)) {
      if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok())
        return Fail(epoch.status());
      std::printf("synced again\n");
      std::fflush(stdout);
    }
    usleep(1000);
  }
  // About 100 MB of unsynced objects, then wait to be killed, never
  // detaching (unbounded, a fast machine fills the heap in a fraction of a
  // second and starves the other clients of a test).
  for (uint64_t i = 0; i < 50000; ++i) {
    absl::StatusOr<void*> p = (*heap)->allocate(SizeOf(i) % 4096 + 8);
    if (i % 10000 == 0 && p.ok()) p = (*heap)->allocate(5 << 20);  // uncommitted large runs
    if (!p.ok()) return Fail(p.status());
  }
  std::printf("allocated\n");
  std::fflush(stdout);
  for (;;) pause();
}

// Attaches `heap_name` read-only and finds the uint64_t bound to `name`.
absl::StatusOr<std::pair<std::unique_ptr<Heap>, uint64_t*>> FindReadOnly(
    Client& client, const std::string& heap_name, const std::string& name) {
  AttachOptions options;
  options.read_only = true;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return heap.status();
  absl::StatusOr<uint64_t*> object = (*heap)->find<uint64_t>(name);
  if (!object.ok()) return object.status();
  return std::make_pair(*std::move(heap), *object);
}

int ReadOnlyWrite(Client& client, const std::string& heap_name, const std::string& name) {
  auto found = FindReadOnly(client, heap_name, name);
  if (!found.ok()) return Fail(found.status());
  uint64_t* object = found->second;
  std::printf("read %llu; writing\n", static_cast<unsigned long long>(*object));
  std::fflush(stdout);
  *const_cast<volatile uint64_t*>(object) = 0xdead;  // must fault
  std::printf("error the store did not fault\n");
  return 3;
}

int FindDataFd(const std::string& heap_name);

int ReadOnlyReopen(Client& client, const std::string& heap_name, const std::string& name) {
  auto found = FindReadOnly(client, heap_name, name);
  if (!found.ok()) return Fail(found.status());
  const uint64_t offset = found->first->offset_of(found->second);
  const int fd = FindDataFd(heap_name);
  if (fd < 0) {
    std::printf("error no descriptor of the heap found\n");
    return 3;
  }
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int writable = open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (writable < 0) {
    std::printf("refused %s\n", std::strerror(errno));
    return 0;
  }
  const uint64_t value = 0xdead;
  const bool stored = pwrite(writable, &value, sizeof(value), static_cast<off_t>(offset)) ==
                      static_cast<ssize_t>(sizeof(value));
  std::printf("reopened writable%s\n", stored ? ", stored" : "");
  return 3;
}

int Put(Client& client, const std::string& heap_name, const std::string& name, uint64_t value) {
  // Whoever owns the heap (it may be another user's, shared), else a new
  // one of this user's.
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (heap.status().code() == absl::StatusCode::kNotFound) {
    AttachOptions options;
    options.create_if_missing = true;
    heap = client.Attach(heap_name, options);
  }
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<uint64_t*> object = (*heap)->construct<uint64_t>(name)(value);
  if (!object.ok()) return Fail(object.status());
  if (absl::Status s = (*heap)->detach(); !s.ok()) return Fail(s);
  std::printf("ok put\n");
  return 0;
}

// Stores `value` at `object` as the kernel does for a system call: "read"
// (read(2) from a pipe) or "vm-write" (another process's
// process_vm_writev into this one).
absl::Status KernelStore(uint64_t* object, uint64_t value, const std::string& how) {
  if (how == "read") {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return absl::InternalError(std::strerror(errno));
    const bool sent = write(pipe_fds[1], &value, sizeof(value)) == sizeof(value);
    const ssize_t got = read(pipe_fds[0], object, sizeof(value));
    const int err = errno;
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    if (!sent || got != sizeof(value)) {
      return absl::InternalError(absl::StrCat("read(2) into the heap: ", std::strerror(err)));
    }
    return absl::OkStatus();
  }
  if (how == "vm-write") {
    const pid_t parent = getpid();
    const pid_t child = fork();
    if (child < 0) return absl::InternalError(std::strerror(errno));
    if (child == 0) {
      iovec local{&value, sizeof(value)};
      iovec remote{object, sizeof(value)};
      _exit(process_vm_writev(parent, &local, 1, &remote, 1, 0) == sizeof(value) ? 0 : errno);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(
          absl::StrCat("process_vm_writev into the heap: ", std::strerror(WEXITSTATUS(status))));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("no kernel store ", how));
}

// Stores `value` into NAME's uint64_t (after syncing once, so the store
// is the session's first since its last sync), prints "stored" and dies of
// SIGKILL without syncing it (with `kernel_store`, the kernel stores it:
// KernelStore); with `wait`, stays attached instead and at
// each SIGUSR1 stores value + 1 and prints "stored again".
int StoreAndDie(Client& client, const std::string& heap_name, const std::string& name,
                uint64_t value, bool wait = false, bool sync_first = true,
                const std::string& kernel_store = "") {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<uint64_t*> object = (*heap)->find<uint64_t>(name);
  if (!object.ok()) return Fail(object.status());
  if (sync_first) {
    if (absl::StatusOr<uint64_t> synced = (*heap)->sync(); !synced.ok()) {
      return Fail(synced.status());
    }
  }
  if (kernel_store.empty()) {
    **object = value;
  } else if (absl::Status s = KernelStore(*object, value, kernel_store); !s.ok()) {
    return Fail(s);
  }
  std::printf("stored %s\n", (*heap)->content_rollback() ? "tracked" : "untracked");
  if (!kernel_store.empty()) std::printf("read back %llu\n", (unsigned long long)**object);
  std::fflush(stdout);
  while (wait) {
    if (sync_requested.exchange(false)) {
      // The test signals after restarting heapd: wait for the fence first
      // (the tracker's thread applies it when the session's socket ends).
      for (int i = 0; i < 10000 && !(*heap)->fenced(); ++i) usleep(1000);
      if (!(*heap)->fenced()) return Fail(absl::DeadlineExceededError("never fenced"));
      **object = ++value;
      std::printf("stored again\n");
      std::fflush(stdout);
    }
    usleep(1000);
  }
  raise(SIGKILL);
  return 3;
}

int RelinkAndDie(Client& client, const std::string& heap_name) {
  AttachOptions options;
  options.create_if_missing = true;
  options.max_size = uint64_t{4} << 30;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return Fail(heap.status());
  Heap& h = **heap;
  absl::StatusOr<void*> first = h.allocate(sizeof(uint64_t));
  if (!first.ok()) return Fail(first.status());
  *static_cast<uint64_t*>(*first) = 11;
  absl::StatusOr<uint64_t*> root = h.construct<uint64_t>("root")(h.offset_of(*first));
  if (!root.ok()) return Fail(root.status());
  if (absl::StatusOr<uint64_t> synced = h.sync(); !synced.ok()) return Fail(synced.status());
  absl::StatusOr<void*> second = h.allocate(sizeof(uint64_t));
  if (!second.ok()) return Fail(second.status());
  *static_cast<uint64_t*>(*second) = 22;
  **root = h.offset_of(*second);
  if (absl::Status s = h.deallocate(*first, sizeof(uint64_t)); !s.ok()) return Fail(s);
  // Two objects a chunk: 1050 chunks changed, more than one sync message
  // carries.
  for (int i = 0; i < 2100; ++i) {
    if (absl::StatusOr<void*> filler = h.allocate(kMaxSmallSize); !filler.ok()) {
      return Fail(filler.status());
    }
  }
  std::printf("relinked\n");
  std::fflush(stdout);
  SetFaultHandler([](const char* point) {
    if (std::strcmp(point, "client.sync.between_parts") == 0) raise(SIGKILL);
  });
  absl::StatusOr<uint64_t> synced = h.sync();
  std::printf("sync returned: %s\n", synced.status().ToString().c_str());
  return 3;
}

int CheckRelinked(Client& client, const std::string& heap_name) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  Heap& h = **heap;
  absl::StatusOr<uint64_t*> root = h.find<uint64_t>("root");
  if (!root.ok()) return Fail(root.status());
  uint64_t* object = h.at<uint64_t>(**root);
  std::printf("value %llu\n", static_cast<unsigned long long>(*object));
  // Live, as at the last sync: freeing it is no double free.
  absl::Status freed = h.deallocate(object, sizeof(uint64_t));
  if (freed.ok()) freed = h.sync().status();
  std::printf("free %s\n", freed.ToString().c_str());
  return 0;
}

int Append(Client& client, const std::string& heap_name, uint64_t count) {
  AttachOptions options;
  options.create_if_missing = true;
  options.max_size = uint64_t{1} << 30;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return Fail(heap.status());
  Heap& h = **heap;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t size = PowerLossSize(i);
    absl::StatusOr<void*> object = h.allocate(size);
    if (!object.ok()) return Fail(object.status());
    auto* words = static_cast<uint64_t*>(*object);
    for (uint64_t k = 0; k < size / 8; ++k) words[k] = PowerLossStamp(i, k);
    if (absl::Status s = h.Bind(absl::StrCat("obj-", i), *object, size, "words"); !s.ok()) {
      return Fail(s);
    }
    if (i >= 2 && i % 3 == 0) {
      const std::string old = absl::StrCat("obj-", i - 2);
      absl::StatusOr<void*> found = h.Find(old, "words", PowerLossSize(i - 2));
      if (!found.ok()) return Fail(found.status());
      if (absl::Status s = h.Unbind(old); !s.ok()) return Fail(s);
      if (absl::Status s = h.deallocate(*found, PowerLossSize(i - 2)); !s.ok()) return Fail(s);
    }
    absl::StatusOr<uint64_t> epoch = h.sync();
    if (!epoch.ok()) return Fail(epoch.status());
    std::printf("step %llu epoch %llu\n", static_cast<unsigned long long>(i),
                static_cast<unsigned long long>(*epoch));
    std::fflush(stdout);
  }
  if (absl::Status s = h.detach(); !s.ok()) return Fail(s);
  std::printf("ok appended\n");
  return 0;
}

int Get(Client& client, const std::string& heap_name, const std::string& name) {
  auto found = FindReadOnly(client, heap_name, name);
  if (!found.ok()) return Fail(found.status());
  std::printf("value %llu\n", static_cast<unsigned long long>(*found->second));
  return 0;
}

int Attach(Client& client, const std::string& heap_name, bool read_only) {
  AttachOptions options;
  options.read_only = read_only;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name, options);
  if (!heap.ok()) return Fail(heap.status());
  std::printf("ok attached session %llu\n", static_cast<unsigned long long>((*heap)->session()));
  return 0;
}

int RawAttach(Client& client, const std::string& heap_name) {
  v1::AttachRequest request;
  request.set_heap(heap_name);
  v1::AttachResponse response;
  grpc::ClientContext context;
  if (absl::Status s = FromGrpc(StubOf(client).Attach(&context, request, &response)); !s.ok()) {
    return Fail(s);
  }
  std::printf("token %s session %llu\n", response.fd_token().c_str(),
              static_cast<unsigned long long>(response.session()));
  std::fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  return 0;
}

int Redeem(const std::string& socket, const std::string& token) {
  const std::string path = FdSocketBeside(socket);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    std::printf("error connect %s\n", path.c_str());
    return 3;
  }
  (void)!write(fd, token.data(), token.size());
  char reply[512] = {};
  const ssize_t n = read(fd, reply, sizeof(reply) - 1);
  if (n > 0 && reply[0] == 'K') {
    std::printf("ok got an fd\n");
    return 0;
  }
  std::printf("refused: %s\n", n > 0 ? reply + 1 : "(closed)");
  return 4;
}

// Objects one process hands to another through the heap.
struct Handoff {
  uint64_t count;
  boost::interprocess::offset_ptr<uint64_t> offsets;
  boost::interprocess::offset_ptr<uint64_t> sizes;
};

uint64_t HandoffSize(uint64_t index) {
  if (index % 50 == 0) return (1 << 20) + 1 + index % (2 << 20);  // large: over 1 MiB
  return 8 + (index * 131) % 4096;
}

int Produce(Client& client, const std::string& heap_name, uint64_t count) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<void*> offsets = (*heap)->allocate(count * sizeof(uint64_t));
  absl::StatusOr<void*> sizes = (*heap)->allocate(count * sizeof(uint64_t));
  if (!offsets.ok() || !sizes.ok()) return Fail(offsets.ok() ? sizes.status() : offsets.status());
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<void*> object = (*heap)->allocate(HandoffSize(i));
    if (!object.ok()) return Fail(object.status());
    *static_cast<uint64_t*>(*object) = Stamp(99, i);
    static_cast<uint64_t*>(*offsets)[i] = (*heap)->offset_of(*object);
    static_cast<uint64_t*>(*sizes)[i] = HandoffSize(i);
  }
  // Binding the hand-off makes it (and only it) known; the objects are not
  // synced: the consumer frees them before their allocator's next sync.
  absl::StatusOr<Handoff*> handoff = (*heap)->construct<Handoff>("handoff")(
      Handoff{count, static_cast<uint64_t*>(*offsets), static_cast<uint64_t*>(*sizes)});
  if (!handoff.ok()) return Fail(handoff.status());
  std::printf("produced\n");
  std::fflush(stdout);
  while (!sync_requested.exchange(false)) usleep(1000);
  if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok()) return Fail(epoch.status());
  if (absl::Status s = (*heap)->detach(); !s.ok()) return Fail(s);
  std::printf("detached\n");
  return 0;
}

int Consume(Client& client, const std::string& heap_name) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  absl::StatusOr<Handoff*> handoff = (*heap)->find<Handoff>("handoff");
  if (!handoff.ok()) return Fail(handoff.status());
  const uint64_t count = (*handoff)->count;
  for (uint64_t i = 0; i < count; ++i) {
    void* object = (*heap)->at((*handoff)->offsets[i]);
    if (*static_cast<uint64_t*>(object) != Stamp(99, i)) {
      std::printf("error object %llu does not hold its stamp\n",
                  static_cast<unsigned long long>(i));
      return 3;
    }
    if (absl::Status s = (*heap)->deallocate(object, (*handoff)->sizes[i]); !s.ok()) {
      return Fail(s);
    }
  }
  void* offsets = (*handoff)->offsets.get();
  void* sizes = (*handoff)->sizes.get();
  if (absl::Status s = (*heap)->destroy<Handoff>("handoff"); !s.ok()) return Fail(s);
  if (absl::Status s = (*heap)->deallocate(offsets); !s.ok()) return Fail(s);
  if (absl::Status s = (*heap)->deallocate(sizes); !s.ok()) return Fail(s);
  if (absl::StatusOr<uint64_t> epoch = (*heap)->sync(); !epoch.ok()) return Fail(epoch.status());
  if (absl::Status s = (*heap)->detach(); !s.ok()) return Fail(s);
  std::printf("consumed %llu\n", static_cast<unsigned long long>(count));
  return 0;
}

int AttachSnapshot(Client& client, const std::string& dir, const std::string& name) {
  AttachOptions options;
  options.read_only = true;
  options.snapshot = name;
  options.snapshot_dir = dir == "-" ? "" : dir;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach("", options);
  if (!heap.ok()) return Fail(heap.status());
  std::printf("ok attached\n");
  return 0;
}

int BindMany(Client& client, const std::string& heap_name, uint64_t count) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<uint64_t*> object = (*heap)->construct<uint64_t>("n-" + std::to_string(i))(i);
    if (!object.ok()) {
      std::printf("error %s at %llu\n", object.status().ToString().c_str(),
                  static_cast<unsigned long long>(i));
      return 3;
    }
  }
  std::printf("ok\n");
  return 0;
}

// The descriptor of the heap's data file this process holds (the client
// keeps it private; a hostile client finds it anyway).
int FindDataFd(const std::string& heap_name) {
  for (int fd = 3; fd < 1024; ++fd) {
    char link[512] = {};
    const std::string proc = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = readlink(proc.c_str(), link, sizeof(link) - 1);
    // The data file, or a working image (memory, docs/consistency.md).
    const std::string target(link);
    if (n > 0 && (target.find("/heaps/" + heap_name + "/data") != std::string::npos ||
                  target.find("memfd:heapd-working-image") != std::string::npos)) {
      return fd;
    }
  }
  return -1;
}

int TruncateData(Client& client, const std::string& heap_name) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(heap_name);
  if (!heap.ok()) return Fail(heap.status());
  for (int i = 0; i < 1000; ++i) {
    if (absl::StatusOr<void*> p = (*heap)->allocate(64); !p.ok()) return Fail(p.status());
  }
  std::printf("sync before: %s\n", (*heap)->sync().status().ToString().c_str());
  const int fd = FindDataFd(heap_name);
  if (fd < 0 || ftruncate(fd, 0) != 0) {
    std::printf("error could not truncate the data file\n");
    return 3;
  }
  std::printf("truncated\n");
  std::fflush(stdout);
  // Stores into the truncated mapping would fault (SIGBUS): this client
  // only asks heapd for more.
  absl::StatusOr<void*> large = (*heap)->allocate(3 << 20);
  std::printf("allocate after: %s\n", large.status().ToString().c_str());
  std::printf("sync after: %s\n", (*heap)->sync().status().ToString().c_str());
  std::fflush(stdout);
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: heap_worker SOCKET HEAP MODE [ARGS]\n");
    return 2;
  }
  const std::string socket = argv[1];
  const std::string heap = argv[2];
  const std::string mode = argv[3];
  const std::string arg = argc > 4 ? argv[4] : "";
  uint64_t id = 0;
  (void)absl::SimpleAtoi(arg, &id);
  if (mode == "redeem") return Redeem(socket, arg);
  std::unique_ptr<Client> client = ConnectOrDie(socket);
  if (mode == "attach-snapshot") {
    if (argc < 6) return 2;
    return AttachSnapshot(*client, arg, argv[5]);
  }
  if (mode == "bind-many") return BindMany(*client, heap, id);
  if (mode == "produce") {
    signal(SIGUSR1, [](int) { sync_requested = true; });
    return Produce(*client, heap, id);
  }
  if (mode == "consume") return Consume(*client, heap);
  if (mode == "truncate-data") return TruncateData(*client, heap);
  if (mode == "alloc") {
    uint64_t count = 0;
    if (argc < 6 || !absl::SimpleAtoi(argv[5], &count)) return 2;
    return Alloc(*client, heap, id, count);
  }
  if (mode == "verify") return Verify(*client, heap, id);
  if (mode == "free-half") return FreeHalf(*client, heap, id);
  if (mode == "alloc-forever") return AllocForever(*client, heap, id);
  if (mode == "hold") {
    signal(SIGUSR1, [](int) { sync_requested = true; });
    return AllocForever(*client, heap, id, /*idle=*/true);
  }
  if (mode == "ro-write") return ReadOnlyWrite(*client, heap, arg);
  if (mode == "ro-reopen") return ReadOnlyReopen(*client, heap, arg);
  if (mode == "put") {
    uint64_t value = 0;
    if (argc < 6 || !absl::SimpleAtoi(argv[5], &value)) return 2;
    return Put(*client, heap, arg, value);
  }
  if (mode == "get") return Get(*client, heap, arg);
  if (mode == "relink-and-die") return RelinkAndDie(*client, heap);
  if (mode == "append") return Append(*client, heap, id);
  if (mode == "check-relinked") return CheckRelinked(*client, heap);
  if (mode == "store-and-die" || mode == "scribble-and-die") {
    uint64_t value = 0;
    if (argc < 6 || !absl::SimpleAtoi(argv[5], &value)) return 2;
    return StoreAndDie(*client, heap, arg, value, /*wait=*/false,
                       /*sync_first=*/mode == "store-and-die");
  }
  if (mode == "kernel-store-and-die") {
    uint64_t value = 0;
    if (argc < 7 || !absl::SimpleAtoi(argv[5], &value)) return 2;
    return StoreAndDie(*client, heap, arg, value, /*wait=*/false, /*sync_first=*/true, argv[6]);
  }
  if (mode == "store-and-wait") {
    uint64_t value = 0;
    if (argc < 6 || !absl::SimpleAtoi(argv[5], &value)) return 2;
    signal(SIGUSR1, [](int) { sync_requested = true; });
    return StoreAndDie(*client, heap, arg, value, /*wait=*/true);
  }
  if (mode == "attach") return Attach(*client, heap, arg == "ro");
  if (mode == "raw-attach") return RawAttach(*client, heap);
  return 2;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) { return heapd::Main(argc, argv); }
