// Command lines of heapd's programs that take absl flags (heapd, the
// examples, the benchmarks): --help and --version answered on stdout with
// exit status 0 (this abseil exits 1 after --help, and its --version says
// only the build type), everything else parsed by absl.
#ifndef HEAPD_UTIL_PROGRAM_FLAGS_H_
#define HEAPD_UTIL_PROGRAM_FLAGS_H_

#include <vector>

namespace heapd {

// Exits 0 after printing `usage` and the program's own flags for --help
// (or -h, --helpfull), or "PROGRAM VERSION" for --version. Otherwise
// returns absl::ParseCommandLine's positional arguments (argv[0] first).
std::vector<char*> ParseProgramFlags(int argc, char** argv, const char* usage, const char* version);

}  // namespace heapd

#endif  // HEAPD_UTIL_PROGRAM_FLAGS_H_
