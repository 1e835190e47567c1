// B8: what content rollback costs a program that updates a
// fraction of a big heap between syncs.
//
// A heap of --heap_mib MiB of --object_bytes objects (default 1 GiB of
// 4 KiB objects, each one page) is built and synced; then --rounds times:
// --update_fraction of the objects (default 10%, chosen at random) each get
// one --write_bytes (64) write at a random aligned place, and the heap is
// synced. Since every object is one page, 10% of the objects is 10% of the
// heap's pages. The same runs against a heapd started with
// --track_contents=false (the baseline) and one with tracking, each with
// its own heapd on /dev/shm, in every rep, alternating which goes first.
//
//   update_bench --heapd=PATH [--reps=3] [--rounds=8]
//
// Per round: ms of the update phase (where the write-protect faults land:
// the pre-image is taken before the store goes on), ms of the sync (which
// re-protects the pages written and commits the journal), the pages the
// updates dirtied, the pre-images the client appended to its undo journal
// (from the journal's size), and µs per dirty page ((update + sync) / pages).
// Prints medians over all rounds of all reps, both configurations side by
// side, and each rep's median. With --state_parent on a file system, each
// rep also measures the device's sequential write bandwidth there (dd,
// oflag=direct, into a file written through before, then fdatasync), and
// the sync's bandwidth (dirty pages x 4 KiB over the sync's time) is shown
// against it.
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/heapd_process.h"
#include "client/client_channel.h"
#include "client/journal_appender.h"
#include "heap/undo_record.h"
#include "heapd/client.h"
#include "heapd/heap.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "the heapd binary");
ABSL_FLAG(int, reps, 3, "runs of each configuration (a new heapd and heap each)");
ABSL_FLAG(int, rounds, 8, "update+sync rounds per run");
ABSL_FLAG(int64_t, heap_mib, 1024, "bytes of objects in the heap, MiB");
ABSL_FLAG(int64_t, object_bytes, 4096, "size of each object");
ABSL_FLAG(double, update_fraction, 0.1, "fraction of the objects updated per round");
ABSL_FLAG(int64_t, write_bytes, 64, "bytes of each update (aligned to its size in the object)");
ABSL_FLAG(std::string, track_contents, "both", "both, true or false");
ABSL_FLAG(std::string, state_parent, "/dev/shm",
          "where the heapds keep their heaps: tmpfs, or a file system's directory (tracking "
          "then gives a working image, --track_contents=false a heap mapped from its file)");
ABSL_FLAG(bool, sequential, false,
          "update a contiguous run of the objects in address order (an in-place sweep "
          "through an array) instead of objects chosen at random");
ABSL_FLAG(int, updater_cpu, -1,
          "bind the thread that makes the updates to this CPU once the heap is attached, as "
          "srun --cpu-bind=cores or mpirun --bind-to core binds a rank (-1: not bound)");
ABSL_FLAG(bool, print_rounds, true, "print every round's figures as it ends");
ABSL_FLAG(bool, components, true,
          "also time, alone in this process, the steps a dirty page costs (write-protect "
          "fault round trip, pre-image encoding, journal append, page lock, re-protection, "
          "heapd's read and check of a record)");

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "update_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

[[noreturn]] void DieErrno(const std::string& what) {
  Die(what, absl::InternalError(std::strerror(errno)));
}

template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(what, value.status());
  return *std::move(value);
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Where a session's undo journal's first record is: after its control
// page, if it has one.
uint64_t JournalRecordsStart(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  uint32_t magic = 0;
  const bool control = fd >= 0 && pread(fd, &magic, sizeof(magic), 0) == sizeof(magic) &&
                       magic == kJournalControlMagic;
  if (fd >= 0) close(fd);
  return control ? kJournalControlBytes : 0;
}

