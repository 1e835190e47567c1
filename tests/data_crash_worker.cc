// data_crash_worker: the client process of //tests:data_crash_test (issue
// 11: "after any crash a heap reads exactly as at its last completed sync:
// allocations, names and every byte of object contents").
//
// A worker keeps three structures bound by name in a heap, all linked with
// offset pointers:
//   PREFIX.vec   boost::container::vector<uint64_t> over heapd::allocator
//   PREFIX.map   boost::unordered_map<uint64_t, uint64_t> over heapd::allocator
//   PREFIX.list  a hand-linked list of nodes {next, key, words, payload[words]}
//                of 16 B to 64 KiB of payload, now and then over 1 MiB (a large
//                object), each allocated with Heap::allocate
// and changes them one operation per step. The operation of step s depends
// only on (seed, s) and on the sizes of the structures at that point (never
// on their contents), so a reference model (std::vector, std::unordered_map,
// std::list) driven by the same stream is the exact state the heap must
// hold after any number of steps. Step s is a "clear everything" whenever
// s % kClearEvery == 0, so the model at step S is replayed from the last
// such step, not from 0.
//
// Modes (flags below):
//   run (default)  attach (creating the heap and the structures if missing,
//                  only at --start_step=0), do steps [start_step, start_step
//                  + steps), sync after each step s with (s + 1) % sync_every
//                  == 0 and at the end. Around each sync it prints
//                  "syncing N" (before the call) and "synced N" (after it
//                  returned OK): N = steps done. Then detach, "done N".
//                  Any error: "error ...", _exit(3) (no destructor runs, so
//                  nothing is committed on the way out).
//   --check        the checker: attach, churn (allocate objects of every size
//                  class and large ones over every free slot and chunk the
//                  heap has, fill them with 0xA5 so that memory whose
//                  allocation rolled back is reused), then compare every
//                  element, pair, node and payload byte with the model at
//                  --expect_step, else at --or_step. Prints "ok step N", or
//                  each divergence (structure, index, expected, got) and
//                  "DIVERGENCE ..." and exits 1. Frees the churn, detaches.
//   --mode=owner / --mode=cowriter / --mode=shared --check
//                  the two-session case: the owner keeps PREFIX.shared, a
//                  fixed vector of 64 Ki words (128 pages), and writes only
//                  even slots; a cowriter process writes only odd slots of
//                  the same pages; each syncs on its own schedule. The owner
//                  runs until SIGTERM, then syncs, detaches, prints "done N".
//                  The shared check is described at CheckShared.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "boost/container/vector.hpp"
#include "boost/functional/hash.hpp"
#include "boost/interprocess/offset_ptr.hpp"
#include "boost/unordered_map.hpp"
#include "client/client_channel.h"
#include "heapd/allocator.h"
#include "heapd/client.h"
#include "heapd/heap.h"

ABSL_FLAG(std::string, socket, "", "heapd's socket");
ABSL_FLAG(std::string, heap, "", "the heap");
ABSL_FLAG(uint64_t, seed, 1, "seed of the operation stream (the owner's in the shared modes)");
ABSL_FLAG(uint64_t, start_step, 0, "the step the heap is at (as the checker confirmed it)");
ABSL_FLAG(uint64_t, steps, 1000000000, "steps to do before the final sync and detach");
ABSL_FLAG(uint64_t, sync_every, 16, "sync after every step s with (s + 1) % sync_every == 0");
ABSL_FLAG(std::string, name_prefix, "dc", "prefix of the names of the structures");
ABSL_FLAG(std::string, mode, "run", "run, owner, cowriter; with --check: run or shared");
ABSL_FLAG(bool, check, false, "check the heap against the model instead of changing it");
ABSL_FLAG(uint64_t, expect_step, 0, "checker: the step the heap should be at");
ABSL_FLAG(int64_t, or_step, -1,
          "checker: the other step the heap may be at (the kill fell inside that sync); "
          "-1: none");
ABSL_FLAG(uint64_t, b_seed, 2, "shared check: the cowriter's seed");
ABSL_FLAG(uint64_t, b_step, 0, "shared check: the cowriter's last synced step");
ABSL_FLAG(uint64_t, b_max_step, 0, "shared check: the furthest step any cowriter run could reach");
ABSL_FLAG(uint64_t, step_delay_us, 100, "owner and cowriter: pause after each step");

namespace heapd {
namespace data_crash {

using boost::interprocess::offset_ptr;

using U64Allocator = allocator<uint64_t>;
using Vec = boost::container::vector<uint64_t, U64Allocator>;
using MapAllocator = allocator<std::pair<const uint64_t, uint64_t>>;
using Map = boost::unordered_map<uint64_t, uint64_t, boost::hash<uint64_t>, std::equal_to<uint64_t>,
                                 MapAllocator>;

// A list node: this header, then `words` payload words.
struct Node {
  offset_ptr<Node> next;
  uint64_t key;
  uint64_t words;
  uint64_t* payload() { return reinterpret_cast<uint64_t*>(this + 1); }
};
struct List {
  offset_ptr<Node> head;
  uint64_t length;
};

}  // namespace data_crash
}  // namespace heapd

