#include "client/heapctl_args.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "util/byte_size.h"

namespace heapd {
namespace {

const FlagSpec* FindFlag(absl::string_view name) {
  for (const FlagSpec& flag : HeapctlFlags()) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

bool IsGlobal(absl::string_view name) {
  const std::vector<const char*>& global = GlobalFlags();
  return std::any_of(global.begin(), global.end(), [name](const char* g) { return name == g; });
}

bool Takes(const CommandSpec& command, absl::string_view flag) {
  return std::any_of(command.flags.begin(), command.flags.end(),
                     [flag](const char* f) { return flag == f; });
}

// The octal number `digits` spells; more than 0777 for anything else.
uint64_t ParseOctal(absl::string_view digits) {
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '7' || value > 0777) return 01000;
    value = value * 8 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

// The value of `flag` checked for its kind; empty if it is fine.
std::string CheckValue(const FlagSpec& flag, const std::string& value) {
  const std::string given = absl::StrCat("--", flag.name, "=", value);
  switch (flag.kind) {
    case FlagKind::kBool:
      if (value != "true" && value != "false") return given + ": true or false";
      return "";
    case FlagKind::kString:
      if (value.empty()) return given + ": empty";
      return "";
    case FlagKind::kSize: {
      absl::StatusOr<uint64_t> bytes = ParseByteSize(value);
      if (!bytes.ok()) return absl::StrCat("--", flag.name, ": ", bytes.status().message());
      if (*bytes == 0)
        return given + ": a heap needs a maximum size (leave the flag out for heapd's default)";
      return "";
    }
    case FlagKind::kMode: {
      const uint64_t mode = ParseOctal(value);
      if (value.empty() || value.size() > 4 || mode > 0777) {
        return given + ": octal permission bits up to 0777, e.g. 0640";
      }
      if (mode == 0) {
        return given + ": a heap no one may read or write (heapd takes 0 for its default, 0600)";
      }
      return "";
    }
    case FlagKind::kImage:
      if (value != "direct" && value != "working") {
        return given + ": direct (clients map the data file) or working (a working image)";
      }
      return "";
    case FlagKind::kUint: {
      uint64_t number;
      if (!absl::SimpleAtoi(value, &number) || absl::StartsWith(value, "-") ||
          absl::StartsWith(value, "+")) {
        return given + ": a whole number, 0 or more";
      }
      return "";
    }
  }
  return "";
}

}  // namespace

const std::vector<FlagSpec>& HeapctlFlags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"socket", FlagKind::kString, "PATH", "heapd's socket (default: $HEAPD_SOCKET or heapd's)"},
      {"json", FlagKind::kBool, "", "print the answer as JSON (protobuf's mapping of heapd.v1)"},
      {"help", FlagKind::kBool, "", "print the usage and exit"},
      {"version", FlagKind::kBool, "", "print heapctl's version and exit"},
      {"max_size", FlagKind::kSize, "SIZE",
       "maximum size: bytes, or with a unit (64G = 64GiB); default: heapd's --default_max_size"},
      {"mode", FlagKind::kMode, "MODE",
       "permission bits, octal, as a file's (default 0600; 0060: the group only)"},
      {"image", FlagKind::kImage, "direct|working",
       "what clients map: working (a working image in memory; the data file changes only at "
       "syncs) or direct (the data file; on a file system contents do not roll back). Default: "
       "heapd's (working on a file system, unless --working_images=false)"},
      {"storage", FlagKind::kString, "TIER",
       "the storage tier to make the heap on, as heapd's --storage names it (default: heapd's "
       "first; a restore replacing the heap --heap names: that heap's)"},
      {"fixed_address", FlagKind::kBool, "",
       "every process maps the heap at one address heapd assigns, so objects may hold plain "
       "pointers (heapd::raw_allocator; docs/api.md, \"Fixed-address heaps\")"},
      {"owner", FlagKind::kUint, "UID", "only heaps of this uid"},
      {"quiet", FlagKind::kBool, "",
       "names only (heap ls), 'SNAPSHOT HEAP' or 'VERSION NODE HEAP' lines (snapshot ls)"},
      {"prefix", FlagKind::kString, "P", "only names starting with P"},
      {"heap", FlagKind::kString, "NAME",
       "clients ls: only clients of this heap; snapshot restore: the heap to make"},
      {"to", FlagKind::kString, "DIR", "a directory of snapshots (default: heapd's own)"},
      {"store", FlagKind::kString, "DIR",
       "a snapshot store (incremental, deduplicated versions) instead of --to"},
      {"from_node", FlagKind::kString, "NODE", "with --store: the part of this node"},
      {"from_heap", FlagKind::kString, "HEAP", "with --store: the part of this heap"},
      {"label", FlagKind::kString, "KEY=VALUE,...", "labels of the snapshot"},
      {"wait_ms", FlagKind::kUint, "N",
       "how long to wait for writers to sync, in milliseconds (default 10000)"},
      {"replace", FlagKind::kBool, "", "replace the heap if it exists (it must have no clients)"},
      {"keep_owner", FlagKind::kBool, "",
       "admins: the heap keeps the snapshot's owner, group and mode"},
      {"grace_s", FlagKind::kUint, "N",
       "keep blocks younger than N seconds (default: heapd's, 600)"},
      {"dry_run", FlagKind::kBool, "", "count what would be removed, remove nothing"},
  };
  return *flags;
}