// Where the records of a session's undo journal end, reading on from
// `from` (a record's start).
uint64_t JournalRecordsEnd(const std::string& path, uint64_t from) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return from;
  std::string record(kUndoImageRecordBytes, '\0');
  for (;;) {
    const ssize_t n = pread(fd, record.data(), record.size(), static_cast<off_t>(from));
    if (n <= 0) break;
    auto decoded = DecodeUndoRecord(absl::string_view(record.data(), n), from);
    if (!decoded.ok() || !decoded->has_value()) break;
    from += (*decoded)->size;
  }
  close(fd);
  return from;
}

// Figures of one configuration: name -> one value per round (or per run).
struct Figures {
  std::map<std::string, std::vector<double>> rounds;       // all reps
  std::map<std::string, std::vector<double>> rep_medians;  // one per rep
  void AddRep(const std::map<std::string, std::vector<double>>& rep) {
    for (const auto& [name, values] : rep) {
      rounds[name].insert(rounds[name].end(), values.begin(), values.end());
      rep_medians[name].push_back(Median(values));
    }
  }
};

// One run: a new heapd (tracking or not), the heap built, --rounds rounds.
// The device's sequential write bandwidth under `dir`, MB/s: dd of `mib`
// MiB in 2 MiB direct writes into a file written through before (no block
// allocation timed), ending with fdatasync. 0 if dd failed.
double DdWriteMBps(const std::string& dir, int mib) {
  const std::string file = dir + "/update_bench.dd";
  const std::string dd = absl::StrCat("dd if=/dev/zero of=", file, " bs=2M count=", mib / 2,
                                      " oflag=direct conv=notrunc,fdatasync status=none");
  if (std::system(dd.c_str()) != 0) return 0;
  const Clock::time_point start = Clock::now();
  const bool ok = std::system(dd.c_str()) == 0;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  unlink(file.c_str());
  return ok ? (uint64_t{static_cast<uint64_t>(mib)} << 20) / seconds / 1e6 : 0;
}

