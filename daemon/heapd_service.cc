#include "daemon/heapd_service.h"

#include <poll.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "allocator/size_class.h"
#include "protocol/fd_protocol.h"
#include "protocol/proto_convert.h"
#include "protocol/version.h"
#include "spdlog/spdlog.h"

namespace heapd {
namespace {

// How long an Attach waits for a heap another call is making.
constexpr absl::Duration kWaitForCreation = absl::Seconds(10);
// How often a snapshot waiting for writers looks whether heapd is stopping
// or the call was cancelled (nothing wakes it for those).
constexpr absl::Duration kStopCheckInterval = absl::Milliseconds(100);

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace

class HeapdService::SnapshotCallSlot {
 public:
  SnapshotCallSlot(HeapdService* service, const Caller& caller)
      : service_(service), uid_(caller.uid) {
    absl::MutexLock lock(&service_->snapshot_calls_mu_);
    uint32_t& calls = service_->snapshot_calls_[uid_];
    if (uid_ != 0 && calls >= service_->options_.limits.snapshot_calls) {
      status_ = service_->CountIfLimited(absl::ResourceExhaustedError(
          absl::StrCat("uid ", uid_, " has ", calls,
                       " snapshot calls running, its limit (--max_snapshot_calls_per_user)")));
      return;
    }
    ++calls;
    taken_ = true;
  }
  ~SnapshotCallSlot() {
    if (!taken_) return;
    absl::MutexLock lock(&service_->snapshot_calls_mu_);
    if (--service_->snapshot_calls_[uid_] == 0) service_->snapshot_calls_.erase(uid_);
  }
  const absl::Status& status() const { return status_; }