HEAPD_TYPE_NAME(heapd::data_crash::Vec, "heapd::tests::DataCrashVec/v1");
HEAPD_TYPE_NAME(heapd::data_crash::Map, "heapd::tests::DataCrashMap/v1");
HEAPD_TYPE_NAME(heapd::data_crash::List, "heapd::tests::DataCrashList/v1");

namespace heapd {
namespace data_crash {
namespace {

// ---------------------------------------------------------------------------
// The operation stream.

constexpr uint64_t kClearEvery = 8192;    // step s % kClearEvery == 0 clears all
constexpr uint64_t kMaxVector = 1 << 17;  // elements: 1 MiB, beyond: shrink instead
constexpr uint64_t kMaxList = 48;         // nodes; beyond: remove instead
constexpr uint64_t kKeySpace = 4096;      // map keys, so that puts overwrite
constexpr uint64_t kHeapMaxSize = uint64_t{4} << 30;
constexpr uint64_t kChurnPattern = 0xA5A5A5A5A5A5A5A5;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}
uint64_t Mix2(uint64_t a, uint64_t b) { return Mix(a ^ Mix(b)); }

enum class OpKind {
  kClear,
  kVecPush,
  kVecOverwrite,
  kVecShrink,
  kMapPut,
  kMapErase,
  kListInsert,
  kListModify,
  kListRemove,
};

// One step. Every value written is Mix2(values, i) for its i.
struct Op {
  OpKind kind = OpKind::kClear;
  uint64_t values = 0;
  uint64_t count = 0;     // push: elements; overwrite: elements; modify: words
  uint64_t position = 0;  // shrink: the new size; list ops: the node's position
  uint64_t first = 0;     // modify: the first payload word written
  uint64_t key = 0;       // map ops and list insert
  uint64_t words = 0;     // list insert: payload words
};

uint64_t PayloadWords(std::mt19937_64& rng) {
  const uint64_t r = rng() % 100;
  if (r < 70) return 2 + rng() % 127;                            // 16 B .. 1 KiB
  if (r < 97) return 128 + rng() % (8192 - 128 + 1);             // 1 .. 64 KiB
  return (uint64_t{1} << 17) + 1 + rng() % (uint64_t{1} << 17);  // 1 .. 2 MiB: large
}

OpKind PickKind(std::mt19937_64& rng, uint64_t vec_size, uint64_t list_length) {
  const uint64_t r = rng() % 1000;
  OpKind kind;
  if (r < 2) {
    kind = OpKind::kClear;
  } else if (r < 200) {
    kind = OpKind::kVecPush;
  } else if (r < 380) {
    kind = OpKind::kVecOverwrite;
  } else if (r < 410) {
    kind = OpKind::kVecShrink;
  } else if (r < 600) {
    kind = OpKind::kMapPut;
  } else if (r < 680) {
    kind = OpKind::kMapErase;
  } else if (r < 780) {
    kind = OpKind::kListInsert;
  } else if (r < 920) {
    kind = OpKind::kListModify;
  } else {
    kind = OpKind::kListRemove;
  }
  if (kind == OpKind::kVecPush && vec_size >= kMaxVector) kind = OpKind::kVecShrink;
  if ((kind == OpKind::kVecOverwrite || kind == OpKind::kVecShrink) && vec_size == 0) {
    kind = OpKind::kVecPush;
  }
  if (kind == OpKind::kListInsert && list_length >= kMaxList) kind = OpKind::kListRemove;
  if ((kind == OpKind::kListModify || kind == OpKind::kListRemove) && list_length == 0) {
    kind = OpKind::kListInsert;
  }
  return kind;
}

// The operation of step `step`, given the sizes of the structures before it.
// `node_words`: the payload words of the node at a position (list ops).
template <typename NodeWords>
Op NextOp(uint64_t seed, uint64_t step, uint64_t vec_size, uint64_t list_length,
          const NodeWords& node_words) {
  std::mt19937_64 rng(Mix2(seed, step));
  Op op;
  op.values = rng();
  if (step % kClearEvery == 0) return op;  // kClear
  op.kind = PickKind(rng, vec_size, list_length);
  switch (op.kind) {
    case OpKind::kClear:
      break;
    case OpKind::kVecPush:
      // Mostly a few elements, now and then thousands: reallocations of
      // every size, small and large.
      op.count = rng() % 50 == 0 ? 1000 + rng() % 4000 : 1 + rng() % 32;
      break;
    case OpKind::kVecOverwrite:
      op.count = 1 + rng() % 16;
      break;
    case OpKind::kVecShrink:
      op.position = vec_size * (rng() % 100) / 100;
      break;
    case OpKind::kMapPut:
    case OpKind::kMapErase:
      op.key = rng() % kKeySpace;
      break;
    case OpKind::kListInsert:
      op.position = rng() % (list_length + 1);
      op.key = rng();
      op.words = PayloadWords(rng);
      break;
    case OpKind::kListModify: {
      op.position = rng() % list_length;
      const uint64_t words = node_words(op.position);
      if (rng() % 20 == 0) {
        op.first = 0;
        op.count = words;  // the whole payload
      } else {
        op.first = rng() % words;
        op.count = 1 + rng() % std::min<uint64_t>(words - op.first, 512);
      }
      break;
    }
    case OpKind::kListRemove:
      op.position = rng() % list_length;
      break;
  }
  return op;
}

// ---------------------------------------------------------------------------
// The reference model.

struct ModelNode {
  uint64_t key;
  std::vector<uint64_t> payload;
};

struct Model {
  std::vector<uint64_t> vec;
  std::unordered_map<uint64_t, uint64_t> map;
  std::list<ModelNode> list;