bool OnTmpfs(const std::string& dir) {
  struct statfs fs;
  return statfs(dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

std::map<std::string, std::vector<double>> Run(bool tracked, int rep, uint64_t seed) {
  const uint64_t object_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_object_bytes));
  const uint64_t write_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_write_bytes));
  const uint64_t objects =
      (static_cast<uint64_t>(absl::GetFlag(FLAGS_heap_mib)) << 20) / object_bytes;
  const uint64_t updates = static_cast<uint64_t>(
      std::llround(absl::GetFlag(FLAGS_update_fraction) * static_cast<double>(objects)));
  const uint64_t slots = object_bytes / write_bytes;  // places of a write in an object
  if (slots == 0 || updates == 0 || updates > objects) {
    Die("flags", absl::InvalidArgumentError("no updates, or writes larger than the objects"));
  }
  std::map<std::string, std::vector<double>> out;

  std::unique_ptr<HeapdProcess> daemon =
      Check(HeapdProcess::Start(absl::GetFlag(FLAGS_heapd),
                                {tracked ? "--track_contents=true" : "--track_contents=false"},
                                /*huge_pages=*/false, absl::GetFlag(FLAGS_state_parent)),
            "start heapd");
  AttachOptions create;
  create.create_if_missing = true;
  create.max_size = std::max<uint64_t>(uint64_t{4} << 30, objects * object_bytes * 2);
  std::unique_ptr<Heap> heap = Check(daemon->client().Attach("b8", create), "attach b8");
  if (heap->content_rollback() != tracked) {
    Die("b8", absl::FailedPreconditionError(absl::StrCat("expected content_rollback() ", tracked,
                                                         ", got ", heap->content_rollback(), ": ",
                                                         heap->content_rollback_note())));
  }

  // Build: every object allocated and written whole (fresh memory: no
  // pre-images), then the first sync.
  std::vector<char*> object(objects);
  const Clock::time_point b0 = Clock::now();
  for (uint64_t i = 0; i < objects; ++i) {
    object[i] = static_cast<char*>(Check(heap->allocate(object_bytes), "allocate"));
    std::memset(object[i], static_cast<int>(i & 0xff), object_bytes);
  }
  const Clock::time_point b1 = Clock::now();
  Check(heap->sync(), "first sync");
  const Clock::time_point b2 = Clock::now();
  out["build s (allocate + fill)"].push_back(Ms(b1 - b0) / 1e3);
  out["first sync ms"].push_back(Ms(b2 - b1));

  const std::string journal =
      absl::StrCat(daemon->state_dir(), "/heaps/b8/undo/session-", heap->session(), ".undo");
  if (tracked && FileSize(journal) < 0) {
    Die("b8", absl::NotFoundError(absl::StrCat("no undo journal at ", journal)));
  }
  // Fresh memory needs no pre-images: 0 expected.
  const uint64_t journal_start = tracked ? JournalRecordsStart(journal) : 0;
  uint64_t journal_end = tracked ? JournalRecordsEnd(journal, journal_start) : 0;
  out["pre-images while building"].push_back(static_cast<double>(journal_end - journal_start) /
                                             kUndoImageRecordBytes);

  // Bound after heapd started and the heap was attached: the tracker
  // follows the thread there (client/tracker_placement.h).
  cpu_set_t unbound;
  CPU_ZERO(&unbound);
  if (sched_getaffinity(0, sizeof(unbound), &unbound) != 0) DieErrno("sched_getaffinity");
  if (const int cpu = absl::GetFlag(FLAGS_updater_cpu); cpu >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) DieErrno("sched_setaffinity");
  }

  std::mt19937_64 rng(seed);
  std::vector<uint32_t> pick(objects);
  for (uint64_t i = 0; i < objects; ++i) pick[i] = static_cast<uint32_t>(i);
  std::vector<char> source(1 << 20);
  for (char& c : source) c = static_cast<char>(rng());
  std::vector<std::pair<char*, const char*>> writes(updates);  // (to, from)
  std::vector<uintptr_t> pages;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    // The round's writes, chosen before the clock starts: a random
    // `updates`-subset of the objects (partial Fisher-Yates), a random
    // aligned place in each, random bytes.
    pages.clear();
    const uint64_t run_start =
        absl::GetFlag(FLAGS_sequential) ? rng() % (objects - updates + 1) : 0;
    for (uint64_t k = 0; k < updates; ++k) {
      if (absl::GetFlag(FLAGS_sequential)) {
        pick[k] = static_cast<uint32_t>(run_start + k);
      } else {
        std::swap(pick[k], pick[k + rng() % (objects - k)]);
      }
      char* to = object[pick[k]] + (rng() % slots) * write_bytes;
      writes[k] = {to, source.data() + (rng() % (source.size() / write_bytes)) * write_bytes};
      pages.push_back(reinterpret_cast<uintptr_t>(to) / kUndoPageBytes);
      pages.push_back((reinterpret_cast<uintptr_t>(to) + write_bytes - 1) / kUndoPageBytes);
    }
    if (absl::GetFlag(FLAGS_sequential)) std::sort(writes.begin(), writes.end());
    std::sort(pages.begin(), pages.end());
    const double dirty =
        static_cast<double>(std::unique(pages.begin(), pages.end()) - pages.begin());

    const uint64_t journal_before = journal_end;
    const Clock::time_point t0 = Clock::now();
    for (const auto& [to, from] : writes) std::memcpy(to, from, write_bytes);
    const Clock::time_point t1 = Clock::now();
    // Before the sync, which punches out the records it makes void; off
    // the clock.
    const uint64_t journal_after = journal_end =
        tracked ? JournalRecordsEnd(journal, journal_end) : 0;
    const Clock::time_point t1_sync = Clock::now();
    Check(heap->sync(), "sync");
    const Clock::time_point t2 = Clock::now();
    for (const auto& [to, from] : writes) {  // distinct objects: each write is still there
      if (std::memcmp(to, from, write_bytes) != 0) {
        Die("b8", absl::DataLossError("an update is not in the heap after the sync"));
      }
    }
    const double update_ms = Ms(t1 - t0), sync_ms = Ms(t2 - t1_sync);
    out["update phase ms"].push_back(update_ms);
    out["sync ms"].push_back(sync_ms);
    out["update + sync ms"].push_back(update_ms + sync_ms);
    out["pages dirtied"].push_back(dirty);
    out["pre-images journaled"].push_back(static_cast<double>(journal_after - journal_before) /
                                          kUndoImageRecordBytes);
    out["us per dirty page: update"].push_back(update_ms * 1e3 / dirty);
    out["us per dirty page: sync"].push_back(sync_ms * 1e3 / dirty);
    out["us per dirty page: update + sync"].push_back((update_ms + sync_ms) * 1e3 / dirty);
    out["sync MB/s (dirty pages / sync)"].push_back(dirty * 4096 / (sync_ms * 1e3));
    if (absl::GetFlag(FLAGS_print_rounds)) {
      std::printf(
          "  rep %d %-9s round %d: update %8.3f ms, sync %8.3f ms, %6.0f pages dirtied, "
          "%6.0f pre-images, %7.3f us per dirty page\n",
          rep + 1, tracked ? "tracking" : "untracked", round + 1, update_ms, sync_ms, dirty,
          out["pre-images journaled"].back(), (update_ms + sync_ms) * 1e3 / dirty);
      std::fflush(stdout);
    }
  }
  if (sched_setaffinity(0, sizeof(unbound), &unbound) != 0) DieErrno("sched_setaffinity");
  v1::HeapStats stats = Check(StatHeap(daemon->client(), "b8"), "stat");
  if (stats.undo_bad_journals() != 0) {
    Die("b8", absl::DataLossError(absl::StrCat(stats.undo_bad_journals(),
                                               " undo journals stopped being read (heapd's log)")));
  }
  const Clock::time_point d0 = Clock::now();
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
  out["detach ms"].push_back(Ms(Clock::now() - d0));
  heap.reset();
  return out;
}

