// The record of a named array (heapd/heapd.h, heapd_array): element type,
// rank, shape and order, kept as the name's type name so that every
// language finds an array with what it needs to read it:
//   "heapd::array/v1 f8 F 100,200"   float64, column-major, 100 x 200
// Element types are numpy's codes (i1 i2 i4 i8 u1 u2 u4 u8 f4 f8 c8 c16),
// little-endian as the node's memory; C (row-major) or F (column-major),
// always C for one dimension (which has no order).
#ifndef HEAPD_CLIENT_ARRAY_RECORD_H_
#define HEAPD_CLIENT_ARRAY_RECORD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "heapd/heapd.h"

namespace heapd {

inline constexpr char kArrayTypePrefix[] = "heapd::array/v1 ";

// OK if `info` describes an array: a known type, rank 1..HEAPD_MAX_RANK,
// every extent at least 1 and the whole below 2^46 bytes. INVALID_ARGUMENT
// saying which.
absl::Status CheckArrayInfo(const heapd_array_info& info);
// The array's bytes. REQUIRES: CheckArrayInfo(info).ok().
uint64_t ArrayBytes(const heapd_array_info& info);

// The type name of `info`. REQUIRES: CheckArrayInfo(info).ok().
std::string ArrayTypeName(const heapd_array_info& info);
// The record `type_name` spells; FAILED_PRECONDITION if it is not an
// array's, DATA_LOSS if it claims to be one and does not parse.
absl::StatusOr<heapd_array_info> ParseArrayTypeName(absl::string_view type_name);

// "float64[100,200] (Fortran order)", for messages.
std::string DescribeArray(const heapd_array_info& info);

}  // namespace heapd

#endif  // HEAPD_CLIENT_ARRAY_RECORD_H_
