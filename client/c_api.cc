// heapd's C API (heapd/heapd.h) over the C++ client: a heapd_heap is a
// Client and the Heap attached through it.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/array_record.h"
#include "client/client_channel.h"
#include "client/heap_impl.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "heapd/heapd.h"
#include "protocol/version.h"

struct heapd_heap {
  std::unique_ptr<heapd::Client> client;
  std::unique_ptr<heapd::Heap> heap;  // detached before the client goes
  pid_t attached_by = 0;              // the process whose session this is
  // In a forked child (heapd_forked_child, or any call from a process that
  // did not attach it): the parent's session and gRPC channel, never used
  // or destroyed here.
  bool forked = false;
};

namespace heapd {
namespace {

// The type name of objects named through the C API (no C++ type).
constexpr char kBytesTypeName[] = "heapd::bytes/v1";
constexpr uint64_t kMallocAlign = 16;
constexpr uint64_t kArrayAlign = 64;

thread_local std::string last_error;

int ErrnoOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return EINVAL;
    case absl::StatusCode::kNotFound:
      return ENOENT;
    case absl::StatusCode::kAlreadyExists:
      return EEXIST;
    case absl::StatusCode::kResourceExhausted:
      return ENOMEM;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return EACCES;
    case absl::StatusCode::kFailedPrecondition:
      return EPERM;
    case absl::StatusCode::kUnavailable:
      return ECONNREFUSED;
    case absl::StatusCode::kDeadlineExceeded:
      return ETIMEDOUT;
    default:
      return EIO;
  }
}

// Records `status` as this thread's last error and sets errno.
void Record(const absl::Status& status) {
  last_error = absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
  errno = ErrnoOf(status.code());
}

template <typename T>
T Fail(const absl::Status& status, T value) {
  Record(status);
  return value;
}

absl::Status NoHeap() { return absl::InvalidArgumentError("no heap (NULL, or detached)"); }

// This process's pid without a system call per heapd_malloc (glibc does
// not cache getpid(), and the call costs ~10x an allocation): taken on
// first use and again in every child fork() makes. A child made by a raw
// clone() keeps the parent's, so it calls heapd_forked_child itself.
std::atomic<pid_t> this_process{0};
pid_t ThisProcess() {
  static const bool watching_forks = [] {
    this_process.store(getpid(), std::memory_order_relaxed);
    return pthread_atfork(nullptr, nullptr,
                          [] { this_process.store(getpid(), std::memory_order_relaxed); }) == 0;
  }();
  return watching_forks ? this_process.load(std::memory_order_relaxed) : getpid();
}

// A heap this process inherited with fork(): see heapd_forked_child.
bool Inherited(heapd_heap* heap) {
  if (heap != nullptr && !heap->forked && heap->heap != nullptr &&
      heap->attached_by != ThisProcess()) {
    heap->forked = true;  // a child that did not call heapd_forked_child
  }
  return heap != nullptr && heap->forked;
}

bool MissingHeap(heapd_heap* heap) {
  if (Inherited(heap)) {
    Record(absl::FailedPreconditionError(
        absl::StrCat("heap ", heap->heap->name(),
                     " was attached by the parent of this forked process: attach "
                     "it again here to use it")));
    return true;
  }
  if (heap != nullptr && heap->heap != nullptr) return false;
  Record(NoHeap());
  return true;
}

bool MissingName(const char* name) {
  if (name != nullptr) return false;
  Record(absl::InvalidArgumentError("no name (NULL)"));
  return true;
}

// C links are heap offsets plus one, so that 0 is no object's (an object
// may start at the heap's first byte).
constexpr uint64_t kLinkBias = 1;

}  // namespace
}  // namespace heapd

using heapd::Fail;
using heapd::Inherited;
using heapd::MissingHeap;
using heapd::MissingName;
using heapd::NoHeap;

