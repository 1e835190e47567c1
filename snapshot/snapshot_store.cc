#include "snapshot/snapshot_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "allocator/size_class.h"
#include "heap/data_file.h"
#include "heap/heap_dir.h"
#include "heap/heap_name.h"
#include "heap/metadata_store.h"
#include "snapshot/block_store.h"
#include "snapshot/file_copy.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/random_name.h"

namespace heapd {
namespace {

// What work in a target directory sends back, one message each; the first
// byte says what it is.
constexpr char kManifestMessage = 'm';  // manifest.json's bytes
constexpr char kMetadataMessage = 'f';  // file name, '\0', its bytes
constexpr char kDataMessage = 'd';      // data size u64 [, copy method u8, bytes copied u64]
constexpr char kListedMessage = 'l';    // snapshot name, '\0', its manifest.json
constexpr char kSkippedMessage = 's';   // "NAME: why", an entry not listed
constexpr char kCreatedMessage = 'c';   // copy method u8, bytes copied u64
// A snapshot directory holds a handful of files; more is not a snapshot.
constexpr size_t kMaxFilesInSnapshot = 64;
// Entries of a target directory looked through for leftovers of a create.
constexpr size_t kMaxEntriesSwept = 1 << 16;

void PutU64(std::string* out, uint64_t value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

bool GetU64(absl::string_view* in, uint64_t* value) {
  if (in->size() < sizeof(*value)) return false;
  std::memcpy(value, in->data(), sizeof(*value));
  in->remove_prefix(sizeof(*value));
  return true;
}

std::string CopyReport(const CopyResult& copied) {
  std::string out(1, static_cast<char>(copied.method));
  PutU64(&out, copied.bytes_written);
  return out;
}

bool ParseCopyReport(absl::string_view in, CopyResult* copied) {
  if (in.empty() || static_cast<uint8_t>(in[0]) > static_cast<uint8_t>(CopyMethod::kPlain)) {
    return false;
  }
  copied->method = static_cast<CopyMethod>(in[0]);
  in.remove_prefix(1);
  return GetU64(&in, &copied->bytes_written) && in.empty();
}

// Splits "name\0bytes".
bool SplitNamed(absl::string_view in, std::string* name, absl::string_view* bytes) {
  const size_t zero = in.find('\0');
  if (zero == absl::string_view::npos) return false;
  *name = std::string(in.substr(0, zero));
  *bytes = in.substr(zero + 1);
  return true;
}

// Creates snapshot `name` in the target directory from the heap's data
// (lent, read only), its metadata files and manifest: built under the
// hidden name `building`, then renamed into place. Sends kCreatedMessage.
absl::Status CreateSnapshotJob(JobInput& input, MessageSink& out) {
  std::string name, building, json;
  uint64_t data_bytes = 0;
  std::map<std::string, absl::string_view> metadata_files;  // in place: megabytes
  std::vector<uint64_t> bounds;  // of the ranges to copy: begin, end, ...
  if (!input.args.Next(&name) || !input.args.Next(&building) || !input.args.Next(&data_bytes) ||
      !input.args.Next(&metadata_files) || !input.args.Next(&json) || !input.args.Next(&bounds) ||
      !input.args.Done() || input.fds.size() != 1 || bounds.size() % 2 != 0) {
    return MalformedJobArgs();
  }
  std::vector<ByteRange> needed;
  for (size_t i = 0; i < bounds.size(); i += 2) needed.push_back({bounds[i], bounds[i + 1]});
  const int target = input.dir;
  const int from = input.fds[0];
  struct stat st;
  if (fstatat(target, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError("it already exists");
  }
  // A create of this name that was killed midway left a hidden
  // partial directory: nothing lists it; clear it now.
  if (absl::StatusOr<std::vector<std::string>> entries = ListDirectory(target, kMaxEntriesSwept);
      entries.ok()) {
    for (const std::string& entry : *entries) {
      if (absl::StartsWith(entry, absl::StrCat(".", name, ".partial-"))) {
        (void)RemoveTreeAt(target, entry);
      }
    }
  }
  if (mkdirat(target, building.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, absl::StrCat("create ", building));
  }
  auto built = [&]() -> absl::StatusOr<CopyResult> {
    absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(target, building);
    if (!dir.ok()) return dir.status();
    UniqueFd copy(openat(dir->get(), kSnapshotDataFile,
                         O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!copy.valid()) return ErrnoStatus(errno, "create its data file");
    absl::StatusOr<CopyResult> copied =
        CopyFileContents(from, data_bytes, copy.get(), "its data file", &needed);
    if (!copied.ok()) return copied.status();
    for (const auto& [name, bytes] : metadata_files) {
      if (absl::Status s = WriteNewFileAt(dir->get(), name, bytes); !s.ok()) return s;
    }
    if (absl::Status s = WriteNewFileAt(dir->get(), kManifestFile, json); !s.ok()) {
      return s;
    }
    if (fsync(dir->get()) != 0) return ErrnoStatus(errno, "fsync its directory");
    if (renameat2(target, building.c_str(), target, name.c_str(), RENAME_NOREPLACE) != 0) {
      return errno == EEXIST ? absl::AlreadyExistsError("it already exists")
                             : ErrnoStatus(errno, "rename it into place");
    }
    return copied;
  }();
  if (!built.ok()) {
    (void)RemoveTreeAt(target, building);
    return built.status();
  }
  if (fsync(target) != 0) return ErrnoStatus(errno, "fsync the snapshot directory");
  return out.Send(absl::StrCat(std::string(1, kCreatedMessage), CopyReport(*built)));
}
HEAPD_RUN_AS_JOB(kCreateSnapshotJob, "snapshot.create", CreateSnapshotJob);

// Reads snapshot `name`: its manifest, metadata files and data file (its
// size; copied into the lent descriptor if there is one; sent with
// `want_fd`).
absl::Status ReadSnapshotJob(JobInput& input, MessageSink& out) {
  std::string name;
  uint64_t want_fd = 0, max_bytes = 0;
  if (!input.args.Next(&name) || !input.args.Next(&want_fd) || !input.args.Next(&max_bytes) ||
      !input.args.Done() || input.fds.size() > 1) {
    return MalformedJobArgs();
  }
  const int target = input.dir;
  const int copy_to = input.fds.empty() ? -1 : input.fds[0];
  absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(target, name);
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::string> manifest = ReadFileAt(dir->get(), kManifestFile, kMaxManifestBytes);
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = out.Send(std::string(1, kManifestMessage) + *manifest); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<std::string>> entries = ListDirectory(dir->get(), kMaxFilesInSnapshot);
  if (!entries.ok()) return entries.status();
  uint64_t metadata_bytes = 0;
  for (const std::string& entry : *entries) {
    if (!IsMetadataFileName(entry)) continue;
    absl::StatusOr<std::string> bytes =
        ReadFileAt(dir->get(), entry, kMaxMetadataBytes - metadata_bytes);
    if (!bytes.ok()) return bytes.status();
    metadata_bytes += bytes->size();
    std::string message = absl::StrCat(std::string(1, kMetadataMessage), entry);
    message.push_back('\0');
    message += *bytes;
    if (absl::Status s = out.Send(message); !s.ok()) return s;
  }
  uint64_t size = 0;
  absl::StatusOr<UniqueFd> data = OpenRegularFileAt(dir->get(), kSnapshotDataFile, &size);
  if (!data.ok()) return data.status();
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("its data file has ", size, " bytes; at most ",
                                                     max_bytes, " are allowed here"));
  }
  std::string message(1, kDataMessage);
  PutU64(&message, size);
  if (copy_to >= 0) {
    absl::StatusOr<CopyResult> copied =
        CopyFileContents(data->get(), size, copy_to, "its data file");
    if (!copied.ok()) return copied.status();
    message += CopyReport(*copied);
  }
  return out.Send(message, want_fd ? data->get() : -1);
}
HEAPD_RUN_AS_JOB(kReadSnapshotJob, "snapshot.read", ReadSnapshotJob);

// Sends each snapshot's manifest (kListedMessage), or why an entry could
// not be read (kSkippedMessage).
absl::Status ListSnapshotsJob(JobInput& input, MessageSink& out) {
  if (!input.args.Done()) return MalformedJobArgs();
  const int target = input.dir;
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(target, kMaxSnapshotEntries);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (!ValidateHeapName(name, "snapshot").ok()) continue;
    absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(target, name);
    absl::StatusOr<std::string> json =
        dir.ok() ? ReadFileAt(dir->get(), kManifestFile, kMaxManifestBytes) : dir.status();
    if (!json.ok()) {
      // Not a snapshot directory (no manifest) says nothing; one the
      // caller cannot read is reported, not silently left out.
      if (json.status().code() == absl::StatusCode::kNotFound) continue;
      const std::string why =
          absl::StrCat(std::string(1, kSkippedMessage), name, ": ", json.status().message());
      if (absl::Status s = out.Send(why); !s.ok()) return s;
      continue;
    }
    std::string message = absl::StrCat(std::string(1, kListedMessage), name);
    message.push_back('\0');
    message += *json;
    if (absl::Status s = out.Send(message); !s.ok()) return s;
  }
  return absl::OkStatus();
}
HEAPD_RUN_AS_JOB(kListSnapshotsJob, "snapshot.list", ListSnapshotsJob);

// Removes snapshot `name`, renamed first to the hidden `doomed`.
absl::Status RemoveSnapshotJob(JobInput& input, MessageSink&) {
  std::string name, doomed;
  if (!input.args.Next(&name) || !input.args.Next(&doomed) || !input.args.Done()) {
    return MalformedJobArgs();
  }
  const int target = input.dir;
  struct stat st;
  absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(target, name);
  if (!dir.ok() || fstatat(dir->get(), kManifestFile, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISREG(st.st_mode)) {
    return absl::NotFoundError("there is no such snapshot");
  }
  // Renamed away first: a crash while deleting leaves no half snapshot.
  if (renameat2(target, name.c_str(), target, doomed.c_str(), RENAME_NOREPLACE) != 0) {
    return ErrnoStatus(errno, "rename it away");
  }
  if (fsync(target) != 0) return ErrnoStatus(errno, "fsync the snapshot directory");
  return RemoveTreeAt(target, doomed);
}
HEAPD_RUN_AS_JOB(kRemoveSnapshotJob, "snapshot.remove", RemoveSnapshotJob);

absl::Status Malformed(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": malformed answer from its worker"));
}

// May `who` read (bit 4) or write (bit 2) something with this owner and
// mode? As heap access (daemon/caller.h) is decided.
bool MayAccess(const Credentials& who, uint32_t owner_uid, uint32_t owner_gid, uint32_t mode,
               uint32_t bit) {
  if (who.uid == 0) return true;
  if (who.uid == owner_uid) return (mode & (bit << 6)) != 0;
  if (who.gid == owner_gid ||
      std::find(who.groups.begin(), who.groups.end(), owner_gid) != who.groups.end()) {
    return (mode & (bit << 3)) != 0;
  }
  return (mode & bit) != 0;
}

// The byte ranges of the chunks `state` uses, runs merged.
absl::StatusOr<std::vector<ByteRange>> UsedRanges(const Checkpoint& state) {
  absl::StatusOr<std::vector<bool>> used = UsedChunks(state);
  if (!used.ok()) return used.status();
  std::vector<ByteRange> ranges;
  for (uint64_t chunk = 0; chunk < used->size(); ++chunk) {
    if (!(*used)[chunk]) continue;
    if (!ranges.empty() && ranges.back().end == chunk * kChunkSize) {
      ranges.back().end += kChunkSize;
    } else {
      ranges.push_back({chunk * kChunkSize, (chunk + 1) * kChunkSize});
    }
  }
  return ranges;
}

}  // namespace

