#include "client/array_record.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace heapd {
namespace {

struct TypeCode {
  int dtype;         // a heapd_dtype
  const char* code;  // numpy's
  const char* name;
  uint64_t bytes;
};

constexpr TypeCode kTypes[] = {
    {HEAPD_INT8, "i1", "int8", 1},           {HEAPD_INT16, "i2", "int16", 2},
    {HEAPD_INT32, "i4", "int32", 4},         {HEAPD_INT64, "i8", "int64", 8},
    {HEAPD_UINT8, "u1", "uint8", 1},         {HEAPD_UINT16, "u2", "uint16", 2},
    {HEAPD_UINT32, "u4", "uint32", 4},       {HEAPD_UINT64, "u8", "uint64", 8},
    {HEAPD_FLOAT32, "f4", "float32", 4},     {HEAPD_FLOAT64, "f8", "float64", 8},
    {HEAPD_COMPLEX64, "c8", "complex64", 8}, {HEAPD_COMPLEX128, "c16", "complex128", 16},
};

const TypeCode* Find(int dtype) {
  for (const TypeCode& type : kTypes) {
    if (type.dtype == dtype) return &type;
  }
  return nullptr;
}

constexpr uint64_t kMaxArrayBytes = uint64_t{1} << 46;  // a heap's largest

}  // namespace

absl::Status CheckArrayInfo(const heapd_array_info& info) {
  const TypeCode* type = Find(info.dtype);
  if (type == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no element type ", info.dtype));
  }
  if (info.rank < 1 || info.rank > HEAPD_MAX_RANK) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", info.rank, " is not in 1..", HEAPD_MAX_RANK));
  }
  uint64_t elements = 1;
  for (int i = 0; i < info.rank; ++i) {
    const uint64_t extent = info.shape[i];
    if (extent == 0 || extent > kMaxArrayBytes / type->bytes / elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("extent ", extent, " of dimension ", i + 1,
                       " is 0 or makes the array larger than a heap (2^46 bytes)"));
    }
    elements *= extent;
  }
  return absl::OkStatus();
}

uint64_t ArrayBytes(const heapd_array_info& info) {
  uint64_t bytes = Find(info.dtype)->bytes;
  for (int i = 0; i < info.rank; ++i) bytes *= info.shape[i];
  return bytes;
}

std::string ArrayTypeName(const heapd_array_info& info) {
  std::vector<uint64_t> shape(info.shape, info.shape + info.rank);
  // One dimension has no order: spelled C whoever makes it.
  const bool fortran = info.fortran_order && info.rank > 1;
  return absl::StrCat(kArrayTypePrefix, Find(info.dtype)->code, " ", fortran ? "F" : "C", " ",
                      absl::StrJoin(shape, ","));
}

absl::StatusOr<heapd_array_info> ParseArrayTypeName(absl::string_view type_name) {
  if (!absl::ConsumePrefix(&type_name, kArrayTypePrefix)) {
    return absl::FailedPreconditionError(absl::StrCat("it binds a ", type_name, ", not an array"));
  }
  auto corrupt = [&] {
    return absl::DataLossError(absl::StrCat("array record '", type_name, "' does not parse"));
  };
  std::vector<absl::string_view> fields = absl::StrSplit(type_name, ' ');
  if (fields.size() != 3 || (fields[1] != "C" && fields[1] != "F")) return corrupt();
  heapd_array_info info{};
  for (const TypeCode& type : kTypes) {
    if (fields[0] == type.code) info.dtype = type.dtype;
  }
  info.fortran_order = fields[1] == "F";
  std::vector<absl::string_view> extents = absl::StrSplit(fields[2], ',');
  if (extents.size() > HEAPD_MAX_RANK) return corrupt();
  info.rank = static_cast<int>(extents.size());
  for (int i = 0; i < info.rank; ++i) {
    if (!absl::SimpleAtoi(extents[i], &info.shape[i])) return corrupt();
  }
  if (!CheckArrayInfo(info).ok()) return corrupt();
  return info;
}

std::string DescribeArray(const heapd_array_info& info) {
  const TypeCode* type = Find(info.dtype);
  std::vector<uint64_t> shape(info.shape,
                              info.shape + std::min(std::max(info.rank, 0), HEAPD_MAX_RANK));
  return absl::StrCat(
      type == nullptr ? "?" : type->name, "[", absl::StrJoin(shape, ","), "]",
      info.rank > 1 ? (info.fortran_order ? " (Fortran order)" : " (C order)") : "");
}

}  // namespace heapd
