#include "util/program_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"

namespace heapd {
namespace {

void PrintHelp(const char* usage) {
  std::printf("%s\n\nflags:\n", usage);
  std::vector<const absl::CommandLineFlag*> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), "absl/")) own.push_back(flag);
  }
  std::sort(own.begin(), own.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  for (const absl::CommandLineFlag* flag : own) {
    const std::string fallback = flag->DefaultValue();
    std::printf("  --%s (default: %s)\n      %s\n", std::string(flag->Name()).c_str(),
                fallback.empty() ? "\"\"" : fallback.c_str(), flag->Help().c_str());
  }
}

}  // namespace

std::vector<char*> ParseProgramFlags(int argc, char** argv, const char* usage,
                                     const char* version) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull") {
      PrintHelp(usage);
      std::exit(0);
    }
    if (arg == "--version" || arg == "-version") {
      const char* slash = std::strrchr(argv[0], '/');
      std::printf("%s %s\n", slash == nullptr ? argv[0] : slash + 1, version);
      std::exit(0);
    }
  }
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace heapd
