#include "heap/heap_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/random_name.h"

namespace heapd {
namespace {

constexpr char kLogPrefix[] = "log.";

const char* PurposeWord(HiddenPurpose purpose) {
  switch (purpose) {
    case HiddenPurpose::kCreating:
      return "creating";
    case HiddenPurpose::kRestoring:
      return "restoring";
    case HiddenPurpose::kRemoving:
      return "removing";
  }
  return "building";
}

}  // namespace

std::string LogFileName(uint64_t generation) { return absl::StrCat(kLogPrefix, generation); }

std::optional<uint64_t> LogGeneration(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kLogPrefix) || name.empty() || name.size() > 20) {
    return std::nullopt;
  }
  for (const char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t generation;
  if (!absl::SimpleAtoi(name, &generation)) return std::nullopt;
  return generation;
}

bool IsMetadataFileName(absl::string_view name) {
  return name == kCheckpointFileName || LogGeneration(name).has_value();
}

std::string HiddenHeapDirName(HiddenPurpose purpose, absl::string_view heap_name) {
  return absl::StrCat(".", PurposeWord(purpose), ".", heap_name, ".", RandomName());
}

bool IsHiddenHeapDirName(absl::string_view name) { return absl::StartsWith(name, "."); }

absl::StatusOr<std::unique_ptr<HeapDirBuilder>> HeapDirBuilder::Start(const std::string& parent,
                                                                      absl::string_view heap_name,
                                                                      HiddenPurpose purpose) {
  UniqueFd parent_fd(open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!parent_fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", parent));
  const std::string hidden = HiddenHeapDirName(purpose, heap_name);
  if (mkdirat(parent_fd.get(), hidden.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, absl::StrCat("create heap directory ", parent, "/", hidden));
  }
  absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(parent_fd.get(), hidden);
  if (!dir.ok()) {
    (void)RemoveTreeAt(parent_fd.get(), hidden);
    return dir.status();
  }
  std::unique_ptr<HeapDirBuilder> builder(
      new HeapDirBuilder(parent, std::move(parent_fd), hidden, *std::move(dir)));
  // Removed by the builder's destructor from here on.
  if (absl::Status s = WriteNewFileAt(builder->dir_fd(), kLockFileName, ""); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(builder->path(), ": ", s.message()));
  }
  return builder;
}

HeapDirBuilder::~HeapDirBuilder() {
  if (!committed_) (void)RemoveTreeAt(parent_.get(), hidden_name_);
}

absl::StatusOr<UniqueFd> HeapDirBuilder::DupDirFd() const {
  UniqueFd fd(fcntl(dir_.get(), F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("duplicate the fd of ", path()));
  return fd;
}

std::string HeapDirBuilder::path() const { return absl::StrCat(parent_path_, "/", hidden_name_); }

std::string HeapDirBuilder::PathOf(absl::string_view name) const {
  return absl::StrCat(path(), "/", name);
}

absl::Status HeapDirBuilder::Commit(const std::string& name) {
  if (fsync(dir_.get()) != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", path()));
  if (renameat2(parent_.get(), hidden_name_.c_str(), parent_.get(), name.c_str(),
                RENAME_NOREPLACE) != 0) {
    return errno == EEXIST ? absl::AlreadyExistsError(absl::StrCat("heap ", name, " exists"))
                           : ErrnoStatus(errno, absl::StrCat("rename ", path(), " to ",
                                                             parent_path_, "/", name));
  }
  committed_ = true;
  if (fsync(parent_.get()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("fsync ", parent_path_, " after making ", name));
  }
  return absl::OkStatus();
}

}  // namespace heapd
