// Fuzzes ChunkDirectory::FromRecords and the recovery pins that follow it
// (PersistentHeap::Open pins every named object with Pin(0, ...)): both read
// records decoded from metadata files that may come from an untrusted
// snapshot.
//
// The input is a compact description of records and pins (see Decode), not
// the metadata file format: that one is fuzzed by heap/metadata_format_fuzz,
// and a CRC-free, length-free form lets mutations reach overlaps, bad
// bitmaps and boundaries quickly. The capacity is kept small: FromRecords
// trusts its caller for it.
//
// Beyond not crashing, checked against an independent model of the
// documented rules (the last record of a chunk wins, an empty small chunk is
// free, live chunks and runs must not overlap or leave the heap):
//   - FromRecords succeeds exactly when the records are consistent, and
//     fails with DATA_LOSS otherwise;
//   - CheckInvariants() holds after it and after the pins;
//   - AllRecords() is the model's set of live chunks, and rebuilding from it
//     gives it back (a checkpoint of a recovered heap recovers the same heap);
//   - Pin(0, object) succeeds exactly for a live object start whose size fits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "allocator/chunk_directory.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"
#include "tools/fuzz/fuzz_seeds.h"

namespace heapd {
namespace {

// Enough chunks for runs, boundaries and overlaps; small enough that one
// input stays fast.
constexpr uint32_t kMaxCapacity = 512;
// Record kinds drawn: 0..2 persisted, 3 (kLargeTail) and 4 (kReserved)
// exist only in memory, 5 stands for every unknown value.
constexpr uint32_t kKindsDrawn = 6;
// Size classes drawn: two past the last, to reach the range check.
constexpr uint32_t kClassesDrawn = kNumSizeClasses + 2;

void Check(bool ok, const char* property) {
  if (ok) return;
  std::fprintf(stderr, "chunk_directory_fuzz: property violated: %s\n", property);
  std::abort();
}

// Little-endian fields; reads past the end return zero.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint64_t Get(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes && pos_ < size_; ++i) value |= uint64_t{data_[pos_++]} << (8 * i);
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

class Writer {
 public:
  void Put(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>(value >> (8 * i)));
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

struct Input {
  uint32_t capacity = 1;
  std::vector<ChunkRecord> records;
  std::vector<ObjectRef> pins;
};

// Word fills of a small record (bits 1-2 of its flags byte); bit 7 makes
// the word count wrong by one (bit 0: one more, else one less).
//   kSparse: u8 n, then n times (u16 index modulo the count, u64 word);
//            other words are zero. Keeps big bitmaps small in the input.
//   kOnes: every word ~0.  kRepeat: one u64 for every word.
//   kExplicit: one u64 per word.
enum Fill : uint32_t { kSparse = 0, kOnes = 1, kRepeat = 2, kExplicit = 3 };

// Layout: u16 capacity-1 | u8 record count | records | pins until the end.
// Record: u16 chunk | u8 kind | small: u8 class, u8 flags, words by fill |
//         head: u32 run (top bit clear: modulo capacity+2, else as is).
// Pin: u8 selector | u16 chunk | u32 position | u32 size. Selector bit 0:
//      position is a slot index of class selector>>1 (so pins hit slot
//      starts); else a byte offset in the chunk.
Input Decode(const uint8_t* data, size_t size) {
  Reader r(data, size);
  Input in;
  in.capacity = 1 + static_cast<uint32_t>(r.Get(2) % kMaxCapacity);
  const uint32_t count = static_cast<uint32_t>(r.Get(1));
  for (uint32_t i = 0; i < count && !r.empty(); ++i) {
    ChunkRecord c;
    // One value past the end: the capacity check.
    c.chunk = static_cast<uint32_t>(r.Get(2) % (in.capacity + 1));
    c.kind = static_cast<ChunkKind>(r.Get(1) % kKindsDrawn);
    if (c.kind == ChunkKind::kSmall) {
      c.size_class = static_cast<uint32_t>(r.Get(1) % kClassesDrawn);
      const uint32_t flags = static_cast<uint32_t>(r.Get(1));
      size_t words =
          c.size_class < kNumSizeClasses ? SlotBitmap::WordCount(SlotsPerChunk(c.size_class)) : 1;
      if (flags & 0x80) words = (flags & 1) ? words + 1 : words - 1;
      const uint32_t fill = (flags >> 1) & 3;
      c.words.assign(words, fill == kOnes ? ~uint64_t{0} : 0);
      if (fill == kRepeat) {
        const uint64_t repeated = r.Get(8);
        for (uint64_t& word : c.words) word = repeated;
      } else if (fill == kExplicit) {
        for (uint64_t& word : c.words) word = r.Get(8);
      } else if (fill == kSparse) {
        const uint32_t n = static_cast<uint32_t>(r.Get(1));
        for (uint32_t k = 0; k < n; ++k) {
          const uint64_t index = r.Get(2);
          const uint64_t word = r.Get(8);
          if (!c.words.empty()) c.words[index % c.words.size()] = word;
        }
      }
    } else if (c.kind == ChunkKind::kLargeHead) {
      const uint32_t run = static_cast<uint32_t>(r.Get(4));
      c.run_chunks = (run >> 31) ? run : run % (in.capacity + 2);
    }
    in.records.push_back(std::move(c));
  }
  while (!r.empty()) {
    const uint32_t selector = static_cast<uint32_t>(r.Get(1));
    const uint64_t chunk = r.Get(2) % (in.capacity + 1);
    const uint32_t position = static_cast<uint32_t>(r.Get(4));
    ObjectRef pin;
    pin.size = r.Get(4);
    uint64_t in_chunk = position % kChunkSize;
    if (selector & 1) {
      const uint32_t size_class = (selector >> 1) % kNumSizeClasses;
      in_chunk = uint64_t{position % SlotsPerChunk(size_class)} * ClassSize(size_class);
    }
    pin.offset = (chunk << kChunkShift) + in_chunk;
    in.pins.push_back(pin);
  }
  return in;
}

// The inverse of Decode for well-formed inputs, to write seeds.
std::string Encode(const Input& in) {
  Writer w;
  w.Put(in.capacity - 1, 2);
  w.Put(in.records.size(), 1);
  for (const ChunkRecord& c : in.records) {
    w.Put(c.chunk, 2);
    w.Put(static_cast<uint64_t>(c.kind), 1);
    if (c.kind == ChunkKind::kSmall) {
      w.Put(c.size_class, 1);
      std::vector<size_t> nonzero;
      for (size_t i = 0; i < c.words.size(); ++i) {
        if (c.words[i] != 0) nonzero.push_back(i);
      }
      if (nonzero.size() <= 255) {
        w.Put(kSparse << 1, 1);
        w.Put(nonzero.size(), 1);
        for (size_t i : nonzero) {
          w.Put(i, 2);
          w.Put(c.words[i], 8);
        }
      } else {
        w.Put(kExplicit << 1, 1);
        for (uint64_t word : c.words) w.Put(word, 8);
      }
    } else if (c.kind == ChunkKind::kLargeHead) {
      w.Put(c.run_chunks, 4);
    }
  }
  for (const ObjectRef& pin : in.pins) {
    w.Put(0, 1);  // a byte offset
    w.Put(pin.offset >> kChunkShift, 2);
    w.Put(pin.offset & (kChunkSize - 1), 4);
    w.Put(pin.size, 4);
  }
  return std::move(w.out());
}

uint64_t PaddingMask(uint32_t size_class) {
  const uint32_t used = SlotsPerChunk(size_class) % 64;
  return used == 0 ? 0 : ~uint64_t{0} << used;
}

// The documented rules, written without looking at how FromRecords does it.
// Returns false when the records are inconsistent; otherwise fills `live`
// with the persisted view of every live chunk (padding bits set, as
// AllRecords reports them).
bool Model(uint32_t capacity, const std::vector<ChunkRecord>& records,
           std::map<uint32_t, ChunkRecord>* live) {
  std::map<uint32_t, ChunkRecord> last;
  for (const ChunkRecord& c : records) {
    if (c.chunk >= capacity) return false;
    last[c.chunk] = c;
  }
  std::vector<bool> taken(capacity, false);
  live->clear();
  for (const auto& [chunk, c] : last) {
    switch (c.kind) {
      case ChunkKind::kFree:
        break;
      case ChunkKind::kSmall: {
        if (c.size_class >= kNumSizeClasses ||
            c.words.size() != SlotBitmap::WordCount(SlotsPerChunk(c.size_class))) {
          return false;
        }
        ChunkRecord persisted{chunk, ChunkKind::kSmall, c.size_class, 0, c.words};
        persisted.words.back() |= PaddingMask(c.size_class);
        bool empty = true;
        for (size_t i = 0; i < c.words.size(); ++i) {
          const uint64_t padding = i + 1 == c.words.size() ? PaddingMask(c.size_class) : 0;
          if ((c.words[i] & ~padding) != 0) empty = false;
        }
        if (empty) break;
        if (taken[chunk]) return false;
        taken[chunk] = true;
        (*live)[chunk] = std::move(persisted);
        break;
      }
      case ChunkKind::kLargeHead:
        if (c.run_chunks == 0 || uint64_t{chunk} + c.run_chunks > capacity) return false;
        for (uint32_t t = chunk; t < chunk + c.run_chunks; ++t) {
          if (taken[t]) return false;
          taken[t] = true;
        }
        (*live)[chunk] = ChunkRecord{chunk, ChunkKind::kLargeHead, 0, c.run_chunks, {}};
        break;
      default:
        return false;
    }
  }
  return true;
}

bool SameRecord(const ChunkRecord& a, const ChunkRecord& b) {
  return a.chunk == b.chunk && a.kind == b.kind && a.size_class == b.size_class &&
         a.run_chunks == b.run_chunks && a.words == b.words;
}

bool SameRecords(const std::vector<ChunkRecord>& got, const std::map<uint32_t, ChunkRecord>& want) {
  if (got.size() != want.size()) return false;
  auto it = want.begin();
  for (const ChunkRecord& record : got) {
    if (!SameRecord(record, (it++)->second)) return false;
  }
  return true;
}

// Whether the model says `pin` names a live object start that its size fits.
bool PinnableInModel(const std::map<uint32_t, ChunkRecord>& live, ObjectRef pin) {
  auto it = live.find(static_cast<uint32_t>(pin.offset >> kChunkShift));
  if (it == live.end()) return false;
  const ChunkRecord& c = it->second;
  const uint64_t in_chunk = pin.offset & (kChunkSize - 1);
  if (c.kind == ChunkKind::kLargeHead) {
    return in_chunk == 0 && pin.size <= uint64_t{c.run_chunks} * kChunkSize;
  }
  const uint32_t slot_size = ClassSize(c.size_class);
  if (in_chunk % slot_size != 0 || pin.size > slot_size) return false;
  const uint64_t slot = in_chunk / slot_size;
  return slot < SlotsPerChunk(c.size_class) && ((c.words[slot / 64] >> (slot % 64)) & 1);
}

void FuzzOne(const Input& in) {
  std::map<uint32_t, ChunkRecord> live;
  const bool consistent = Model(in.capacity, in.records, &live);
  absl::StatusOr<std::unique_ptr<ChunkDirectory>> dir =
      ChunkDirectory::FromRecords(in.capacity, in.records);
  Check(dir.ok() == consistent, "FromRecords accepts inconsistent or rejects consistent records");
  if (!dir.ok()) {
    Check(dir.status().code() == absl::StatusCode::kDataLoss,
          "FromRecords failed without DATA_LOSS");
    return;
  }
  Check((*dir)->CheckInvariants().ok(), "invariants broken after FromRecords");
  Check((*dir)->capacity_chunks() == in.capacity, "capacity changed");
  const std::vector<ChunkRecord> records = (*dir)->AllRecords();
  Check(SameRecords(records, live), "AllRecords is not the live chunks of the records");

  absl::StatusOr<std::unique_ptr<ChunkDirectory>> again =
      ChunkDirectory::FromRecords(in.capacity, records);
  Check(again.ok() && (*again)->CheckInvariants().ok() && SameRecords((*again)->AllRecords(), live),
        "rebuilding from AllRecords gives another directory");

  for (const ObjectRef& pin : in.pins) {
    const absl::Status pinned = (*dir)->Pin(0, pin);
    Check(pinned.ok() == PinnableInModel(live, pin), "Pin disagrees with the model");
  }
  // Once, not per pin: it walks every chunk, and speed finds more bugs.
  Check((*dir)->CheckInvariants().ok(), "invariants broken after the pins");
  // Recovery's pins change what is protected, not what is persisted.
  Check(SameRecords((*dir)->AllRecords(), live), "Pin changed the persisted view");
}

// Seeds come from a directory used the way the daemon uses it, so they
// start the fuzzer from realistic bitmaps and runs.
Input Used() {
  ChunkDirectory dir(24);
  Input in;
  in.capacity = 24;
  for (uint32_t size_class : {0u, 9u, 40u, kNumSizeClasses - 1}) {
    absl::StatusOr<std::vector<LeaseGrant>> grants = dir.Lease(1, size_class, 1);
    Check(grants.ok() && grants->size() == 1, "seed lease failed");
    LeaseReport report{(*grants)[0].chunk, (*grants)[0].words};
    report.words[0] |= 0x15;  // slots 0, 2 and 4 live
    Check(dir.Report(1, {report}, /*release=*/true).ok(), "seed report failed");
    in.pins.push_back(ObjectRef{uint64_t{report.chunk} << kChunkShift, ClassSize(size_class)});
    in.pins.push_back(
        ObjectRef{(uint64_t{report.chunk} << kChunkShift) + 2 * ClassSize(size_class), 0});
  }
  absl::StatusOr<uint64_t> large = dir.AllocateLarge(2, 5 * kChunkSize + 1);
  Check(large.ok(), "seed large allocation failed");
  dir.Commit(2);
  in.pins.push_back(ObjectRef{*large, 6 * kChunkSize});
  in.pins.push_back(ObjectRef{*large + kChunkSize, 0});  // inside the run
  in.records = dir.AllRecords();
  return in;
}

}  // namespace

namespace fuzz {

Seeds MakeSeeds() {
  const Input used = Used();
  // The same chunks, then later records that free a small chunk, make a
  // free one a run and free the old run (the last record wins), as a log
  // replayed onto a checkpoint does.
  Input replayed = used;
  const ChunkRecord& run = used.records.back();
  replayed.records.push_back(ChunkRecord{used.records[0].chunk, ChunkKind::kFree, 0, 0, {}});
  replayed.records.push_back(
      ChunkRecord{run.chunk + run.run_chunks, ChunkKind::kLargeHead, 0, 3, {}});
  replayed.records.push_back(ChunkRecord{run.chunk, ChunkKind::kFree, 0, 0, {}});
  // A run over a live small chunk: must be refused.
  Input overlap = used;
  overlap.records.push_back(ChunkRecord{0, ChunkKind::kLargeHead, 0, 3, {}});
  Input edge;
  edge.capacity = kMaxCapacity;
  edge.records = {ChunkRecord{kMaxCapacity - 2, ChunkKind::kLargeHead, 0, 2, {}}};
  edge.pins = {ObjectRef{uint64_t{kMaxCapacity - 2} << kChunkShift, 2 * kChunkSize}};
  return {{"used", Encode(used)},
          {"replayed", Encode(replayed)},
          {"overlap", Encode(overlap)},
          {"edge", Encode(edge)},
          {"empty", ""}};
}

}  // namespace fuzz
}  // namespace heapd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  heapd::FuzzOne(heapd::Decode(data, size));
  return 0;
}
