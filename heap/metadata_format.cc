#include "heap/metadata_format.h"

#include <zlib.h>

#include <cstring>

#include "absl/strings/str_cat.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "heapd's metadata format is little-endian");

namespace heapd {
namespace {

class ByteWriter {
 public:
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void PutString(absl::string_view s) {
    Put(static_cast<uint16_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// Reads fields in order; the first overrun sets an error and every later
// read returns zero, so decoders check ok() once per entry.
class ByteReader {
 public:
  ByteReader(absl::string_view in, absl::string_view file) : in_(in), file_(file) {}
  template <typename T>
  T Get() {
    T value{};
    if (!Need(sizeof(T))) return value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string GetString() {
    const uint16_t size = Get<uint16_t>();
    if (!Need(size)) return {};
    std::string s(in_.substr(pos_, size));
    pos_ += size;
    return s;
  }
  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  void Fail(absl::string_view what) {
    if (status_.ok()) {
      status_ = absl::DataLossError(
          absl::StrCat("metadata file ", file_, ": ", what, " at payload byte ", pos_));
    }
  }
  absl::Status Finish() {
    if (status_.ok() && pos_ != in_.size()) Fail("trailing bytes");
    return status_;
  }

 private:
  bool Need(size_t n) {
    if (!status_.ok()) return false;
    if (in_.size() - pos_ < n) {
      Fail("truncated payload");
      return false;
    }
    return true;
  }
  absl::string_view in_;
  absl::string_view file_;
  size_t pos_ = 0;
  absl::Status status_;
};

void PutChunk(ByteWriter& w, const ChunkRecord& c) {
  w.Put<uint32_t>(c.chunk);
  w.Put<uint8_t>(static_cast<uint8_t>(c.kind));
  if (c.kind == ChunkKind::kSmall) {
    w.Put<uint8_t>(static_cast<uint8_t>(c.size_class));
    w.Put<uint32_t>(static_cast<uint32_t>(c.words.size()));
    w.out().append(reinterpret_cast<const char*>(c.words.data()),
                   c.words.size() * sizeof(uint64_t));
  } else if (c.kind == ChunkKind::kLargeHead) {
    w.Put<uint32_t>(c.run_chunks);
  }
}

ChunkRecord GetChunk(ByteReader& r) {
  ChunkRecord c;
  c.chunk = r.Get<uint32_t>();
  const uint8_t kind = r.Get<uint8_t>();
  switch (kind) {
    case static_cast<uint8_t>(ChunkKind::kFree):
      c.kind = ChunkKind::kFree;
      break;
    case static_cast<uint8_t>(ChunkKind::kSmall): {
      c.kind = ChunkKind::kSmall;
      c.size_class = r.Get<uint8_t>();
      const uint32_t words = r.Get<uint32_t>();
      if (words > SlotBitmap::WordCount(SlotsPerChunk(0))) {
        r.Fail(absl::StrCat("chunk ", c.chunk, " has a bitmap of ", words, " words"));
        break;
      }
      c.words.resize(words);
      for (uint64_t& word : c.words) word = r.Get<uint64_t>();
      break;
    }
    case static_cast<uint8_t>(ChunkKind::kLargeHead):
      c.kind = ChunkKind::kLargeHead;
      c.run_chunks = r.Get<uint32_t>();
      break;
    default:
      r.Fail(absl::StrCat("chunk ", c.chunk, " has unknown kind ", kind));
  }
  return c;
}

void PutName(ByteWriter& w, const NameEntry& e) {
  w.PutString(e.name);
  w.Put<uint64_t>(e.offset);
  w.Put<uint64_t>(e.size);
  w.PutString(e.type_name);
  w.Put<uint32_t>(e.owner_uid);
  w.Put<int64_t>(e.created_unix_ns);
}

NameEntry GetName(ByteReader& r) {
  NameEntry e;
  e.name = r.GetString();
  e.offset = r.Get<uint64_t>();
  e.size = r.Get<uint64_t>();
  e.type_name = r.GetString();
  e.owner_uid = r.Get<uint32_t>();
  e.created_unix_ns = r.Get<int64_t>();
  return e;
}

// Reads a u32 count and that many entries. The vector grows only as entries
// are read, so a corrupt count cannot make it allocate more than the payload.
template <typename T, typename GetOne>
std::vector<T> GetList(ByteReader& r, GetOne get_one) {
  const uint32_t count = r.Get<uint32_t>();
  std::vector<T> list;
  for (uint32_t i = 0; i < count && r.ok(); ++i) list.push_back(get_one(r));
  return list;
}

uint32_t FrameCrc(absl::string_view header_tail, absl::string_view payload) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(header_tail.data()), header_tail.size());
  crc = crc32(crc, reinterpret_cast<const Bytef*>(payload.data()), payload.size());
  return static_cast<uint32_t>(crc);
}

std::string Frame(FrameKind kind, const std::string& payload, uint16_t version = kFormatVersion) {
  ByteWriter tail;
  tail.Put<uint16_t>(version);
  tail.Put<uint16_t>(static_cast<uint16_t>(kind));
  tail.Put<uint32_t>(static_cast<uint32_t>(payload.size()));
  ByteWriter frame;
  frame.Put<uint32_t>(kFrameMagic);
  frame.out().append(tail.out());
  frame.Put<uint32_t>(FrameCrc(tail.out(), payload));
  frame.out().append(payload);
  return std::move(frame.out());
}

}  // namespace

std::string EncodeCheckpoint(const Checkpoint& cp) {
  ByteWriter w;
  w.Put<uint64_t>(cp.config.max_size);
  w.Put<uint32_t>(cp.config.owner_uid);
  w.Put<uint32_t>(cp.config.owner_gid);
  w.Put<uint32_t>(cp.config.mode);
  w.Put<int64_t>(cp.config.created_unix_ns);
  w.Put<uint64_t>(cp.epoch);
  w.Put<uint64_t>(cp.log_generation);
  w.Put<uint32_t>(cp.capacity_chunks);
  w.Put<uint32_t>(static_cast<uint32_t>(cp.chunks.size()));
  for (const ChunkRecord& c : cp.chunks) PutChunk(w, c);
  w.Put<uint32_t>(static_cast<uint32_t>(cp.names.size()));
  for (const NameEntry& e : cp.names) PutName(w, e);
  if (cp.config.fixed_base != 0) {
    w.Put<uint32_t>(static_cast<uint32_t>(cp.config.image));
    w.Put<uint64_t>(cp.config.fixed_base);
    return Frame(FrameKind::kCheckpoint, w.out(), kFixedAddressFormatVersion);
  }
  if (cp.config.image == ImageMode::kDirect) return Frame(FrameKind::kCheckpoint, w.out());
  w.Put<uint32_t>(static_cast<uint32_t>(cp.config.image));
  return Frame(FrameKind::kCheckpoint, w.out(), kWorkingImageFormatVersion);
}

std::string EncodeEpochRecord(const EpochRecord& record) {
  ByteWriter w;
  w.Put<uint64_t>(record.epoch);
  w.Put<uint32_t>(record.capacity_chunks);
  w.Put<uint32_t>(static_cast<uint32_t>(record.chunks.size()));
  for (const ChunkRecord& c : record.chunks) PutChunk(w, c);
  w.Put<uint32_t>(static_cast<uint32_t>(record.names.bound.size()));
  for (const NameEntry& e : record.names.bound) PutName(w, e);
  w.Put<uint32_t>(static_cast<uint32_t>(record.names.unbound.size()));
  for (const std::string& name : record.names.unbound) w.PutString(name);
  return Frame(FrameKind::kEpoch, w.out());
}

const char* ImageModeName(ImageMode mode) {
  return mode == ImageMode::kWorkingImage ? "working image" : "direct";
}

absl::StatusOr<DecodedFrame> DecodeFrame(absl::string_view bytes, absl::string_view file) {
  if (bytes.size() < kFrameHeaderSize) {
    return absl::DataLossError(absl::StrCat("metadata file ", file, ": truncated frame header (",
                                            bytes.size(), " bytes)"));
  }
  uint32_t magic, length, crc;
  uint16_t version, kind;
  std::memcpy(&magic, bytes.data(), 4);
  std::memcpy(&version, bytes.data() + 4, 2);
  std::memcpy(&kind, bytes.data() + 6, 2);
  std::memcpy(&length, bytes.data() + 8, 4);
  std::memcpy(&crc, bytes.data() + 12, 4);
  if (magic != kFrameMagic) {
    return absl::DataLossError(
        absl::StrCat("metadata file ", file, ": bad magic 0x", absl::Hex(magic)));
  }
  if (version < kFormatVersion || version > kFixedAddressFormatVersion) {
    return absl::DataLossError(absl::StrCat("metadata file ", file, ": format version ", version,
                                            ", this heapd reads ", kFormatVersion, " to ",
                                            kFixedAddressFormatVersion));
  }
  if (bytes.size() - kFrameHeaderSize < length) {
    return absl::DataLossError(absl::StrCat("metadata file ", file, ": frame of ", length,
                                            " payload bytes is truncated at ",
                                            bytes.size() - kFrameHeaderSize));
  }
  const absl::string_view payload = bytes.substr(kFrameHeaderSize, length);
  if (FrameCrc(bytes.substr(4, 8), payload) != crc) {
    return absl::DataLossError(absl::StrCat("metadata file ", file, ": checksum mismatch"));
  }
  if (kind != static_cast<uint16_t>(FrameKind::kCheckpoint) &&
      kind != static_cast<uint16_t>(FrameKind::kEpoch)) {
    return absl::DataLossError(absl::StrCat("metadata file ", file, ": unknown frame kind ", kind));
  }
  return DecodedFrame{static_cast<FrameKind>(kind), version, payload, kFrameHeaderSize + length};
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(absl::string_view payload, absl::string_view file,
                                            uint16_t version) {
  ByteReader r(payload, file);
  Checkpoint cp;
  cp.config.max_size = r.Get<uint64_t>();
  cp.config.owner_uid = r.Get<uint32_t>();
  cp.config.owner_gid = r.Get<uint32_t>();
  cp.config.mode = r.Get<uint32_t>();
  cp.config.created_unix_ns = r.Get<int64_t>();
  cp.epoch = r.Get<uint64_t>();
  cp.log_generation = r.Get<uint64_t>();
  cp.capacity_chunks = r.Get<uint32_t>();
  cp.chunks = GetList<ChunkRecord>(r, GetChunk);
  cp.names = GetList<NameEntry>(r, GetName);
  if (version >= kWorkingImageFormatVersion) {
    const uint32_t image = r.Get<uint32_t>();
    const uint32_t lowest = version == kWorkingImageFormatVersion
                                ? static_cast<uint32_t>(ImageMode::kWorkingImage)
                                : static_cast<uint32_t>(ImageMode::kDirect);
    if (r.ok() && (image < lowest || image > static_cast<uint32_t>(ImageMode::kWorkingImage))) {
      return absl::DataLossError(
          absl::StrCat("metadata file ", file, ": unknown image mode ", image));
    }
    cp.config.image = static_cast<ImageMode>(image);
  }
  if (version == kFixedAddressFormatVersion) {
    cp.config.fixed_base = r.Get<uint64_t>();
    if (r.ok() && cp.config.fixed_base == 0) {
      return absl::DataLossError(
          absl::StrCat("metadata file ", file, ": a fixed-address checkpoint without an address"));
    }
  }
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return cp;
}

absl::StatusOr<EpochRecord> DecodeEpochRecord(absl::string_view payload, absl::string_view file) {
  ByteReader r(payload, file);
  EpochRecord record;
  record.epoch = r.Get<uint64_t>();
  record.capacity_chunks = r.Get<uint32_t>();
  record.chunks = GetList<ChunkRecord>(r, GetChunk);
  record.names.bound = GetList<NameEntry>(r, GetName);
  record.names.unbound = GetList<std::string>(r, [](ByteReader& r) { return r.GetString(); });
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return record;
}

}  // namespace heapd
