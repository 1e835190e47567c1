// Checks of what heapd answers a client. Every number heapd sends is
// checked before it is used as an index or an address: a wrong one is an
// error (INTERNAL, naming the heap and the number), never a stray store.
#ifndef HEAPD_CLIENT_HEAPD_ANSWERS_H_
#define HEAPD_CLIENT_HEAPD_ANSWERS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/heapd.pb.h"

namespace heapd {

// heapd answered `what`, which cannot be right.
absl::Status Unexpected(const std::string& heap, const std::string& what);

// A capacity within the heap's maximum size, in whole chunks.
absl::Status CheckCapacity(const std::string& heap, uint64_t capacity, uint64_t max_size);

// A lease of one chunk of `size_class` within `capacity`, with its bitmap.
absl::Status CheckGrant(const std::string& heap, const v1::LeaseGrant& grant, uint32_t size_class,
                        uint64_t capacity);

// An object of `size` bytes at `offset` within `max_size`.
absl::Status CheckObject(const std::string& heap, uint64_t offset, uint64_t size,
                         uint64_t max_size);

}  // namespace heapd

#endif  // HEAPD_CLIENT_HEAPD_ANSWERS_H_
