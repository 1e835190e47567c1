#include "heap/name_table.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

NameEntry Entry(const std::string& name, uint64_t offset) {
  return NameEntry{name, offset, 16, "heapd::test", 1000, 42};
}

TEST(NameTableTest, BindLookupUnbind) {
  NameTable table;
  ASSERT_TRUE(table.Bind(Entry("graph", 64)).ok());
  absl::StatusOr<NameEntry> found = table.Lookup("graph");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, Entry("graph", 64));
  absl::Status taken = table.Bind(Entry("graph", 128));
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(taken.message().find("'graph'"), std::string::npos);
  EXPECT_EQ(table.Lookup("graph")->offset, 64u);
  EXPECT_EQ(table.Lookup("other").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table.Unbind("graph").ok());
  EXPECT_EQ(table.Unbind("graph").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.size(), 0u);
}

TEST(NameTableTest, ListsByPrefixInOrderWithLimit) {
  NameTable table;
  for (const char* name : {"b/2", "a/1", "b/1", "c", "b/3"}) {
    ASSERT_TRUE(table.Bind(Entry(name, 8)).ok());
  }
  std::vector<NameEntry> b = table.List("b/");
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].name, "b/1");
  EXPECT_EQ(b[2].name, "b/3");
  EXPECT_EQ(table.List("", 2).size(), 2u);
  EXPECT_TRUE(table.List("z").empty());
}

TEST(NameTableTest, ChangesReportFinalStateOnce) {
  NameTable table;
  ASSERT_TRUE(table.Bind(Entry("kept", 8)).ok());
  ASSERT_TRUE(table.Bind(Entry("gone", 16)).ok());
  table.TakeChanges();
  ASSERT_TRUE(table.Unbind("gone").ok());
  ASSERT_TRUE(table.Bind(Entry("new", 24)).ok());
  ASSERT_TRUE(table.Unbind("kept").ok());
  ASSERT_TRUE(table.Bind(Entry("kept", 32)).ok());
  NameChanges changes = table.TakeChanges();
  ASSERT_EQ(changes.bound.size(), 2u);
  EXPECT_EQ(changes.bound[0].name, "kept");
  EXPECT_EQ(changes.bound[0].offset, 32u);
  EXPECT_EQ(changes.unbound, std::vector<std::string>{"gone"});
  EXPECT_TRUE(table.TakeChanges().bound.empty());
}

TEST(NameTableTest, ValidateNameRejectsBadNames) {
  EXPECT_TRUE(ValidateName("graph/edges-v2").ok());
  EXPECT_TRUE(ValidateName(std::string(255, 'x')).ok());
  EXPECT_EQ(ValidateName("").code(), absl::StatusCode::kInvalidArgument);
  absl::Status too_long = ValidateName(std::string(256, 'x'));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("256 bytes"), std::string::npos);
  absl::Status control = ValidateName(std::string("a\nb"), "type name");
  EXPECT_EQ(control.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(control.message().find("type name has control character 0xa at byte 1"),
            std::string::npos);
  EXPECT_EQ(ValidateName(std::string("a\0b", 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateName("del\x7f").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace heapd