struct SnapshotStore::Read {
  std::string manifest_json;
  std::map<std::string, std::string> metadata_files;
  uint64_t data_bytes = 0;
  UniqueFd data_fd;   // with want_fd
  CopyResult copied;  // with copy_to
};

absl::StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Open(
    const std::string& own_dir, const std::vector<std::string>& heapd_dirs,
    SnapshotStoreOptions options) {
  if (mkdir(own_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("create snapshot directory ", own_dir));
  }
  UniqueFd own(open(own_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!own.valid()) return ErrnoStatus(errno, absl::StrCat("open snapshot directory ", own_dir));
  struct stat st;
  if (fstat(own.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", own_dir));
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot directory ", own_dir, " must belong to uid ", geteuid(),
                     " and be writable by no one else (it is uid ", st.st_uid, ", mode 0",
                     absl::StrFormat("%o", st.st_mode & 07777), ")"));
  }
  std::vector<std::pair<dev_t, ino_t>> forbidden;
  for (const std::string& dir : heapd_dirs) {
    struct stat state;
    if (stat(dir.c_str(), &state) != 0) {
      return ErrnoStatus(errno, absl::StrCat("stat heapd's directory ", dir));
    }
    forbidden.emplace_back(state.st_dev, state.st_ino);
  }
  return std::unique_ptr<SnapshotStore>(
      new SnapshotStore(own_dir, std::move(own), std::move(forbidden), options));
}

