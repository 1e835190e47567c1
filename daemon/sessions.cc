#include "daemon/sessions.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "protocol/fd_protocol.h"
#include "protocol/proto_convert.h"
#include "spdlog/spdlog.h"
#include "util/running_thread.h"

namespace heapd {
namespace {

absl::Status InHeap(const Session& session, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("heap ", session.heap->name, ": ", status.message()));
}

void LogRejectedFrees(const Session& session, const std::vector<std::string>& rejected,
                      const char* when, Metrics* metrics) {
  for (const std::string& message : rejected) {
    metrics->CountRejectedFree(absl::InvalidArgumentError(message));
    spdlog::warn("session {} on heap {} ({}) {} before it learned: {}", session.id,
                 session.heap->name, session.caller.ToString(), when, message);
  }
}

}  // namespace

Sessions::Sessions(absl::Duration token_lifetime, uint32_t max_per_user, Metrics* metrics)
    : table_(token_lifetime, max_per_user), metrics_(metrics) {
  reapers_.reserve(kReapers);  // no joinable thread is lost to a failed growth
  try {
    for (int i = 0; i < kReapers; ++i) reapers_.push_back(StartRunningThread([this] { Reap(); }));
  } catch (...) {
    StopReapers();  // the ones that started: no joinable thread is destroyed
    throw;
  }
}

Sessions::~Sessions() { StopReapers(); }

void Sessions::StopReapers() {
  {
    absl::MutexLock lock(&reaper_mu_);
    stopping_ = true;
  }
  for (std::thread& reaper : reapers_) reaper.join();
  reapers_.clear();
}

void Sessions::QueueEndLocked(Ending ending) {
  const std::string& heap = ending.session->heap->name;
  std::deque<Ending>& queue = to_end_[heap];
  if (queue.empty() && !reaping_.contains(heap)) ready_.push_back(heap);
  queue.push_back(std::move(ending));
  ++queued_;
}

void Sessions::Reap() {
  for (;;) {
    Ending ending;
    std::string heap;
    {
      absl::MutexLock lock(&reaper_mu_);
      reaper_mu_.Await(absl::Condition(
          +[](Sessions* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->reaper_mu_) {
            return !self->ready_.empty() || (self->stopping_ && self->queued_ == 0);
          },
          this));
      if (ready_.empty()) return;  // stopping, and nothing left to end
      heap = std::move(ready_.front());
      ready_.pop_front();
      auto queue = to_end_.find(heap);
      ending = std::move(queue->second.front());
      queue->second.pop_front();
      if (queue->second.empty()) to_end_.erase(queue);
      --queued_;
      reaping_.insert(heap);
    }
    End(ending.session, ending.reason, ending.why);
    // Let go before the session stops counting: a heap removed once it
    // has no clients is then closed by its remover, not by this thread,
    // which the ends of every heap's dead sessions wait for.
    ending.session.reset();
    {
      absl::MutexLock lock(&reaper_mu_);
      reaping_.erase(heap);
      if (to_end_.contains(heap)) ready_.push_back(heap);  // its next end
    }
    Ended(heap);
  }
}

std::shared_ptr<Session> Sessions::TakeToEnd(ClientId id) {
  absl::MutexLock lock(&reaper_mu_);
  std::shared_ptr<Session> session = table_.Take(id);
  if (session == nullptr) return nullptr;
  ++ending_on_[session->heap->name];
  session->heap->Progressed();
  return session;
}

void Sessions::Ended(const std::string& heap_name) {
  absl::MutexLock lock(&reaper_mu_);
  auto it = ending_on_.find(heap_name);
  if (it != ending_on_.end() && --it->second == 0) ending_on_.erase(it);
}

size_t Sessions::CountOn(absl::string_view heap_name) const {
  absl::MutexLock lock(&reaper_mu_);
  auto it = ending_on_.find(heap_name);
  return table_.CountOn(heap_name) + (it == ending_on_.end() ? 0 : it->second);
}

