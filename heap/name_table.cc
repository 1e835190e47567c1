#include "heap/name_table.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace heapd {

absl::Status ValidateName(absl::string_view name, absl::string_view what) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", absl::CHexEscape(name.substr(0, 32)),
                                                   "...' has ", name.size(), " bytes; at most ",
                                                   kMaxNameLength, " are allowed"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has control character 0x", absl::Hex(c), " at byte ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status NameTable::Bind(const NameEntry& entry) {
  auto [it, inserted] = entries_.emplace(entry.name, entry);
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("name '", entry.name,
                                                 "' is already bound (offset ", it->second.offset,
                                                 ", type ", it->second.type_name, ")"));
  }
  changed_.insert(entry.name);
  return absl::OkStatus();
}

absl::StatusOr<NameEntry> NameTable::Lookup(absl::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("name '", name, "' is not bound"));
  }
  return it->second;
}

absl::StatusOr<NameEntry> NameTable::Unbind(absl::string_view name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("name '", name, "' is not bound"));
  }
  NameEntry entry = std::move(it->second);
  entries_.erase(it);
  changed_.insert(entry.name);
  return entry;
}

std::vector<NameEntry> NameTable::List(absl::string_view prefix, size_t limit) const {
  std::vector<NameEntry> result;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && absl::StartsWith(it->first, prefix); ++it) {
    if (limit != 0 && result.size() == limit) break;
    result.push_back(it->second);
  }
  return result;
}

NameChanges NameTable::TakeChanges() {
  NameChanges changes;
  for (const std::string& name : changed_) {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      changes.unbound.push_back(name);
    } else {
      changes.bound.push_back(it->second);
    }
  }
  changed_.clear();
  return changes;
}

}  // namespace heapd