// ---- The steps of a dirty page, each timed alone on a /dev/shm file of
// kComponentPages pages mapped shared, as the client maps a heap. The
// client's tracker does per fault: enter the journal's guard, encode the
// pre-image (copy 4 KiB + XXH3), append it (write()), leave the guard,
// UFFDIO_WRITEPROTECT off (which wakes the faulting thread, whose store
// then takes a minor fault); 0.4's tracker took an OFD lock instead of the
// guard and checked with CRC-32. The sync does one
// UFFDIO_WRITEPROTECT on per page (ranges merged when adjacent); heapd
// reads and checks each record at the sync.
constexpr uint64_t kComponentPages = 8192;  // 32 MiB

void Protect(int uffd, char* page, bool on) {
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uint64_t>(page), kUndoPageBytes};
  wp.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
  if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) != 0) DieErrno("UFFDIO_WRITEPROTECT");
}

// A handler thread that only lifts the protection of each faulting page
// (no pre-image), until `stop`.
void LiftProtectionAtFaults(int uffd, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    pollfd polled = {uffd, POLLIN, 0};
    if (poll(&polled, 1, 10) <= 0) continue;
    uffd_msg messages[16];
    const ssize_t got = read(uffd, messages, sizeof(messages));
    for (ssize_t i = 0; i < got / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
      const uint64_t at = messages[i].arg.pagefault.address & ~(kUndoPageBytes - 1);
      Protect(uffd, reinterpret_cast<char*>(at), false);
    }
  }
}