  std::list<ModelNode>::iterator NodeAt(uint64_t position) {
    return std::next(list.begin(), static_cast<std::ptrdiff_t>(position));
  }

  void Apply(const Op& op) {
    switch (op.kind) {
      case OpKind::kClear:
        vec.clear();
        map.clear();
        list.clear();
        break;
      case OpKind::kVecPush:
        for (uint64_t i = 0; i < op.count; ++i) vec.push_back(Mix2(op.values, i));
        break;
      case OpKind::kVecOverwrite:
        for (uint64_t i = 0; i < op.count; ++i) {
          vec[Mix2(op.values, 2 * i) % vec.size()] = Mix2(op.values, 2 * i + 1);
        }
        break;
      case OpKind::kVecShrink:
        vec.resize(op.position);
        break;
      case OpKind::kMapPut:
        map[op.key] = Mix2(op.values, 0);
        break;
      case OpKind::kMapErase:
        map.erase(op.key);
        break;
      case OpKind::kListInsert: {
        ModelNode node{op.key, std::vector<uint64_t>(op.words)};
        for (uint64_t j = 0; j < op.words; ++j) node.payload[j] = Mix2(op.values, j);
        list.insert(NodeAt(op.position), std::move(node));
        break;
      }
      case OpKind::kListModify: {
        std::vector<uint64_t>& payload = NodeAt(op.position)->payload;
        for (uint64_t j = 0; j < op.count; ++j) payload[op.first + j] = Mix2(op.values, j);
        break;
      }
      case OpKind::kListRemove:
        list.erase(NodeAt(op.position));
        break;
    }
  }
};

// The model after steps [0, step) of `seed`: replayed from the last step
// that cleared everything.
Model ModelAt(uint64_t seed, uint64_t step) {
  Model model;
  if (step == 0) return model;
  for (uint64_t s = (step - 1) / kClearEvery * kClearEvery; s < step; ++s) {
    model.Apply(NextOp(seed, s, model.vec.size(), model.list.size(),
                       [&](uint64_t position) { return model.NodeAt(position)->payload.size(); }));
  }
  return model;
}

// ---------------------------------------------------------------------------
// The structures in the heap.

struct Structures {
  Vec* vec = nullptr;
  Map* map = nullptr;
  List* list = nullptr;
};

std::string VecName(const std::string& prefix) { return prefix + ".vec"; }
std::string MapName(const std::string& prefix) { return prefix + ".map"; }
std::string ListName(const std::string& prefix) { return prefix + ".list"; }
std::string SharedName(const std::string& prefix) { return prefix + ".shared"; }

uint64_t NodeBytes(uint64_t words) { return sizeof(Node) + words * sizeof(uint64_t); }

Node* ListNodeAt(List& list, uint64_t position) {
  Node* node = list.head.get();
  for (uint64_t i = 0; i < position; ++i) node = node->next.get();
  return node;
}

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void Die(const std::string& what) {
  Print("error " + what);
  _exit(3);  // no destructor: a Heap destroyed here would detach and commit
}

absl::Status FreeListNode(Heap& heap, Node* node) {
  return heap.deallocate(node, NodeBytes(node->words));
}

absl::Status ApplyToList(Heap& heap, List& list, const Op& op) {
  switch (op.kind) {
    case OpKind::kListInsert: {
      absl::StatusOr<void*> memory = heap.allocate(NodeBytes(op.words));
      if (!memory.ok()) return memory.status();
      Node* node = static_cast<Node*>(*memory);
      node->key = op.key;
      node->words = op.words;
      uint64_t* payload = node->payload();
      for (uint64_t j = 0; j < op.words; ++j) payload[j] = Mix2(op.values, j);
      if (op.position == 0) {
        node->next = list.head;
        list.head = node;
      } else {
        Node* before = ListNodeAt(list, op.position - 1);
        node->next = before->next;
        before->next = node;
      }
      ++list.length;
      return absl::OkStatus();
    }
    case OpKind::kListModify: {
      uint64_t* payload = ListNodeAt(list, op.position)->payload();
      for (uint64_t j = 0; j < op.count; ++j) payload[op.first + j] = Mix2(op.values, j);
      return absl::OkStatus();
    }
    case OpKind::kListRemove: {
      Node* node;
      if (op.position == 0) {
        node = list.head.get();
        list.head = node->next;
      } else {
        Node* before = ListNodeAt(list, op.position - 1);
        node = before->next.get();
        before->next = node->next;
      }
      --list.length;
      return FreeListNode(heap, node);
    }
    default:
      return absl::InternalError("not a list operation");
  }
}

absl::Status ClearAll(Heap& heap, Structures& s) {
  s.vec->clear();
  s.vec->shrink_to_fit();
  s.map->clear();
  while (s.list->head) {
    Node* node = s.list->head.get();
    s.list->head = node->next;
    --s.list->length;
    if (absl::Status status = FreeListNode(heap, node); !status.ok()) return status;
  }
  return absl::OkStatus();
}

// Applies `op` to the heap's structures; containers throw std::bad_alloc
// when the heap refuses memory.
absl::Status ApplyToHeap(Heap& heap, Structures& s, const Op& op) {
  switch (op.kind) {
    case OpKind::kClear:
      return ClearAll(heap, s);
    case OpKind::kVecPush:
      for (uint64_t i = 0; i < op.count; ++i) s.vec->push_back(Mix2(op.values, i));
      return absl::OkStatus();
    case OpKind::kVecOverwrite:
      for (uint64_t i = 0; i < op.count; ++i) {
        (*s.vec)[Mix2(op.values, 2 * i) % s.vec->size()] = Mix2(op.values, 2 * i + 1);
      }
      return absl::OkStatus();
    case OpKind::kVecShrink:
      s.vec->resize(op.position);
      s.vec->shrink_to_fit();
      return absl::OkStatus();
    case OpKind::kMapPut:
      (*s.map)[op.key] = Mix2(op.values, 0);
      return absl::OkStatus();
    case OpKind::kMapErase:
      s.map->erase(op.key);
      return absl::OkStatus();
    default:
      return ApplyToList(heap, *s.list, op);
  }
}

std::unique_ptr<Client> ConnectOrDie() {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) Die("connect: " + client.status().ToString());
  return *std::move(client);
}

std::unique_ptr<Heap> AttachOrDie(Client& client, bool create, bool read_only = false) {
  AttachOptions options;
  options.create_if_missing = create;
  options.read_only = read_only;
  options.max_size = kHeapMaxSize;
  absl::StatusOr<std::unique_ptr<Heap>> heap = client.Attach(absl::GetFlag(FLAGS_heap), options);
  if (!heap.ok()) Die("attach: " + heap.status().ToString());
  return *std::move(heap);
}

// The object bound to `name`, made by `make` if unbound. `created` is set
// when it was made.
template <typename T, typename Make>
T* FindOrMake(Heap& heap, const std::string& name, bool* created, const Make& make) {
  absl::StatusOr<T*> found = heap.find<T>(name);
  if (found.ok()) return *found;
  if (found.status().code() != absl::StatusCode::kNotFound) {
    Die("find " + name + ": " + found.status().ToString());
  }
  absl::StatusOr<T*> made = make();
  if (!made.ok()) Die("construct " + name + ": " + made.status().ToString());
  *created = true;
  return *made;
}

// "syncing N", sync, "synced N".
void SyncOrDie(Heap& heap, uint64_t steps_done) {
  Print(absl::StrCat("syncing ", steps_done));
  absl::StatusOr<uint64_t> epoch = heap.sync();
  if (!epoch.ok()) Die(absl::StrCat("sync at step ", steps_done, ": ", epoch.status().ToString()));
  Print(absl::StrCat("synced ", steps_done));
}

void DetachOrDie(Heap& heap, uint64_t steps_done) {
  if (absl::Status s = heap.detach(); !s.ok()) Die("detach: " + s.ToString());
  Print(absl::StrCat("done ", steps_done));
}

int Run() {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const uint64_t start = absl::GetFlag(FLAGS_start_step);
  const uint64_t end = start + absl::GetFlag(FLAGS_steps);
  const uint64_t sync_every = std::max<uint64_t>(1, absl::GetFlag(FLAGS_sync_every));
  const std::string prefix = absl::GetFlag(FLAGS_name_prefix);
  std::unique_ptr<Client> client = ConnectOrDie();
  std::unique_ptr<Heap> heap = AttachOrDie(*client, /*create=*/start == 0);
  bool created = false;
  Structures s;
  s.vec = FindOrMake<Vec>(*heap, VecName(prefix), &created, [&] {
    return heap->construct<Vec>(VecName(prefix))(U64Allocator(*heap));
  });
  s.map = FindOrMake<Map>(*heap, MapName(prefix), &created, [&] {
    return heap->construct<Map>(MapName(prefix))(MapAllocator(*heap));
  });
  s.list = FindOrMake<List>(*heap, ListName(prefix), &created, [&] {
    return heap->construct<List>(ListName(prefix))(List{nullptr, 0});
  });
  if (created && start != 0) Die(absl::StrCat("structures missing at step ", start));
  SyncOrDie(*heap, start);
  for (uint64_t step = start; step < end; ++step) {
    const Op op = NextOp(seed, step, s.vec->size(), s.list->length,
                         [&](uint64_t position) { return ListNodeAt(*s.list, position)->words; });
    try {
      if (absl::Status status = ApplyToHeap(*heap, s, op); !status.ok()) {
        Die(absl::StrCat("step ", step, ": ", status.ToString()));
      }
    } catch (const std::exception& e) {
      Die(absl::StrCat("step ", step, ": ", e.what()));
    }
    if ((step + 1) % sync_every == 0 && step + 1 < end) SyncOrDie(*heap, step + 1);
  }
  SyncOrDie(*heap, end);
  DetachOrDie(*heap, end);
  return 0;
}

// ---------------------------------------------------------------------------
// The checker.

// What the checker is reading, for the fault handler: a fault there means
// the structure points outside the heap's live memory (memory whose
// allocation rolled back and the churn reused, or past the heap's end).
char reading[256] = "nothing yet";
std::atomic<char*> heap_base{nullptr};
std::atomic<uint64_t> model_step{0};  // the model compared with

__attribute__((format(printf, 1, 2))) void Reading(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(reading, sizeof(reading), format, args);
  va_end(args);
}

void OnFault(int signal, siginfo_t* info, void*) {
  char message[512];
  const uint64_t offset =
      reinterpret_cast<uintptr_t>(info->si_addr) - reinterpret_cast<uintptr_t>(heap_base.load());
  const int n = std::snprintf(message, sizeof(message),
                              "DIVERGENCE: %s at heap offset 0x%" PRIx64
                              " while reading %s against the model at step %" PRIu64
                              ": the structure points outside the heap's live memory\n",
                              signal == SIGSEGV  ? "SIGSEGV"
                              : signal == SIGBUS ? "SIGBUS"
                                                 : "a timeout (a loop?)",
                              offset, reading, model_step.load());
  (void)!write(1, message, n > 0 ? std::min<size_t>(n, sizeof(message) - 1) : 0);
  _exit(1);
}

// Installed before the heap is attached: the client's growth fault handler
// passes the faults it does not resolve on to this one.
void InstallFaultHandlers() {
  struct sigaction action = {};
  action.sa_sigaction = OnFault;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, nullptr);
  sigaction(SIGBUS, &action, nullptr);
  sigaction(SIGALRM, &action, nullptr);  // a loop in a corrupt structure
  alarm(120);
}