void Sessions::End(const std::shared_ptr<Session>& session, const char* reason, const char* why) {
  if (session == nullptr) return;
  absl::MutexLock lock(&session->mu);
  if (session->ended) return;
  session->ended = true;
  const ReclaimResult reclaimed = session->heap->heap->Reclaim(session->id);
  if (!session->read_only) session->heap->WriterEnded();  // its pages went back
  metrics_->CountReclaim(reason, reclaimed.leases, reclaimed.large_runs);
  LogRejectedFrees(*session, reclaimed.rejected_frees, "ended", metrics_);
  spdlog::info(
      "session {} on heap {} ({}) ended: {}; reclaimed {} leased chunks and {} "
      "uncommitted large objects",
      session->id, session->heap->name, session->caller.ToString(), why, reclaimed.leases,
      reclaimed.large_runs);
}

void Sessions::ConnectionClosed(ClientId id) {
  QueueEnd(id, "connection_closed", "its fd-socket connection closed without a detach");
}

void Sessions::QueueEnd(ClientId id, const char* reason, const char* why) {
  std::shared_ptr<Session> session = TakeToEnd(id);
  if (session == nullptr) return;
  absl::MutexLock lock(&reaper_mu_);
  QueueEndLocked({std::move(session), reason, why});
}

void Sessions::ExpireTokens() {
  absl::MutexLock lock(&reaper_mu_);
  for (std::shared_ptr<Session>& session : table_.TakeExpired(absl::Now())) {
    ++ending_on_[session->heap->name];
    session->heap->Progressed();
    QueueEndLocked({std::move(session), "token_expired", "it did not fetch its fd in time"});
  }
}

absl::StatusOr<SessionTable::Started> Sessions::Start(std::shared_ptr<ServedHeap> heap,
                                                      const Caller& caller, bool read_only) {
  // Before the session can write.
  ServedHeap* const served = heap.get();
  if (!read_only) served->WriterStarts();
  absl::StatusOr<SessionTable::Started> started = table_.Start(std::move(heap), caller, read_only);
  if (!started.ok() && !read_only) served->WriterDidNotStart();
  if (started.ok()) {
    spdlog::info("session {} attached heap {} {} ({})", started->session->id,
                 started->session->heap->name, read_only ? "read-only" : "read-write",
                 caller.ToString());
  }
  return started;
}

absl::StatusOr<std::vector<LeaseGrant>> Sessions::LeaseAtStart(
    const std::shared_ptr<Session>& session, absl::Span<const LeaseWant> wants) {
  absl::StatusOr<std::vector<LeaseGrant>> grants;
  {
    absl::MutexLock lock(&session->mu);
    grants = session->heap->heap->LeaseAll(session->id, wants);
  }
  if (!grants.ok()) {
    if (std::shared_ptr<Session> taken = TakeToEnd(session->id)) {
      End(taken, "attach_failed", "its attach failed");
      Ended(taken->heap->name);
    }
    return InHeap(*session, grants.status());
  }
  return grants;
}

absl::Status Sessions::OnSession(uint64_t id, const Caller& caller,
                                 const std::function<absl::Status(Session&)>& body) {
  absl::StatusOr<std::shared_ptr<Session>> session = table_.Get(id, caller);
  if (!session.ok()) return session.status();
  Session& s = **session;
  absl::MutexLock lock(&s.mu);
  if (s.ended) return absl::FailedPreconditionError(absl::StrCat("session ", id, " has ended"));
  if (s.read_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", id, " attached heap ", s.heap->name, " read-only"));
  }
  const uint64_t repairs = s.heap->heap->data_file_repairs();
  absl::Status status = body(s);
  if (s.heap->heap->data_file_repairs() != repairs) {
    spdlog::warn(
        "heap {}: its data file had been truncated or extended by a client holding it "
        "writable; heapd put it back to {} bytes (noticed during a call of session {}, "
        "{})",
        s.heap->name, s.heap->heap->capacity_bytes(), id, caller.ToString());
  }
  return status;
}

