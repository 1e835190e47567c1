#include "heap/redo_log.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/dir_files.h"
#include "util/errno_status.h"

// XXH3 inlined from the header: no library to load at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace heapd {
namespace {

constexpr char kFileMagic[8] = {'H', 'E', 'A', 'P', 'D', 'R', 'D', 'O'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kRecordMagic = 0x31525248;  // "HRR1"
// Where block 0 holds its two header slots: different sectors, so one
// torn write cannot damage both.
constexpr uint64_t kSlotOffsets[2] = {0, kRedoBlockBytes / 2};
// The most a log holds (a petabyte): keeps every offset a valid off_t.
constexpr uint64_t kMaxCapacity = uint64_t{1} << 50;

// One header slot in block 0.
struct HeaderSlot {
  char magic[8];
  uint32_t version;
  uint32_t block_bytes;
  uint64_t blocks;      // in the file, block 0 included
  uint64_t pass;        // records of other passes are stale
  uint64_t generation;  // the slot with the higher one is the header
  // The heap's epoch whose pages the image held when this pass began:
  // the committed epoch, if no record of a later one follows.
  uint64_t applied_epoch;
  uint64_t hash;  // of this struct with hash 0
};

// A record's first block; its pages follow.
struct RecordHeader {
  uint32_t magic;
  uint32_t pages;
  uint64_t pass;
  uint64_t append_id;  // random per Append
  uint64_t epoch;
  uint64_t previous_hash;  // header_hash of the record before (the first: ChainStart)
  uint64_t data_hash;      // of the pages
  uint64_t header_hash;    // of the whole block with this field 0
  uint64_t offsets[(kRedoBlockBytes - 56) / sizeof(uint64_t)];
};
static_assert(sizeof(RecordHeader) <= kRedoBlockBytes, "a record header is one block");
constexpr uint64_t kPagesPerRecord = sizeof(RecordHeader::offsets) / sizeof(uint64_t);

// XXH3, 64 bits: checks torn writes at memory speed (zlib's CRC-32 ran at
// 1.9 GB/s, the log's bottleneck), and links the chain with 64 bits.
uint64_t Hash(const void* bytes, uint64_t size) { return XXH3_64bits(bytes, size); }

uint64_t HeaderHash(const char* block) {
  char copy[kRedoBlockBytes];
  std::memcpy(copy, block, kRedoBlockBytes);
  reinterpret_cast<RecordHeader*>(copy)->header_hash = 0;
  return Hash(copy, kRedoBlockBytes);
}

uint64_t SlotHash(HeaderSlot slot) {
  slot.hash = 0;
  return Hash(&slot, sizeof(slot));
}

// What the first record of `pass` names as the record before it.
uint64_t ChainStart(uint64_t pass) { return Hash(&pass, sizeof(pass)); }

uint64_t Random64() {
  std::random_device random;
  return (uint64_t{random()} << 32) ^ random();
}

// Memory aligned for O_DIRECT (a block; DirectIoFits checks it is enough).
struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t bytes) {
    void* memory = nullptr;
    if (posix_memalign(&memory, kRedoBlockBytes, bytes) == 0) data = static_cast<char*>(memory);
  }
  ~AlignedBuffer() { free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data = nullptr;
};

// Whether the file `name` in `dir` takes O_DIRECT I/O in whole blocks from
// block-aligned memory.
bool DirectIoFits(int dir, const std::string& name) {
  struct statx info {};
  if (statx(dir, name.c_str(), AT_SYMLINK_NOFOLLOW, STATX_DIOALIGN, &info) != 0) return false;
  return (info.stx_mask & STATX_DIOALIGN) != 0 && info.stx_dio_offset_align != 0 &&
         kRedoBlockBytes % info.stx_dio_offset_align == 0 && info.stx_dio_mem_align != 0 &&
         kRedoBlockBytes % info.stx_dio_mem_align == 0;
}

// A valid record as read: its header block and its pages.
struct ReadRecord {
  const RecordHeader* header;
  const char* pages;
};

}  // namespace

uint64_t RedoLog::PagesPerRecord() { return kPagesPerRecord; }

uint64_t RedoLog::BytesFor(uint64_t pages) {
  // At least one record: an epoch without pages still writes its header.
  const uint64_t records = std::max<uint64_t>(1, (pages + kPagesPerRecord - 1) / kPagesPerRecord);
  return (records + pages) * kRedoBlockBytes;
}