absl::StatusOr<SnapshotStore::ReadingCharge> SnapshotStore::ChargeReading(uint64_t bytes,
                                                                          const std::string& what) {
  if (reading_budget_.used.fetch_add(bytes) + bytes > reading_budget_.limit) {
    reading_budget_.used.fetch_sub(bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat(what,
                     ": heapd holds as much read from snapshots as it may "
                     "(--max_snapshot_reading_bytes); try again"));
  }
  return ReadingCharge(&reading_budget_, bytes);
}

std::string SnapshotStore::Where(const SnapshotRef& ref) {
  return ref.target_dir.empty() ? absl::StrCat("heapd:", ref.name)
                                : absl::StrCat(ref.target_dir, "/", ref.name);
}

absl::StatusOr<std::vector<ChildMessage>> SnapshotStore::RunIn(
    const SnapshotCaller& caller, const std::string& target_dir, const RunAsJob& job,
    const std::string& args, const std::vector<int>& fds, const std::string& what,
    uint64_t max_reply_bytes) {
  if (target_dir.empty()) {
    absl::StatusOr<std::vector<ChildMessage>> here = RunJobHere(job, own_fd_.get(), fds, args);
    if (!here.ok()) {
      return absl::Status(here.status().code(), absl::StrCat(what, ": ", here.status().message()));
    }
    return here;
  }
  if (absl::Status s = ValidateSnapshotDir(target_dir); !s.ok()) return s;
  RunAsRequest request;
  request.job = &job;
  request.args = args;
  request.fds = fds;
  // Resolved by the caller's own process: the kernel checks each component
  // with the caller's rights; never heapd's state directory.
  request.dir = target_dir;
  request.forbidden = heapd_dirs_;
  RunAsOptions options;
  options.timeout = options_.timeout;
  options.cancel_fd = options_.cancel_fd;
  options.cancelled = caller.cancelled;
  options.max_reply_bytes = max_reply_bytes != 0
                                ? max_reply_bytes
                                : kMaxMetadataBytes + kMaxSnapshotEntries * kMaxManifestBytes / 16;
  options.budget = &reading_budget_;
  options.what = what;
  absl::StatusOr<std::vector<ChildMessage>> messages = RunAs(caller.credentials, request, options);
  if (!messages.ok()) {
    return absl::Status(
        messages.status().code(),
        absl::StrCat(what, " as uid ", caller.credentials.uid, ": ", messages.status().message()));
  }
  return messages;
}

