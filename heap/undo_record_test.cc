#include "heap/undo_record.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace heapd {
namespace {

std::string Image(char seed) {
  std::string image(kUndoPageBytes, '\0');
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<char>(seed + i * 7);
  return image;
}

UndoRecordHeader Header(UndoKind kind) {
  UndoRecordHeader h;
  h.kind = static_cast<uint32_t>(kind);
  h.page = 5 * kUndoPageBytes;
  h.time_ns = 123456789;
  h.session = 42;
  h.generation = 3;
  h.epoch = 17;
  return h;
}

absl::StatusCode DecodeCode(const std::string& bytes) {
  return DecodeUndoRecord(bytes, 0).status().code();
}

TEST(UndoRecordTest, RoundTripsEveryKind) {
  for (UndoKind kind :
       {UndoKind::kPreImage, UndoKind::kCommitImage, UndoKind::kClear, UndoKind::kGenerationEnd}) {
    SCOPED_TRACE(static_cast<uint32_t>(kind));
    const bool has_image = UndoKindHasImage(static_cast<uint32_t>(kind));
    EXPECT_EQ(has_image, kind == UndoKind::kPreImage || kind == UndoKind::kCommitImage);
    const std::string image = has_image ? Image('a') : "";
    const std::string bytes = EncodeUndoRecord(Header(kind), image);
    ASSERT_EQ(bytes.size(), has_image ? kUndoImageRecordBytes : kUndoHeaderBytes);

    // The client's allocation-free encoder writes the same bytes.
    std::string into(bytes.size(), '\xff');
    EncodeUndoRecordInto(Header(kind), has_image ? image.data() : nullptr, into.data());
    EXPECT_EQ(into, bytes);

    // Decoded at some offset of a journal, with the next record's bytes after it.
    const uint64_t at = 3 * kUndoImageRecordBytes;
    auto decoded = DecodeUndoRecord(bytes + "trailing bytes of the next record", at);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_TRUE(decoded->has_value());
    const DecodedUndoRecord& r = **decoded;
    EXPECT_EQ(r.size, bytes.size());
    EXPECT_EQ(r.image_at, at + kUndoHeaderBytes);
    EXPECT_EQ(r.header.magic, kUndoMagic);
    EXPECT_EQ(r.header.kind, static_cast<uint32_t>(kind));
    EXPECT_EQ(r.header.page, 5 * kUndoPageBytes);
    EXPECT_EQ(r.header.time_ns, 123456789u);
    EXPECT_EQ(r.header.session, 42u);
    EXPECT_EQ(r.header.generation, 3u);
    EXPECT_EQ(r.header.epoch, 17u);
    EXPECT_EQ(r.header.image_bytes, has_image ? kUndoPageBytes : 0u);
    if (has_image) {
      EXPECT_EQ(bytes.substr(r.image_at - at, kUndoPageBytes), image);
    }
  }
}

TEST(UndoRecordTest, TornTailIsNotARecordYet) {
  for (UndoKind kind :
       {UndoKind::kPreImage, UndoKind::kCommitImage, UndoKind::kClear, UndoKind::kGenerationEnd}) {
    SCOPED_TRACE(static_cast<uint32_t>(kind));
    const bool has_image = UndoKindHasImage(static_cast<uint32_t>(kind));
    const std::string bytes = EncodeUndoRecord(Header(kind), has_image ? Image('b') : "");
    for (size_t n : {size_t{0}, size_t{1}, kUndoHeaderBytes - 1, kUndoHeaderBytes,
                     kUndoHeaderBytes + 1, kUndoImageRecordBytes - 1}) {
      if (n >= bytes.size()) continue;
      SCOPED_TRACE(n);
      auto decoded = DecodeUndoRecord(bytes.substr(0, n), 0);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_FALSE(decoded->has_value());
    }
  }
}

// A mapped journal's tail: zeros until its writer stores the magic, last.
TEST(UndoRecordTest, NoMagicYetIsNotARecordYet) {
  std::string bytes = EncodeUndoRecord(Header(UndoKind::kPreImage), Image('z'));
  std::memset(bytes.data(), 0, sizeof(uint32_t));
  auto decoded = DecodeUndoRecord(bytes, 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->has_value());
  decoded = DecodeUndoRecord(std::string(kUndoImageRecordBytes, '\0'), 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->has_value());
}

// Journals of heapd 0.4.0's clients (and its heap.undo) hold records
// checked with CRC-32: still read after an upgrade.
TEST(UndoRecordTest, ReadsRecordsCheckedWithCrc32) {
  UndoRecordHeader h = Header(UndoKind::kPreImage);
  h.magic = kUndoMagicCrc32;
  h.image_bytes = kUndoPageBytes;
  h.crc = 0;
  const std::string image = Image('v');
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(&h), sizeof(h));
  crc = crc32(crc, reinterpret_cast<const Bytef*>(image.data()), image.size());
  h.crc = static_cast<uint32_t>(crc);
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  bytes += image;
  auto decoded = DecodeUndoRecord(bytes, 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(decoded->has_value());
  EXPECT_EQ((*decoded)->header.magic, kUndoMagicCrc32);
  EXPECT_EQ(bytes.substr((*decoded)->image_at, kUndoPageBytes), image);
  bytes[kUndoHeaderBytes + 100] ^= 1;
  EXPECT_EQ(DecodeCode(bytes), absl::StatusCode::kDataLoss);
}

TEST(UndoRecordTest, FlippedByteIsDataLoss) {
  const std::string bytes = EncodeUndoRecord(Header(UndoKind::kPreImage), Image('c'));
  // Every header byte, and bytes across the image.
  for (size_t i = 0; i < bytes.size(); i += (i < kUndoHeaderBytes ? 1 : 97)) {
    SCOPED_TRACE(i);
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
    EXPECT_EQ(DecodeCode(flipped), absl::StatusCode::kDataLoss);
  }
  // The last image byte and the crc itself.
  for (size_t i : {bytes.size() - 1, kUndoHeaderBytes - 4}) {
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 1);
    EXPECT_EQ(DecodeCode(flipped), absl::StatusCode::kDataLoss);
  }
  // And a record without an image.
  std::string clear = EncodeUndoRecord(Header(UndoKind::kClear), "");
  clear[offsetof(UndoRecordHeader, time_ns)] ^= 1;
  EXPECT_EQ(DecodeCode(clear), absl::StatusCode::kDataLoss);
}