RedoLog::RedoLog(UniqueFd fd, std::string path, uint64_t blocks, bool direct)
    : fd_(std::move(fd)), path_(std::move(path)), blocks_(blocks), direct_(direct) {}

RedoLog::~RedoLog() = default;

absl::StatusOr<std::unique_ptr<RedoLog>> RedoLog::Create(int dir, const std::string& name,
                                                         uint64_t capacity, const std::string& path,
                                                         uint64_t applied_epoch) {
  if (capacity == 0 || capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("redo log ", path, ": a capacity of ", capacity,
                                                   " bytes; it holds 1 to ", kMaxCapacity));
  }
  struct stat st;
  if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("redo log ", path, " already exists"));
  }
  // Built under a temporary name (a crash leaves only that, cleared by the
  // next Create) and renamed into place when whole.
  const std::string building = name + ".new";
  unlinkat(dir, building.c_str(), 0);
  const uint64_t blocks = 1 + (capacity + kRedoBlockBytes - 1) / kRedoBlockBytes;
  UniqueFd fd(
      openat(dir, building.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create redo log ", path));
  auto fail = [&](absl::Status status) {
    unlinkat(dir, building.c_str(), 0);
    return status;
  };
  if (const int error = posix_fallocate(fd.get(), 0, static_cast<off_t>(blocks * kRedoBlockBytes));
      error != 0) {
    return fail(ErrnoStatus(
        error, absl::StrCat("reserve ", blocks * kRedoBlockBytes, " bytes for redo log ", path)));
  }
  // Written through once: an unwritten extent would make every later
  // fdatasync journal its conversion.
  const std::string zeros(uint64_t{1} << 20, '\0');
  for (uint64_t at = 0; at < blocks * kRedoBlockBytes; at += zeros.size()) {
    const uint64_t step = std::min<uint64_t>(zeros.size(), blocks * kRedoBlockBytes - at);
    if (!WriteAllAt(fd.get(), absl::string_view(zeros.data(), step), at)) {
      return fail(ErrnoStatus(errno, absl::StrCat("write zeros through redo log ", path)));
    }
  }
  {
    RedoLog log(std::move(fd), path, blocks, /*direct=*/false);
    log.next_.pass = Random64();
    log.applied_epoch_ = applied_epoch;
    if (absl::Status s = log.WriteHeader(); !s.ok()) return fail(s);  // ends with fdatasync
  }
  if (renameat2(dir, building.c_str(), dir, name.c_str(), RENAME_NOREPLACE) != 0) {
    return fail(ErrnoStatus(errno, absl::StrCat("rename redo log ", path, " into place")));
  }
  if (fsync(dir) != 0) return ErrnoStatus(errno, absl::StrCat("fsync the directory of ", path));
  absl::StatusOr<std::unique_ptr<RedoLog>> log = Open(dir, name, path);
  if (log.ok()) {  // nothing to replay or apply in a new log
    (*log)->replayed_ = true;
    (*log)->applied_block_ = (*log)->next_.block;
    (*log)->committed_epoch_ = applied_epoch;  // Append takes only later epochs
  }
  return log;
}

absl::StatusOr<std::unique_ptr<RedoLog>> RedoLog::Open(int dir, const std::string& name,
                                                       const std::string& path) {
  const bool direct = DirectIoFits(dir, name);
  UniqueFd fd(openat(dir, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | (direct ? O_DIRECT : 0)));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open redo log ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(2 * kRedoBlockBytes) ||
      st.st_size % kRedoBlockBytes != 0) {
    return absl::DataLossError(
        absl::StrCat("redo log ", path, " is not a redo log (", st.st_size, " bytes)"));
  }
  std::unique_ptr<RedoLog> log(new RedoLog(
      std::move(fd), path, static_cast<uint64_t>(st.st_size) / kRedoBlockBytes, direct));
  if (absl::Status s = log->ReadHeader(); !s.ok()) return s;
  if (absl::Status s = log->Scan(); !s.ok()) return s;
  return log;
}

