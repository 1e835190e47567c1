// Names of heaps and snapshots: directory names under the daemon's state
// directory or a snapshot target, so they are restricted to be safe there.
#ifndef HEAPD_HEAP_HEAP_NAME_H_
#define HEAPD_HEAP_HEAP_NAME_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace heapd {

// OK if `name` may name a heap (or a snapshot: `what`): 1..64 of
// [A-Za-z0-9._-], not starting with '.'; INVALID_ARGUMENT saying why.
absl::Status ValidateHeapName(absl::string_view name, absl::string_view what = "heap");

}  // namespace heapd

#endif  // HEAPD_HEAP_HEAP_NAME_H_