const std::vector<const char*>& GlobalFlags() {
  static const auto* global = new std::vector<const char*>{"socket", "json", "help", "version"};
  return *global;
}

const std::vector<CommandSpec>& HeapctlCommands() {
  static const auto* commands = new std::vector<CommandSpec>{
      {Command::kHeapCreate,
       "heap create",
       "NAME",
       1,
       1,
       {"max_size", "mode", "image", "storage", "fixed_address"},
       {},
       "create a heap"},
      {Command::kHeapLs, "heap ls", "", 0, 0, {"owner", "quiet"}, {}, "list the heaps"},
      {Command::kHeapStat,
       "heap stat",
       "NAME",
       1,
       1,
       {},
       {},
       "a heap's usage, chunks, size classes and clients"},
      {Command::kHeapRm,
       "heap rm",
       "NAME",
       1,
       1,
       {},
       {},
       "remove a heap (it must have no clients)"},
      {Command::kNamesLs,
       "names ls",
       "HEAP",
       1,
       1,
       {"prefix"},
       {},
       "the names bound in a heap, with type and size"},
      {Command::kNamesRm,
       "names rm",
       "HEAP NAME",
       2,
       2,
       {},
       {},
       "unbind a name (the object stays allocated), persisted at once"},
      {Command::kClientsLs,
       "clients ls",
       "[HEAP]",
       0,
       1,
       {"heap"},
       {},
       "the sessions attached (to one heap)",
       "heap"},
      {Command::kSnapshotCreate,
       "snapshot create",
       "HEAP NAME",
       2,
       2,
       {"to", "store", "label", "wait_ms"},
       {},
       "snapshot a heap at its last sync: a directory snapshot, or a store version's part"},
      {Command::kSnapshotLs,
       "snapshot ls",
       "",
       0,
       0,
       {"to", "store", "quiet"},
       {},
       "list snapshots or store versions"},
      {Command::kSnapshotVerify,
       "snapshot verify",
       "NAME",
       1,
       1,
       {"to", "store", "from_node", "from_heap"},
       {},
       "check a snapshot or store version whole"},
      {Command::kSnapshotRm,
       "snapshot rm",
       "NAME",
       1,
       1,
       {"to", "store", "from_node", "from_heap"},
       {},
       "remove a snapshot, or parts of a store version"},
      {Command::kSnapshotRestore,
       "snapshot restore",
       "NAME",
       1,
       1,
       {"to", "store", "from_node", "from_heap", "heap", "replace", "keep_owner", "storage"},
       {},
       "make a heap from a snapshot or a store version's part"},
      {Command::kSnapshotGc,
       "snapshot gc",
       "",
       0,
       0,
       {"store", "grace_s", "dry_run"},
       {"store"},
       "remove a store's blocks no version names"},
      {Command::kSnapshotDu,
       "snapshot du",
       "",
       0,
       0,
       {"store"},
       {"store"},
       "what each part of a store takes"},
  };
  return *commands;
}

std::string Invocation::String(const std::string& flag) const {
  auto it = flags.find(flag);
  return it == flags.end() ? "" : it->second;
}

bool Invocation::Bool(const std::string& flag) const { return String(flag) == "true"; }

uint64_t Invocation::Number(const std::string& flag) const {
  const std::string value = String(flag);
  uint64_t number = 0;
  const FlagSpec* spec = FindFlag(flag);
  if (spec == nullptr || value.empty()) return 0;
  switch (spec->kind) {
    case FlagKind::kSize:
      return ParseByteSize(value).value_or(0);
    case FlagKind::kMode:
      return ParseOctal(value);
    default:
      (void)absl::SimpleAtoi(value, &number);
      return number;
  }
}

