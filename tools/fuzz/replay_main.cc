// main() of a fuzzer built without libFuzzer (gcc, or clang without
// --config=fuzz): runs the fuzzer's seeds and every file named on the command
// line (directories are walked) through LLVMFuzzerTestOneInput once. This
// turns the checked-in corpus, and any crash input added to it, into a
// regression test of the ordinary `bazel test //...`.
//
//   replay [PATH...]            replay seeds and files; exit 1 if a PATH is missing
//   replay --write_corpus=DIR   write the seeds into DIR (relative to the
//                               work tree under `bazel run`) and exit
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tools/fuzz/fuzz_seeds.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

constexpr char kWriteFlag[] = "--write_corpus=";

// Hands the fuzzer a buffer of exactly the input's size, as libFuzzer does,
// so a sanitized build catches reads past its end.
void RunOne(const std::string& bytes) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size()]);
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  LLVMFuzzerTestOneInput(copy.get(), bytes.size());
}

bool ReadFile(const fs::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

int WriteCorpus(fs::path dir) {
  // `bazel run` starts in the runfiles tree; a relative DIR means the work tree.
  if (const char* root = std::getenv("BUILD_WORKSPACE_DIRECTORY"); root && dir.is_relative()) {
    dir = fs::path(root) / dir;
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    std::fprintf(stderr, "replay: cannot create %s: %s\n", dir.c_str(), error.message().c_str());
    return 1;
  }
  const heapd::fuzz::Seeds seeds = heapd::fuzz::MakeSeeds();
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "replay: cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("replay: wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Looked for first: the test's own corpus argument comes before it under
  // `bazel run`, and may not exist yet for a new fuzzer.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(kWriteFlag, 0) == 0) return WriteCorpus(arg.substr(sizeof(kWriteFlag) - 1));
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-", 0) == 0) continue;  // libFuzzer flags: meaningless here
    std::error_code error;
    if (fs::is_directory(arg, error)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (fs::is_regular_file(arg, error)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr,
                   "replay: %s is neither a file nor a directory (a new fuzzer's corpus is "
                   "made with --write_corpus, see docs/testing.md)\n",
                   arg.c_str());
      return 1;
    }
  }
  std::sort(files.begin(), files.end());

  const heapd::fuzz::Seeds seeds = heapd::fuzz::MakeSeeds();
  for (const auto& [name, bytes] : seeds) RunOne(bytes);
  for (const fs::path& path : files) {
    std::string bytes;
    if (!ReadFile(path, &bytes)) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 1;
    }
    // Printed first, so a crash names its input.
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
    RunOne(bytes);
  }
  std::printf("replay: %zu seeds and %zu files ran clean\n", seeds.size(), files.size());
  return 0;
}