std::string Hex(uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%016" PRIx64, value);
  std::string out = text;
  if (value == kChurnPattern) out += " (the checker's churn: reused memory)";
  return out;
}

// Differences between the heap and the model, at most kMaxLines lines per
// structure (and a count of the rest).
class Diffs {
 public:
  static constexpr int kMaxLines = 8;

  void Add(const std::string& structure, const std::string& line) {
    int& lines = lines_[structure];
    ++total_;
    if (lines++ < kMaxLines) out_.push_back(structure + " " + line);
    if (lines == kMaxLines + 1) out_.push_back(structure + ": more differences follow");
  }
  bool empty() const { return total_ == 0; }
  uint64_t total() const { return total_; }
  const std::vector<std::string>& lines() const { return out_; }

 private:
  std::unordered_map<std::string, int> lines_;
  std::vector<std::string> out_;
  uint64_t total_ = 0;
};

// Whether [p, p + bytes) lies in the heap's first `capacity` bytes.
bool InHeap(const Heap& heap, const void* p, uint64_t bytes, uint64_t capacity) {
  const uint64_t offset = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(heap.base());
  return offset < capacity && bytes <= capacity - offset;
}

void CompareVec(const Heap& heap, const Vec* vec, const std::vector<uint64_t>& model,
                uint64_t capacity, Diffs& diffs) {
  Reading("the vector");
  const std::string name = "vector";
  if (vec == nullptr) {
    if (!model.empty()) diffs.Add(name, "is not bound");
    return;
  }
  const uint64_t size = vec->size();
  const uint64_t* data = boost::interprocess::ipcdetail::to_raw_pointer(vec->data());
  if (size != model.size()) {
    diffs.Add(name, absl::StrCat("size: expected ", model.size(), ", got ", size));
  }
  if (size > vec->capacity() || (size > 0 && !InHeap(heap, data, size * 8, capacity))) {
    diffs.Add(name, absl::StrCat("buffer of ", size, " elements (capacity ", vec->capacity(),
                                 ") at heap offset ", heap.offset_of(data),
                                 " is not inside the heap (", capacity, " bytes)"));
    return;
  }
  const uint64_t common = std::min<uint64_t>(size, model.size());
  for (uint64_t i = 0; i < common; ++i) {
    if (data[i] != model[i]) {
      diffs.Add(name, absl::StrCat("[", i, "]: expected ", Hex(model[i]), ", got ", Hex(data[i])));
    }
  }
}

