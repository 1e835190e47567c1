#include "client/thread_caches.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

std::atomic<uint64_t> next_serial{1};

}  // namespace

absl::StatusOr<std::vector<LeaseGrant>> ThreadCaches::Cache::LeaseChunks(
    uint32_t size_class, uint32_t count, absl::Span<const uint32_t> reuse) {
  absl::StatusOr<std::vector<LeaseGrant>> grants = caches->leaser_(size_class, count, reuse);
  if (!grants.ok()) return grants;
  for (const LeaseGrant& grant : *grants) {
    caches->owner_[grant.chunk].store(this, std::memory_order_release);
  }
  return grants;
}

ThreadCaches::ThreadCaches(std::string heap, uint32_t lease_batch, Leaser leaser)
    : heap_(std::move(heap)),
      lease_batch_(lease_batch),
      leaser_(std::move(leaser)),
      serial_(next_serial.fetch_add(1)) {}

void ThreadCaches::Start(uint64_t max_chunks) {
  max_chunks_ = max_chunks;
  owner_.reset(new std::atomic<Cache*>[max_chunks]());
}

ThreadCaches::Cache* ThreadCaches::NewForThisThread() {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Cache>& cache = caches_[std::this_thread::get_id()];
  if (cache == nullptr) cache = std::make_unique<Cache>(this, max_chunks_, lease_batch_);
  return cache.get();
}

void ThreadCaches::QueueFree(Cache* owner, uint64_t offset) {
  owner->queued_lock.lock();
  owner->queued_frees.push_back(offset);
  owner->has_queued_frees.store(true, std::memory_order_relaxed);
  owner->queued_lock.unlock();
}

void ThreadCaches::ApplyQueuedFrees(Cache* cache) {
  std::vector<uint64_t> frees;
  cache->queued_lock.lock();
  frees.swap(cache->queued_frees);
  cache->has_queued_frees.store(false, std::memory_order_relaxed);
  cache->queued_lock.unlock();
  for (uint64_t offset : frees) {
    const LocalFree result = cache->pool.Free(offset);
    if (result == LocalFree::kFreed) continue;
    const std::string why = result == LocalFree::kNotLive
                                ? cache->pool.DescribeNotLive(offset)
                                : absl::StrCat("offset ", offset, " is in no leased chunk");
    absl::MutexLock lock(&rejected_mu_);
    rejected_.Update(absl::InvalidArgumentError(
        absl::StrCat("heap ", heap_, ": a free from another thread was rejected: ", why)));
  }
}

std::vector<ThreadCaches::Cache*> ThreadCaches::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<Cache*> all;
  for (const auto& [thread, cache] : caches_) all.push_back(cache.get());
  return all;
}

absl::Status ThreadCaches::TakeRejected() {
  absl::MutexLock lock(&rejected_mu_);
  return std::exchange(rejected_, absl::OkStatus());
}

}  // namespace heapd