absl::StatusOr<Sessions::Leased> Sessions::Lease(uint64_t id, const Caller& caller,
                                                 absl::Span<const LeaseWant> wants) {
  Leased leased;
  absl::Status status = OnSession(id, caller, [&](Session& session) {
    absl::StatusOr<std::vector<LeaseGrant>> grants =
        session.heap->heap->LeaseAll(session.id, wants);
    if (!grants.ok()) return InHeap(session, grants.status());
    leased.grants = *std::move(grants);
    leased.capacity_bytes = session.heap->heap->capacity_bytes();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return leased;
}

absl::Status Sessions::StageSyncPart(uint64_t id, const Caller& caller,
                                     absl::Span<const LeaseReport> reports,
                                     const ReserveReport& reserve) {
  return OnSession(id, caller, [&](Session& session) {
    return InHeap(session, session.heap->heap->StageReports(session.id, reports, reserve));
  });
}

absl::StatusOr<Sessions::Allocated> Sessions::AllocateLarge(uint64_t id, const Caller& caller,
                                                            uint64_t size, bool reserve,
                                                            uint64_t min_size) {
  Allocated allocated;
  absl::Status status = OnSession(id, caller, [&](Session& session) {
    PersistentHeap& heap = *session.heap->heap;
    if (size > heap.config().max_size) {
      return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", size, " bytes in heap ",
                                                     session.heap->name, " of maximum size ",
                                                     heap.config().max_size));
    }
    absl::StatusOr<LargePlacement> run =
        AllocateOrReserve(heap, session.id, size, reserve, min_size);
    if (!run.ok()) return run.status();
    allocated = {uint64_t{run->chunk} * kChunkSize, uint64_t{run->chunks} * kChunkSize,
                 heap.capacity_bytes()};
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return allocated;
}

absl::Status Sessions::Free(uint64_t id, const Caller& caller,
                            absl::Span<const ObjectRef> objects) {
  return OnSession(id, caller, [&](Session& session) {
    absl::Status status = session.heap->heap->Free(session.id, objects);
    if (!status.ok()) metrics_->CountRejectedFree(status);
    return InHeap(session, status);
  });
}

absl::Status Sessions::StoresUnseen(uint64_t id, const Caller& caller) {
  return OnSession(id, caller, [&](Session& session) {
    session.heap->heap->StoresUnseen(session.id);
    return absl::OkStatus();
  });
}

absl::StatusOr<Sessions::Synced> Sessions::Sync(uint64_t id, const Caller& caller,
                                                absl::Span<const LeaseReport> reports,
                                                uint64_t generation, const ReserveReport& reserve) {
  Synced synced;
  absl::Status status = OnSession(id, caller, [&](Session& session) {
    PersistentHeap& heap = *session.heap->heap;
    const absl::Time start = absl::Now();
    absl::StatusOr<SyncResult> result = heap.Sync(session.id, reports, generation, reserve);
    metrics_->CountSync(session.heap->name, result.status(),
                        absl::ToDoubleSeconds(absl::Now() - start));
    if (!result.ok()) return result.status();
    session.last_sync_unix_ns = absl::ToUnixNanos(start);
    session.heap->Progressed();
    for (std::string& rejected : result->rejected_frees) {
      metrics_->CountRejectedFree(absl::InvalidArgumentError(rejected));
      rejected = absl::StrCat("heap ", session.heap->name, ": ", rejected);
    }
    synced.result = *std::move(result);
    synced.capacity_bytes = heap.capacity_bytes();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return synced;
}

absl::Status Sessions::Bind(uint64_t id, const Caller& caller, NameEntry entry) {
  return OnSession(id, caller, [&](Session& session) {
    entry.owner_uid = caller.uid;
    entry.created_unix_ns = absl::ToUnixNanos(absl::Now());
    return InHeap(session, session.heap->heap->Bind(session.id, entry));
  });
}

absl::StatusOr<NameEntry> Sessions::Unbind(uint64_t id, const Caller& caller,
                                           const std::string& name) {
  NameEntry unbound;
  absl::Status status = OnSession(id, caller, [&](Session& session) {
    absl::StatusOr<NameEntry> entry = session.heap->heap->Unbind(name);
    if (!entry.ok()) return InHeap(session, entry.status());
    unbound = *std::move(entry);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return unbound;
}

absl::StatusOr<uint64_t> Sessions::Detach(uint64_t id, const Caller& caller,
                                          absl::Span<const LeaseReport> reports,
                                          uint64_t generation, const ReserveReport& reserve) {
  absl::StatusOr<std::shared_ptr<Session>> found = table_.Get(id, caller);
  if (!found.ok()) return found.status();
  std::shared_ptr<Session> session = TakeToEnd(id);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("session ", id, " already ended"));
  }
  absl::Cleanup counted = [&] { Ended(session->heap->name); };  // after the lock below
  absl::MutexLock lock(&session->mu);
  if (session->ended) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id, " has ended"));
  }
  session->ended = true;
  PersistentHeap& heap = *session->heap->heap;
  // Once its detach (or the reclaim after a failed one) is done.
  absl::Cleanup ended = [&] {
    if (!session->read_only) session->heap->WriterEnded();
  };
  if (session->read_only) {
    spdlog::info("session {} detached heap {} ({})", id, session->heap->name, caller.ToString());
    return heap.epoch();
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<SyncResult> result = heap.Detach(session->id, reports, generation, reserve);
  metrics_->CountSync(session->heap->name, result.status(),
                      absl::ToDoubleSeconds(absl::Now() - start));
  if (!result.ok()) {
    const ReclaimResult reclaimed = heap.Reclaim(session->id);
    metrics_->CountReclaim("detach_failed", reclaimed.leases, reclaimed.large_runs);
    LogRejectedFrees(*session, reclaimed.rejected_frees, "ended", metrics_);
    spdlog::warn(
        "session {} on heap {} failed to detach ({}); reclaimed {} chunks as at its "
        "last commit",
        id, session->heap->name, result.status().ToString(), reclaimed.leases);
    return absl::Status(result.status().code(),
                        absl::StrCat(result.status().message(), "; session ", id,
                                     " ended as at its last commit (its last sync, or this "
                                     "detach if it got as far as applying its reports)"));
  }
  LogRejectedFrees(*session, result->rejected_frees, "detached", metrics_);
  spdlog::info("session {} detached heap {} at epoch {} ({})", id, session->heap->name,
               result->epoch, caller.ToString());
  return result->epoch;
}

absl::StatusOr<Sessions::Redeemed> Sessions::Redeem(const std::string& token,
                                                    const Caller& caller) {
  absl::StatusOr<std::shared_ptr<Session>> session = table_.Redeem(token, caller);
  if (!session.ok()) return session.status();
  absl::StatusOr<int> fd = (*session)->heap->heap->OpenDataFile(!(*session)->read_only);
  if (!fd.ok()) {
    QueueEnd((*session)->id, "no_data_fd", "its data fd could not be opened");
    return fd.status();
  }
  UniqueFd data(*fd);
  UniqueFd journal;
  if (!(*session)->read_only) {
    absl::StatusOr<UniqueFd> opened = (*session)->heap->heap->OpenUndoJournal((*session)->id);
    if (!opened.ok()) {
      QueueEnd((*session)->id, "no_undo_journal", "its undo journal could not be made");
      return opened.status();
    }
    journal = *std::move(opened);
  }
  return Redeemed{(*session)->id, data.release(), journal.release()};
}

std::string Sessions::AnswerFdRequest(ClientId id, absl::string_view payload) {
  absl::StatusOr<FdRequest> request = ParseRequest(payload);
  if (!request.ok()) return EncodeLookupAnswer(request.status());
  std::shared_ptr<Session> session = table_.Find(id);
  if (session == nullptr) {
    return EncodeLookupAnswer(
        absl::FailedPreconditionError(absl::StrCat("session ", id, " has ended")));
  }
  absl::StatusOr<NameEntry> entry = session->heap->heap->Lookup(request->name);
  if (!entry.ok()) return EncodeLookupAnswer(InHeap(*session, entry.status()));
  v1::NameEntry out;
  ToProto(*entry, &out);
  return EncodeLookupAnswer(out);
}

}  // namespace heapd
