#include "daemon/caller.h"

#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace heapd {
namespace {

HeapConfig Owned(uint32_t uid, uint32_t gid, uint32_t mode) {
  HeapConfig config;
  config.owner_uid = uid;
  config.owner_gid = gid;
  config.mode = mode;
  return config;
}

TEST(CallerTest, PeerOfASocketPairIsThisProcess) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  absl::StatusOr<Caller> caller = PeerOf(fds[0]);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->uid, geteuid());
  EXPECT_EQ(caller->gid, getegid());
  EXPECT_EQ(caller->pid, getpid());
  close(fds[0]);
  close(fds[1]);
  EXPECT_FALSE(PeerOf(fds[0]).ok());  // closed fd
}

TEST(CallerTest, OwnerGroupAndOtherBitsApplyLikeAFile) {
  // A pid that does not exist: no supplementary groups to read.
  const Caller owner{1000, 1000, 999999999};
  const Caller member{1001, 2000, 999999999};
  const Caller other{1002, 3000, 999999999};
  const HeapConfig config = Owned(1000, 2000, 0640);
  EXPECT_TRUE(MayAccess(owner, config, Access::kWrite));
  EXPECT_TRUE(MayAccess(owner, config, Access::kRead));
  EXPECT_TRUE(MayAccess(member, config, Access::kRead));
  EXPECT_FALSE(MayAccess(member, config, Access::kWrite));
  EXPECT_FALSE(MayAccess(other, config, Access::kRead));
  EXPECT_FALSE(MayAccess(other, config, Access::kWrite));
  // The owner's bits apply to the owner even when others have more.
  EXPECT_FALSE(MayAccess(owner, Owned(1000, 2000, 0066), Access::kRead));
  EXPECT_TRUE(MayAccess(other, Owned(1000, 2000, 0606), Access::kWrite));
  EXPECT_TRUE(MayAccess(Caller{0, 0, 1}, Owned(1000, 2000, 0), Access::kWrite));
}

TEST(CallerTest, SupplementaryGroupsComeFromProc) {
  // This process's own supplementary groups, if any, count.
  gid_t groups[64];
  const int count = getgroups(64, groups);
  ASSERT_GE(count, 0);
  const Caller self{geteuid(), 4000000000u, getpid()};
  for (int i = 0; i < count; ++i) EXPECT_TRUE(InGroup(self, groups[i]));
  EXPECT_FALSE(InGroup(self, 4000000001u));
  EXPECT_TRUE(IsAdmin(Caller{0, 0, 1}, std::nullopt));
  EXPECT_FALSE(IsAdmin(Caller{5, 5, 999999999}, std::nullopt));
  EXPECT_TRUE(IsAdmin(Caller{5, 77, 999999999}, 77u));
}

}  // namespace
}  // namespace heapd
