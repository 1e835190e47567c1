#include "daemon/heap_registry.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "heap/data_file.h"
#include "spdlog/spdlog.h"

namespace heapd {
std::shared_ptr<ServedHeap> MakeServedHeap(const std::string& name, std::unique_ptr<PersistentHeap> heap) {
  const bool reflink = ReflinkSupported(heap->dir());
  return std::make_shared<ServedHeap>(ServedHeap{name, std::move(heap), reflink});
}

absl::StatusOr<std::unique_ptr<HeapRegistry>> HeapRegistry::Open(const std::string& state_dir) {
  const std::string heaps_dir = absl::StrCat(state_dir, "/heaps");
  std::error_code error;
  std::filesystem::create_directories(heaps_dir, error);
  if (error) {
    return ErrnoStatus(error.value(), absl::StrCat("create state directory ", heaps_dir));
  }
  std::unique_ptr<HeapRegistry> registry(new HeapRegistry(heaps_dir));
  absl::MutexLock lock(&registry->mu_);
  for (const auto& entry : std::filesystem::directory_iterator(heaps_dir, error)) {
    const std::string name = entry.path().filename();
    if (!entry.is_directory() || !ValidateHeapName(name).ok()) continue;  // e.g. leftovers
    absl::StatusOr<std::unique_ptr<PersistentHeap>> heap = PersistentHeap::Open(entry.path());
    if (!heap.ok()) {
      spdlog::error("heap {} cannot be opened and is left as it is: {}", name,
                    heap.status().ToString());
      registry->broken_.emplace(name, heap.status());
      continue;
    }
    spdlog::info("opened heap {} at epoch {}", name, (*heap)->epoch());
    registry->heaps_.emplace(name, MakeServedHeap(name, *std::move(heap)));
  }
  if (error) return ErrnoStatus(error.value(), absl::StrCat("list ", heaps_dir));
  return registry;
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::Create(const std::string& name,
                                                                 const HeapConfig& config) {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (heaps_.count(name) != 0 || broken_.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("heap ", name, " already exists"));
  }
  absl::StatusOr<std::unique_ptr<PersistentHeap>> heap =
      PersistentHeap::Create(absl::StrCat(heaps_dir_, "/", name), config);
  if (!heap.ok()) return heap.status();
  std::shared_ptr<ServedHeap> served = MakeServedHeap(name, *std::move(heap));
  heaps_.emplace(name, served);
  return served;
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::OpenNew(const std::string& name) {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (heaps_.count(name) != 0 || broken_.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("heap ", name, " already exists"));
  }
  const std::string dir = absl::StrCat(heaps_dir_, "/", name);
  absl::StatusOr<std::unique_ptr<PersistentHeap>> heap = PersistentHeap::Open(dir);
  if (!heap.ok()) return heap.status();
  std::shared_ptr<ServedHeap> served = MakeServedHeap(name, *std::move(heap));
  heaps_.emplace(name, served);
  return served;
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapRegistry::Get(absl::string_view name) const {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (auto it = heaps_.find(name); it != heaps_.end()) return it->second;
  if (auto it = broken_.find(name); it != broken_.end()) {
    return absl::Status(it->second.code(),
                        absl::StrCat("heap ", name, " failed to open: ", it->second.message()));
  }
  return absl::NotFoundError(absl::StrCat("no heap named ", name));
}

absl::Status HeapRegistry::Remove(absl::string_view name) {
  if (absl::Status s = ValidateHeapName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = heaps_.find(name);
  auto broken = broken_.find(name);
  if (it == heaps_.end() && broken == broken_.end()) {
    return absl::NotFoundError(absl::StrCat("no heap named ", name));
  }
  // Rename first, so a crash while deleting leaves no heap behind (Open
  // skips names starting with '.').
  const std::string dir = absl::StrCat(heaps_dir_, "/", name);
  const std::string doomed = absl::StrCat(heaps_dir_, "/.removing.", name);
  std::error_code error;
  std::filesystem::remove_all(doomed, error);
  std::filesystem::rename(dir, doomed, error);
  if (error) return ErrnoStatus(error.value(), absl::StrCat("rename ", dir, " to ", doomed));
  if (it != heaps_.end()) heaps_.erase(it);
  if (broken != broken_.end()) broken_.erase(broken);
  std::filesystem::remove_all(doomed, error);
  if (error) spdlog::warn("removing {}: {}", doomed, error.message());
  return absl::OkStatus();
}

std::vector<std::shared_ptr<ServedHeap>> HeapRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<ServedHeap>> heaps;
  for (const auto& [name, heap] : heaps_) heaps.push_back(heap);
  return heaps;
}

std::map<std::string, absl::Status> HeapRegistry::Broken() const {
  absl::MutexLock lock(&mu_);
  return {broken_.begin(), broken_.end()};
}

absl::Status HeapRegistry::SyncAll() {
  absl::Status first;
  for (const std::shared_ptr<ServedHeap>& served : List()) {
    absl::StatusOr<SyncResult> result = served->heap->Sync(/*client=*/0, {});
    if (!result.ok()) {
      spdlog::error("sync of heap {} failed: {}", served->name, result.status().ToString());
      first.Update(result.status());
    }
  }
  return first;
}

}  // namespace heapd
