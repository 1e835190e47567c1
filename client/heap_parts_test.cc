// The small parts of a client Heap that hold state of their own: the
// batch of frees for heapd and the names prefetched at attach.
#include <thread>
#include <vector>

#include "client/free_batch.h"
#include "client/prefetched_names.h"
#include "gtest/gtest.h"

namespace heapd {
namespace {

v1::ObjectRef Object(uint64_t offset) {
  v1::ObjectRef object;
  object.set_offset(offset);
  return object;
}

TEST(FreeBatchTest, HandsOutAFullBatchOnceAndEverythingOnDemand) {
  FreeBatch batch(3);
  EXPECT_TRUE(batch.empty());
  EXPECT_TRUE(batch.Add(Object(1)).empty());
  EXPECT_TRUE(batch.Add(Object(2)).empty());
  EXPECT_FALSE(batch.empty());
  const std::vector<v1::ObjectRef> full = batch.Add(Object(3));
  ASSERT_EQ(full.size(), 3u);
  EXPECT_EQ(full[2].offset(), 3u);
  EXPECT_TRUE(batch.empty());
  EXPECT_TRUE(batch.Add(Object(4)).empty());
  EXPECT_EQ(batch.TakeAll().size(), 1u);
  EXPECT_TRUE(batch.TakeAll().empty());
  EXPECT_EQ(FreeBatch(0).Add(Object(5)).size(), 1u) << "a batch of 0 is a batch of 1";
}

TEST(FreeBatchTest, NoFreeIsLostOrSentTwiceAcrossThreads) {
  FreeBatch batch(7);
  constexpr int kThreads = 4, kEach = 10000;
  std::vector<std::vector<uint64_t>> sent(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        for (const v1::ObjectRef& object : batch.Add(Object(uint64_t(t) * kEach + i))) {
          sent[t].push_back(object.offset());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<bool> seen(kThreads * kEach, false);
  size_t count = 0;
  auto see = [&](uint64_t offset) {
    ASSERT_LT(offset, seen.size());
    EXPECT_FALSE(seen[offset]) << offset << " sent twice";
    seen[offset] = true;
    ++count;
  };
  for (const std::vector<uint64_t>& each : sent) {
    for (uint64_t offset : each) see(offset);
  }
  for (const v1::ObjectRef& object : batch.TakeAll()) see(object.offset());
  EXPECT_EQ(count, seen.size());
}

TEST(PrefetchedNamesTest, EachNameIsServedOnceAndForgottenOnUnbind) {
  PrefetchedNames names;
  NameEntry a;
  a.name = "a";
  a.offset = 64;
  NameEntry b;
  b.name = "b";
  b.offset = 128;
  names.Put({a, b});
  std::optional<NameEntry> found = names.Take("a");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->offset, 64u);
  EXPECT_FALSE(names.Take("a").has_value()) << "served twice: a later lookup must ask heapd";
  names.Forget("b");
  EXPECT_FALSE(names.Take("b").has_value());
  EXPECT_FALSE(names.Take("never").has_value());
}

}  // namespace
}  // namespace heapd