absl::Status SnapshotStore::CheckOwnAccess(const SnapshotCaller& caller,
                                           const v1::SnapshotManifest& manifest,
                                           bool remove) const {
  const Credentials& who = caller.credentials;
  const v1::HeapInfo& source = manifest.source();
  if (caller.admin || who.uid == manifest.created_by_uid() || who.uid == source.owner_uid() ||
      (!remove && MayAccess(who, source.owner_uid(), source.owner_gid(), source.mode(), 4))) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", who.uid, " may not ", remove ? "remove" : "read", " snapshot heapd:", manifest.name(),
      " (made by uid ", manifest.created_by_uid(), " of heap ", manifest.heap(), " owned by uid ",
      source.owner_uid(), ", mode 0", absl::StrFormat("%o", source.mode()), ")"));
}

absl::StatusOr<uint64_t> SnapshotStore::OwnBytesOf(uint32_t uid) {
  absl::StatusOr<std::vector<std::string>> names =
      ListDirectory(own_fd_.get(), kMaxSnapshotEntries);
  if (!names.ok()) return names.status();
  uint64_t bytes = 0;
  for (const std::string& name : *names) {
    if (!ValidateHeapName(name, "snapshot").ok()) continue;
    absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(own_fd_.get(), name);
    if (!dir.ok()) continue;
    absl::StatusOr<std::string> json = ReadFileAt(dir->get(), kManifestFile, kMaxManifestBytes);
    if (!json.ok()) continue;
    absl::StatusOr<v1::SnapshotManifest> manifest = ParseManifest(*json, name);
    if (manifest.ok() && manifest->created_by_uid() == uid) bytes += manifest->data_bytes();
  }
  return bytes;
}

