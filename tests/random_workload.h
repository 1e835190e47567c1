// RandomWorkload: a deterministic stream of random heap operations from one
// or more sessions of the real client (heapd::Heap) attached in process
// (testing/in_process.h), each checked against a simple reference model
// (live objects, who allocated them and whether that is committed, names).
// The same seed always produces the same operations and, on a fresh heap,
// the same heap, which is what the crash test replays. Tests only.
#ifndef HEAPD_TESTS_RANDOM_WORKLOAD_H_
#define HEAPD_TESTS_RANDOM_WORKLOAD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "heap/heap.h"
#include "heapd/heap.h"
#include "testing/in_process.h"

namespace heapd {

class RandomWorkload {
 public:
  // Starts `sessions` sessions (client ids 1..sessions) on `heap`, which
  // outlives the workload. `live_target` is about how many objects stay
  // live; `syncs_per_mille` is how often a step syncs every session.
  static absl::StatusOr<std::unique_ptr<RandomWorkload>> Start(PersistentHeap* heap, uint64_t seed,
                                                               int sessions, size_t live_target,
                                                               int syncs_per_mille = 5);

  // Runs one random operation; an error describes where the heap and the
  // model disagree.
  absl::Status Step();

  // Syncs every session, then checks the heap's counts (and, with
  // `deep`, every invariant and every name's contents) against the model.
  absl::Status SyncAll(bool deep);

  // Ends every session as a crash of its process would (they commit
  // nothing more); the workload can only be destroyed afterwards.
  void Crash();

  uint64_t syncs() const { return syncs_; }
  uint64_t steps() const { return steps_; }
  uint64_t names_made() const { return next_name_; }
  const std::map<std::string, uint64_t>& names() const { return names_; }

  // The first word of an object (of 8 bytes or more): kFreshMark when
  // allocated, then Tag(name) of the last name bound to it.
  static constexpr uint64_t kFreshMark = 0xF4E5A110CA7EDull;
  static uint64_t Tag(const std::string& name);

 private:
  struct Object {
    uint64_t size;
    uint64_t footprint;  // slot or run bytes
    int session;
    bool committed;
    int pins;
    uint64_t tag;  // the first word the workload last wrote (size >= 8)
  };

  RandomWorkload(PersistentHeap* heap, uint64_t seed, size_t live_target, int syncs_per_mille)
      : heap_(heap), rng_(seed), live_target_(live_target), syncs_per_mille_(syncs_per_mille) {}

  absl::Status Allocate(int s);
  absl::Status Free(int s);
  absl::Status BadFree(int s);
  absl::Status Bind(int s);
  absl::Status Unbind();
  absl::Status Lookup();
  // A live object chosen at random, or objects_.end().
  std::map<uint64_t, Object>::iterator RandomObject();
  bool LeasedBy(int s, uint64_t offset) const;

  PersistentHeap* heap_;
  std::mt19937_64 rng_;
  size_t live_target_;
  int syncs_per_mille_;
  // The session's address of the object at `offset`.
  char* At(int s, uint64_t offset) const { return sessions_[s]->base() + offset; }

  std::vector<std::unique_ptr<Heap>> sessions_;
  std::vector<InProcessSessionCalls*> calls_;  // sessions_'s, owned by them
  std::map<uint64_t, Object> objects_;
  std::vector<uint64_t> uncommitted_;  // allocated since the last SyncAll
  std::map<std::string, uint64_t> names_;
  std::vector<uint64_t> recently_freed_;
  uint64_t next_name_ = 0;
  uint64_t syncs_ = 0;
  uint64_t steps_ = 0;
};

}  // namespace heapd

#endif  // HEAPD_TESTS_RANDOM_WORKLOAD_H_