extern "C" {

const char* heapd_version(void) { return heapd::kHeapdVersion; }

void heapd_attach_options_init_sized(heapd_attach_options* options, size_t size) {
  if (options == nullptr || size < offsetof(heapd_attach_options, socket)) return;
  size = std::min(size, sizeof(*options));
  std::memset(options, 0, size);
  options->struct_size = size;
}

// The function programs built against 0.4.0's header call: it fills only
// the fields that struct had (through `mode`), never more.
#undef heapd_attach_options_init
extern "C" void heapd_attach_options_init(heapd_attach_options* options);
void heapd_attach_options_init(heapd_attach_options* options) {
  heapd_attach_options_init_sized(options, offsetof(heapd_attach_options, image));
}

heapd_heap* heapd_attach(const char* name, const heapd_attach_options* options) try {
  if (MissingName(name)) return nullptr;
  heapd_attach_options given;
  heapd_attach_options_init_sized(&given, sizeof(given));
  if (options != nullptr) {
    // A caller built against an older, shorter struct: read what it has.
    if (options->struct_size < offsetof(heapd_attach_options, socket) + sizeof(const char*)) {
      return Fail(absl::InvalidArgumentError(
                      "heapd_attach_options not filled by heapd_attach_options_init"),
                  static_cast<heapd_heap*>(nullptr));
    }
    std::memcpy(&given, options, std::min(options->struct_size, sizeof(given)));
    given.struct_size = sizeof(given);
  }
  absl::StatusOr<std::unique_ptr<heapd::Client>> client =
      heapd::Client::Connect(given.socket == nullptr ? "" : given.socket);
  if (!client.ok()) return Fail(client.status(), static_cast<heapd_heap*>(nullptr));
  heapd::AttachOptions attach;
  attach.create_if_missing = given.create_if_missing != 0;
  attach.read_only = given.read_only != 0;
  attach.max_size = given.max_size;
  attach.mode = given.mode;
  if (given.storage != nullptr) attach.storage = given.storage;
  attach.fixed_address = given.fixed_address != 0;
  switch (given.image) {
    case HEAPD_IMAGE_DEFAULT:
      break;
    case HEAPD_IMAGE_DIRECT:
      attach.image = heapd::HeapImage::kDirect;
      break;
    case HEAPD_IMAGE_WORKING:
      attach.image = heapd::HeapImage::kWorking;
      break;
    default:
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "heapd_attach_options.image ", given.image,
                      " is none of HEAPD_IMAGE_DEFAULT, HEAPD_IMAGE_DIRECT, HEAPD_IMAGE_WORKING")),
                  static_cast<heapd_heap*>(nullptr));
  }
  absl::StatusOr<std::unique_ptr<heapd::Heap>> heap = (*client)->Attach(name, attach);
  if (!heap.ok()) return Fail(heap.status(), static_cast<heapd_heap*>(nullptr));
  return new heapd_heap{*std::move(client), *std::move(heap), heapd::ThisProcess()};
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())),
                     static_cast<heapd_heap*>(nullptr));
}

int heapd_forked_child(heapd_heap* heap) {
  if (heap == nullptr || heap->heap == nullptr) return Fail(NoHeap(), -1);
  if (heap->forked && heap->attached_by == heapd::ThisProcess()) return 0;  // called twice
  heap->forked = true;
  const absl::Status kept = heapd::HeapImpl::Of(*heap->heap).KeepPrivatelyAfterFork();
  return kept.ok() ? 0 : Fail(kept, -1);
}

int heapd_detach(heapd_heap* heap) try {
  if (Inherited(heap)) {
    // The parent's objects: released, never destroyed here (the gRPC
    // channel and session are the parent's). A fixed-address heap's
    // mapping goes, so that this process may attach the heap anew.
    heapd::HeapImpl::Of(*heap->heap).UnmapInForkedChild();
    (void)heap->client.release();
    (void)heap->heap.release();
    delete heap;
    return 0;
  }
  if (MissingHeap(heap)) return -1;
  const absl::Status detached = heap->heap->detach();
  heap->heap.reset();
  delete heap;
  return detached.ok() ? 0 : Fail(detached, -1);
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())), -1);
}

void* heapd_malloc(heapd_heap* heap, size_t size) try {
  if (MissingHeap(heap)) return nullptr;
  absl::StatusOr<void*> memory = heap->heap->allocate(size == 0 ? 1 : size, heapd::kMallocAlign);
  return memory.ok() ? *memory : Fail(memory.status(), static_cast<void*>(nullptr));
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())),
                     static_cast<void*>(nullptr));
}

int heapd_free(heapd_heap* heap, void* p) try {
  if (MissingHeap(heap)) return -1;
  if (p == nullptr) return 0;
  const absl::Status freed = heap->heap->deallocate(p);
  return freed.ok() ? 0 : Fail(freed, -1);
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())), -1);
}

