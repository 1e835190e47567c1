// File operations relative to an open directory, one path component at a
// time, never following a symlink: what snapshot code does inside a
// directory, whether in heapd's own directory or in a RunAs helper working
// in a caller's (util/run_as.h).
#ifndef HEAPD_UTIL_DIR_FILES_H_
#define HEAPD_UTIL_DIR_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

// Opens the directory `name` in `dir` (no symlink).
absl::StatusOr<UniqueFd> OpenDirectoryAt(int dir, const std::string& name);

// Opens the regular file `name` in `dir` read-only (no symlink; a FIFO or
// device is refused without blocking). FAILED_PRECONDITION if it is not a
// regular file; `size` gets its size.
absl::StatusOr<UniqueFd> OpenRegularFileAt(int dir, const std::string& name, uint64_t* size);

// The whole of the regular file `name` in `dir`, if it has at most
// `max_bytes` (RESOURCE_EXHAUSTED otherwise, before reading anything).
absl::StatusOr<std::string> ReadFileAt(int dir, const std::string& name, uint64_t max_bytes);

// Creates the file `name` in `dir` (it must not exist), writes `bytes` and
// fsyncs it.
absl::Status WriteNewFileAt(int dir, const std::string& name, absl::string_view bytes);

// Reads exactly `length` bytes of `fd` at `at` into `out`; false with
// errno set on an error (EIO if the file ends first).
bool ReadAllAt(int fd, char* out, size_t length, uint64_t at);
// Writes all of `bytes` to `fd` at `at` (short writes continued); false
// with errno set on an error.
bool WriteAllAt(int fd, absl::string_view bytes, uint64_t at);

// Removes `name` in `dir` and, if it is a directory, everything in it
// (symlinks are removed, never followed). OK if it does not exist.
absl::Status RemoveTreeAt(int dir, const std::string& name);

// The names in the directory `dir`, "." and ".." left out; at most
// `max_entries` (RESOURCE_EXHAUSTED beyond).
absl::StatusOr<std::vector<std::string>> ListDirectory(int dir, size_t max_entries);

// True if the directory `dir` is the directory (device, inode) or lies
// anywhere beneath it.
bool IsWithinDirectory(int dir, dev_t device, ino_t inode);

}  // namespace heapd

#endif  // HEAPD_UTIL_DIR_FILES_H_
