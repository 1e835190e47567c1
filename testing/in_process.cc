#include "testing/in_process.h"

#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/heap_impl.h"
#include "protocol/proto_convert.h"
#include "protocol/version.h"

namespace heapd {

InProcessSessionCalls::InProcessSessionCalls(PersistentHeap* heap, ClientId session, bool read_only)
    : heap_(heap), session_(session), read_only_(read_only) {
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) == 0) {
    absl::MutexLock lock(&mu_);
    lifeline_.reset(ends[0]);
    lifeline_peer_.reset(ends[1]);
  }
}

InProcessSessionCalls::~InProcessSessionCalls() {
  Close();
  absl::MutexLock lock(&mu_);
  lifeline_.reset();
}

absl::Status InProcessSessionCalls::CheckLive() const {
  if (!ended_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("session ", session_, " has ended"));
}

absl::Status InProcessSessionCalls::CheckWritable() const {
  if (absl::Status s = CheckLive(); !s.ok()) return s;
  if (!read_only_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("session ", session_, " attached heap ", heap_->dir(), " read-only"));
}

absl::Status InProcessSessionCalls::LeaseChunks(const v1::LeaseChunksRequest& request,
                                                v1::LeaseChunksResponse* response) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  // All or none, as heapd.
  absl::StatusOr<std::vector<LeaseGrant>> grants =
      heap_->LeaseAll(session_, FromProto(request.wants()));
  if (!grants.ok()) return grants.status();
  for (const LeaseGrant& grant : *grants) ToProto(grant, response->add_grants());
  response->set_capacity_bytes(heap_->capacity_bytes());
  return absl::OkStatus();
}

absl::Status InProcessSessionCalls::AllocateLarge(const v1::AllocateLargeRequest& request,
                                                  v1::AllocateLargeResponse* response) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  absl::StatusOr<LargePlacement> run =
      AllocateOrReserve(*heap_, session_, request.size(), request.reserve(), request.min_size());
  if (!run.ok()) return run.status();
  response->set_offset(uint64_t{run->chunk} * kChunkSize);
  response->set_size(uint64_t{run->chunks} * kChunkSize);
  response->set_capacity_bytes(heap_->capacity_bytes());
  return absl::OkStatus();
}

absl::Status InProcessSessionCalls::Free(const v1::FreeRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  return heap_->Free(session_, FromProto(request.objects()));
}

absl::Status InProcessSessionCalls::Sync(const v1::SyncRequest& request,
                                         v1::SyncResponse* response) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  if (request.more()) {
    return heap_->StageReports(session_, FromProto(request.reports()), ReserveReportOf(request));
  }
  if (request.stores_unseen()) heap_->StoresUnseen(session_);
  absl::StatusOr<SyncResult> result = heap_->Sync(session_, FromProto(request.reports()),
                                                  request.generation(), ReserveReportOf(request));
  if (!result.ok()) return result.status();
  response->set_epoch(result->epoch);
  for (const LeaseCorrection& c : result->corrections) ToProto(c, response->add_corrections());
  for (const std::string& rejected : result->rejected_frees) response->add_rejected_frees(rejected);
  response->set_capacity_bytes(heap_->capacity_bytes());
  return absl::OkStatus();
}

absl::Status InProcessSessionCalls::Detach(const v1::DetachRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckLive(); !s.ok()) return s;
  ended_ = true;
  if (read_only_) return absl::OkStatus();
  if (request.stores_unseen()) heap_->StoresUnseen(session_);
  absl::StatusOr<SyncResult> result = heap_->Detach(session_, FromProto(request.reports()),
                                                    request.generation(), ReserveReportOf(request));
  if (result.ok()) return absl::OkStatus();
  heap_->Reclaim(session_);  // as heapd: the session ends at its last sync
  return result.status();
}

absl::Status InProcessSessionCalls::Bind(const v1::BindRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  return heap_->Bind(
      session_, NameEntry{request.name(), request.offset(), request.size(), request.type_name(),
                          getuid(), absl::ToUnixNanos(absl::Now())});
}

absl::StatusOr<NameEntry> InProcessSessionCalls::Unbind(const v1::UnbindRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritable(); !s.ok()) return s;
  return heap_->Unbind(request.name());
}

absl::StatusOr<NameEntry> InProcessSessionCalls::Lookup(const std::string& name) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLive(); !s.ok()) return s;
  }
  return heap_->Lookup(name);
}

int InProcessSessionCalls::lifeline() {
  absl::MutexLock lock(&mu_);
  return lifeline_.get();
}

void InProcessSessionCalls::Close() {
  absl::MutexLock lock(&mu_);
  // The serving end hangs up first: the client's tracker fences its
  // mapping, as when heapd ends a session. The client's end stays open
  // until this goes (after the Heap stopped its tracker).
  lifeline_peer_.reset();
  if (!ended_ && !read_only_) heap_->Reclaim(session_);
  ended_ = true;
}

absl::StatusOr<std::unique_ptr<Heap>> AttachInProcess(PersistentHeap* heap, ClientId session,
                                                      const AttachOptions& options,
                                                      const WrapCalls& wrap) {
  absl::StatusOr<int> data_fd = heap->OpenDataFile(!options.read_only);
  if (!data_fd.ok()) return data_fd.status();
  UniqueFd data(*data_fd);
  UniqueFd journal;
  if (!options.read_only) {
    absl::StatusOr<UniqueFd> opened = heap->OpenUndoJournal(session);
    if (!opened.ok()) return opened.status();
    journal = *std::move(opened);
  }
  v1::AttachResponse attached;
  attached.set_session(session);
  attached.set_protocol_revision(kProtocolRevision);
  v1::HeapInfo* info = attached.mutable_heap();
  info->set_max_size(heap->config().max_size);
  info->set_fixed_address(heap->config().fixed_base);
  info->set_capacity_bytes(heap->capacity_bytes());
  info->set_content_rollback(heap->content_rollback());
  info->set_content_rollback_note(heap->content_rollback_note());
  for (const std::string& name : options.prefetch_names) {
    if (absl::StatusOr<NameEntry> entry = heap->Lookup(name); entry.ok()) {
      ToProto(*entry, attached.add_found());
    }
  }
  auto in_process = std::make_unique<InProcessSessionCalls>(heap, session, options.read_only);
  std::unique_ptr<SessionCalls> calls =
      wrap != nullptr ? wrap(std::move(in_process)) : std::move(in_process);
  return HeapImpl::Start(std::move(calls), heap->dir(), options, attached, data.release(),
                         std::move(journal));
}

}  // namespace heapd
