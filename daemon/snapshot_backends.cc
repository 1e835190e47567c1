#include "daemon/snapshot_backends.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace heapd {
namespace {

std::map<std::string, std::string> LabelsOf(const v1::CreateSnapshotRequest& request) {
  return {request.labels().begin(), request.labels().end()};
}

PartSelector PartOf(const v1::SnapshotRef& ref) {
  return {ref.store_dir(), ref.name(), ref.node(), ref.heap()};
}

}  // namespace

// ---- directory snapshots

std::string DirectorySnapshots::DirOf(const std::string& target_dir) const {
  return target_dir.empty() ? snapshots_->own_dir() : target_dir;
}

absl::StatusOr<v1::SnapshotManifest> DirectorySnapshots::Create(
    const SnapshotCaller& who, const Caller& caller, ServedHeap& heap, const v1::HeapInfo& source,
    const v1::CreateSnapshotRequest& request, absl::Time start) {
  absl::StatusOr<v1::SnapshotManifest> manifest =
      snapshots_->Create(who, *heap.heap, heap.name, source, {request.target_dir(), request.name()},
                         LabelsOf(request));
  if (!manifest.ok()) return manifest.status();
  manifest->set_duration_us(absl::ToInt64Microseconds(absl::Now() - start));
  spdlog::info(
      "snapshot {} of heap {} at epoch {} taken by {} into {} ({}, {} bytes copied, {} us)",
      request.name(), request.heap(), manifest->epoch(), caller.ToString(),
      DirOf(request.target_dir()), manifest->copy_method(), manifest->bytes_written(),
      manifest->duration_us());
  return manifest;
}

void DirectorySnapshots::CountCreate(const absl::Status& status, double seconds,
                                     const v1::SnapshotManifest& manifest) {
  metrics_->CountSnapshot(status, seconds, manifest.bytes_written());
}

absl::Status DirectorySnapshots::List(const SnapshotCaller& who,
                                      const v1::ListSnapshotsRequest& request,
                                      v1::ListSnapshotsResponse* response) {
  absl::StatusOr<v1::ListSnapshotsResponse> listed = snapshots_->List(who, request.target_dir());
  if (!listed.ok()) return listed.status();
  *response = *std::move(listed);
  return absl::OkStatus();
}

absl::StatusOr<v1::SnapshotManifest> DirectorySnapshots::Verify(const SnapshotCaller& who,
                                                                const v1::SnapshotRef& ref,
                                                                uint64_t max_bytes) {
  return snapshots_->Verify(who, {ref.target_dir(), ref.name()}, max_bytes);
}

