#include "client/mapped_heap.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "heap/fixed_address.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// The fixed-address heaps mapped in this process (or inherited by it),
// each with the process whose range it is. One lock, which the forking
// thread holds across fork() (pthread_atfork): a child finds it free and
// the list whole.
struct FixedHeaps {
  std::mutex mu;
  std::vector<std::pair<MappedHeap*, pid_t>> listed;  // guarded by mu
};

FixedHeaps& Fixed() {
  static FixedHeaps* const fixed = [] {
    auto* made = new FixedHeaps;
    pthread_atfork([] { Fixed().mu.lock(); }, [] { Fixed().mu.unlock(); },
                   [] { Fixed().mu.unlock(); });
    return made;
  }();
  return *fixed;
}

AddressRange RangeOf(const MappedHeap& heap) {
  return FixedRangeOf(reinterpret_cast<uintptr_t>(heap.base()), heap.max_size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedHeap>> MappedHeap::Map(std::string heap_name, int data_fd,
                                                            uint64_t max_size, uint64_t capacity,
                                                            bool writable, uint64_t prefix_bytes,
                                                            uint64_t fixed_base) {
  if (fixed_base != 0) {
    // In a forked child: a mapping of this range inherited and not kept
    // goes first (anything else of the process there is named below).
    const AddressRange wanted = FixedRangeOf(fixed_base, max_size);
    std::lock_guard<std::mutex> lock(Fixed().mu);
    std::vector<std::pair<MappedHeap*, pid_t>>& listed = Fixed().listed;
    for (auto it = listed.begin(); it != listed.end();) {
      if (it->second != getpid() && RangeOf(*it->first).Overlaps(wanted)) {
        it->first->given_back_.store(true);
        it->first->mapping_->Unmap();
        it = listed.erase(it);
      } else {
        ++it;
      }
    }
  }
  absl::StatusOr<std::unique_ptr<HeapMapping>> mapping =
      HeapMapping::Map(data_fd, max_size, capacity, writable, prefix_bytes, fixed_base);
  if (!mapping.ok()) {
    if (fixed_base == 0) return mapping.status();
    return absl::Status(
        mapping.status().code(),
        absl::StrCat("heap ", heap_name, " is a fixed-address heap, and ",
                     mapping.status().message(), " (a process maps a fixed-address heap once)"));
  }
  std::unique_ptr<MappedHeap> mapped(
      new MappedHeap(std::move(heap_name), data_fd, *std::move(mapping)));
  if (fixed_base != 0) {
    mapped->fixed_ = true;
    std::lock_guard<std::mutex> lock(Fixed().mu);
    Fixed().listed.emplace_back(mapped.get(), getpid());
  }
  return mapped;
}

MappedHeap::~MappedHeap() {
  StopGrowth();
  if (fixed_) Unlist();
}

void MappedHeap::Unlist() {
  std::lock_guard<std::mutex> lock(Fixed().mu);
  std::vector<std::pair<MappedHeap*, pid_t>>& listed = Fixed().listed;
  for (auto it = listed.begin(); it != listed.end(); ++it) {
    if (it->first == this) {
      listed.erase(it);
      return;
    }
  }
}

void MappedHeap::UnmapInForkedChild() {
  if (!fixed_) return;
  Unlist();
  given_back_.store(true);
  mapping_->Unmap();
}

void MappedHeap::StartGrowth(WriteTracker* tracker) {
  if (tracker != nullptr) {
    growing_.uffd = tracker->fd();
    growing_.fenced = tracker->fencing();
    growing_.unprotected = tracker->unprotected_growth();
  }
  fault_slot_ = RegisterHeapForGrowthFaults(growing_);
  if (tracker != nullptr) tracker->set_growth_slot(fault_slot_);
}

void MappedHeap::StopGrowth() {
  if (fault_slot_ < 0) return;
  UnregisterHeapForGrowthFaults(fault_slot_);
  fault_slot_ = -1;
}

absl::Status MappedHeap::MapUpTo(uint64_t capacity) {
  if (capacity <= mapped_bytes()) return absl::OkStatus();
  if (given_back_.load()) return GivenBack();
  if (capacity > max_size()) {
    return absl::InternalError(absl::StrCat("heap ", heap_name_, ": heapd answered capacity ",
                                            capacity, " beyond the heap's maximum ", max_size()));
  }
  absl::MutexLock lock(&mu_);
  if (const int error = MapHeapGrowth(growing_, fault_slot_, capacity); error != 0) {
    return ErrnoStatus(error, absl::StrCat("map heap ", heap_name_, " up to ", capacity, " bytes"));
  }
  mapping_->Adopt(mapped_bytes());
  return absl::OkStatus();
}

absl::Status MappedHeap::MapUpToFileSize(uint64_t needed) {
  if (needed <= mapped_bytes()) return absl::OkStatus();
  struct stat st;
  if (fstat(data_fd_, &st) != 0) return ErrnoStatus(errno, "stat the heap's data file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (needed > file_bytes) {
    return absl::DataLossError(
        absl::StrCat("heap ", heap_name_, " ends at ", file_bytes, " bytes, before byte ", needed));
  }
  return MapUpTo(std::min<uint64_t>(file_bytes / kChunkSize * kChunkSize, max_size()));
}

absl::Status MappedHeap::Flush() {
  {
    absl::MutexLock lock(&mu_);
    mapping_->Adopt(mapped_bytes());
  }
  return mapping_->Flush();
}

absl::Status MappedHeap::GivenBack() const {
  return absl::FailedPreconditionError(
      absl::StrCat("heap ", heap_name_,
                   ": this forked child gave the fixed-address heap's range back to map the heap "
                   "anew; its parent's mapping is gone"));
}

absl::Status MappedHeap::MapPrivately(bool writable) {
  // The fork emptied this process's fault slots (growth_fault_handler.cc):
  // the slot number may be another heap's once this process attaches one.
  fault_slot_ = -1;
  if (fixed_) {
    std::lock_guard<std::mutex> lock(Fixed().mu);
    if (given_back_.load()) return GivenBack();
    for (std::pair<MappedHeap*, pid_t>& each : Fixed().listed) {
      if (each.first == this) each.second = getpid();  // kept: this child's range now
    }
  }
  const uint64_t mapped = mapped_bytes();
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  if (mapped != 0 &&
      mmap(base(), mapped, prot, MAP_PRIVATE | MAP_FIXED, data_fd_, 0) == MAP_FAILED) {
    return ErrnoStatus(errno,
                       absl::StrCat("map heap ", heap_name_, " privately in a forked child"));
  }
  return absl::OkStatus();
}

}  // namespace heapd
