#include "client/heapctl_args.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace heapd {
namespace {

// Parses `args`; on a usage error returns its message (and the command it
// names in `command`), else "".
std::string Parse(const std::vector<std::string>& args, Invocation* invocation,
                  std::string* command = nullptr) {
  UsageError error;
  if (ParseHeapctlArgs(args, invocation, &error)) return "";
  if (command != nullptr) *command = error.command == nullptr ? "" : error.command->name;
  EXPECT_FALSE(error.message.empty());
  return error.message;
}

std::string ErrorOf(const std::vector<std::string>& args, std::string* command = nullptr) {
  Invocation invocation;
  return Parse(args, &invocation, command);
}

TEST(HeapctlArgsTest, TakesACommandItsOperandsAndItsFlagsAnywhere) {
  Invocation in;
  ASSERT_EQ(Parse({"--json", "heap", "create", "big", "--max_size=64G", "--mode", "0640"}, &in),
            "");
  EXPECT_STREQ(in.command->name, "heap create");
  EXPECT_EQ(in.operands, std::vector<std::string>{"big"});
  EXPECT_TRUE(in.Bool("json"));
  EXPECT_EQ(in.Number("max_size"), uint64_t{64} << 30);
  EXPECT_EQ(in.Number("mode"), 0640u);
  ASSERT_EQ(Parse({"snapshot", "create", "h", "v1", "--label=a=1,b=2", "--label", "c=3",
                   "--store=/s", "--socket=/x.sock"},
                  &in),
            "");
  EXPECT_EQ(in.labels, (std::vector<std::string>{"a=1", "b=2", "c=3"}));
  EXPECT_EQ(in.String("socket"), "/x.sock");
  ASSERT_EQ(Parse({"clients", "ls", "graph"}, &in), "");
  EXPECT_EQ(in.operands, std::vector<std::string>{"graph"});
  ASSERT_EQ(Parse({"heap", "rm", "--", "-odd"}, &in), "");  // "--" ends the flags
  EXPECT_EQ(in.operands, std::vector<std::string>{"-odd"});
}

TEST(HeapctlArgsTest, RefusesOperandsItDoesNotTake) {
  std::string command;
  EXPECT_EQ(ErrorOf({"heap", "ls", "extra"}, &command), "heap ls takes no operands; got 1: extra");
  EXPECT_EQ(command, "heap ls");
  EXPECT_EQ(ErrorOf({"heap", "rm", "s5", "s8"}), "heap rm takes NAME; got 2: s5 s8");
  EXPECT_EQ(ErrorOf({"heap", "rm"}), "heap rm takes NAME; got 0");
  EXPECT_EQ(ErrorOf({"clients", "ls", "a", "b"}), "clients ls takes [HEAP]; got 2: a b");
  EXPECT_EQ(ErrorOf({"names", "rm", "graph"}), "names rm takes HEAP NAME; got 1: graph");
  EXPECT_EQ(ErrorOf({"heap", "frobnicate"}, &command), "unknown command 'heap frobnicate'");
  EXPECT_EQ(command, "");
  EXPECT_EQ(ErrorOf({}), "no command");
}

TEST(HeapctlArgsTest, RefusesFlagsOfOtherCommandsAndUnknownFlags) {
  EXPECT_EQ(ErrorOf({"heap", "ls", "--to=/tmp"}), "--to does not apply to 'heap ls'");
  EXPECT_EQ(ErrorOf({"heap", "ls", "--frob"}), "unknown flag --frob");
  EXPECT_EQ(ErrorOf({"heap", "ls", "--quiet", "--quiet"}), "--quiet is given twice");
  EXPECT_EQ(ErrorOf({"snapshot", "gc"}), "snapshot gc needs --store=DIR");
  EXPECT_EQ(ErrorOf({"snapshot", "du"}), "snapshot du needs --store=DIR");
  EXPECT_NE(ErrorOf({"snapshot", "ls", "--to=/a", "--store=/b"}).find("exclude each other"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"snapshot", "rm", "v2", "--from_heap=g"}).find("needs --store"),
            std::string::npos);
  EXPECT_EQ(ErrorOf({"heap", "create", "x", "--max_size"}),
            "--max_size needs a value (--max_size=SIZE)");
}