TEST(UndoRecordTest, UnalignedPageIsDataLoss) {
  for (uint64_t page : {uint64_t{1}, kUndoPageBytes + 8, uint64_t{4095}}) {
    UndoRecordHeader h = Header(UndoKind::kPreImage);
    h.page = page;
    EXPECT_EQ(DecodeCode(EncodeUndoRecord(h, Image('d'))), absl::StatusCode::kDataLoss) << page;
    h.kind = static_cast<uint32_t>(UndoKind::kClear);
    EXPECT_EQ(DecodeCode(EncodeUndoRecord(h, "")), absl::StatusCode::kDataLoss) << page;
  }
}

TEST(UndoRecordTest, UnknownKindIsDataLoss) {
  for (uint32_t kind : {0u, 5u, 0xffffffffu}) {
    UndoRecordHeader h = Header(UndoKind::kClear);
    h.kind = kind;
    EXPECT_FALSE(UndoKindHasImage(kind));
    EXPECT_EQ(DecodeCode(EncodeUndoRecord(h, "")), absl::StatusCode::kDataLoss) << kind;
  }
}

TEST(UndoRecordTest, BadMagicAndImageSizeAreDataLoss) {
  std::string bytes = EncodeUndoRecord(Header(UndoKind::kClear), "");
  bytes[0] = 'X';
  EXPECT_EQ(DecodeCode(bytes), absl::StatusCode::kDataLoss);

  // A header-only kind claiming an image, with a correct crc over it.
  UndoRecordHeader h = Header(UndoKind::kClear);
  h.image_bytes = kUndoPageBytes;
  std::string claimed(kUndoImageRecordBytes, '\0');
  std::memcpy(claimed.data(), &h, sizeof(h));
  EXPECT_EQ(DecodeCode(claimed), absl::StatusCode::kDataLoss);
}

// A pre-image is taken of a page other processes may be storing into: the
// record must still be whole (its checksum over the bytes it holds).
TEST(UndoRecordTest, APageChangingWhileEncodedStillMakesAValidRecord) {
  void* shared =
      mmap(nullptr, kUndoPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* page = static_cast<volatile char*>(shared);
  const pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    for (unsigned i = 0;; ++i) page[(i * 2654435761u) % kUndoPageBytes] = static_cast<char>(i);
  }
  std::string record(kUndoImageRecordBytes, '\0');
  int bad = 0;
  for (int i = 0; i < 20000; ++i) {
    EncodeUndoRecordInto(Header(UndoKind::kPreImage), static_cast<const char*>(shared),
                         record.data());
    if (!DecodeUndoRecord(record, 0).ok()) ++bad;
  }
  kill(writer, SIGKILL);
  waitpid(writer, nullptr, 0);
  munmap(shared, kUndoPageBytes);
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace heapd