bool ParseHeapctlArgs(absl::Span<const std::string> args, Invocation* invocation,
                      UsageError* error) {
  *invocation = Invocation();
  auto fail = [error](std::string message, const CommandSpec* command = nullptr) {
    *error = UsageError{std::move(message), command};
    return false;
  };
  std::vector<std::string> words;
  bool flags_ended = false;
  // A wrong flag or value is reported once the command is known, with its
  // usage.
  std::string wrong_value;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_ended || arg.size() < 2 || arg[0] != '-') {
      words.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t equals = body.find('=');
    std::string name = body.substr(0, equals);
    if (name == "h") name = "help";
    const FlagSpec* flag = FindFlag(name);
    if (flag == nullptr) {
      if (wrong_value.empty())
        wrong_value = absl::StrCat("unknown flag ", arg.substr(0, arg.find('=')));
      continue;
    }
    std::string value;
    if (equals != std::string::npos) {
      value = body.substr(equals + 1);
    } else if (flag->kind == FlagKind::kBool) {
      value = "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      if (wrong_value.empty()) {
        wrong_value = absl::StrCat("--", name, " needs a value (--", name, "=", flag->value, ")");
      }
      continue;
    }
    if (std::string wrong = CheckValue(*flag, value); !wrong.empty() && wrong_value.empty()) {
      wrong_value = wrong;
    }
    if (name == "label") {
      for (absl::string_view label : absl::StrSplit(value, ',')) {
        if ((label.find('=') == absl::string_view::npos || label.front() == '=') &&
            wrong_value.empty()) {
          wrong_value = absl::StrCat("--label=", value, ": each label is KEY=VALUE");
        }
        invocation->labels.emplace_back(label);
      }
      invocation->flags[name] = value;
      continue;
    }
    if (!invocation->flags.emplace(name, value).second) {
      return fail(absl::StrCat("--", name, " is given twice"));
    }
  }
  const std::string name = words.size() >= 2   ? absl::StrCat(words[0], " ", words[1])
                           : words.size() == 1 ? words[0]
                                               : "";
  for (const CommandSpec& command : HeapctlCommands()) {
    if (name == command.name) invocation->command = &command;
  }
  const CommandSpec* command = invocation->command;
  // With a command, --help is that command's usage.
  if (invocation->Bool("help") || invocation->Bool("version")) return true;
  if (!wrong_value.empty()) return fail(wrong_value, command);
  if (words.empty()) return fail("no command");
  if (command == nullptr) return fail(absl::StrCat("unknown command '", name, "'"));
  invocation->operands.assign(words.begin() + 2, words.end());
  const size_t count = invocation->operands.size();
  if (count < command->min_operands || count > command->max_operands) {
    const std::string takes =
        command->max_operands == 0 ? "no operands" : absl::StrCat(command->operands);
    return fail(absl::StrCat(
                    command->name, " takes ", takes, "; got ", count,
                    count == 0 ? "" : absl::StrCat(": ", absl::StrJoin(invocation->operands, " "))),
                command);
  }
  for (const auto& [flag, value] : invocation->flags) {
    if (!IsGlobal(flag) && !Takes(*command, flag)) {
      return fail(absl::StrCat("--", flag, " does not apply to '", command->name, "'"), command);
    }
  }
  if (command->operand_flag != nullptr && invocation->Has(command->operand_flag)) {
    if (!invocation->operands.empty()) {
      return fail(
          absl::StrCat("give ", command->operands, " or --", command->operand_flag, ", not both"),
          command);
    }
    invocation->operands.push_back(invocation->String(command->operand_flag));
  }
  for (const char* flag : command->required_flags) {
    if (!invocation->Has(flag)) {
      return fail(absl::StrCat(command->name, " needs --", flag, "=", FindFlag(flag)->value),
                  command);
    }
  }
  if (invocation->Has("to") && invocation->Has("store")) {
    return fail(
        "--to and --store exclude each other: --to names a directory of snapshots, "
        "--store a snapshot store",
        command);
  }
  for (const char* flag : {"from_node", "from_heap"}) {
    if (invocation->Has(flag) && !invocation->Has("store")) {
      return fail(
          absl::StrCat("--", flag, " picks a part of a store version: it needs --store=DIR"),
          command);
    }
  }
  return true;
}

std::string HeapctlUsage(const CommandSpec* command) {
  auto line = [](const CommandSpec& c) {
    std::string text = absl::StrCat("heapctl [--socket=PATH] [--json] ", c.name);
    if (*c.operands != '\0') absl::StrAppend(&text, " ", c.operands);
    for (const char* name : c.flags) {
      const FlagSpec* flag = FindFlag(name);
      const bool required =
          std::any_of(c.required_flags.begin(), c.required_flags.end(),
                      [name](const char* r) { return absl::string_view(r) == name; });
      const std::string shown = flag->kind == FlagKind::kBool
                                    ? absl::StrCat("--", name)
                                    : absl::StrCat("--", name, "=", flag->value);
      absl::StrAppend(&text, required ? " " : " [", shown, required ? "" : "]");
    }
    return text;
  };
  if (command == nullptr) {
    std::string text = "usage:\n";
    for (const CommandSpec& c : HeapctlCommands()) absl::StrAppend(&text, "  ", line(c), "\n");
    absl::StrAppend(&text, "heapctl COMMAND --help: a command's flags; heapctl --version");
    return text;
  }
  std::string text = absl::StrCat("usage: ", line(*command), "\n  ", command->summary);
  for (const char* name : command->flags) {
    const FlagSpec* flag = FindFlag(name);
    absl::StrAppend(&text, "\n  --", name, flag->kind == FlagKind::kBool ? "" : "=", flag->value,
                    "  ", flag->help);
  }
  return text;
}

}  // namespace heapd
