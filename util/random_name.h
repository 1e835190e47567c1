// Names for temporary files and directories, unique without coordination
// (across processes, and across the nodes that share a snapshot store,
// where pids are not).
#ifndef HEAPD_UTIL_RANDOM_NAME_H_
#define HEAPD_UTIL_RANDOM_NAME_H_

#include <string>

namespace heapd {

// 128 random bits (getrandom) in 32 hex digits.
std::string RandomName();

}  // namespace heapd

#endif  // HEAPD_UTIL_RANDOM_NAME_H_