absl::StatusOr<v1::SnapshotManifest> SnapshotStore::Create(
    const SnapshotCaller& caller, PersistentHeap& heap, const std::string& heap_name,
    const v1::HeapInfo& source, const SnapshotRef& ref,
    const std::map<std::string, std::string>& labels) {
  if (absl::Status s = ValidateHeapName(ref.name, "snapshot"); !s.ok()) return s;
  if (absl::Status s = ValidateLabels(labels); !s.ok()) return s;
  const std::string where = Where(ref);
  v1::SnapshotManifest manifest;
  manifest.set_name(ref.name);
  manifest.set_heap(heap_name);
  manifest.mutable_labels()->insert(labels.begin(), labels.end());
  *manifest.mutable_source() = source;
  manifest.set_created_by_uid(caller.credentials.uid);
  absl::Status status = heap.WithCommittedState([&](const CommittedState& state) -> absl::Status {
    const uint32_t uid = caller.credentials.uid;
    const bool counted = ref.target_dir.empty() && options_.max_bytes_per_user != 0 && uid != 0;
    if (counted) {
      absl::StatusOr<uint64_t> kept = OwnBytesOf(uid);
      if (!kept.ok()) return kept.status();
      absl::MutexLock lock(&own_mu_);
      const uint64_t used = *kept + own_pending_[uid];
      if (used + state.data_bytes > options_.max_bytes_per_user) {
        return absl::ResourceExhaustedError(
            absl::StrCat("snapshot ", where, ": uid ", uid, " keeps ", used,
                         " bytes of snapshots in heapd's directory; ", state.data_bytes,
                         " more would pass the limit of ", options_.max_bytes_per_user,
                         " (--max_snapshot_bytes_per_user)"));
      }
      own_pending_[uid] += state.data_bytes;
    }
    // Counted as kept once made (or never, if not): pending no more.
    absl::Cleanup unpend = [&] {
      if (!counted) return;
      absl::MutexLock lock(&own_mu_);
      if ((own_pending_[uid] -= state.data_bytes) == 0) own_pending_.erase(uid);
    };
    manifest.set_epoch(state.epoch);
    manifest.set_data_bytes(state.data_bytes);
    manifest.set_created_unix_ns(absl::ToUnixNanos(absl::Now()));
    for (const auto& [name, bytes] : state.metadata_files) {
      (*manifest.mutable_metadata_crc32())[name] = MetadataCrc32(bytes);
    }
    const std::string json = ManifestToJson(manifest);
    // Only the chunks the committed epoch uses are copied (the rest is free:
    // its bytes never matter), as its metadata says (checked as a
    // snapshot's would be).
    absl::StatusOr<VerifiedSnapshot> verified =
        VerifySnapshotFiles(where, json, state.metadata_files, state.data_bytes);
    if (!verified.ok()) return verified.status();
    absl::StatusOr<std::vector<ByteRange>> needed = UsedRanges(verified->metadata.state);
    if (!needed.ok()) return needed.status();
    // The helper gets only a read-only descriptor of the heap's data.
    absl::StatusOr<int> data = heap.OpenCommittedData();
    if (!data.ok()) return data.status();
    UniqueFd data_fd(*data);
    const int from = data_fd.get();
    const std::string building = absl::StrCat(".", ref.name, ".partial-", RandomName());
    std::vector<uint64_t> bounds;
    for (const ByteRange& range : *needed) bounds.insert(bounds.end(), {range.begin, range.end});
    absl::StatusOr<std::vector<ChildMessage>> messages =
        RunIn(caller, ref.target_dir, kCreateSnapshotJob,
              ArgsWriter()
                  .Add(ref.name)
                  .Add(building)
                  .Add(state.data_bytes)
                  .Add(state.metadata_files)
                  .Add(json)
                  .Add(bounds)
                  .Take(),
              {from}, absl::StrCat("create snapshot ", where));
    if (!messages.ok()) return messages.status();
    CopyResult copied;
    if (messages->size() != 1 || (*messages)[0].bytes.empty() ||
        (*messages)[0].bytes[0] != kCreatedMessage ||
        !ParseCopyReport(absl::string_view((*messages)[0].bytes).substr(1), &copied)) {
      return Malformed(absl::StrCat("create snapshot ", where));
    }
    manifest.set_copy_method(CopyMethodName(copied.method));
    manifest.set_bytes_written(copied.bytes_written);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return manifest;
}

absl::StatusOr<SnapshotStore::Read> SnapshotStore::ReadSnapshot(const SnapshotCaller& caller,
                                                                const SnapshotRef& ref, int copy_to,
                                                                bool want_fd, uint64_t max_bytes) {
  if (absl::Status s = ValidateHeapName(ref.name, "snapshot"); !s.ok()) return s;
  const std::string where = Where(ref);
  std::vector<int> keep;
  if (copy_to >= 0) keep.push_back(copy_to);
  absl::StatusOr<std::vector<ChildMessage>> messages =
      RunIn(caller, ref.target_dir, kReadSnapshotJob,
            ArgsWriter().Add(ref.name).Add(uint64_t{want_fd}).Add(max_bytes).Take(), keep,
            absl::StrCat("read snapshot ", where));
  if (!messages.ok()) return messages.status();
  Read read;
  bool data_seen = false;
  for (ChildMessage& message : *messages) {
    absl::string_view body = message.bytes;
    if (body.empty()) return Malformed(where);
    const char kind = body[0];
    body.remove_prefix(1);
    if (kind == kManifestMessage) {
      read.manifest_json = std::move(message.bytes);
      read.manifest_json.erase(0, 1);
    } else if (kind == kMetadataMessage) {
      std::string name;
      absl::string_view bytes;
      if (!SplitNamed(body, &name, &bytes)) return Malformed(where);
      // Moved, not copied: metadata may be large.
      const size_t skip = 1 + name.size() + 1;
      std::string& file = read.metadata_files[name];
      file = std::move(message.bytes);
      file.erase(0, skip);
    } else if (kind == kDataMessage && GetU64(&body, &read.data_bytes)) {
      data_seen = true;
      if (copy_to >= 0 && !ParseCopyReport(body, &read.copied)) return Malformed(where);
      read.data_fd = std::move(message.fd);
    } else {
      return Malformed(where);
    }
  }
  if (!data_seen || (want_fd && !read.data_fd.valid())) return Malformed(where);
  return read;
}

absl::StatusOr<v1::ListSnapshotsResponse> SnapshotStore::List(const SnapshotCaller& caller,
                                                              const std::string& target_dir) {
  absl::StatusOr<std::vector<ChildMessage>> messages = RunIn(
      caller, target_dir, kListSnapshotsJob, "", {},
      absl::StrCat("list snapshots in ", target_dir.empty() ? "heapd's directory" : target_dir));
  if (!messages.ok()) return messages.status();
  v1::ListSnapshotsResponse listing;
  std::vector<v1::SnapshotManifest> snapshots;
  for (const ChildMessage& message : *messages) {
    if (!message.bytes.empty() && message.bytes[0] == kSkippedMessage) {
      // Heapd's own directory holds other users' snapshots: not theirs to
      // hear of.
      if (!target_dir.empty()) listing.add_skipped(message.bytes.substr(1));
      continue;
    }
    std::string name;
    absl::string_view json;
    if (message.bytes.empty() || message.bytes[0] != kListedMessage ||
        !SplitNamed(absl::string_view(message.bytes).substr(1), &name, &json)) {
      return Malformed("list snapshots");
    }
    absl::StatusOr<v1::SnapshotManifest> manifest = ParseManifest(json, Where({target_dir, name}));
    if (manifest.ok() && manifest->name() != name) {
      manifest =
          absl::DataLossError(absl::StrCat("its manifest names snapshot ", manifest->name()));
    }
    if (!manifest.ok()) {
      if (!target_dir.empty()) {
        listing.add_skipped(absl::StrCat(name, ": ", manifest.status().message()));
      }
      continue;
    }
    if (target_dir.empty() && !CheckOwnAccess(caller, *manifest, false).ok()) continue;
    snapshots.push_back(*std::move(manifest));
  }
  std::sort(snapshots.begin(), snapshots.end(),
            [](const v1::SnapshotManifest& a, const v1::SnapshotManifest& b) {
              return a.name() < b.name();
            });
  for (v1::SnapshotManifest& manifest : snapshots) *listing.add_snapshots() = std::move(manifest);
  return listing;
}

absl::StatusOr<v1::SnapshotManifest> SnapshotStore::Verify(const SnapshotCaller& caller,
                                                           const SnapshotRef& ref,
                                                           uint64_t max_bytes) {
  absl::StatusOr<Read> read = ReadSnapshot(caller, ref, -1, false, max_bytes);
  if (!read.ok()) return read.status();
  absl::StatusOr<VerifiedSnapshot> verified =
      VerifySnapshotFiles(Where(ref), read->manifest_json, read->metadata_files, read->data_bytes);
  if (!verified.ok()) return verified.status();
  if (ref.target_dir.empty()) {
    if (absl::Status s = CheckOwnAccess(caller, verified->manifest, false); !s.ok()) return s;
  }
  return verified->manifest;
}

absl::Status SnapshotStore::Remove(const SnapshotCaller& caller, const SnapshotRef& ref) {
  if (absl::Status s = ValidateHeapName(ref.name, "snapshot"); !s.ok()) return s;
  const std::string where = Where(ref);
  if (ref.target_dir.empty()) {
    absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(own_fd_.get(), ref.name);
    if (!dir.ok()) return absl::NotFoundError(absl::StrCat("no snapshot ", where));
    absl::StatusOr<std::string> json = ReadFileAt(dir->get(), kManifestFile, kMaxManifestBytes);
    if (!json.ok()) return absl::NotFoundError(absl::StrCat("no snapshot ", where));
    absl::StatusOr<v1::SnapshotManifest> manifest = ParseManifest(*json, where);
    // A damaged snapshot in heapd's directory: an admin may remove it.
    if (!manifest.ok() && !caller.admin) return manifest.status();
    if (manifest.ok()) {
      if (absl::Status s = CheckOwnAccess(caller, *manifest, true); !s.ok()) return s;
    }
  }
  const std::string doomed = absl::StrCat(".", ref.name, ".removing-", RandomName());
  absl::StatusOr<std::vector<ChildMessage>> messages = RunIn(
      caller, ref.target_dir, kRemoveSnapshotJob, ArgsWriter().Add(ref.name).Add(doomed).Take(), {},
      absl::StrCat("remove snapshot ", where));
  return messages.status();
}

absl::StatusOr<std::unique_ptr<RestoredHeapDir>> SnapshotStore::Restore(
    const SnapshotCaller& caller, const SnapshotRef& ref, const std::string& heaps_dir,
    const std::string& heap_name, const RestoreOptions& options, v1::SnapshotManifest* manifest) {
  return RestoreWith(
      caller, Where(ref), /*own_dir=*/ref.target_dir.empty(),
      [&](int data_fd) -> absl::StatusOr<RestoreSource> {
        absl::StatusOr<Read> read = ReadSnapshot(caller, ref, data_fd, false, options.max_bytes);
        if (!read.ok()) return read.status();
        RestoreSource source;
        source.manifest_json = std::move(read->manifest_json);
        source.metadata_files = std::move(read->metadata_files);
        source.data_bytes = read->data_bytes;
        source.copied = read->copied;
        return source;
      },
      heaps_dir, heap_name, options, manifest);
}

absl::StatusOr<std::unique_ptr<RestoredHeapDir>> SnapshotStore::RestoreWith(
    const SnapshotCaller& caller, const std::string& where, bool own_dir, const Filler& fill,
    const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
    v1::SnapshotManifest* manifest) {
  // Removed on every failure below.
  absl::StatusOr<std::unique_ptr<HeapDirBuilder>> building =
      HeapDirBuilder::Start(heaps_dir, heap_name, HiddenPurpose::kRestoring);
  if (!building.ok()) return building.status();
  UniqueFd data(openat((*building)->dir_fd(), kDataFileName,
                       O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!data.valid()) return ErrnoStatus(errno, "create the restored heap's data file");
  absl::StatusOr<RestoreSource> read = fill(data.get());
  if (!read.ok()) return read.status();
  absl::StatusOr<VerifiedSnapshot> verified =
      VerifySnapshotFiles(where, read->manifest_json, read->metadata_files, read->data_bytes);
  if (!verified.ok()) return verified.status();
  if (own_dir) {
    if (absl::Status s = CheckOwnAccess(caller, verified->manifest, false); !s.ok()) return s;
  }
  // What was copied is what heapd holds now: check it, not the report.
  struct stat st;
  if (fstat(data.get(), &st) != 0) return ErrnoStatus(errno, "stat the restored data file");
  if (static_cast<uint64_t>(st.st_size) != verified->manifest.data_bytes()) {
    return absl::DataLossError(absl::StrCat("snapshot ", where, ": ", st.st_size,
                                            " bytes of data copied, its manifest says ",
                                            verified->manifest.data_bytes()));
  }
  Checkpoint state = std::move(verified->metadata.state);
  if (options.max_names != 0 && state.names.size() > options.max_names) {
    return absl::ResourceExhaustedError(absl::StrCat("snapshot ", where, " has ",
                                                     state.names.size(), " names; a heap may hold ",
                                                     options.max_names, " (--max_names_per_heap)"));
  }
  if (!options.keep_recorded_owner) {
    state.config.owner_uid = options.owner_uid;
    state.config.owner_gid = options.owner_gid;
  }
  if (state.config.max_size > options.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("snapshot ", where, " is of a heap of maximum size ", state.config.max_size,
                     "; at most ", options.max_bytes, " bytes are allowed here"));
  }
  if (absl::Status s = ReserveFile(data.get(), static_cast<uint64_t>(st.st_size),
                                   absl::StrCat("restored heap ", heap_name));
      !s.ok()) {
    return s;
  }
  // The metadata is heapd's own from here: written anew from the checked
  // state, with the new owner, in heapd's own directory.
  state.log_generation = 0;
  absl::StatusOr<UniqueFd> metadata_dir = (*building)->DupDirFd();
  if (!metadata_dir.ok()) return metadata_dir.status();
  absl::StatusOr<std::unique_ptr<MetadataStore>> store =
      MetadataStore::CreateAt(*std::move(metadata_dir), (*building)->path(), state);
  if (!store.ok()) return store.status();
  *manifest = verified->manifest;
  manifest->set_copy_method(CopyMethodName(read->copied.method));
  manifest->set_bytes_written(read->copied.bytes_written);
  return std::make_unique<RestoredHeapDir>(*std::move(building), state.config);
}

absl::StatusOr<std::unique_ptr<PersistentHeap>> SnapshotStore::OpenInPlace(
    const SnapshotCaller& caller, const SnapshotRef& ref, uint64_t max_bytes, uint64_t max_names,
    v1::SnapshotManifest* manifest) {
  absl::StatusOr<Read> read = ReadSnapshot(caller, ref, -1, true, max_bytes);
  if (!read.ok()) return read.status();
  const std::string where = Where(ref);
  absl::StatusOr<VerifiedSnapshot> verified =
      VerifySnapshotFiles(where, read->manifest_json, read->metadata_files, read->data_bytes);
  if (!verified.ok()) return verified.status();
  if (ref.target_dir.empty()) {
    if (absl::Status s = CheckOwnAccess(caller, verified->manifest, false); !s.ok()) return s;
  }
  if (max_names != 0 && verified->metadata.state.names.size() > max_names) {
    return absl::ResourceExhaustedError(
        absl::StrCat("snapshot ", where, " has ", verified->metadata.state.names.size(),
                     " names; a heap may hold ", max_names, " (--max_names_per_heap)"));
  }
  *manifest = verified->manifest;
  return PersistentHeap::OpenSnapshot(absl::StrCat("snapshot ", where), std::move(read->data_fd),
                                      verified->metadata);
}

}  // namespace heapd
