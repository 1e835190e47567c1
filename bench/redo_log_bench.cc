// What the redo log costs a sync (issue 21): a heap whose durable image is
// on a block device writes each page a sync changed twice, first to the
// redo log (on the sync's path, made durable before the epoch commits),
// later in place into the durable image (off the path). Measured here on
// the file system of --dir (ext4 on this machine's disk), pages read from a
// working image on tmpfs, against the device's sequential write bandwidth
// measured in the same run with `dd bs=2M oflag=direct conv=notrunc,fdatasync`
// into a file written through before.
//
// For each dirty-set size: the median over --reps syncs of
//   append   RedoLog::Append: read the pages from the working image, write
//            them to the log (O_DIRECT where allowed) and fdatasync
//   apply    RedoLog::ApplyTo: the pages read back from the log and
//            written in place into a durable image file (each once,
//            consecutive ones together), fdatasync, then Reset: the
//            later, second write
// in microseconds per sync and MB/s of page data.
//
//   bazel build -c opt //bench:redo_log_bench
//   bazel-bin/bench/redo_log_bench --dir=/var/tmp --reps=5
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "heap/redo_log.h"
#include "heap/test_dir.h"

ABSL_FLAG(std::string, dir, "/var/tmp", "a directory on the device to measure");
ABSL_FLAG(std::string, image_dir, "/dev/shm", "where the working image goes (tmpfs)");
ABSL_FLAG(int, reps, 5, "syncs per dirty-set size (median)");
ABSL_FLAG(uint64_t, image_mib, 1024, "working image size, MiB");

namespace heapd {
namespace {

constexpr uint64_t kPage = kRedoBlockBytes;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "redo_log_bench: %s\n", what.c_str());
  std::exit(1);
}

// The device's sequential write bandwidth, MB/s: dd of `mib` MiB in 2 MiB
// O_DIRECT writes, then fdatasync, into a file of `dir` written through
// before (as the log is: no block allocation or extent conversion timed).
double DdBandwidth(const std::string& dir, uint64_t mib) {
  const std::string file = dir + "/dd.out";
  if (std::system(absl::StrCat("dd if=/dev/zero of=", file, " bs=1M count=", mib,
                               " conv=fdatasync status=none")
                      .c_str()) != 0) {
    Die("dd: write the file through");
  }
  const std::string command =
      absl::StrCat("dd if=/dev/zero of=", file, " bs=2M count=", mib / 2,
                   " oflag=direct conv=notrunc,fdatasync 2>&1 >/dev/null | tail -1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) Die("popen dd");
  char line[512] = {};
  if (fgets(line, sizeof(line), pipe) == nullptr) line[0] = '\0';
  pclose(pipe);
  unlink(file.c_str());
  // "... bytes (...) copied, 1.234 s, 870 MB/s": bytes over seconds.
  unsigned long long bytes = 0;
  double seconds = 0;
  const char* copied = std::strstr(line, "copied, ");
  if (std::sscanf(line, "%llu", &bytes) != 1 || copied == nullptr ||
      std::sscanf(copied, "copied, %lf", &seconds) != 1 || seconds <= 0) {
    Die(absl::StrCat("cannot read dd's output: ", line));
  }
  return static_cast<double>(bytes) / seconds / 1e6;
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int reps = absl::GetFlag(FLAGS_reps);
  const uint64_t image_pages = absl::GetFlag(FLAGS_image_mib) << 20 >> 12;
  TestDir work(dir);
  TestDir image_dir(absl::GetFlag(FLAGS_image_dir));

  // The working image, filled with random bytes.
  const UniqueFd image(open(image_dir.Sub("image").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  std::mt19937_64 random(42);
  {
    std::vector<uint64_t> chunk((uint64_t{1} << 20) / sizeof(uint64_t));
    for (uint64_t at = 0; at < image_pages * kPage; at += chunk.size() * sizeof(uint64_t)) {
      for (uint64_t& word : chunk) word = random();
      if (pwrite(image.get(), chunk.data(), chunk.size() * sizeof(uint64_t),
                 static_cast<off_t>(at)) < 0) {
        Die("fill the working image");
      }
    }
  }
  // The durable image, written through once (as a heap's data file is).
  const UniqueFd durable(open(work.Sub("data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  {
    const std::string zeros(uint64_t{1} << 20, '\0');
    for (uint64_t at = 0; at < image_pages * kPage; at += zeros.size()) {
      if (pwrite(durable.get(), zeros.data(), zeros.size(), static_cast<off_t>(at)) < 0) {
        Die("write the durable image");
      }
    }
    fdatasync(durable.get());
  }
  const UniqueFd work_fd(open(work.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  absl::StatusOr<std::unique_ptr<RedoLog>> log = RedoLog::Create(
      work_fd.get(), kRedoLogFileName, RedoLog::BytesFor(image_pages / 4), work.Sub("redo"));
  if (!log.ok()) Die(log.status().ToString());

  const double dd = DdBandwidth(work.path(), 1024);
  std::printf("redo log in %s (%s), working image on %s\n", dir.c_str(),
              (*log)->direct() ? "O_DIRECT" : "buffered", absl::GetFlag(FLAGS_image_dir).c_str());
  std::printf("device: dd bs=2M oflag=direct conv=notrunc,fdatasync, 1 GiB: %.0f MB/s\n", dd);
  std::printf("%10s %12s %10s %8s %12s %10s\n", "pages", "append us", "MB/s", "of dd", "apply us",
              "MB/s");
  std::vector<uint64_t> all(image_pages);
  for (uint64_t i = 0; i < image_pages; ++i) all[i] = i * kPage;
  uint64_t epoch = 0;
  for (const uint64_t pages :
       {uint64_t{1}, uint64_t{16}, uint64_t{256}, uint64_t{4096}, uint64_t{65536}}) {
    if (pages > image_pages / 4) break;
    std::vector<double> append, apply;
    for (int rep = 0; rep < reps; ++rep) {
      // Random pages, in offset order (as a sync lists them).
      std::shuffle(all.begin(), all.end(), random);
      std::vector<uint64_t> dirty(all.begin(), all.begin() + static_cast<ptrdiff_t>(pages));
      std::sort(dirty.begin(), dirty.end());
      auto start = std::chrono::steady_clock::now();
      if (absl::StatusOr<RedoLog::Position> at = (*log)->Append(++epoch, dirty, image.get());
          !at.ok()) {
        Die(at.status().ToString());
      }
      append.push_back(SecondsSince(start));
      start = std::chrono::steady_clock::now();
      if (absl::StatusOr<uint64_t> applied = (*log)->ApplyTo(durable.get(), epoch);
          !applied.ok() || *applied != pages) {
        Die(applied.ok() ? "applied another number of pages" : applied.status().ToString());
      }
      if (absl::Status s = (*log)->Reset(); !s.ok()) Die(s.ToString());
      apply.push_back(SecondsSince(start));
    }
    const double bytes = static_cast<double>(pages * kPage);
    const double append_s = Median(append), apply_s = Median(apply);
    std::printf("%10llu %12.1f %10.0f %7.0f%% %12.1f %10.0f\n",
                static_cast<unsigned long long>(pages), append_s * 1e6, bytes / append_s / 1e6,
                100 * bytes / append_s / 1e6 / dd, apply_s * 1e6, bytes / apply_s / 1e6);
  }
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Run();
}