void* heapd_named_malloc(heapd_heap* heap, const char* name, size_t size) try {
  if (MissingHeap(heap) || MissingName(name)) return nullptr;
  absl::StatusOr<void*> memory = heap->heap->allocate(size == 0 ? 1 : size, heapd::kMallocAlign);
  if (!memory.ok()) return Fail(memory.status(), static_cast<void*>(nullptr));
  if (absl::Status bound = heap->heap->Bind(name, *memory, size, heapd::kBytesTypeName);
      !bound.ok()) {
    (void)heap->heap->deallocate(*memory);
    return Fail(bound, static_cast<void*>(nullptr));
  }
  return *memory;
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())),
                     static_cast<void*>(nullptr));
}

void* heapd_find(heapd_heap* heap, const char* name, size_t* size) try {
  if (MissingHeap(heap) || MissingName(name)) return nullptr;
  absl::StatusOr<heapd::Heap::Named> named = heap->heap->Lookup(name);
  if (!named.ok()) return Fail(named.status(), static_cast<void*>(nullptr));
  if (size != nullptr) *size = named->size;
  return named->object;
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())),
                     static_cast<void*>(nullptr));
}

int heapd_named_free(heapd_heap* heap, const char* name) try {
  if (MissingHeap(heap) || MissingName(name)) return -1;
  // The object the unbind took: another process may rebind the name.
  absl::StatusOr<heapd::Heap::Named> removed = heap->heap->Remove(name);
  if (!removed.ok()) return Fail(removed.status(), -1);
  const absl::Status freed = heap->heap->deallocate(removed->object, removed->size);
  return freed.ok() ? 0 : Fail(freed, -1);
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())), -1);
}

int heapd_sync(heapd_heap* heap) try {
  if (MissingHeap(heap)) return -1;
  absl::StatusOr<uint64_t> epoch = heap->heap->sync();
  return epoch.ok() ? 0 : Fail(epoch.status(), -1);
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())), -1);
}

// Offsets are arithmetic on the mapping: they work in a forked child too.
uint64_t heapd_offset(heapd_heap* heap, const void* p) {
  if (heap == nullptr || heap->heap == nullptr) return Fail(NoHeap(), UINT64_MAX);
  if (p == nullptr) return 0;
  const char* at = static_cast<const char*>(p);
  if (at < heap->heap->base() || at >= heap->heap->base() + heap->heap->max_size()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("address 0x",
                                                        absl::Hex(reinterpret_cast<uintptr_t>(p)),
                                                        " is not in heap ", heap->heap->name())),
                UINT64_MAX);
  }
  return heap->heap->offset_of(p) + heapd::kLinkBias;
}

void* heapd_pointer(heapd_heap* heap, uint64_t link) {
  if (heap == nullptr || heap->heap == nullptr) return Fail(NoHeap(), static_cast<void*>(nullptr));
  if (link == 0) return nullptr;
  const uint64_t offset = link - heapd::kLinkBias;
  if (offset >= heap->heap->max_size()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("link ", link, " is beyond heap ",
                                                        heap->heap->name(), "'s maximum size")),
                static_cast<void*>(nullptr));
  }
  return heap->heap->at(offset);
}

int64_t heapd_list_names(heapd_heap* heap, const char* prefix, heapd_name_visitor each,
                         void* arg) try {
  if (MissingHeap(heap)) return -1;
  heapd::ClientChannel& channel = heapd::ChannelOf(*heap->client);
  heapd::v1::ListNamesRequest request;
  request.set_heap(heap->heap->name());
  if (prefix != nullptr) request.set_prefix(prefix);
  heapd::v1::ListNamesResponse response;
  grpc::ClientContext context;
  channel.Prepare(&context);
  if (absl::Status s = heapd::FromGrpc(channel.stub->ListNames(&context, request, &response));
      !s.ok()) {
    return Fail(s, int64_t{-1});
  }
  if (each != nullptr) {
    for (const heapd::v1::NameEntry& entry : response.names()) {
      each(entry.name().c_str(), entry.size(), entry.type_name().c_str(), arg);
    }
  }
  return response.names_size();
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())), int64_t{-1});
}