void Components(std::vector<std::pair<std::string, double>>* out) {
  const uint64_t bytes = kComponentPages * kUndoPageBytes;
  char path[] = "/dev/shm/heapd-b8-components-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) DieErrno("mkstemp");
  unlink(path);
  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) DieErrno("fallocate");
  char* base = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (base == MAP_FAILED) DieErrno("mmap");
  std::memset(base, 7, bytes);
  int uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (uffd < 0 && errno == EPERM) {
    uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  }
  if (uffd < 0) DieErrno("userfaultfd");
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
  if (ioctl(uffd, UFFDIO_API, &api) != 0) DieErrno("UFFDIO_API");
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uint64_t>(base), bytes};
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) DieErrno("UFFDIO_REGISTER");

  std::mt19937_64 rng(7);
  std::vector<char*> pages(kComponentPages);
  for (uint64_t i = 0; i < kComponentPages; ++i) pages[i] = base + i * kUndoPageBytes;
  std::shuffle(pages.begin(), pages.end(), rng);
  const double n = static_cast<double>(kComponentPages);
  auto per_page_us = [&](Clock::time_point t0) { return Ms(Clock::now() - t0) * 1e3 / n; };

  // Re-protection, one page at a time in random order (as BeginSync does
  // for scattered pages), and lifting it (as Capture does).
  Clock::time_point t0 = Clock::now();
  for (char* p : pages) Protect(uffd, p, true);
  out->emplace_back("re-protect one page (ioctl WP on)", per_page_us(t0));
  t0 = Clock::now();
  for (char* p : pages) Protect(uffd, p, false);
  out->emplace_back("unprotect one page (ioctl WP off)", per_page_us(t0));

  // The fault round trip: a store to a protected page, a handler thread
  // that only lifts the protection (no pre-image).
  for (char* p : pages) Protect(uffd, p, true);
  std::atomic<bool> stop{false};
  std::thread handler([&] { LiftProtectionAtFaults(uffd, stop); });
  t0 = Clock::now();
  for (char* p : pages) *reinterpret_cast<volatile char*>(p + 64) = 1;
  out->emplace_back("write-protect fault round trip (no pre-image)", per_page_us(t0));
  stop = true;
  handler.join();

  // The same with the handler bound to the storing thread's CPU (what the
  // tracker does for a thread bound to one: tracker_placement.h).
  for (char* p : pages) Protect(uffd, p, true);
  stop = false;
  const int cpu = sched_getcpu();
  cpu_set_t unbound, one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_getaffinity(0, sizeof(unbound), &unbound) != 0) DieErrno("sched_getaffinity");
  if (sched_setaffinity(0, sizeof(one), &one) != 0) DieErrno("sched_setaffinity");
  std::thread colocated([&] { LiftProtectionAtFaults(uffd, stop); });  // inherits the CPU
  t0 = Clock::now();
  for (char* p : pages) *reinterpret_cast<volatile char*>(p + 128) = 1;
  out->emplace_back("the same, handler on the storing thread's CPU", per_page_us(t0));
  stop = true;
  colocated.join();
  if (sched_setaffinity(0, sizeof(unbound), &unbound) != 0) DieErrno("sched_setaffinity");

  // A store to a page whose protection was just lifted: lifting leaves the
  // page read-only until a store faults it writable (a minor fault).
  for (char* p : pages) Protect(uffd, p, true);
  for (char* p : pages) Protect(uffd, p, false);
  t0 = Clock::now();
  for (char* p : pages) *reinterpret_cast<volatile char*>(p + 192) = 1;
  out->emplace_back("first store after the protection is lifted (minor fault)", per_page_us(t0));

  // The pre-image: lock, encode, append, unlock.
  char journal_path[] = "/dev/shm/heapd-b8-journal-XXXXXX";
  const int journal_tmp = mkstemp(journal_path);
  if (journal_tmp < 0) DieErrno("mkstemp");
  close(journal_tmp);
  const int journal = open(journal_path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (journal < 0) DieErrno("open journal");
  std::string record(kUndoImageRecordBytes, '\0');
  UndoRecordHeader header;
  header.kind = static_cast<uint32_t>(UndoKind::kPreImage);
  auto lock = [&](char* p, short type) {
    struct flock l {};
    l.l_type = type;
    l.l_whence = SEEK_SET;
    l.l_start = p - base;
    l.l_len = 1;
    if (fcntl(fd, F_OFD_SETLKW, &l) != 0) DieErrno("F_OFD_SETLKW");
  };
  t0 = Clock::now();
  for (char* p : pages) {
    header.page = static_cast<uint64_t>(p - base);
    EncodeUndoRecordInto(header, p, record.data());
  }
  out->emplace_back("encode a pre-image (4 KiB copy + XXH3)", per_page_us(t0));
  header.magic = kUndoMagicCrc32;
  t0 = Clock::now();
  for (char* p : pages) {
    header.page = static_cast<uint64_t>(p - base);
    EncodeUndoRecordInto(header, p, record.data());
  }
  out->emplace_back("the same checked with CRC-32 (0.4)", per_page_us(t0));
  header.magic = kUndoMagic;

  // Appended as the tracker does (journal_appender.h: one write()).
  {
    char appended_path[] = "/dev/shm/heapd-b8-appended-XXXXXX";
    const int appended_fd = mkstemp(appended_path);
    if (appended_fd < 0) DieErrno("mkstemp");
    unlink(appended_path);
    JournalAppender appender(UniqueFd(appended_fd), /*heapd_revision_2=*/true);
    t0 = Clock::now();
    for (char* p : pages) {
      header.page = static_cast<uint64_t>(p - base);
      if (!appender.Append(header, p).ok()) Die("components", absl::InternalError("append"));
    }
    out->emplace_back("encode + append it to a tmpfs journal (write)", per_page_us(t0));
  }
  t0 = Clock::now();
  for (char* p : pages) {
    if (write(journal, record.data(), record.size()) != static_cast<ssize_t>(record.size())) {
      DieErrno("write journal");
    }
    (void)p;
  }
  out->emplace_back("append an encoded record (write)", per_page_us(t0));
  t0 = Clock::now();
  for (char* p : pages) {
    lock(p, F_RDLCK);
    lock(p, F_UNLCK);
  }
  out->emplace_back("OFD lock + unlock of the page's byte (0.4)", per_page_us(t0));

  // heapd at the sync: read each record back and check it.
  const int reader = open(journal_path, O_RDONLY | O_CLOEXEC);
  if (reader < 0) DieErrno("open journal");
  t0 = Clock::now();
  for (uint64_t i = 0; i < kComponentPages; ++i) {
    const uint64_t at = i * kUndoImageRecordBytes;
    if (pread(reader, record.data(), record.size(), static_cast<off_t>(at)) !=
        static_cast<ssize_t>(record.size())) {
      DieErrno("pread journal");
    }
    if (!DecodeUndoRecord(record, at).ok()) Die("components", absl::DataLossError("decode"));
  }
  out->emplace_back("heapd: read + check a record (pread, XXH3)", per_page_us(t0));
  close(reader);
  close(journal);
  unlink(journal_path);
  close(uffd);
  munmap(base, bytes);
  close(fd);
}

