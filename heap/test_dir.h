// TestDir: a fresh temporary directory for one test, removed with it.
#ifndef HEAPD_HEAP_TEST_DIR_H_
#define HEAPD_HEAP_TEST_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace heapd {

class TestDir {
 public:
  // Makes the directory under $TEST_TMPDIR (else /tmp), or under `parent`.
  explicit TestDir(const std::string& parent = "") {
    std::string base = parent;
    if (base.empty()) {
      const char* tmp = getenv("TEST_TMPDIR");
      base = tmp != nullptr ? tmp : "/tmp";
    }
    std::string pattern = base + "/heapd-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) abort();
    path_ = pattern;
  }
  ~TestDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_TEST_DIR_H_