TEST(HeapctlArgsTest, RefusesValuesItWouldHaveToGuess) {
  std::string command;
  EXPECT_NE(ErrorOf({"heap", "create", "x", "--max_size=1GB"}, &command).find("1GiB"),
            std::string::npos);
  EXPECT_EQ(command, "heap create");  // its usage goes with the message
  EXPECT_NE(ErrorOf({"heap", "create", "x", "--max_size=0"}).find("needs a maximum size"),
            std::string::npos);
  EXPECT_NE(ErrorOf({"heap", "create", "x", "--mode=0000"}).find("no one may"), std::string::npos);
  EXPECT_NE(ErrorOf({"heap", "create", "x", "--mode=0"}).find("no one may"), std::string::npos);
  EXPECT_NE(ErrorOf({"heap", "create", "x", "--mode=0648"}).find("octal"), std::string::npos);
  EXPECT_NE(ErrorOf({"heap", "create", "x", "--mode=1777"}).find("octal"), std::string::npos);
  EXPECT_NE(ErrorOf({"heap", "ls", "--owner=-1"}).find("whole number"), std::string::npos);
  EXPECT_NE(ErrorOf({"heap", "ls", "--quiet=yes"}).find("true or false"), std::string::npos);
  EXPECT_NE(ErrorOf({"snapshot", "create", "h", "s", "--label=novalue"}).find("KEY=VALUE"),
            std::string::npos);
  Invocation in;
  ASSERT_EQ(Parse({"heap", "create", "x", "--max_size=4097", "--mode=600"}, &in), "");
  EXPECT_EQ(in.Number("max_size"), 4097u);
  EXPECT_EQ(in.Number("mode"), 0600u);
  ASSERT_EQ(Parse({"heap", "create", "x", "--mode=0060"}, &in), "");  // the group only
  EXPECT_EQ(in.Number("mode"), 0060u);
}

TEST(HeapctlArgsTest, HelpAndVersionNeedNoCommand) {
  Invocation in;
  ASSERT_EQ(Parse({"--version"}, &in), "");
  EXPECT_TRUE(in.Bool("version"));
  EXPECT_EQ(in.command, nullptr);
  ASSERT_EQ(Parse({"snapshot", "gc", "--help"}, &in), "");
  ASSERT_NE(in.command, nullptr);
  EXPECT_STREQ(in.command->name, "snapshot gc");
  EXPECT_NE(HeapctlUsage(in.command).find("--store=DIR"), std::string::npos);
  EXPECT_NE(HeapctlUsage(nullptr).find("names rm HEAP NAME"), std::string::npos);
}

TEST(HeapctlArgsTest, EveryCommandsFlagsAreKnown) {
  for (const CommandSpec& command : HeapctlCommands()) {
    for (const char* flag : command.flags) {
      const bool known =
          std::any_of(HeapctlFlags().begin(), HeapctlFlags().end(),
                      [flag](const FlagSpec& f) { return std::string(f.name) == flag; });
      ASSERT_TRUE(known) << command.name << " takes an unknown flag --" << flag;
      EXPECT_NE(HeapctlUsage(&command).find(std::string("--") + flag), std::string::npos)
          << command.name;
    }
    EXPECT_LE(command.min_operands, command.max_operands) << command.name;
  }
}

TEST(HeapctlArgsTest, AFlagMayGiveTheOperandButNotBoth) {
  Invocation in;
  ASSERT_EQ(Parse({"clients", "ls", "--heap=g"}, &in), "");
  EXPECT_EQ(in.operands, std::vector<std::string>{"g"});
  EXPECT_EQ(ErrorOf({"clients", "ls", "g", "--heap=h"}), "give [HEAP] or --heap, not both");
}

TEST(HeapctlArgsTest, AWrongFlagComesWithItsCommandsUsage) {
  std::string command;
  EXPECT_EQ(ErrorOf({"heap", "ls", "--frob"}, &command), "unknown flag --frob");
  EXPECT_EQ(command, "heap ls");
  EXPECT_EQ(ErrorOf({"--frob"}, &command), "unknown flag --frob");
  EXPECT_EQ(command, "");
}

}  // namespace
}  // namespace heapd