absl::Status RedoLog::ReadHeader() {
  AlignedBuffer block(kRedoBlockBytes);
  if (block.data == nullptr) return absl::ResourceExhaustedError("no memory for a redo log block");
  if (absl::Status s = ReadBlocks(0, block.data, 1); !s.ok()) return s;
  bool found = false;
  std::string refused;
  for (const uint64_t offset : kSlotOffsets) {
    HeaderSlot slot;
    std::memcpy(&slot, block.data + offset, sizeof(slot));
    if (std::memcmp(slot.magic, kFileMagic, sizeof(kFileMagic)) != 0 ||
        slot.hash != SlotHash(slot)) {
      continue;  // torn, or never written
    }
    if (slot.version != kFormatVersion || slot.block_bytes != kRedoBlockBytes ||
        slot.blocks != blocks_) {
      refused = absl::StrCat("format ", slot.version, ", blocks of ", slot.block_bytes, " bytes, ",
                             slot.blocks, " blocks; this heapd reads format ", kFormatVersion,
                             " of this file's ", blocks_, " blocks");
      continue;
    }
    if (!found || slot.generation > generation_) {
      found = true;
      generation_ = slot.generation;
      applied_epoch_ = slot.applied_epoch;
      next_.pass = slot.pass;
    }
  }
  if (!found) {
    return absl::DataLossError(absl::StrCat("redo log ", path_, ": ",
                                            refused.empty() ? "its header is damaged" : refused));
  }
  return absl::OkStatus();
}

absl::Status RedoLog::WriteHeader() {
  // The block as it is, the slot of generation_ rewritten: the other slot's
  // bytes are written unchanged.
  AlignedBuffer block(kRedoBlockBytes);
  if (block.data == nullptr) return absl::ResourceExhaustedError("no memory for a redo log block");
  if (absl::Status s = ReadBlocks(0, block.data, 1); !s.ok()) return s;
  HeaderSlot slot{};
  std::memcpy(slot.magic, kFileMagic, sizeof(kFileMagic));
  slot.version = kFormatVersion;
  slot.block_bytes = kRedoBlockBytes;
  slot.blocks = blocks_;
  slot.pass = next_.pass;
  slot.generation = generation_;
  slot.applied_epoch = applied_epoch_;
  slot.hash = SlotHash(slot);
  std::memcpy(block.data + kSlotOffsets[generation_ % 2], &slot, sizeof(slot));
  if (absl::Status s = WriteBlocks(0, block.data, 1); !s.ok()) return s;
  if (fdatasync(fd_.get()) != 0) return ErrnoStatus(errno, absl::StrCat("fdatasync ", path_));
  return absl::OkStatus();
}

namespace {

// Calls `visit` for each record of the chain of `pass` from block 1 on, in
// order, up to `blocks`: each names the checksum of the one before it
// (the first, ChainStart). Returns where the next record would go. Without
// `with_pages`, only headers are read (pages null, their hash unchecked):
// for records read whole once already.
template <typename Visit>
absl::StatusOr<RedoLog::Position> ForEachRecord(
    uint64_t pass, uint64_t blocks,
    const std::function<absl::Status(uint64_t, char*, uint64_t)>& read, Visit visit,
    bool with_pages = true) {
  RedoLog::Position end;
  end.pass = pass;
  end.last_hash = ChainStart(pass);
  AlignedBuffer buffer((1 + kPagesPerRecord) * kRedoBlockBytes);
  if (buffer.data == nullptr) return absl::ResourceExhaustedError("no memory for a redo record");
  while (end.block < blocks) {
    if (absl::Status s = read(end.block, buffer.data, 1); !s.ok()) return s;
    const auto* header = reinterpret_cast<const RecordHeader*>(buffer.data);
    if (header->magic != kRecordMagic || header->pass != pass || header->pages > kPagesPerRecord ||
        header->pages >= blocks - end.block || header->previous_hash != end.last_hash ||
        header->header_hash != HeaderHash(buffer.data)) {
      break;
    }
    if (with_pages) {
      if (absl::Status s = read(end.block + 1, buffer.data + kRedoBlockBytes, header->pages);
          !s.ok()) {
        return s;
      }
      if (header->data_hash !=
          Hash(buffer.data + kRedoBlockBytes, header->pages * kRedoBlockBytes)) {
        break;
      }
    }
    if (absl::Status s =
            visit(ReadRecord{header, with_pages ? buffer.data + kRedoBlockBytes : nullptr});
        !s.ok()) {
      return s;
    }
    end.block += 1 + header->pages;
    end.last_epoch = header->epoch;
    end.last_hash = header->header_hash;
  }
  return end;
}

}  // namespace

absl::Status RedoLog::Scan() {
  absl::StatusOr<Position> end = ForEachRecord(
      next_.pass, blocks_,
      [this](uint64_t block, char* into, uint64_t count) { return ReadBlocks(block, into, count); },
      [](const ReadRecord&) { return absl::OkStatus(); });
  if (!end.ok()) return end.status();
  next_ = *end;
  return absl::OkStatus();
}