void CompareMap(const Map* map, const std::unordered_map<uint64_t, uint64_t>& model, Diffs& diffs) {
  Reading("the map (its size)");
  const std::string name = "map";
  if (map == nullptr) {
    if (!model.empty()) diffs.Add(name, "is not bound");
    return;
  }
  if (map->size() != model.size()) {
    diffs.Add(name, absl::StrCat("size: expected ", model.size(), ", got ", map->size()));
  }
  for (const auto& [key, value] : model) {
    Reading("the map: find(%" PRIu64 ")", key);
    const auto it = map->find(key);
    if (it == map->end()) {
      diffs.Add(name, absl::StrCat("[", key, "]: expected ", Hex(value), ", missing"));
    } else if (it->second != value) {
      diffs.Add(name,
                absl::StrCat("[", key, "]: expected ", Hex(value), ", got ", Hex(it->second)));
    }
  }
  uint64_t visited = 0;
  Reading("the map: iterating over it");
  for (const auto& [key, value] : *map) {
    if (++visited > model.size() + Diffs::kMaxLines) break;  // a corrupt chain
    if (model.count(key) == 0) {
      diffs.Add(name, absl::StrCat("[", key, "]: not expected, got ", Hex(value)));
    }
  }
}

void ComparePayload(const std::string& name, const uint64_t* payload,
                    const std::vector<uint64_t>& model, Diffs& diffs) {
  uint64_t differing = 0;
  uint64_t first = 0;
  for (uint64_t j = 0; j < model.size(); ++j) {
    if (payload[j] == model[j]) continue;
    if (differing++ == 0) first = j;
  }
  if (differing == 0) return;
  diffs.Add(name, absl::StrCat("payload: ", differing, " of ", model.size(),
                               " words differ, the first at word ", first, ": expected ",
                               Hex(model[first]), ", got ", Hex(payload[first])));
}

