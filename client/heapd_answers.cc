#include "client/heapd_answers.h"

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"

namespace heapd {

absl::Status Unexpected(const std::string& heap, const std::string& what) {
  return absl::InternalError(absl::StrCat("heap ", heap, ": heapd answered ", what));
}

absl::Status CheckCapacity(const std::string& heap, uint64_t capacity, uint64_t max_size) {
  if (capacity > max_size || capacity % kChunkSize != 0) {
    return Unexpected(heap,
                      absl::StrCat("a capacity of ", capacity, " bytes (maximum ", max_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckGrant(const std::string& heap, const v1::LeaseGrant& grant, uint32_t size_class,
                        uint64_t capacity) {
  if (grant.size_class() != size_class || uint64_t{grant.chunk()} >= capacity / kChunkSize ||
      static_cast<size_t>(grant.words_size()) != SlotBitmap::WordCount(SlotsPerChunk(size_class))) {
    return Unexpected(heap, absl::StrCat("a lease of chunk ", grant.chunk(), " of size class ",
                                         grant.size_class(), " with ", grant.words_size(),
                                         " bitmap words for class ", size_class));
  }
  return absl::OkStatus();
}

absl::Status CheckObject(const std::string& heap, uint64_t offset, uint64_t size,
                         uint64_t max_size) {
  if (offset >= max_size || size > max_size - offset) {
    return Unexpected(heap, absl::StrCat("an object of ", size, " bytes at offset ", offset,
                                         " (maximum size ", max_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace heapd