absl::StatusOr<RedoLog::Position> RedoLog::WalkCommitted(
    uint64_t committed_epoch, bool with_pages,
    const std::function<absl::Status(uint64_t offset, absl::string_view page)>& page) const {
  Position committed;  // the end of the committed records
  committed.pass = next_.pass;
  committed.last_hash = ChainStart(next_.pass);
  bool past = false;  // a record of an epoch not committed was seen
  absl::StatusOr<Position> end = ForEachRecord(
      next_.pass, next_.block,
      [this](uint64_t block, char* into, uint64_t count) { return ReadBlocks(block, into, count); },
      [&](const ReadRecord& record) {
        past = past || record.header->epoch > committed_epoch;
        if (past) return absl::OkStatus();
        for (uint32_t i = 0; i < record.header->pages; ++i) {
          const uint64_t offset = record.header->offsets[i];
          if (offset % kRedoBlockBytes != 0) {
            return absl::DataLossError(absl::StrCat("redo log ", path_, ": a record names offset ",
                                                    offset, ", not a page's"));
          }
          const absl::string_view bytes =
              with_pages ? absl::string_view(record.pages + i * kRedoBlockBytes, kRedoBlockBytes)
                         : absl::string_view();
          if (absl::Status s = page(offset, bytes); !s.ok()) return s;
        }
        committed.block += 1 + record.header->pages;
        committed.last_epoch = record.header->epoch;
        committed.last_hash = record.header->header_hash;
        return absl::OkStatus();
      },
      with_pages);
  if (!end.ok()) return end.status();
  // Every committed epoch wrote a record (or was applied before the pass
  // began): one missing is a committed record that no longer reads back.
  const uint64_t reached = committed.block == 1 ? applied_epoch_ : committed.last_epoch;
  if (reached != committed_epoch) {
    return absl::DataLossError(absl::StrCat("redo log ", path_, ": epoch ", committed_epoch,
                                            " is committed, but the log reaches epoch ", reached,
                                            " only"));
  }
  return committed;
}