int Main() {
  const std::string mode = absl::GetFlag(FLAGS_track_contents);
  if (mode != "both" && mode != "true" && mode != "false") {
    std::fprintf(stderr, "--track_contents: both, true or false\n");
    return 1;
  }
  std::vector<bool> configurations;
  if (mode != "true") configurations.push_back(false);
  if (mode != "false") configurations.push_back(true);
  std::map<bool, Figures> figures;
  std::vector<std::string> order;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    std::vector<bool> now = configurations;
    if (rep % 2 == 1) std::reverse(now.begin(), now.end());
    for (bool tracked : now) {
      std::map<std::string, std::vector<double>> run = Run(tracked, rep, 2026 + rep);
      const std::string parent = absl::GetFlag(FLAGS_state_parent);
      if (!OnTmpfs(parent)) run["device write MB/s (dd)"].push_back(DdWriteMBps(parent, 1024));
      if (order.empty()) {
        for (const char* name :
             {"build s (allocate + fill)", "pre-images while building", "first sync ms",
              "update phase ms", "sync ms", "update + sync ms", "pages dirtied",
              "pre-images journaled", "us per dirty page: update", "us per dirty page: sync",
              "us per dirty page: update + sync", "detach ms", "sync MB/s (dirty pages / sync)",
              "device write MB/s (dd)"}) {
          order.push_back(name);
        }
      }
      figures[tracked].AddRep(run);
      std::fprintf(stderr, "rep %d %s done\n", rep + 1,
                   tracked ? "tracking" : "--track_contents=false");
    }
  }
  const uint64_t object_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_object_bytes));
  const uint64_t objects =
      (static_cast<uint64_t>(absl::GetFlag(FLAGS_heap_mib)) << 20) / object_bytes;
  std::printf(
      "B8: %llu objects of %llu B (%lld MiB), %.0f%% of them updated per round with one "
      "%lld-byte write each, %d rounds x %d reps; medians over all rounds\n",
      static_cast<unsigned long long>(objects), static_cast<unsigned long long>(object_bytes),
      static_cast<long long>(absl::GetFlag(FLAGS_heap_mib)),
      absl::GetFlag(FLAGS_update_fraction) * 100,
      static_cast<long long>(absl::GetFlag(FLAGS_write_bytes)), absl::GetFlag(FLAGS_rounds),
      absl::GetFlag(FLAGS_reps));
  const bool both = figures.size() == 2;
  std::printf("%-34s %16s %16s %10s\n", "figure", "no tracking", "tracking", both ? "ratio" : "");
  auto cell = [&](bool tracked, const std::string& name) -> double {
    auto it = figures.find(tracked);
    if (it == figures.end()) return NAN;
    return Median(it->second.rounds[name]);
  };
  for (const std::string& name : order) {
    const double off = cell(false, name), on = cell(true, name);
    std::printf("%-34s %16.3f %16.3f", name.c_str(), off, on);
    if (both && off != 0) std::printf(" %10.2f", on / off);
    std::printf("\n");
  }
  const double dd_on = cell(true, "device write MB/s (dd)");
  if (dd_on > 0) {
    std::printf(
        "%-34s %16.3f %16.3f\n", "sync MB/s over dd's",
        cell(false, "sync MB/s (dirty pages / sync)") / cell(false, "device write MB/s (dd)"),
        cell(true, "sync MB/s (dirty pages / sync)") / dd_on);
  }
  if (both) {
    const double pages = cell(true, "pages dirtied");
    std::printf("%-34s %16s %16.3f\n", "tracking's extra us per dirty page", "",
                (cell(true, "update + sync ms") - cell(false, "update + sync ms")) * 1e3 / pages);
  }
  if (absl::GetFlag(FLAGS_components)) {
    // Median of 3 passes each.
    std::map<std::string, std::vector<double>> passes;
    std::vector<std::string> names;
    for (int pass = 0; pass < 3; ++pass) {
      std::vector<std::pair<std::string, double>> one;
      Components(&one);
      for (const auto& [name, us] : one) {
        if (pass == 0) names.push_back(name);
        passes[name].push_back(us);
      }
    }
    std::printf(
        "\nsteps of a dirty page, each timed alone (%llu pages of a /dev/shm file, "
        "random order; median of 3 passes), us per page:\n",
        static_cast<unsigned long long>(kComponentPages));
    for (const std::string& name : names) {
      std::printf("  %-52s %8.3f\n", name.c_str(), Median(passes[name]));
    }
  }
  std::printf("\nper-rep medians (reps in the order run):\n");
  for (const auto& [tracked, f] : figures) {
    for (const std::string& name : order) {
      auto values = f.rep_medians.find(name);
      if (values == f.rep_medians.end()) continue;  // dd: not on tmpfs
      std::string runs;
      for (double v : values->second) runs += absl::StrFormat(" %.4g", v);
      std::printf("  %-9s %-34s %s\n", tracked ? "tracking" : "untracked", name.c_str(),
                  runs.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Main();
}