absl::Status DirectorySnapshots::Remove(const SnapshotCaller& who, const Caller& caller,
                                        const v1::SnapshotRef& ref,
                                        v1::RemoveSnapshotResponse* /*response*/) {
  if (absl::Status s = snapshots_->Remove(who, {ref.target_dir(), ref.name()}); !s.ok()) return s;
  spdlog::info("snapshot {} in {} removed by {}", ref.name(), DirOf(ref.target_dir()),
               caller.ToString());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RestoredHeapDir>> DirectorySnapshots::Restore(
    const SnapshotCaller& who, const v1::RestoreSnapshotRequest& request,
    const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
    v1::SnapshotManifest* manifest) {
  return snapshots_->Restore(who, {request.target_dir(), request.name()}, heaps_dir, heap_name,
                             options, manifest);
}

void DirectorySnapshots::LogRestored(const std::string& heap, const Caller& caller,
                                     const v1::RestoreSnapshotRequest& request,
                                     const v1::SnapshotManifest& /*manifest*/,
                                     const v1::HeapInfo& info) {
  spdlog::info("heap {} restored by {} from snapshot {} in {} (epoch {}, owner uid {})", heap,
               caller.ToString(), request.name(), DirOf(request.target_dir()), info.epoch(),
               info.owner_uid());
}

// ---- snapshot stores

absl::StatusOr<v1::SnapshotManifest> StoreBackend::Create(const SnapshotCaller& who,
                                                          const Caller& caller, ServedHeap& heap,
                                                          const v1::HeapInfo& source,
                                                          const v1::CreateSnapshotRequest& request,
                                                          absl::Time /*start*/) {
  absl::StatusOr<v1::SnapshotManifest> manifest =
      stores_->Create(who, *heap.heap, heap.name, source, request.store_dir(), request.name(),
                      LabelsOf(request), [&heap] { return heap.UnchangedToken(); });
  if (!manifest.ok()) return manifest.status();
  const v1::StoreUsage& usage = manifest->store();
  spdlog::info(
      "part {}/{}/{} of heap {} at epoch {} stored by {} in {}: {} logical bytes, {} of {} "
      "blocks new, {} of them deltas ({} bytes stored)",
      request.name(), manifest->node(), request.heap(), request.heap(), manifest->epoch(),
      caller.ToString(), request.store_dir(), usage.logical_bytes(), usage.blocks_written(),
      usage.blocks(), usage.delta_blocks(), usage.stored_bytes());
  return manifest;
}

void StoreBackend::CountCreate(const absl::Status& status, double seconds,
                               const v1::SnapshotManifest& manifest) {
  metrics_->CountStoreSnapshot(status, seconds, manifest.store());
}

absl::Status StoreBackend::List(const SnapshotCaller& who, const v1::ListSnapshotsRequest& request,
                                v1::ListSnapshotsResponse* response) {
  absl::StatusOr<std::vector<v1::SnapshotManifest>> parts =
      stores_->List(who, request.store_dir(), "");
  if (!parts.ok()) return parts.status();
  for (v1::SnapshotManifest& manifest : *parts) *response->add_snapshots() = std::move(manifest);
  return absl::OkStatus();
}

absl::StatusOr<v1::SnapshotManifest> StoreBackend::Verify(const SnapshotCaller& who,
                                                          const v1::SnapshotRef& ref,
                                                          uint64_t /*max_bytes*/) {
  absl::StatusOr<std::vector<v1::SnapshotManifest>> parts = stores_->Verify(who, PartOf(ref));
  if (!parts.ok()) return parts.status();
  v1::SnapshotManifest verified = parts->front();
  if (parts->size() > 1) {
    verified.clear_node();
    verified.clear_heap();
    v1::StoreUsage total;
    for (const v1::SnapshotManifest& part : *parts) {
      total.set_logical_bytes(total.logical_bytes() + part.store().logical_bytes());
      total.set_blocks(total.blocks() + part.store().blocks());
    }
    *verified.mutable_store() = total;
  }
  return verified;
}

absl::Status StoreBackend::Remove(const SnapshotCaller& who, const Caller& caller,
                                  const v1::SnapshotRef& ref,
                                  v1::RemoveSnapshotResponse* response) {
  absl::StatusOr<StoreSnapshots::Removed> removed = stores_->Remove(who, PartOf(ref));
  if (!removed.ok()) return removed.status();
  for (const PartRef& part : removed->parts) response->add_removed_parts(part.ToString());
  response->set_remaining_parts(static_cast<uint32_t>(removed->remaining));
  spdlog::info("{} part(s) of version {} in {} removed by {}; {} left", removed->parts.size(),
               ref.name(), ref.store_dir(), caller.ToString(), removed->remaining);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RestoredHeapDir>> StoreBackend::Restore(
    const SnapshotCaller& who, const v1::RestoreSnapshotRequest& request,
    const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
    v1::SnapshotManifest* manifest) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> restored = stores_->Restore(
      who, {request.store_dir(), request.name(), request.from_node(), request.from_heap()},
      heaps_dir, heap_name, options, manifest);
  metrics_->CountStoreRestore(restored.status(), absl::ToDoubleSeconds(absl::Now() - start),
                              manifest->store().fetched_blocks());
  return restored;
}

void StoreBackend::LogRestored(const std::string& heap, const Caller& caller,
                               const v1::RestoreSnapshotRequest& request,
                               const v1::SnapshotManifest& manifest, const v1::HeapInfo& info) {
  spdlog::info(
      "heap {} restored by {} from part {}/{}/{} in {} (epoch {}, owner uid {}, {} blocks read "
      "from the store)",
      heap, caller.ToString(), request.name(), manifest.node(), manifest.heap(),
      request.store_dir(), info.epoch(), info.owner_uid(), manifest.store().fetched_blocks());
}

}  // namespace heapd
