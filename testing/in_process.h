// In-process sessions: the real client (heapd::Heap: thread caches, remote
// frees, write tracking) with its session calls going to a PersistentHeap
// in the same process instead of to heapd. For the model and crash tests,
// benchmarks and tools that open a heap's directory themselves.
//
// What heapd's Sessions layer does around a call is done here too: a
// failed detach reclaims the session; names are bound as this process's
// user. Access checks do not apply (whoever opens the directory owns it).
#ifndef HEAPD_TESTING_IN_PROCESS_H_
#define HEAPD_TESTING_IN_PROCESS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/session_calls.h"
#include "heap/heap.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "util/unique_fd.h"

namespace heapd {

class InProcessSessionCalls : public SessionCalls {
 public:
  // `heap` outlives this.
  InProcessSessionCalls(PersistentHeap* heap, ClientId session, bool read_only);
  ~InProcessSessionCalls() override;

  absl::Status LeaseChunks(const v1::LeaseChunksRequest& request,
                           v1::LeaseChunksResponse* response) override;
  absl::Status AllocateLarge(const v1::AllocateLargeRequest& request,
                             v1::AllocateLargeResponse* response) override;
  absl::Status Free(const v1::FreeRequest& request) override;
  absl::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response) override;
  absl::Status Detach(const v1::DetachRequest& request) override;
  absl::Status Bind(const v1::BindRequest& request) override;
  absl::StatusOr<NameEntry> Unbind(const v1::UnbindRequest& request) override;
  absl::StatusOr<NameEntry> Lookup(const std::string& name) override;
  int lifeline() override;
  // Unless it detached, ends the session as its process's death would (as
  // heapd does when a client's connection closes): the lifeline hangs up
  // (the client's mapping is fenced by its tracker thread, which may take
  // a moment: stores made meanwhile are put back too only if none runs
  // beside the rollback; tests store nothing then) and the heap reclaims
  // it (contents and leases back at its last sync). Every later call
  // fails; the Heap can only be destroyed afterwards.
  void Close() override;

 private:
  // FAILED_PRECONDITION once the session ended; CheckWritable: also for a
  // read-only session (as heapd refuses its calls but lookups and detach).
  absl::Status CheckLive() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckWritable() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  PersistentHeap* const heap_;
  const ClientId session_;
  const bool read_only_;
  // Calls of one session are serialized, as heapd's Sessions does.
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // The serving end of the lifeline: the client's end hangs up when this
  // closes (Crash, Close).
  UniqueFd lifeline_peer_ ABSL_GUARDED_BY(mu_);
  UniqueFd lifeline_ ABSL_GUARDED_BY(mu_);  // the client's end
};

// Makes the calls a Heap uses from the in-process ones (tests wrap them to
// inject faults, or keep a pointer to Close() them: the session's crash).
using WrapCalls =
    std::function<std::unique_ptr<SessionCalls>(std::unique_ptr<InProcessSessionCalls>)>;

// Attaches `heap` (which outlives the Heap) in this process as session
// `session` (not 0; unique among the heap's sessions).
absl::StatusOr<std::unique_ptr<Heap>> AttachInProcess(PersistentHeap* heap, ClientId session,
                                                      const AttachOptions& options = {},
                                                      const WrapCalls& wrap = nullptr);

}  // namespace heapd

#endif  // HEAPD_TESTING_IN_PROCESS_H_
