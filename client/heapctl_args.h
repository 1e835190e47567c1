// heapctl's command line, parsed strictly, as git parses its own: every
// command names the operands and flags it takes, and anything else (an
// unknown word, a flag of another command, a missing or extra operand, a
// value that does not parse) is a usage error naming what and which.
//
//   heapctl [--socket=PATH] [--json] COMMAND SUBCOMMAND OPERAND... [--flag=VALUE | --flag VALUE]...
//
// Global flags may come anywhere; "--" ends the flags.
#ifndef HEAPD_CLIENT_HEAPCTL_ARGS_H_
#define HEAPD_CLIENT_HEAPCTL_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace heapd {

enum class FlagKind {
  kBool,    // --flag, --flag=true, --flag=false
  kString,  // any text
  kSize,    // bytes with an optional unit (util/byte_size.h)
  kMode,    // octal permission bits up to 0777
  kUint,    // a non-negative integer
  kImage,   // what a heap's clients map: direct or working
};

struct FlagSpec {
  const char* name;
  FlagKind kind;
  const char* value;  // its value in usage lines: "SIZE", "DIR" (empty for a bool)
  const char* help;
};

// Every command; heapctl.cc switches over them (-Werror=switch: a command
// without a function does not build).
enum class Command {
  kHeapCreate,
  kHeapLs,
  kHeapStat,
  kHeapRm,
  kNamesLs,
  kNamesRm,
  kClientsLs,
  kSnapshotCreate,
  kSnapshotLs,
  kSnapshotVerify,
  kSnapshotRm,
  kSnapshotRestore,
  kSnapshotGc,
  kSnapshotDu,
};

struct CommandSpec {
  Command id;
  const char* name;      // "heap create"
  const char* operands;  // as shown in usage: "NAME", "HEAP NAME", "[HEAP]"
  size_t min_operands;
  size_t max_operands;
  std::vector<const char*> flags;           // the flags it takes, besides the global ones
  std::vector<const char*> required_flags;  // of those, the ones it cannot do without
  const char* summary;
  // A flag that may give the optional operand instead (clients ls --heap);
  // giving both is a usage error. Null: none.
  const char* operand_flag = nullptr;
};

// Every flag heapctl knows; the global ones apply to every command.
const std::vector<FlagSpec>& HeapctlFlags();
const std::vector<const char*>& GlobalFlags();
// Every command.
const std::vector<CommandSpec>& HeapctlCommands();

struct Invocation {
  const CommandSpec* command = nullptr;  // null with --help or --version alone
  std::vector<std::string> operands;
  std::map<std::string, std::string> flags;  // as given; a bool given bare is "true"
  std::vector<std::string> labels;           // --label, each KEY=VALUE, in order

  bool Has(const std::string& flag) const { return flags.count(flag) != 0; }
  std::string String(const std::string& flag) const;
  bool Bool(const std::string& flag) const;
  // REQUIRES: the flag is of kind kSize, kMode or kUint (checked when parsed).
  uint64_t Number(const std::string& flag) const;
};

// A usage error: what is wrong, and the command it is about (null when no
// command was recognised), whose usage goes with the message.
struct UsageError {
  std::string message;
  const CommandSpec* command = nullptr;
};

// Parses heapctl's arguments (without argv[0]). Values are checked for
// their kind; --to and --store exclude each other, and --from_node and
// --from_heap need --store. `error` is set when it returns false.
bool ParseHeapctlArgs(absl::Span<const std::string> args, Invocation* invocation,
                      UsageError* error);

// "usage: heapctl ... COMMAND OPERANDS [--flag=VALUE]..." and a line per
// flag for one command; every command's line when `command` is null.
std::string HeapctlUsage(const CommandSpec* command);

}  // namespace heapd

#endif  // HEAPD_CLIENT_HEAPCTL_ARGS_H_