absl::Status RedoLog::Replay(
    uint64_t committed_epoch,
    const std::function<absl::Status(uint64_t offset, absl::string_view page)>& apply) {
  replayed_ = false;
  last_append_.reset();
  absl::StatusOr<Position> committed = WalkCommitted(committed_epoch, /*with_pages=*/true, apply);
  if (!committed.ok()) return committed.status();
  next_ = *committed;
  committed_epoch_ = std::max(committed_epoch_, committed_epoch);
  replayed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RedoLog::ApplyTo(int image, uint64_t committed_epoch) {
  // Pages are numbered in log order. The headers alone (the records were
  // read whole when the log was opened or written) say each offset's last
  // copy and where the committed records end; then those records are read
  // whole, in order, each writing the pages that are last copies: the log
  // is read once, every page written once, consecutive pages in one write.
  replayed_ = false;
  last_append_.reset();
  std::map<uint64_t, uint64_t> last;  // offset -> number of its last copy
  uint64_t number = 0;
  absl::StatusOr<Position> committed =
      WalkCommitted(committed_epoch, /*with_pages=*/false, [&](uint64_t offset, absl::string_view) {
        last[offset] = number++;
        return absl::OkStatus();
      });
  if (!committed.ok()) return committed.status();
  const auto read_blocks = [this](uint64_t block, char* into, uint64_t count) {
    return ReadBlocks(block, into, count);
  };
  uint64_t written = 0;
  number = 0;
  absl::StatusOr<Position> walked = ForEachRecord(
      next_.pass, committed->block, read_blocks, [&](const ReadRecord& record) -> absl::Status {
        const uint64_t* offsets = record.header->offsets;
        const uint32_t pages = record.header->pages;
        for (uint32_t i = 0; i < pages;) {
          // A run of last copies at consecutive offsets.
          uint32_t run = 0;
          while (i + run < pages && last[offsets[i + run]] == number + i + run &&
                 offsets[i + run] == offsets[i] + uint64_t{run} * kRedoBlockBytes) {
            ++run;
          }
          if (run == 0) {
            ++i;
            continue;
          }
          const absl::string_view bytes(record.pages + uint64_t{i} * kRedoBlockBytes,
                                        uint64_t{run} * kRedoBlockBytes);
          if (!WriteAllAt(image, bytes, offsets[i])) {
            return ErrnoStatus(errno, absl::StrCat("write ", run, " pages at ", offsets[i],
                                                   " from redo log ", path_, " into its image"));
          }
          written += run;
          i += run;
        }
        number += pages;
        return absl::OkStatus();
      });
  if (!walked.ok()) return walked.status();
  if (walked->block != committed->block) {
    return absl::DataLossError(absl::StrCat("redo log ", path_, ": the record at block ",
                                            walked->block, " no longer reads back as written"));
  }
  if (fdatasync(image) != 0) {
    return ErrnoStatus(errno, absl::StrCat("fdatasync the image of redo log ", path_));
  }
  next_ = *committed;
  committed_epoch_ = std::max(committed_epoch_, committed_epoch);
  applied_block_ = next_.block;
  replayed_ = true;
  return written;
}

absl::StatusOr<RedoLog::Position> RedoLog::Append(uint64_t epoch,
                                                  const std::vector<uint64_t>& offsets, int source,
                                                  const PagePatch& patch) {
  last_append_.reset();  // only the last successful Append can be taken back
  if (!broken_.ok()) return broken_;
  if (!replayed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("redo log ", path_, ": replay it before appending"));
  }
  struct stat data;
  if (fstat(source, &data) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat the heap's data for redo log ", path_));
  }
  for (uint64_t offset : offsets) {
    if (offset % kRedoBlockBytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("redo log ", path_, ": offset ", offset, " is not a page's"));
    }
    const uint64_t size = static_cast<uint64_t>(data.st_size);
    if (offset > size || size - offset < kRedoBlockBytes) {
      return absl::OutOfRangeError(absl::StrCat("redo log ", path_, ": page ", offset,
                                                " is past the end of the heap's data (",
                                                data.st_size, " bytes)"));
    }
  }
  if (epoch <= std::max(next_.last_epoch, committed_epoch_)) {
    return absl::InvalidArgumentError(absl::StrCat("redo log ", path_, ": epoch ", epoch,
                                                   " is not after epoch ",
                                                   std::max(next_.last_epoch, committed_epoch_)));
  }
  const uint64_t needed = BytesFor(offsets.size());
  if (needed > capacity() - used_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("redo log ", path_, ": ", offsets.size(), " pages need ", needed, " bytes; ",
                     capacity() - used_bytes(), " of its ", capacity(), " are left"));
  }
  const uint64_t append_id = Random64();
  // Records are filled into kBuffers buffers in turn, while up to
  // kBuffers - 1 are written, each by a thread of its own (~50 us against
  // a 2 MiB write); a buffer is filled again once its write ended.
  constexpr size_t kBuffers = 3;
  std::unique_ptr<AlignedBuffer> buffers[kBuffers];
  std::future<absl::Status> writes[kBuffers];
  Position at = next_;
  absl::Status status;
  for (size_t first = 0, record = 0; first < offsets.size() || record == 0; ++record) {
    const size_t pages = std::min<size_t>(kPagesPerRecord, offsets.size() - first);
    const size_t slot = record % kBuffers;
    if (writes[slot].valid()) status.Update(writes[slot].get());
    if (!status.ok()) break;
    if (buffers[slot] == nullptr) {
      buffers[slot] = std::make_unique<AlignedBuffer>((1 + kPagesPerRecord) * kRedoBlockBytes);
    }
    char* const buffer = buffers[slot]->data;
    if (buffer == nullptr) {
      status = absl::ResourceExhaustedError("no memory for a redo record");
      break;
    }
    status = FillRecord(epoch, append_id, at.last_hash, offsets.data() + first, pages, source,
                        patch, buffer);
    if (!status.ok()) break;
    try {
      writes[slot] = std::async(std::launch::async, [this, block = at.block, buffer, pages] {
        return WriteBlocks(block, buffer, 1 + pages);
      });
    } catch (const std::system_error& error) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("redo log ", path_, ": no thread to write with: ", error.what()));
      break;
    }
    at.block += 1 + pages;
    at.last_hash = reinterpret_cast<const RecordHeader*>(buffer)->header_hash;
    first += pages;
  }
  for (std::future<absl::Status>& write : writes) {
    if (write.valid()) status.Update(write.get());
  }
  if (status.ok() && fdatasync(fd_.get()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("fdatasync redo log ", path_));
  }
  // On failure the next Append writes here again; what this one wrote
  // names its own records and never continues the chain.
  if (!status.ok()) return status;
  const Position start = next_;
  at.last_epoch = epoch;
  next_ = at;
  last_append_ = start;
  return start;
}

