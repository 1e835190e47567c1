#include "util/byte_size.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

TEST(ByteSizeTest, PlainNumbersAreBytes) {
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_EQ(*ParseByteSize("4097"), 4097u);
  EXPECT_EQ(*ParseByteSize("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseByteSize("512B"), 512u);
}

TEST(ByteSizeTest, UnitsArePowersOfTwoWithOrWithoutIB) {
  EXPECT_EQ(*ParseByteSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("1M"), 1u << 20);
  EXPECT_EQ(*ParseByteSize("1g"), uint64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("64G"), uint64_t{64} << 30);
  EXPECT_EQ(*ParseByteSize("64GiB"), uint64_t{64} << 30);
  EXPECT_EQ(*ParseByteSize("2TIB"), uint64_t{2} << 40);
  EXPECT_EQ(*ParseByteSize("3P"), uint64_t{3} << 50);
}

TEST(ByteSizeTest, RefusesWhatItWouldHaveToGuess) {
  for (const char* text : {"", "G", "1.5G", "-1", " 1G", "1 G", "1GB", "1kb", "1X", "1Gi",
                           "99999999999999999999", "16384P", "0x10"}) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
    ASSERT_FALSE(bytes.ok()) << text;
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << bytes.status();
  }
  EXPECT_NE(ParseByteSize("1GB").status().message().find("1GiB"), std::string::npos);
  EXPECT_EQ(ParseByteSize("1ZB").status().message().find("1ZiB"),
            std::string::npos);  // no such unit
}

TEST(ByteSizeTest, FormatsInTheLargestExactUnitAndParsesBack) {
  EXPECT_EQ(FormatByteSize(0), "0");
  EXPECT_EQ(FormatByteSize(4097), "4097");
  EXPECT_EQ(FormatByteSize(uint64_t{16} << 30), "16G");
  EXPECT_EQ(FormatByteSize(uint64_t{1536} << 20), "1536M");
  EXPECT_EQ(FormatByteSize(uint64_t{1} << 60), "1024P");
  for (uint64_t bytes :
       {uint64_t{1}, uint64_t{4096}, uint64_t{3} << 40, uint64_t{1} << 60, UINT64_MAX}) {
    EXPECT_EQ(*ParseByteSize(FormatByteSize(bytes)), bytes) << bytes;
  }
}

TEST(ByteSizeTest, IsAFlagType) {
  ByteSize size;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("32M", &size, &error));
  EXPECT_EQ(size.bytes, 32u << 20);
  EXPECT_EQ(AbslUnparseFlag(size), "32M");
  EXPECT_FALSE(AbslParseFlag("32 MB", &size, &error));
  EXPECT_NE(error.find("'32 MB'"), std::string::npos) << error;
  EXPECT_EQ(size.bytes, 32u << 20);  // unchanged
}

}  // namespace
}  // namespace heapd
