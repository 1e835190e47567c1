#include "client/mapped_heap.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// The fixed-address heaps mapped in this process (or inherited by it),
// each with the process holding its range. No lock (a forked child would
// inherit it held): a slot is claimed by its holder (0 -> pid), then
// points at its heap; it is emptied in the opposite order. Only a holder
// that is not this process leads to its heap being touched, and in the
// parent every slot's holder is the parent: a heap another thread is
// destroying there is never dereferenced.
struct FixedSlot {
  std::atomic<pid_t> holder{0};
  std::atomic<MappedHeap*> heap{nullptr};
};
constexpr int kFixedSlots = 256;
FixedSlot fixed_slots[kFixedSlots];

// The slot now holding `heap` for this process, or -1 (more than 256 at
// once: its range stays inherited by forked children).
int List(MappedHeap* heap) {
  for (int i = 0; i < kFixedSlots; ++i) {
    pid_t free = 0;
    if (fixed_slots[i].holder.compare_exchange_strong(free, getpid())) {
      fixed_slots[i].heap.store(heap);
      return i;
    }
  }
  return -1;
}

void Unlist(int slot) {
  if (slot < 0) return;
  fixed_slots[slot].heap.store(nullptr);
  fixed_slots[slot].holder.store(0);
}

// In a forked child: gives back the fixed-address ranges it inherited and
// did not keep.
void GiveBackInheritedRanges() {
  const pid_t self = getpid();
  for (FixedSlot& slot : fixed_slots) {
    const pid_t holder = slot.holder.load();
    if (holder == 0 || holder == self) continue;
    if (MappedHeap* heap = slot.heap.load(); heap != nullptr) heap->GiveBackInherited();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedHeap>> MappedHeap::Map(std::string heap_name, int data_fd,
                                                            uint64_t max_size, uint64_t capacity,
                                                            bool writable, uint64_t prefix_bytes,
                                                            uint64_t fixed_base) {
  if (fixed_base != 0) GiveBackInheritedRanges();
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
  if (fixed_base != 0) mapped->fixed_slot_ = List(mapped.get());
  return mapped;
}

MappedHeap::~MappedHeap() {
  StopGrowth();
  Unlist(std::exchange(fixed_slot_, -1));
}

void MappedHeap::GiveBackInherited() {
  if (given_back_.exchange(true)) return;
  mapping_->Unmap();
  Unlist(std::exchange(fixed_slot_, -1));
}

void MappedHeap::UnmapInForkedChild() {
  given_back_.store(true);
  mapping_->Unmap();
  Unlist(std::exchange(fixed_slot_, -1));
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

absl::Status MappedHeap::MapPrivately(bool writable) {
  // The fork emptied this process's fault slots (growth_fault_handler.cc):
  // the slot number may be another heap's once this process attaches one.
  fault_slot_ = -1;
  if (given_back_.load()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heap ", heap_name_,
        ": this forked child mapped the fixed-address heap anew, and its parent's mapping "
        "is gone"));
  }
  if (fixed_slot_ >= 0) fixed_slots[fixed_slot_].holder.store(getpid());  // kept: this child's
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
