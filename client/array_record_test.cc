#include "client/array_record.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

heapd_array_info Array(int dtype, bool fortran, std::initializer_list<uint64_t> shape) {
  heapd_array_info info{};
  info.dtype = dtype;
  info.fortran_order = fortran;
  info.rank = static_cast<int>(shape.size());
  int i = 0;
  for (uint64_t extent : shape) info.shape[i++] = extent;
  return info;
}

TEST(ArrayRecordTest, SpellsAndParsesEveryType) {
  const heapd_array_info u = Array(HEAPD_FLOAT64, true, {100, 200});
  ASSERT_TRUE(CheckArrayInfo(u).ok());
  EXPECT_EQ(ArrayTypeName(u), "heapd::array/v1 f8 F 100,200");
  EXPECT_EQ(ArrayBytes(u), 8u * 100 * 200);
  EXPECT_EQ(DescribeArray(u), "float64[100,200] (Fortran order)");
  for (int dtype = HEAPD_INT8; dtype <= HEAPD_COMPLEX128; ++dtype) {
    const heapd_array_info info = Array(dtype, dtype % 2, {3, 1, 7});
    absl::StatusOr<heapd_array_info> parsed = ParseArrayTypeName(ArrayTypeName(info));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(ArrayTypeName(*parsed), ArrayTypeName(info));
    EXPECT_EQ(parsed->rank, 3);
    EXPECT_EQ(parsed->shape[2], 7u);
  }
}

TEST(ArrayRecordTest, RefusesWhatIsNoArray) {
  EXPECT_EQ(CheckArrayInfo(Array(99, false, {1})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckArrayInfo(Array(HEAPD_INT32, false, {})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckArrayInfo(Array(HEAPD_INT32, false, {4, 0})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckArrayInfo(Array(HEAPD_FLOAT64, false, {uint64_t{1} << 40, 1 << 10})).code(),
            absl::StatusCode::kInvalidArgument);  // 2^53 bytes
  EXPECT_EQ(ParseArrayTypeName("my::Graph/v1").status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (const char* bad :
       {"heapd::array/v1 f8 F", "heapd::array/v1 f9 F 3", "heapd::array/v1 f8 X 3",
        "heapd::array/v1 f8 C 3,0", "heapd::array/v1 f8 C 1,2,3,4,5,6,7,8,9",
        "heapd::array/v1 f8 C -3", "heapd::array/v1 f8 C 3 extra"}) {
    EXPECT_EQ(ParseArrayTypeName(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

}  // namespace
}  // namespace heapd