int heapd_stats(heapd_heap* heap, heapd_heap_stats* stats) try {
  if (MissingHeap(heap)) return -1;
  if (stats == nullptr || stats->struct_size < offsetof(heapd_heap_stats, content_rollback)) {
    return Fail(absl::InvalidArgumentError("heapd_heap_stats without its struct_size"), -1);
  }
  absl::StatusOr<heapd::v1::HeapStats> got = heapd::StatHeap(*heap->client, heap->heap->name());
  if (!got.ok()) return Fail(got.status(), -1);
  heapd_heap_stats filled{};
  filled.struct_size = std::min(stats->struct_size, sizeof(filled));  // what is filled
  filled.max_size = got->info().max_size();
  filled.reserved_bytes = got->info().capacity_bytes();
  filled.allocated_bytes = got->info().allocated_bytes();
  filled.live_objects = got->info().live_objects();
  filled.names = got->info().names();
  filled.epoch = got->info().epoch();
  filled.clients = got->info().clients();
  filled.content_rollback = got->info().content_rollback() ? 1 : 0;
  filled.fixed_address = got->info().fixed_address();
  std::memcpy(stats, &filled, std::min(stats->struct_size, sizeof(filled)));
  return 0;
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())), -1);
}

const char* heapd_last_error(void) { return heapd::last_error.c_str(); }

size_t heapd_dtype_size(int dtype) {
  heapd_array_info one{};
  one.dtype = dtype;
  one.rank = 1;
  one.shape[0] = 1;
  return heapd::CheckArrayInfo(one).ok() ? heapd::ArrayBytes(one) : 0;
}

void* heapd_find_array(heapd_heap* heap, const char* name, heapd_array_info* info) try {
  if (MissingHeap(heap) || MissingName(name)) return nullptr;
  absl::StatusOr<heapd::Heap::Named> named = heap->heap->Lookup(name);
  if (!named.ok()) return Fail(named.status(), static_cast<void*>(nullptr));
  absl::StatusOr<heapd_array_info> record = heapd::ParseArrayTypeName(named->type_name);
  if (!record.ok()) {
    return Fail(absl::Status(record.status().code(),
                             absl::StrCat("name '", name, "' in heap ", heap->heap->name(), ": ",
                                          record.status().message())),
                static_cast<void*>(nullptr));
  }
  if (named->size < heapd::ArrayBytes(*record)) {
    return Fail(absl::DataLossError(absl::StrCat("array '", name, "' in heap ", heap->heap->name(),
                                                 " holds ", named->size,
                                                 " bytes, less than its record says")),
                static_cast<void*>(nullptr));
  }
  if (info != nullptr) *info = *record;
  return named->object;
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())),
                     static_cast<void*>(nullptr));
}

void* heapd_array(heapd_heap* heap, const char* name, const heapd_array_info* info,
                  int create) try {
  if (MissingHeap(heap) || MissingName(name)) return nullptr;
  if (info == nullptr) {
    return Fail(absl::InvalidArgumentError("no array record (NULL)"), static_cast<void*>(nullptr));
  }
  if (absl::Status s = heapd::CheckArrayInfo(*info); !s.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("array '", name, "': ", s.message())),
                static_cast<void*>(nullptr));
  }
  // Find, else create; a creation that loses the race to another process's
  // finds that one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    heapd_array_info found{};
    void* existing = heapd_find_array(heap, name, &found);
    if (existing != nullptr) {
      if (heapd::ArrayTypeName(found) == heapd::ArrayTypeName(*info)) return existing;
      return Fail(absl::FailedPreconditionError(absl::StrCat(
                      "array '", name, "' in heap ", heap->heap->name(), " is ",
                      heapd::DescribeArray(found), ", not ", heapd::DescribeArray(*info))),
                  static_cast<void*>(nullptr));
    }
    if (errno != ENOENT || !create) return nullptr;  // heapd_find_array said why
    const uint64_t bytes = heapd::ArrayBytes(*info);
    absl::StatusOr<void*> memory = heap->heap->allocate(bytes, heapd::kArrayAlign);
    if (!memory.ok()) return Fail(memory.status(), static_cast<void*>(nullptr));
    std::memset(*memory, 0, bytes);
    const absl::Status bound = heap->heap->Bind(name, *memory, bytes, heapd::ArrayTypeName(*info));
    if (bound.ok()) return *memory;
    (void)heap->heap->deallocate(*memory);
    if (bound.code() != absl::StatusCode::kAlreadyExists) {
      return Fail(bound, static_cast<void*>(nullptr));
    }
  }
  return Fail(absl::UnavailableError(absl::StrCat("array '", name, "' in heap ", heap->heap->name(),
                                                  " was made and removed while this call ran")),
              static_cast<void*>(nullptr));
} catch (const std::exception& e) {
  return heapd::Fail(absl::ResourceExhaustedError(absl::StrCat("heapd: ", e.what())),
                     static_cast<void*>(nullptr));
}

}  // extern "C"
