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
  // SO_PEERGROUPS: exactly this process's supplementary groups.
  std::vector<gid_t> groups(static_cast<size_t>(getgroups(0, nullptr)));
  ASSERT_EQ(getgroups(static_cast<int>(groups.size()), groups.data()),
            static_cast<int>(groups.size()));
  EXPECT_EQ(caller->groups, std::vector<uint32_t>(groups.begin(), groups.end()));
  close(fds[0]);
  close(fds[1]);
  EXPECT_FALSE(PeerOf(fds[0]).ok());  // closed fd
}

TEST(CallerTest, OwnerGroupAndOtherBitsApplyLikeAFile) {
  const Caller owner{1000, 1000, 1, {}};
  const Caller member{1001, 2000, 1, {}};
  const Caller other{1002, 3000, 1, {}};
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
  EXPECT_TRUE(MayAccess(Caller{0, 0, 1, {}}, Owned(1000, 2000, 0), Access::kWrite));
  // A supplementary group counts as the heap's group.
  EXPECT_TRUE(MayAccess(Caller{1003, 3000, 1, {7, 2000}}, config, Access::kRead));
}

TEST(CallerTest, GroupsAreThoseTakenAtConnectNotThePidsNow) {
  // The pid of a caller says nothing about its groups: only the list taken
  // at accept counts (a reused pid must not lend its groups).
  const Caller caller{5, 5, getpid(), {77}};
  EXPECT_TRUE(InGroup(caller, 77));
  EXPECT_TRUE(InGroup(caller, 5));
  EXPECT_FALSE(InGroup(caller, 0));
  EXPECT_TRUE(IsAdmin(Caller{0, 0, 1, {}}, std::nullopt));
  EXPECT_FALSE(IsAdmin(Caller{5, 5, 1, {}}, std::nullopt));
  EXPECT_TRUE(IsAdmin(Caller{5, 5, 1, {77}}, 77u));
  EXPECT_TRUE(IsAdmin(Caller{5, 77, 1, {}}, 77u));
}

}  // namespace
}  // namespace heapd