absl::Status RedoLog::FillRecord(uint64_t epoch, uint64_t append_id, uint64_t previous_hash,
                                 const uint64_t* offsets, size_t pages, int source,
                                 const PagePatch& patch, char* buffer) const {
  std::memset(buffer, 0, kRedoBlockBytes);
  char* const data = buffer + kRedoBlockBytes;
  // Consecutive pages are read in one call.
  for (size_t i = 0; i < pages;) {
    size_t run = 1;
    while (i + run < pages && offsets[i + run] == offsets[i] + run * kRedoBlockBytes) ++run;
    if (!ReadAllAt(source, data + i * kRedoBlockBytes, run * kRedoBlockBytes, offsets[i])) {
      return ErrnoStatus(errno, absl::StrCat("read ", run, " pages at ", offsets[i],
                                             " of the heap's data for redo log ", path_));
    }
    i += run;
  }
  if (patch != nullptr && pages != 0) {
    if (absl::Status s = patch(offsets, pages, data); !s.ok()) return s;
  }
  auto* header = reinterpret_cast<RecordHeader*>(buffer);
  header->magic = kRecordMagic;
  header->pages = static_cast<uint32_t>(pages);
  header->pass = next_.pass;
  header->append_id = append_id;
  header->epoch = epoch;
  header->previous_hash = previous_hash;
  std::copy(offsets, offsets + pages, header->offsets);
  header->data_hash = Hash(data, pages * kRedoBlockBytes);
  header->header_hash = HeaderHash(buffer);
  return absl::OkStatus();
}

absl::Status RedoLog::RewindTo(const Position& start) {
  const Position* last = last_append_ ? &*last_append_ : nullptr;
  if (last == nullptr || last->pass != start.pass || last->block != start.block ||
      last->last_epoch != start.last_epoch || last->last_hash != start.last_hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        "redo log ", path_, ": only the last Append can be taken back, once (asked: block ",
        start.block, " of pass ", start.pass, ")"));
  }
  next_ = start;
  last_append_.reset();
  return absl::OkStatus();
}

absl::Status RedoLog::RestartAt(uint64_t applied_epoch) {
  if (used_bytes() != 0 && applied_block_ != next_.block) {
    return absl::FailedPreconditionError(
        absl::StrCat("redo log ", path_, ": restarted before its records were applied"));
  }
  applied_block_ = next_.block;
  committed_epoch_ = std::max(committed_epoch_, applied_epoch);
  if (absl::Status s = Reset(); !s.ok()) return s;
  replayed_ = true;  // a new pass: nothing to replay
  return absl::OkStatus();
}

absl::Status RedoLog::Reset() {
  if (applied_block_ != next_.block) {
    return absl::FailedPreconditionError(
        absl::StrCat("redo log ", path_, ": reset before its records were applied (ApplyTo)"));
  }
  last_append_.reset();
  // The new pass goes into the slot not in use; until it is durable the
  // old one stays the header. A failure leaves either on disk: Append
  // refuses until a Reset succeeds.
  const Position before = next_;
  const uint64_t generation = generation_;
  const uint64_t applied_epoch = applied_epoch_;
  applied_epoch_ = committed_epoch_;
  next_ = Position();
  next_.pass = Random64();
  next_.last_hash = ChainStart(next_.pass);
  ++generation_;
  if (absl::Status s = WriteHeader(); !s.ok()) {
    next_ = before;
    generation_ = generation;
    applied_epoch_ = applied_epoch;
    broken_ = s;
    return s;
  }
  broken_ = absl::OkStatus();
  applied_block_ = next_.block;
  return absl::OkStatus();
}

absl::Status RedoLog::WriteBlocks(uint64_t block, const char* bytes, uint64_t count) const {
  if (!WriteAllAt(fd_.get(), absl::string_view(bytes, count * kRedoBlockBytes),
                  block * kRedoBlockBytes)) {
    return ErrnoStatus(
        errno, absl::StrCat("write ", count, " blocks at block ", block, " of redo log ", path_));
  }
  return absl::OkStatus();
}

absl::Status RedoLog::ReadBlocks(uint64_t block, char* bytes, uint64_t count) const {
  if (!ReadAllAt(fd_.get(), bytes, count * kRedoBlockBytes, block * kRedoBlockBytes)) {
    return ErrnoStatus(
        errno, absl::StrCat("read ", count, " blocks at block ", block, " of redo log ", path_));
  }
  return absl::OkStatus();
}

}  // namespace heapd