void CompareList(const Heap& heap, const List* list, const std::list<ModelNode>& model,
                 uint64_t capacity, Diffs& diffs) {
  Reading("the list (its head)");
  const std::string name = "list";
  if (list == nullptr) {
    if (!model.empty()) diffs.Add(name, "is not bound");
    return;
  }
  if (list->length != model.size()) {
    diffs.Add(name, absl::StrCat("length field: expected ", model.size(), ", got ", list->length));
  }
  const Node* node = list->head.get();
  uint64_t position = 0;
  for (const ModelNode& expected : model) {
    const std::string at = absl::StrCat("node ", position, " (key ", Hex(expected.key), ")");
    Reading("the list: node %" PRIu64, position);
    if (node == nullptr) {
      diffs.Add(name, absl::StrCat("ends after ", position, " nodes, expected ", model.size()));
      return;
    }
    if (!InHeap(heap, node, sizeof(Node), capacity)) {
      diffs.Add(name, at + absl::StrCat(": at heap offset ", heap.offset_of(node),
                                        ", outside the heap (", capacity, " bytes)"));
      return;
    }
    if (node->key != expected.key) {
      diffs.Add(name, at + ": key is " + Hex(node->key));
    }
    if (node->words != expected.payload.size()) {
      diffs.Add(name, at + absl::StrCat(": payload words: expected ", expected.payload.size(),
                                        ", got ", node->words));
    } else if (!InHeap(heap, node, NodeBytes(node->words), capacity)) {
      diffs.Add(name, at + ": payload runs past the heap's end");
    } else {
      ComparePayload(name + " " + at, const_cast<Node*>(node)->payload(), expected.payload, diffs);
    }
    node = node->next.get();
    ++position;
  }
  if (node != nullptr) {
    diffs.Add(name, absl::StrCat("has more than the expected ", model.size(), " nodes"));
  }
}

// Objects the checker allocates over the heap's free memory and fills with
// kChurnPattern, so that memory whose allocation rolled back while a
// structure still points at it reads as the pattern: every free slot of the
// chunks of the classes in use, one whole chunk of every other class, then
// a large object (one chunk, 2 MiB - 64 B) over every chunk still free.
// The checker leases one chunk at a time, so it leases no chunk it does not
// fill. Freed again before it detaches; the heap does not grow round after
// round.
class Churn {
 public:
  explicit Churn(Heap& heap) : heap_(heap) {}

