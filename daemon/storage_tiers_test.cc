#include "daemon/storage_tiers.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

TEST(StorageTiersTest, ParsesNamesAndRootsInOrder) {
  absl::StatusOr<std::vector<StorageTier>> tiers =
      ParseStorageTiers("tmpfs:/dev/shm/heapd,nvme:/var/lib/heapd/,dax:/mnt/pmem0//heapd");
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  ASSERT_EQ(tiers->size(), 3u);
  EXPECT_EQ((*tiers)[0].name, "tmpfs");
  EXPECT_EQ((*tiers)[0].root, "/dev/shm/heapd");
  EXPECT_EQ((*tiers)[1].root, "/var/lib/heapd");
  EXPECT_EQ((*tiers)[2].name, "dax");
  EXPECT_EQ((*tiers)[2].root, "/mnt/pmem0/heapd");
}

TEST(StorageTiersTest, RefusesMalformedEntriesNamingThem) {
  struct Case {
    const char* flag;
    const char* says;
  };
  for (const Case& c : {
           Case{"nvme", "'nvme' is not NAME:PATH"},
           Case{":/var/lib/heapd", "name is empty"},
           Case{".hidden:/x", "starts with '.'"},
           Case{"a b:/x", "outside [A-Za-z0-9._-]"},
           Case{"nvme:var/lib/heapd", "is not absolute"},
           Case{"a:/x,a:/y", "names tier a twice"},
           Case{"a:/x,b:/x/", "overlap"},
           Case{"a:/x,b:/x/y", "overlap"},
           Case{"a:/x/y,b:/x", "overlap"},
           Case{"a:/x,", "is not NAME:PATH"},
       }) {
    absl::StatusOr<std::vector<StorageTier>> tiers = ParseStorageTiers(c.flag);
    ASSERT_FALSE(tiers.ok()) << c.flag;
    EXPECT_EQ(tiers.status().code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_NE(tiers.status().message().find(c.says), absl::string_view::npos)
        << c.flag << ": " << tiers.status();
  }
  // Siblings sharing a prefix are not nested.
  EXPECT_TRUE(ParseStorageTiers("a:/x/heapd,b:/x/heapd2").ok());
}

TEST(StorageTiersTest, StateDirIsTheOneTierShorthand) {
  absl::StatusOr<std::vector<StorageTier>> tiers = StorageTiersFromFlags("", "/var/lib/heapd");
  ASSERT_TRUE(tiers.ok());
  ASSERT_EQ(tiers->size(), 1u);
  EXPECT_EQ((*tiers)[0].name, kDefaultTierName);
  EXPECT_EQ((*tiers)[0].root, "/var/lib/heapd");
  tiers = StorageTiersFromFlags("fast:/dev/shm/h", "/var/lib/heapd");
  ASSERT_TRUE(tiers.ok());
  EXPECT_EQ((*tiers)[0].name, "fast");
}

}  // namespace
}  // namespace heapd