 private:
  HeapdService* const service_;
  const uint32_t uid_;
  bool taken_ = false;
  absl::Status status_;
};

grpc::Status HeapdService::Serve(grpc::ServerContext* context, const char* method,
                                 const std::function<absl::Status(const Caller&)>& body) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = caller_of_(context->peer());
  absl::Status status = caller.status();
  if (caller.ok()) {
    // Each call in flight holds one of heapd's threads: a user's are bounded.
    bool admitted = true;
    if (caller->uid != 0) {
      absl::MutexLock lock(&calls_mu_);
      uint32_t& calls = calls_in_flight_[caller->uid];
      admitted = calls < options_.limits.calls;
      if (admitted) ++calls;
    }
    if (admitted) {
      absl::Cleanup slot_back = [&] {
        if (caller->uid == 0) return;
        absl::MutexLock lock(&calls_mu_);
        if (--calls_in_flight_[caller->uid] == 0) calls_in_flight_.erase(caller->uid);
      };
      // A handler that throws (std::bad_alloc) fails its call, logged, and
      // still gives its slot back (gRPC would answer UNKNOWN and keep it).
      std::optional<std::string> thrown;
      try {
        status = body(*caller);
      } catch (const std::exception& e) {
        thrown = e.what();
      } catch (...) {
        thrown = "an unknown exception";
      }
      if (thrown) {
        status = absl::InternalError(absl::StrCat(method, " failed: ", *thrown));
        spdlog::error("{} for {}: {}", method, caller->ToString(), *thrown);
      }
    } else {
      status = CountIfLimited(absl::ResourceExhaustedError(
          absl::StrCat(caller->ToString(), " has ", options_.limits.calls,
                       " calls in flight, its limit (--max_calls_per_user)")));
    }
  }
  metrics_->CountCall(method, status, absl::ToDoubleSeconds(absl::Now() - start));
  return ToGrpc(status);
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapdService::HeapFor(const std::string& name,
                                                                  const Caller& caller,
                                                                  Access access) {
  absl::StatusOr<std::shared_ptr<ServedHeap>> served = heaps_->Get(name);
  if (!served.ok()) return served;
  if (!MayAccess(caller, (*served)->heap->config(), access)) {
    return absl::PermissionDeniedError(absl::StrCat(caller.ToString(), " may not ",
                                                    access == Access::kWrite ? "write" : "read",
                                                    " heap ", name));
  }
  return served;
}

void HeapdService::FillInfo(const ServedHeap& served, bool with_usage, v1::HeapInfo* info) const {
  const HeapConfig& config = served.heap->config();
  info->set_name(served.name);
  info->set_max_size(config.max_size);
  info->set_owner_uid(config.owner_uid);
  info->set_owner_gid(config.owner_gid);
  info->set_mode(config.mode);
  info->set_created_unix_ns(config.created_unix_ns);
  info->set_reflink(served.reflink);
  info->set_clients(static_cast<uint32_t>(sessions_->CountOn(served.name)));
  info->set_content_rollback(served.heap->content_rollback());
  info->set_content_rollback_note(served.heap->content_rollback_note());
  info->set_image(config.image == ImageMode::kWorkingImage ? v1::IMAGE_WORKING : v1::IMAGE_DIRECT);
  info->set_storage(served.storage);
  info->set_fixed_address(config.fixed_base);
  if (!with_usage) {
    info->set_capacity_bytes(served.heap->capacity_bytes());
    info->set_epoch(served.heap->epoch());
    return;
  }
  const HeapStats stats = served.heap->Stats();
  info->set_capacity_bytes(stats.capacity_bytes);
  info->set_epoch(stats.epoch);
  info->set_broken(stats.broken);
  info->set_backing(ToProto(stats.backing));
  info->set_allocated_bytes(stats.directory.allocated_bytes);
  info->set_live_objects(stats.directory.live_objects);
  info->set_names(static_cast<uint32_t>(stats.names));
  info->set_last_sync_unix_ns(stats.last_sync_unix_ns);
}

void HeapdService::FillClient(const Session& session, v1::ClientInfo* info) const {
  info->set_session(session.id);
  info->set_heap(session.heap->name);
  info->set_uid(session.caller.uid);
  info->set_gid(session.caller.gid);
  info->set_pid(session.caller.pid);
  info->set_read_only(session.read_only);
  info->set_leased_chunks(static_cast<uint32_t>(session.heap->heap->LeaseCount(session.id)));
  info->set_attached_unix_ns(absl::ToUnixNanos(session.attached));
  info->set_connected(sessions_->table().Connected(session.id));
}

grpc::Status HeapdService::CreateHeap(grpc::ServerContext* context,
                                      const v1::CreateHeapRequest* request, v1::HeapInfo* info) {
  return Serve(context, "CreateHeap", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<std::shared_ptr<ServedHeap>> served =
        NewHeap(request->name(), request->max_size(), request->mode(), request->image(),
                request->storage(), request->fixed_address(), caller);
    if (!served.ok()) return served.status();
    FillInfo(**served, /*with_usage=*/true, info);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::shared_ptr<ServedHeap>> HeapdService::NewHeap(
    const std::string& name, uint64_t max_size, uint32_t mode, v1::ImageKind image,
    const std::string& storage, bool fixed_address, const Caller& caller) {
  if (max_size == 0) max_size = options_.default_max_size;
  if (max_size > kMaxHeapBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("heap maximum size ", max_size, " is above the limit of ", kMaxHeapBytes));
  }
  HeapConfig config;
  config.max_size = (max_size + kChunkSize - 1) / kChunkSize * kChunkSize;
  config.owner_uid = caller.uid;
  config.owner_gid = caller.gid;
  config.mode = mode == 0 ? 0600 : mode;
  if (absl::Status s = ValidateHeapConfig(config); !s.ok()) return s;
  std::optional<ImageMode> asked;
  if (image == v1::IMAGE_DIRECT) asked = ImageMode::kDirect;
  if (image == v1::IMAGE_WORKING) asked = ImageMode::kWorkingImage;
  absl::StatusOr<std::string> tier = heaps_->ChooseStorage(name, storage);
  if (!tier.ok()) return tier.status();
  absl::StatusOr<ImageMode> chosen = heaps_->ChooseImage(name, asked, *tier, config.max_size);
  if (!chosen.ok()) return chosen.status();
  config.image = *chosen;
  absl::StatusOr<HeapRegistry::Reservation> reserved =
      heaps_->Reserve(name, caller.uid, config.max_size, /*replacing=*/false, *tier,
                      FixedPlacement{fixed_address, 0});
  if (!reserved.ok()) return CountIfLimited(reserved.status());
  const uint64_t fixed_base = reserved->fixed_base();
  absl::StatusOr<std::shared_ptr<ServedHeap>> served = heaps_->Create(*std::move(reserved), config);
  if (served.ok()) {
    spdlog::info("heap {} created by {} on tier {}: maximum size {} bytes, mode 0{:o}, {}{}", name,
                 caller.ToString(), *tier, config.max_size, config.mode,
                 ImageModeName(config.image),
                 fixed_base == 0 ? "" : absl::StrCat(", fixed at 0x", absl::Hex(fixed_base)));
  }
  return served;
}

absl::Status HeapdService::CountIfLimited(absl::Status status) const {
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  for (const char* limit : kLimitNames) {
    // Messages end the limit's part with "(--max_LIMIT)"; heap names,
    // which messages carry too, cannot hold a parenthesis.
    if (absl::StrContains(status.message(), absl::StrCat("(--max_", limit, ")"))) {
      metrics_->CountLimitRefusal(limit);
    }
  }
  return status;
}

bool HeapdService::Stopping() const {
  if (options_.stop_fd < 0) return false;
  pollfd polled{options_.stop_fd, POLLIN, 0};
  return poll(&polled, 1, 0) == 1;
}

grpc::Status HeapdService::ListHeaps(grpc::ServerContext* context,
                                     const v1::ListHeapsRequest* request,
                                     v1::ListHeapsResponse* response) {
  return Serve(context, "ListHeaps", *request, [&](const Caller& caller) -> absl::Status {
    for (const std::shared_ptr<ServedHeap>& served : heaps_->List()) {
      if (!MayAccess(caller, served->heap->config(), Access::kRead) && !IsAdmin(caller)) continue;
      FillInfo(*served, /*with_usage=*/true, response->add_heaps());
    }
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::StatHeap(grpc::ServerContext* context,
                                    const v1::StatHeapRequest* request, v1::HeapStats* stats) {
  return Serve(context, "StatHeap", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<std::shared_ptr<ServedHeap>> served =
        HeapFor(request->heap(), caller, Access::kRead);
    if (!served.ok()) return served.status();
    FillInfo(**served, /*with_usage=*/true, stats->mutable_info());
    const HeapStats heap = (*served)->heap->Stats();
    const DirectoryStats& d = heap.directory;
    stats->set_capacity_chunks(d.capacity_chunks);
    stats->set_free_chunks(d.free_chunks);
    stats->set_small_chunks(d.small_chunks);
    stats->set_leased_chunks(d.leased_chunks);
    stats->set_large_reserve_chunks(d.large_reserve_chunks);
    stats->set_large_chunks(d.large_chunks);
    stats->set_large_objects(d.large_objects);
    stats->set_metadata_log_bytes(heap.metadata_log_bytes);
    stats->set_data_file_repairs(heap.data_file_repairs);
    stats->set_undo_pages_restored(heap.undo.pages_restored);
    stats->set_undo_pages_handed_over(heap.undo.pages_handed_over);
    stats->set_undo_bad_journals(heap.undo.bad_journals);
    for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
      if (d.by_class[c].chunks == 0) continue;
      v1::SizeClassStats* out = stats->add_size_classes();
      out->set_size_class(c);
      out->set_slot_size(ClassSize(c));
      out->set_chunks(d.by_class[c].chunks);
      out->set_live_objects(d.by_class[c].live_objects);
    }
    // Others' sessions (uid, pid) are for admins, as in ListClients.
    const bool admin = IsAdmin(caller);
    for (const std::shared_ptr<Session>& session : sessions_->List()) {
      if (session->heap != *served || (!admin && session->caller.uid != caller.uid)) continue;
      FillClient(*session, stats->add_clients());
    }
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::RemoveHeap(grpc::ServerContext* context,
                                      const v1::RemoveHeapRequest* request,
                                      v1::RemoveHeapResponse*) {
  return Serve(context, "RemoveHeap", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<HeapRegistry::Removed> removed;
    {
      absl::MutexLock lock(&attach_mu_);
      removed = RemoveHeapLocked(request->heap(), caller);
    }
    if (!removed.ok()) return removed.status();
    heaps_->DeleteRemoved(*std::move(removed));
    return absl::OkStatus();
  });
}

absl::StatusOr<HeapRegistry::Removed> HeapdService::RemoveHeapLocked(const std::string& name,
                                                                     const Caller& caller) {
  const bool admin = IsAdmin(caller);
  if (absl::StatusOr<std::shared_ptr<ServedHeap>> served = heaps_->Get(name); !served.ok()) {
    if (!admin) return served.status();  // a heap that failed to open: admins only
  } else if (const uint32_t owner = (*served)->heap->config().owner_uid;
             owner != caller.uid && !admin) {
    return absl::PermissionDeniedError(absl::StrCat(caller.ToString(), " may not remove heap ",
                                                    name, " of uid ", owner,
                                                    " (only its owner or an admin may)"));
  }
  if (const size_t clients = sessions_->CountOn(name); clients != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("heap ", name, " has ", clients, clients == 1 ? " client" : " clients",
                     " attached; detach ", clients == 1 ? "it" : "them", " first"));
  }
  absl::StatusOr<HeapRegistry::Removed> removed = heaps_->Remove(name);
  if (removed.ok()) {
    metrics_->ForgetHeap(name);
    spdlog::info("heap {} removed by {}", name, caller.ToString());
  }
  return removed;
}

grpc::Status HeapdService::Attach(grpc::ServerContext* context, const v1::AttachRequest* request,
                                  v1::AttachResponse* response) {
  return Serve(context, "Attach", *request, [&](const Caller& caller) -> absl::Status {
    bool created = false;
    absl::StatusOr<std::shared_ptr<ServedHeap>> served;
    if (!request->snapshot().empty()) {
      // Opened (as the caller, in a caller's directory) and checked whole
      // before any lock is taken.
      SnapshotCallSlot slot(this, caller);
      if (!slot.status().ok()) return slot.status();
      v1::SnapshotManifest manifest;
      absl::StatusOr<std::unique_ptr<PersistentHeap>> heap = snapshots_->OpenInPlace(
          SnapshotCallerOf(caller, context), {request->snapshot_dir(), request->snapshot()},
          SnapshotBytesAllowed(caller), options_.limits.names_per_heap, &manifest);
      if (!heap.ok()) return heap.status();
      auto in_place = std::make_shared<ServedHeap>();
      in_place->name = absl::StrCat("snapshot:", request->snapshot());
      in_place->heap = *std::move(heap);
      served = std::move(in_place);
    } else {
      served = heaps_->GetMade(request->heap(), kWaitForCreation);
      if (!served.ok() && served.status().code() == absl::StatusCode::kNotFound &&
          request->create_if_missing()) {
        if (request->fixed_address() && request->client_revision() < kFixedAddressRevision) {
          return absl::InvalidArgumentError(
              absl::StrCat("fixed_address from a client of revision ", request->client_revision(),
                           " of heapd.v1: a fixed-address heap is served from revision ",
                           kFixedAddressRevision));
        }
        served = NewHeap(request->heap(), request->create_max_size(), request->create_mode(),
                         request->create_image(), request->create_storage(),
                         request->fixed_address(), caller);
        created = served.ok();
        if (served.status().code() == absl::StatusCode::kAlreadyExists) {
          // Another call was first: use the heap it makes.
          served = heaps_->GetMade(request->heap(), kWaitForCreation);
        }
      }
    }
    if (!served.ok()) return served.status();
    if ((*served)->heap->config().fixed_base != 0 &&
        request->client_revision() < kFixedAddressRevision) {
      return absl::FailedPreconditionError(absl::StrCat(
          "heap ", (*served)->name, " is a fixed-address heap, and this client speaks revision ",
          request->client_revision(),
          " of heapd.v1 and would map it elsewhere; use a heapd client library of revision ",
          kFixedAddressRevision, " or later (this heapd's own)"));
    }
    // Asked to make its own heap, a caller does not silently get another
    // user's heap of that name (squatted to read what it writes).
    if (request->create_if_missing() && !created &&
        (*served)->heap->config().owner_uid != caller.uid) {
      return absl::FailedPreconditionError(
          absl::StrCat("heap ", request->heap(), " exists and belongs to uid ",
                       (*served)->heap->config().owner_uid, ", not to ", caller.ToString(),
                       "; attach without create_if_missing to use another user's heap"));
    }
    const Access access = request->read_only() ? Access::kRead : Access::kWrite;
    const HeapConfig& config = (*served)->heap->config();
    if (!MayAccess(caller, config, access)) {
      return absl::PermissionDeniedError(
          absl::StrCat(caller.ToString(), " may not attach heap ", (*served)->name,
                       request->read_only() ? " read-only" : " read-write", " (owner uid ",
                       config.owner_uid, ", mode 0", absl::StrFormat("%o", config.mode), ")"));
    }
    if (request->fixed_address() && config.fixed_base == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "heap ", (*served)->name, " is not a fixed-address heap (asked with fixed_address)"));
    }
    if (!request->read_only()) {
      if (absl::Status s = (*served)->heap->broken(); !s.ok()) return s;
    }
    absl::StatusOr<SessionTable::Started> started;
    {
      absl::MutexLock lock(&attach_mu_);
      // A heap removed since it was looked up gets no session.
      if (request->snapshot().empty()) {
        absl::StatusOr<std::shared_ptr<ServedHeap>> current = heaps_->Get(request->heap());
        if (!current.ok() || *current != *served) {
          return absl::NotFoundError(absl::StrCat("heap ", request->heap(), " was removed"));
        }
      }
      started = sessions_->Start(*served, caller, request->read_only());
    }
    if (!started.ok()) return CountIfLimited(started.status());
    // Leased with no lock held: the heap may grow.
    absl::StatusOr<std::vector<LeaseGrant>> grants =
        sessions_->LeaseAtStart(started->session, FromProto(request->leases()));
    if (!grants.ok()) return grants.status();
    for (const LeaseGrant& grant : *grants) ToProto(grant, response->add_grants());
    PersistentHeap& heap = *(*served)->heap;
    for (const std::string& name : request->lookup()) {
      if (absl::StatusOr<NameEntry> entry = heap.Lookup(name); entry.ok()) {
        ToProto(*entry, response->add_found());
      }
    }
    response->set_session(started->session->id);
    response->set_fd_token(started->token);
    response->set_protocol_revision(kProtocolRevision);
    response->set_created(created);
    FillInfo(**served, /*with_usage=*/false, response->mutable_heap());
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::Detach(grpc::ServerContext* context, const v1::DetachRequest* request,
                                  v1::DetachResponse* response) {
  return Serve(context, "Detach", *request, [&](const Caller& caller) -> absl::Status {
    if (request->stores_unseen()) {
      if (absl::Status s = sessions_->StoresUnseen(request->session(), caller); !s.ok()) return s;
    }
    absl::StatusOr<uint64_t> epoch =
        sessions_->Detach(request->session(), caller, FromProto(request->reports()),
                          request->generation(), ReserveReportOf(*request));
    if (!epoch.ok()) return epoch.status();
    response->set_epoch(*epoch);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::ListClients(grpc::ServerContext* context,
                                       const v1::ListClientsRequest* request,
                                       v1::ListClientsResponse* response) {
  return Serve(context, "ListClients", *request, [&](const Caller& caller) -> absl::Status {
    const bool admin = IsAdmin(caller);
    if (!request->heap().empty()) {
      if (absl::Status s = heaps_->Get(request->heap()).status(); !s.ok()) return s;
    }
    for (const std::shared_ptr<Session>& session : sessions_->List()) {
      if (!request->heap().empty() && session->heap->name != request->heap()) continue;
      if (!admin && session->caller.uid != caller.uid) continue;  // others' are admin-only
      FillClient(*session, response->add_clients());
    }
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::LeaseChunks(grpc::ServerContext* context,
                                       const v1::LeaseChunksRequest* request,
                                       v1::LeaseChunksResponse* response) {
  return Serve(context, "LeaseChunks", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<Sessions::Leased> leased =
        sessions_->Lease(request->session(), caller, FromProto(request->wants()));
    if (!leased.ok()) return leased.status();
    for (const LeaseGrant& grant : leased->grants) ToProto(grant, response->add_grants());
    response->set_capacity_bytes(leased->capacity_bytes);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::AllocateLarge(grpc::ServerContext* context,
                                         const v1::AllocateLargeRequest* request,
                                         v1::AllocateLargeResponse* response) {
  return Serve(context, "AllocateLarge", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<Sessions::Allocated> allocated = sessions_->AllocateLarge(
        request->session(), caller, request->size(), request->reserve(), request->min_size());
    if (!allocated.ok()) return allocated.status();
    response->set_offset(allocated->offset);
    response->set_size(allocated->size);
    response->set_capacity_bytes(allocated->capacity_bytes);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::Free(grpc::ServerContext* context, const v1::FreeRequest* request,
                                v1::FreeResponse*) {
  return Serve(context, "Free", *request, [&](const Caller& caller) -> absl::Status {
    return sessions_->Free(request->session(), caller, FromProto(request->objects()));
  });
}

grpc::Status HeapdService::Sync(grpc::ServerContext* context, const v1::SyncRequest* request,
                                v1::SyncResponse* response) {
  return Serve(context, "Sync", *request, [&](const Caller& caller) -> absl::Status {
    if (request->more()) {
      return sessions_->StageSyncPart(request->session(), caller, FromProto(request->reports()),
                                      ReserveReportOf(*request));
    }
    if (request->stores_unseen()) {
      if (absl::Status s = sessions_->StoresUnseen(request->session(), caller); !s.ok()) return s;
    }
    absl::StatusOr<Sessions::Synced> synced =
        sessions_->Sync(request->session(), caller, FromProto(request->reports()),
                        request->generation(), ReserveReportOf(*request));
    if (!synced.ok()) return synced.status();
    response->set_epoch(synced->result.epoch);
    for (const LeaseCorrection& c : synced->result.corrections) {
      ToProto(c, response->add_corrections());
    }
    for (const std::string& rejected : synced->result.rejected_frees) {
      response->add_rejected_frees(rejected);
    }
    response->set_capacity_bytes(synced->capacity_bytes);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::Bind(grpc::ServerContext* context, const v1::BindRequest* request,
                                v1::BindResponse*) {
  return Serve(context, "Bind", *request, [&](const Caller& caller) -> absl::Status {
    NameEntry entry;
    entry.name = request->name();
    entry.offset = request->offset();
    entry.size = request->size();
    entry.type_name = request->type_name();
    return sessions_->Bind(request->session(), caller, std::move(entry));
  });
}

grpc::Status HeapdService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                  v1::NameEntry* response) {
  return Serve(context, "Lookup", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<std::shared_ptr<ServedHeap>> served =
        HeapFor(request->heap(), caller, Access::kRead);
    if (!served.ok()) return served.status();
    absl::StatusOr<NameEntry> entry = (*served)->heap->Lookup(request->name());
    if (!entry.ok()) {
      return absl::Status(entry.status().code(),
                          absl::StrCat("heap ", request->heap(), ": ", entry.status().message()));
    }
    ToProto(*entry, response);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::Unbind(grpc::ServerContext* context, const v1::UnbindRequest* request,
                                  v1::NameEntry* response) {
  return Serve(context, "Unbind", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<NameEntry> entry =
        request->heap().empty() ? sessions_->Unbind(request->session(), caller, request->name())
                                : UnbindAndPersist(request->heap(), caller, request->name());
    if (!entry.ok()) return entry.status();
    ToProto(*entry, response);
    return absl::OkStatus();
  });
}

absl::StatusOr<NameEntry> HeapdService::UnbindAndPersist(const std::string& heap,
                                                         const Caller& caller,
                                                         const std::string& name) {
  // An admin's repair, or a writer's: as RemoveHeap, admins may.
  absl::StatusOr<std::shared_ptr<ServedHeap>> served =
      IsAdmin(caller) ? heaps_->Get(heap) : HeapFor(heap, caller, Access::kWrite);
  if (!served.ok()) return served.status();
  absl::StatusOr<NameEntry> entry = (*served)->heap->Unbind(name);
  if (!entry.ok()) {
    return absl::Status(entry.status().code(),
                        absl::StrCat("heap ", heap, ": ", entry.status().message()));
  }
  absl::StatusOr<SyncResult> synced = (*served)->heap->Sync(/*client=*/0, {});
  if (!synced.ok()) {
    return absl::Status(synced.status().code(),
                        absl::StrCat("name '", name, "' of heap ", heap,
                                     " is unbound but not persisted (the next sync of the heap "
                                     "persists it): ",
                                     synced.status().message()));
  }
  spdlog::info("name {} of heap {} unbound by {} (epoch {})", name, heap, caller.ToString(),
               synced->epoch);
  return entry;
}

grpc::Status HeapdService::ListNames(grpc::ServerContext* context,
                                     const v1::ListNamesRequest* request,
                                     v1::ListNamesResponse* response) {
  return Serve(context, "ListNames", *request, [&](const Caller& caller) -> absl::Status {
    absl::StatusOr<std::shared_ptr<ServedHeap>> served =
        HeapFor(request->heap(), caller, Access::kRead);
    if (!served.ok()) return served.status();
    for (const NameEntry& entry : (*served)->heap->ListNames(request->prefix(), request->limit())) {
      ToProto(entry, response->add_names());
    }
    return absl::OkStatus();
  });
}

SnapshotBackend& HeapdService::BackendFor(const std::string& store_dir) {
  if (store_dir.empty()) return directory_snapshots_;
  return store_versions_;
}

uint64_t HeapdService::SnapshotBytesAllowed(const Caller& caller) const {
  return caller.uid == 0 ? kMaxHeapBytes : options_.limits.heap_bytes;
}

absl::Status HeapdService::WaitForWriters(const ServedHeap& heap, absl::Time since,
                                          absl::Time deadline, grpc::ServerContext* context) const {
  const int64_t since_ns = absl::ToUnixNanos(since);
  for (;;) {
    // Read before the sessions are: a sync after the read wakes the wait.
    const uint64_t progress = heap.progress();
    std::string laggards;
    for (const std::shared_ptr<Session>& session : sessions_->List()) {
      if (session->heap.get() != &heap || session->read_only) continue;
      if (session->last_sync_unix_ns.load() >= since_ns) continue;
      absl::StrAppend(&laggards, laggards.empty() ? "" : ", ", "session ", session->id, " (pid ",
                      session->caller.pid, ")");
    }
    if (laggards.empty()) return absl::OkStatus();
    if (Stopping()) {
      return absl::UnavailableError(
          absl::StrCat("heapd is stopping; snapshot of heap ", heap.name, " not taken"));
    }
    if (context->IsCancelled()) {
      return absl::CancelledError(absl::StrCat("snapshot of heap ", heap.name, " cancelled"));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::FailedPreconditionError(absl::StrCat("heap ", heap.name,
                                                        " is not at a consistent point: ", laggards,
                                                        " did not sync or detach in time"));
    }
    // Woken by a sync or an ending session; a stop or a cancellation is
    // seen within kStopCheckInterval.
    heap.AwaitProgress(progress, std::min(deadline, now + kStopCheckInterval));
  }
}

grpc::Status HeapdService::CreateSnapshot(grpc::ServerContext* context,
                                          const v1::CreateSnapshotRequest* request,
                                          v1::SnapshotManifest* response) {
  return Serve(context, "CreateSnapshot", *request, [&](const Caller& caller) -> absl::Status {
    const absl::Time start = absl::Now();
    absl::Status status = [&]() -> absl::Status {
      absl::StatusOr<std::shared_ptr<ServedHeap>> served =
          HeapFor(request->heap(), caller, Access::kWrite);
      if (!served.ok()) return served.status();
      SnapshotCallSlot slot(this, caller);
      if (!slot.status().ok()) return slot.status();
      if (absl::Status s = WaitForWriters(**served, start,
                                          start + absl::Milliseconds(request->wait_ms()), context);
          !s.ok()) {
        return s;
      }
      v1::HeapInfo source;
      FillInfo(**served, /*with_usage=*/true, &source);
      absl::StatusOr<v1::SnapshotManifest> manifest =
          BackendFor(request->store_dir())
              .Create(SnapshotCallerOf(caller, context), caller, **served, source, *request, start);
      if (!manifest.ok()) return CountIfLimited(manifest.status());
      *response = *std::move(manifest);
      return absl::OkStatus();
    }();
    BackendFor(request->store_dir())
        .CountCreate(status, absl::ToDoubleSeconds(absl::Now() - start), *response);
    if (!status.ok()) {
      spdlog::warn("snapshot {} of heap {} by {} failed: {}", request->name(), request->heap(),
                   caller.ToString(), status.ToString());
    }
    return status;
  });
}

grpc::Status HeapdService::ListSnapshots(grpc::ServerContext* context,
                                         const v1::ListSnapshotsRequest* request,
                                         v1::ListSnapshotsResponse* response) {
  return Serve(context, "ListSnapshots", *request, [&](const Caller& caller) -> absl::Status {
    SnapshotCallSlot slot(this, caller);
    if (!slot.status().ok()) return slot.status();
    return BackendFor(request->store_dir())
        .List(SnapshotCallerOf(caller, context), *request, response);
  });
}

grpc::Status HeapdService::VerifySnapshot(grpc::ServerContext* context,
                                          const v1::SnapshotRef* request,
                                          v1::SnapshotManifest* response) {
  return Serve(context, "VerifySnapshot", *request, [&](const Caller& caller) -> absl::Status {
    SnapshotCallSlot slot(this, caller);
    if (!slot.status().ok()) return slot.status();
    absl::StatusOr<v1::SnapshotManifest> manifest =
        BackendFor(request->store_dir())
            .Verify(SnapshotCallerOf(caller, context), *request, SnapshotBytesAllowed(caller));
    if (!manifest.ok()) return manifest.status();
    *response = *std::move(manifest);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::RemoveSnapshot(grpc::ServerContext* context,
                                          const v1::SnapshotRef* request,
                                          v1::RemoveSnapshotResponse* response) {
  return Serve(context, "RemoveSnapshot", *request, [&](const Caller& caller) -> absl::Status {
    SnapshotCallSlot slot(this, caller);
    if (!slot.status().ok()) return slot.status();
    return BackendFor(request->store_dir())
        .Remove(SnapshotCallerOf(caller, context), caller, *request, response);
  });
}

grpc::Status HeapdService::RestoreSnapshot(grpc::ServerContext* context,
                                           const v1::RestoreSnapshotRequest* request,
                                           v1::HeapInfo* info) {
  return Serve(context, "RestoreSnapshot", *request, [&](const Caller& caller) -> absl::Status {
    if (request->keep_owner() && !IsAdmin(caller)) {
      return absl::PermissionDeniedError(absl::StrCat(
          caller.ToString(), " may not restore with the snapshot's owner (admins only)"));
    }
    SnapshotCallSlot slot(this, caller);
    if (!slot.status().ok()) return slot.status();
    RestoreOptions options;
    options.owner_uid = caller.uid;
    options.owner_gid = caller.gid;
    options.keep_recorded_owner = request->keep_owner();
    options.max_names = options_.limits.names_per_heap;
    // The heap it replaces (if any) frees its share only once removed:
    // the final check is the registry's, at Reserve below.
    options.max_bytes = std::min(kMaxHeapBytes, caller.uid == 0 || request->replace()
                                                    ? SnapshotBytesAllowed(caller)
                                                    : heaps_->HeapBytesLeft(caller.uid));
    // Copied and checked whole with no lock held.
    v1::SnapshotManifest manifest;
    SnapshotBackend& backend = BackendFor(request->store_dir());
    const std::string building = request->heap().empty() ? "heap" : request->heap();
    // The tier is chosen before the copy (it is built there): for a heap
    // named by the snapshot, the one it replaces is not known yet.
    absl::StatusOr<std::string> tier =
        heaps_->ChooseStorage(request->heap(), request->storage(), request->replace());
    if (!tier.ok()) return tier.status();
    absl::StatusOr<std::string> heaps_dir = heaps_->HeapsDir(*tier);
    if (!heaps_dir.ok()) return heaps_dir.status();
    absl::StatusOr<std::unique_ptr<RestoredHeapDir>> restored = backend.Restore(
        SnapshotCallerOf(caller, context), *request, *heaps_dir, building, options, &manifest);
    if (!restored.ok()) return CountIfLimited(restored.status());
    const std::string heap = request->heap().empty() ? manifest.heap() : request->heap();
    const HeapConfig& config = (*restored)->config();
    std::optional<HeapRegistry::Reservation> reserved;
    std::optional<HeapRegistry::Removed> replaced;
    {
      absl::MutexLock lock(&attach_mu_);
      const bool exists = heaps_->Get(heap).status().code() != absl::StatusCode::kNotFound;
      if (exists && !request->replace()) {
        return absl::AlreadyExistsError(
            absl::StrCat("heap ", heap, " exists; restore with replace to overwrite it"));
      }
      // Reserved first: if a limit refuses the new heap, the old one stays.
      absl::StatusOr<HeapRegistry::Reservation> reservation =
          heaps_->Reserve(heap, config.owner_uid, config.max_size, /*replacing=*/exists, *tier,
                          FixedPlacement{config.fixed_base != 0, config.fixed_base});
      if (!reservation.ok()) return CountIfLimited(reservation.status());
      reserved.emplace(*std::move(reservation));
      if (exists) {
        absl::StatusOr<HeapRegistry::Removed> removed = RemoveHeapLocked(heap, caller);
        if (!removed.ok()) return removed.status();
        replaced = *std::move(removed);
      }
    }
    if (replaced) heaps_->DeleteRemoved(*std::move(replaced));
    // Renamed into place, opened and added with no lock held: the name is
    // reserved meanwhile (attaches to it wait for it).
    absl::StatusOr<std::shared_ptr<ServedHeap>> served =
        heaps_->AddRestored(*std::move(reserved), **restored);
    if (!served.ok()) return served.status();
    FillInfo(**served, /*with_usage=*/true, info);
    backend.LogRestored(heap, caller, *request, manifest, *info);
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::GcStore(grpc::ServerContext* context, const v1::GcStoreRequest* request,
                                   v1::GcStoreResponse* response) {
  return Serve(context, "GcStore", *request, [&](const Caller& caller) -> absl::Status {
    SnapshotCallSlot slot(this, caller);
    if (!slot.status().ok()) return slot.status();
    std::optional<absl::Duration> grace;
    if (request->has_grace_s()) grace = absl::Seconds(request->grace_s());
    absl::StatusOr<v1::GcStoreResponse> result = store_snapshots_->CollectGarbage(
        SnapshotCallerOf(caller, context), request->store_dir(), grace, request->dry_run());
    if (!result.ok()) return result.status();
    *response = *std::move(result);
    spdlog::info("gc of store {} by {}{}: {} blocks ({} bytes) removed, {} kept, {} young",
                 request->store_dir(), caller.ToString(), request->dry_run() ? " (dry run)" : "",
                 response->blocks_removed(), response->bytes_removed(), response->blocks_kept(),
                 response->blocks_young());
    return absl::OkStatus();
  });
}

grpc::Status HeapdService::StoreUsage(grpc::ServerContext* context,
                                      const v1::StoreUsageRequest* request,
                                      v1::StoreUsageResponse* response) {
  return Serve(context, "StoreUsage", *request, [&](const Caller& caller) -> absl::Status {
    SnapshotCallSlot slot(this, caller);
    if (!slot.status().ok()) return slot.status();
    absl::StatusOr<v1::StoreUsageResponse> usage =
        store_snapshots_->Usage(SnapshotCallerOf(caller, context), request->store_dir());
    if (!usage.ok()) return usage.status();
    *response = *std::move(usage);
    return absl::OkStatus();
  });
}

}  // namespace heapd
