// Stable type names for named objects. find<T>(name) checks that the name
// binds a T by comparing these strings, which must not change between
// builds (typeid().hash_code() may).
//
// The default is the type as the compiler spells it (g++'s
// __PRETTY_FUNCTION__); names longer than a name entry holds keep their
// first 200 bytes and add a 64-bit FNV-1a hash of the whole. A program that
// must agree with code built by another compiler names its types itself:
//   HEAPD_TYPE_NAME(my::Graph, "my::Graph/v1");
// at global scope, before the type is used with a Heap.
#ifndef HEAPD_HEAPD_TYPE_NAME_H_
#define HEAPD_HEAPD_TYPE_NAME_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace heapd {
namespace internal {

template <typename T>
std::string SpelledTypeName() {
  const std::string function = __PRETTY_FUNCTION__;
  const size_t begin = function.find("T = ") + 4;
  const size_t end = function.find_first_of(";]", begin);
  return function.substr(begin, end - begin);
}

inline std::string FitTypeName(std::string name) {
  constexpr size_t kMaxLength = 255;
  if (name.size() <= kMaxLength) return name;
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ull;
  char suffix[24];
  std::snprintf(suffix, sizeof(suffix), "#%016llx", static_cast<unsigned long long>(hash));
  return name.substr(0, 200) + suffix;
}

}  // namespace internal

template <typename T>
struct TypeNameOf {
  static std::string Get() { return internal::FitTypeName(internal::SpelledTypeName<T>()); }
};

template <typename T>
std::string TypeName() {
  return TypeNameOf<T>::Get();
}

}  // namespace heapd

#define HEAPD_TYPE_NAME(Type, Name)           \
  template <>                                 \
  struct heapd::TypeNameOf<Type> {            \
    static std::string Get() { return Name; } \
  }

#endif  // HEAPD_HEAPD_TYPE_NAME_H_