  absl::Status Fill(Client& client) {
    absl::StatusOr<v1::HeapStats> stats = StatHeap(client, heap_.name());
    if (!stats.ok()) return stats.status();
    std::vector<uint64_t> count(kNumSizeClasses);
    for (uint32_t c = 0; c < kNumSizeClasses; ++c) count[c] = SlotsPerChunk(c);
    for (const v1::SizeClassStats& used : stats->size_classes()) {
      const uint64_t slots = uint64_t{used.chunks()} * SlotsPerChunk(used.size_class());
      count[used.size_class()] = slots - std::min(slots, used.live_objects());
    }
    for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
      for (uint64_t i = 0; i < count[c]; ++i) {
        if (absl::Status s = Allocate(ClassSize(c)); !s.ok()) return s;
      }
    }
    stats = StatHeap(client, heap_.name());
    if (!stats.ok()) return stats.status();
    for (uint32_t i = 0; i < stats->free_chunks(); ++i) {
      if (absl::Status s = Allocate(kChunkSize - 64); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Free() {
    for (const auto& [p, size] : objects_) {
      if (absl::Status s = heap_.deallocate(p, size); !s.ok()) return s;
    }
    objects_.clear();
    return absl::OkStatus();
  }

  uint64_t objects() const { return objects_.size(); }
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr uint64_t kMaxBytes = uint64_t{2} << 30;

  absl::Status Allocate(uint64_t size) {
    if (bytes_ + size > kMaxBytes) return absl::OkStatus();  // enough
    absl::StatusOr<void*> p = heap_.allocate(size);
    if (!p.ok()) return p.status();
    std::memset(*p, 0xA5, size);
    objects_.emplace_back(*p, size);
    bytes_ += size;
    return absl::OkStatus();
  }

  Heap& heap_;
  std::vector<std::pair<void*, uint64_t>> objects_;
  uint64_t bytes_ = 0;
};

// The heap's structures against the model at `step`.
Diffs Compare(const Heap& heap, const Structures& s, uint64_t seed, uint64_t step,
              uint64_t capacity) {
  const Model model = ModelAt(seed, step);
  model_step = step;
  Diffs diffs;
  CompareVec(heap, s.vec, model.vec, capacity, diffs);
  CompareMap(s.map, model.map, diffs);
  CompareList(heap, s.list, model.list, capacity, diffs);
  return diffs;
}

template <typename T>
T* FindOrNull(Heap& heap, const std::string& name) {
  absl::StatusOr<T*> found = heap.find<T>(name);
  if (found.ok()) return *found;
  if (found.status().code() != absl::StatusCode::kNotFound) {
    Die("find " + name + ": " + found.status().ToString());
  }
  return nullptr;
}

int Check() {
  InstallFaultHandlers();
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string prefix = absl::GetFlag(FLAGS_name_prefix);
  std::vector<uint64_t> steps = {absl::GetFlag(FLAGS_expect_step)};
  if (absl::GetFlag(FLAGS_or_step) >= 0) steps.push_back(absl::GetFlag(FLAGS_or_step));
  std::unique_ptr<Client> client = ConnectOrDie();
  // A heap the first worker never got to create is the state at step 0.
  AttachOptions options;
  options.lease_batch = 1;
  absl::StatusOr<std::unique_ptr<Heap>> attached =
      client->Attach(absl::GetFlag(FLAGS_heap), options);
  if (attached.status().code() == absl::StatusCode::kNotFound &&
      std::find(steps.begin(), steps.end(), 0) != steps.end()) {
    Print("ok step 0 (no heap)");
    return 0;
  }
  if (!attached.ok()) Die("attach: " + attached.status().ToString());
  std::unique_ptr<Heap> heap = *std::move(attached);
  heap_base = heap->base();
  Churn churn(*heap);
  if (absl::Status s = churn.Fill(*client); !s.ok()) Die("churn: " + s.ToString());
  absl::StatusOr<v1::HeapStats> stats = StatHeap(*client, absl::GetFlag(FLAGS_heap));
  if (!stats.ok()) Die("stat: " + stats.status().ToString());
  const uint64_t capacity = stats->info().capacity_bytes();
  Print(absl::StrCat("churned ", churn.objects(), " objects, ", churn.bytes() >> 20, " MiB"));

  Structures s;
  s.vec = FindOrNull<Vec>(*heap, VecName(prefix));
  s.map = FindOrNull<Map>(*heap, MapName(prefix));
  s.list = FindOrNull<List>(*heap, ListName(prefix));
  std::vector<Diffs> diffs;
  int matched = -1;
  for (size_t i = 0; i < steps.size() && matched < 0; ++i) {
    diffs.push_back(Compare(*heap, s, seed, steps[i], capacity));
    if (diffs.back().empty()) matched = static_cast<int>(i);
  }
  Reading("nothing (freeing the churn)");
  if (absl::Status st = churn.Free(); !st.ok()) Die("free churn: " + st.ToString());
  if (absl::Status st = heap->detach(); !st.ok()) Die("detach: " + st.ToString());
  if (matched >= 0) {
    Print(absl::StrCat("ok step ", steps[matched]));
    return 0;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    Print(absl::StrCat("against the model at step ", steps[i], ": ", diffs[i].total(),
                       " differences"));
    for (const std::string& line : diffs[i].lines()) Print("  " + line);
  }
  Print(absl::StrCat("DIVERGENCE: heap ", absl::GetFlag(FLAGS_heap), " (", prefix,
                     ".*) matches the model at none of the steps it may be at"));
  return 1;
}

// ---------------------------------------------------------------------------
// Two sessions writing the same pages.

constexpr uint64_t kSharedSlots = 1 << 16;  // 512 KiB: 128 pages
constexpr uint64_t kWritesPerStep = 16;

// Write j of step `step` of a writer with `seed` and `parity` (0: the
// owner's even slots, 1: the cowriter's odd ones).
uint64_t SharedSlot(uint64_t seed, uint64_t step, uint64_t j, uint64_t parity) {
  return 2 * (Mix2(Mix2(seed, step), 2 * j) % (kSharedSlots / 2)) + parity;
}
uint64_t SharedValue(uint64_t seed, uint64_t step, uint64_t j) {
  return Mix2(Mix2(seed, step), 2 * j + 1) | 1;  // never 0, the initial value
}

// The slots of a writer after its steps [0, step).
std::vector<uint64_t> SharedModel(uint64_t seed, uint64_t parity, uint64_t step) {
  std::vector<uint64_t> slots(kSharedSlots);
  for (uint64_t s = 0; s < step; ++s) {
    for (uint64_t j = 0; j < kWritesPerStep; ++j) {
      slots[SharedSlot(seed, s, j, parity)] = SharedValue(seed, s, j);
    }
  }
  return slots;
}

std::atomic<bool> stop_requested{false};

// The owner (parity 0, runs until SIGTERM) or the cowriter (parity 1,
// runs --steps steps).
int RunSharedWriter(uint64_t parity) {
  signal(SIGTERM, [](int) { stop_requested = true; });
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const uint64_t start = absl::GetFlag(FLAGS_start_step);
  const uint64_t end = start + absl::GetFlag(FLAGS_steps);
  const uint64_t sync_every = std::max<uint64_t>(1, absl::GetFlag(FLAGS_sync_every));
  const uint64_t delay_us = absl::GetFlag(FLAGS_step_delay_us);
  const std::string name = SharedName(absl::GetFlag(FLAGS_name_prefix));
  std::unique_ptr<Client> client = ConnectOrDie();
  std::unique_ptr<Heap> heap = AttachOrDie(*client, /*create=*/parity == 0 && start == 0);
  bool created = false;
  Vec* vec;
  if (parity == 0) {
    vec = FindOrMake<Vec>(*heap, name, &created, [&]() -> absl::StatusOr<Vec*> {
      absl::StatusOr<Vec*> made = heap->construct<Vec>(name)(U64Allocator(*heap));
      if (made.ok()) (*made)->resize(kSharedSlots, 0);
      return made;
    });
    if (created && start != 0) Die(absl::StrCat(name, " missing at step ", start));
  } else {
    absl::StatusOr<Vec*> found = heap->find<Vec>(name);
    if (!found.ok()) Die("find " + name + ": " + found.status().ToString());
    vec = *found;
  }
  if (vec->size() != kSharedSlots) Die(absl::StrCat(name, " has ", vec->size(), " slots"));
  uint64_t* slots = vec->data();
  SyncOrDie(*heap, start);
  Print("ready");
  uint64_t step = start;
  for (; step < end && !stop_requested; ++step) {
    for (uint64_t j = 0; j < kWritesPerStep; ++j) {
      slots[SharedSlot(seed, step, j, parity)] = SharedValue(seed, step, j);
    }
    if ((step + 1) % sync_every == 0) SyncOrDie(*heap, step + 1);
    if (delay_us > 0) usleep(static_cast<useconds_t>(delay_us));
  }
  SyncOrDie(*heap, step);
  DetachOrDie(*heap, step);
  return 0;
}

// The shared vector after the owner stopped cleanly at --expect_step and the
// cowriter was killed (or finished) with --b_step its last synced step:
//   - every even slot equals the owner's model at its step, exactly;
//   - every odd slot equals the cowriter's model at --b_step, or a value the
//     cowriter wrote to that slot in a later step (below --b_max_step).
// Why odd slots may be newer than the cowriter's last sync: a page written by
// two sessions commits as it is at each sync of either. When the owner
// synced after the cowriter's unsynced store to a page, that store is
// committed with the owner's sync and survives the cowriter's death; only
// the cowriter's stores that no sync committed roll back.
int CheckShared() {
  InstallFaultHandlers();
  const std::string name = SharedName(absl::GetFlag(FLAGS_name_prefix));
  const uint64_t a_step = absl::GetFlag(FLAGS_expect_step);
  const uint64_t b_seed = absl::GetFlag(FLAGS_b_seed);
  const uint64_t b_step = absl::GetFlag(FLAGS_b_step);
  const uint64_t b_max = std::max(b_step, absl::GetFlag(FLAGS_b_max_step));
  std::unique_ptr<Client> client = ConnectOrDie();
  std::unique_ptr<Heap> heap = AttachOrDie(*client, /*create=*/false, /*read_only=*/true);
  heap_base = heap->base();
  model_step = a_step;
  Reading("the shared vector");
  absl::StatusOr<Vec*> vec = heap->find<Vec>(name);
  if (!vec.ok()) Die("find " + name + ": " + vec.status().ToString());
  if ((*vec)->size() != kSharedSlots) {
    Print(absl::StrCat("DIVERGENCE: ", name, " has ", (*vec)->size(), " slots"));
    return 1;
  }
  const uint64_t* slots = (*vec)->data();
  const std::vector<uint64_t> owner = SharedModel(absl::GetFlag(FLAGS_seed), 0, a_step);
  const std::vector<uint64_t> cowriter = SharedModel(b_seed, 1, b_step);
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> later;  // slot -> values
  for (uint64_t s = b_step; s < b_max; ++s) {
    for (uint64_t j = 0; j < kWritesPerStep; ++j) {
      later[SharedSlot(b_seed, s, j, 1)].insert(SharedValue(b_seed, s, j));
    }
  }
  Diffs diffs;
  uint64_t newer = 0;
  for (uint64_t i = 0; i < kSharedSlots; ++i) {
    const uint64_t got = slots[i];
    if (i % 2 == 0) {
      if (got != owner[i]) {
        diffs.Add("owner's even slot",
                  absl::StrCat("[", i, "] at the owner's step ", a_step, ": expected ",
                               Hex(owner[i]), ", got ", Hex(got)));
      }
    } else if (got != cowriter[i]) {
      const auto it = later.find(i);
      if (it != later.end() && it->second.count(got) != 0) {
        ++newer;
        continue;
      }
      diffs.Add(
          "cowriter's odd slot",
          absl::StrCat("[", i, "]: got ", Hex(got), ", neither its value at step ", b_step, " (",
                       Hex(cowriter[i]), ") nor one it wrote in steps ", b_step, "..", b_max));
    }
  }
  if (diffs.empty()) {
    Print(absl::StrCat("ok step ", a_step, " (cowriter at step ", b_step, "; ", newer,
                       " of its later stores committed by the owner's syncs)"));
    return 0;
  }
  for (const std::string& line : diffs.lines()) Print("  " + line);
  Print(absl::StrCat("DIVERGENCE: ", diffs.total(), " slots of ", name, " are wrong"));
  return 1;
}

int Main() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (absl::GetFlag(FLAGS_check)) {
    if (mode == "run") return Check();
    if (mode == "shared") return CheckShared();
  } else {
    if (mode == "run") return Run();
    if (mode == "owner") return RunSharedWriter(0);
    if (mode == "cowriter") return RunSharedWriter(1);
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace data_crash
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::data_crash::Main();
}
