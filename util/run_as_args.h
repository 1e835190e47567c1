// The arguments of a RunAs job (util/run_as.h) as bytes: heapd writes them,
// the helper it spawned reads them back in the same order. Both are the
// same executable, so the order is the whole format; a reader that finds
// less or other than it expects says so (a bug, not a hostile input: the
// bytes never pass through a user's hands).
#ifndef HEAPD_UTIL_RUN_AS_ARGS_H_
#define HEAPD_UTIL_RUN_AS_ARGS_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace heapd {

class ArgsWriter {
 public:
  ArgsWriter& Add(uint64_t value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value));
    return *this;
  }
  ArgsWriter& Add(absl::string_view value) {
    Add(static_cast<uint64_t>(value.size()));
    bytes_.append(value.data(), value.size());
    return *this;
  }
  ArgsWriter& Add(const char* value) { return Add(absl::string_view(value)); }
  ArgsWriter& Add(const std::string& value) { return Add(absl::string_view(value)); }
  ArgsWriter& Add(const std::vector<uint64_t>& values) {
    Add(static_cast<uint64_t>(values.size()));
    for (uint64_t value : values) Add(value);
    return *this;
  }
  template <typename Bytes>  // std::string, absl::string_view
  ArgsWriter& Add(const std::map<std::string, Bytes>& files) {
    Add(static_cast<uint64_t>(files.size()));
    for (const auto& [name, bytes] : files) Add(name).Add(bytes);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Reads what an ArgsWriter wrote. Each Next returns false, and every later
// one too, once the bytes do not hold what is asked for.
class ArgsReader {
 public:
  ArgsReader() = default;
  explicit ArgsReader(absl::string_view bytes) : rest_(bytes) {}

  bool Next(uint64_t* value) {
    if (!ok_ || rest_.size() < sizeof(*value)) return ok_ = false;
    std::memcpy(value, rest_.data(), sizeof(*value));
    rest_.remove_prefix(sizeof(*value));
    return true;
  }
  // A string's bytes in place: valid as long as the bytes read.
  bool Next(absl::string_view* value) {
    uint64_t size = 0;
    if (!Next(&size) || size > rest_.size()) return ok_ = false;
    *value = rest_.substr(0, size);
    rest_.remove_prefix(size);
    return true;
  }
  bool Next(std::string* value) {
    absl::string_view view;
    if (!Next(&view)) return false;
    value->assign(view.data(), view.size());
    return true;
  }
  bool Next(std::vector<uint64_t>* values) {
    uint64_t count = 0;
    if (!Next(&count) || count > rest_.size() / sizeof(uint64_t)) return ok_ = false;
    values->resize(count);
    for (uint64_t& value : *values) Next(&value);
    return ok_;
  }
  // Files by name, their bytes copied (std::string) or in place
  // (absl::string_view, valid as long as the bytes read).
  template <typename Bytes>
  bool Next(std::map<std::string, Bytes>* files) {
    uint64_t count = 0;
    if (!Next(&count)) return false;
    for (uint64_t i = 0; i < count; ++i) {
      std::string name;
      if (!Next(&name) || !Next(&(*files)[name])) return false;
    }
    return true;
  }
  // True if every read so far succeeded and nothing is left.
  bool Done() const { return ok_ && rest_.empty(); }

 private:
  absl::string_view rest_;
  bool ok_ = true;
};

}  // namespace heapd

#endif  // HEAPD_UTIL_RUN_AS_ARGS_H_
