// NameTable: name -> the object it binds (offset, size, stable type name,
// owner uid, creation time). Tracks which names changed since the last
// persisted epoch so a sync writes only those.
//
// Names are 1..255 bytes without control characters; type names likewise.
// Not thread-safe: the owning PersistentHeap serializes calls.
#ifndef HEAPD_HEAP_NAME_TABLE_H_
#define HEAPD_HEAP_NAME_TABLE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heapd {

inline constexpr size_t kMaxNameLength = 255;

struct NameEntry {
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::string type_name;
  uint32_t owner_uid = 0;
  int64_t created_unix_ns = 0;

  bool operator==(const NameEntry& other) const {
    return name == other.name && offset == other.offset && size == other.size &&
           type_name == other.type_name && owner_uid == other.owner_uid &&
           created_unix_ns == other.created_unix_ns;
  }
};

// Returns OK if `name` may name an object; INVALID_ARGUMENT naming the
// problem otherwise. `what` says which field it is ("name", "type name").
absl::Status ValidateName(absl::string_view name, absl::string_view what = "name");

// Changes to names since the last persisted epoch.
struct NameChanges {
  std::vector<NameEntry> bound;
  std::vector<std::string> unbound;
};

class NameTable {
 public:
  // Adds `entry`. ALREADY_EXISTS if the name is taken.
  // REQUIRES: the entry's name and type name are valid.
  absl::Status Bind(const NameEntry& entry);

  // Returns the entry of `name`, or NOT_FOUND.
  absl::StatusOr<NameEntry> Lookup(absl::string_view name) const;

  // Removes `name` and returns its entry, or NOT_FOUND.
  absl::StatusOr<NameEntry> Unbind(absl::string_view name);

  // Entries whose name starts with `prefix`, in name order, at most `limit`
  // (0: no limit).
  std::vector<NameEntry> List(absl::string_view prefix, size_t limit = 0) const;

  // Changes since the last call; the table is clean afterwards.
  NameChanges TakeChanges();

  size_t size() const { return entries_.size(); }

 private:
  std::map<std::string, NameEntry, std::less<>> entries_;
  std::set<std::string, std::less<>> changed_;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_NAME_TABLE_H_
