// heapd::Heap: one attached heap in this process — mapped at a reserved
// address range, growing in place, with allocation, named objects and sync.
// A Heap comes from heapd::Client::Attach (heapd/client.h).
//
// Allocation: small objects (up to 1 MiB) come from chunks this process
// leases from heapd in batches, carved by each thread on its own: allocate
// and deallocate make no system call and no RPC. Large objects come from
// chunks heapd reserves for the session in batches; the largest are one
// call each. Freeing an object another process allocated goes to heapd in
// batches, which validates it.
//
// Consistency: allocations, frees and names become persistent at sync(),
// detach() or (for a bound object) construct(); after a crash the heap
// opens at the last sync. Object contents are written in place; on a heap
// with content_rollback() they too go back to this process's last sync if
// it dies (the first store to a page after a sync costs one fault);
// elsewhere they stay as they were last written (docs/consistency.md).
//
// Thread-safe, except that nothing may run concurrently with detach() or
// the destructor. A read-only heap is mapped PROT_READ: allocation fails and
// a stray store faults.
//
// Every process maps the heap at its own address: link objects with offset
// pointers (boost::interprocess::offset_ptr, as heapd::allocator does) or
// offset_of() / at(). A fixed-address heap (AttachOptions::fixed_address)
// is mapped at one address in every process, and objects may hold plain
// pointers (heapd::raw_allocator). Objects that other processes allocate
// after this one mapped the heap are mapped on first touch.
#ifndef HEAPD_HEAPD_HEAP_H_
#define HEAPD_HEAPD_HEAP_H_

#include <cstdint>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "heapd/type_name.h"

namespace heapd {

// Lives in private memory just before the mapped heap, at the same distance
// from every object in every process: a heapd::allocator stored in the heap
// reaches its process's Heap through it with an offset pointer.
struct ProcessHeader {
  static constexpr uint64_t kMagic = 0x6865617064504831;  // "heapdPH1"
  uint64_t magic;
  class Heap* heap;
};
inline constexpr uint64_t kProcessHeaderBytes = 4096;

class Heap {
 public:
  virtual ~Heap();  // detaches if detach() was not called; errors go to stderr
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Allocates `size` bytes aligned to `align` (a power of two up to 4096).
  // RESOURCE_EXHAUSTED when the heap or its file system is full,
  // FAILED_PRECONDITION on a read-only heap.
  absl::StatusOr<void*> allocate(uint64_t size, uint64_t align = 8);

  // Frees the object at `p`. INVALID_ARGUMENT if `p` is not in the heap or
  // (for objects of this thread) not a live object. Frees of other threads'
  // objects are applied by that thread or the next sync(), and frees of
  // other processes' objects are validated by the daemon when their batch
  // is sent: their errors are returned by that call or by sync().
  // `size_hint` (0: unknown) lets objects above 1 MiB go to the daemon at
  // once.
  absl::Status deallocate(void* p, uint64_t size_hint = 0);

  // construct<T>(name)(args...): allocates a T, constructs it and binds
  // `name` to it. ALREADY_EXISTS if the name is taken (nothing is left
  // allocated).
  template <typename T>
  class Constructor {
   public:
    template <typename... Args>
    absl::StatusOr<T*> operator()(Args&&... args) {
      absl::StatusOr<void*> memory = heap_->allocate(sizeof(T), alignof(T));
      if (!memory.ok()) return memory.status();
      T* object;
      try {
        object = new (*memory) T(std::forward<Args>(args)...);
      } catch (...) {
        (void)heap_->deallocate(*memory, sizeof(T));
        throw;
      }
      absl::Status bound = heap_->Bind(name_, object, sizeof(T), TypeName<T>());
      if (!bound.ok()) {
        object->~T();
        (void)heap_->deallocate(object, sizeof(T));
        return bound;
      }
      return object;
    }

   private:
    friend class Heap;
    Constructor(Heap* heap, std::string name) : heap_(heap), name_(std::move(name)) {}
    Heap* heap_;
    std::string name_;
  };
  template <typename T>
  Constructor<T> construct(std::string name) {
    return Constructor<T>(this, std::move(name));
  }

  // Binds `name` to `object`, a T in this heap made by allocate() and
  // placement new: for a structure built first and named last, so that a
  // failure while building leaves no name bound to half of it.
  // ALREADY_EXISTS if the name is taken.
  template <typename T>
  absl::Status bind(const std::string& name, const T* object) {
    return Bind(name, object, sizeof(T), TypeName<T>());
  }

  // The T bound to `name`. NOT_FOUND if unbound; FAILED_PRECONDITION if the
  // name binds another type.
  template <typename T>
  absl::StatusOr<T*> find(const std::string& name) {
    absl::StatusOr<void*> object = Find(name, TypeName<T>(), sizeof(T));
    if (!object.ok()) return object.status();
    return static_cast<T*>(*object);
  }

  // Unbinds `name`, destroys the T it bound and frees it. FAILED_PRECONDITION
  // (and nothing unbound) if the name binds another type.
  template <typename T>
  absl::Status destroy(const std::string& name) {
    if (absl::Status s = find<T>(name).status(); !s.ok()) return s;
    // What the unbind took, not what find saw: another process may have
    // rebound the name in between.
    absl::StatusOr<Named> removed = Remove(name);
    if (!removed.ok()) return removed.status();
    if (removed->type_name != TypeName<T>()) {
      return absl::FailedPreconditionError("name '" + name + "' was rebound to a " +
                                           removed->type_name + " meanwhile; unbound, not freed");
    }
    static_cast<T*>(removed->object)->~T();
    return deallocate(removed->object, removed->size);
  }

  // Makes this process's allocations, frees and object contents persistent;
  // returns the heap's new epoch. Concurrent calls run one after the other.
  absl::StatusOr<uint64_t> sync();

  // Syncs, returns every leased chunk and ends the session. The heap's
  // memory is unmapped: no pointer into it may be used afterwards.
  absl::Status detach();

  // Offsets and addresses in this process's mapping.
  char* base() const { return base_; }
  uint64_t offset_of(const void* p) const {
    return static_cast<uint64_t>(static_cast<const char*>(p) - base());
  }
  template <typename T = void>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(base() + offset);
  }

  const std::string& name() const;
  bool read_only() const;
  // Object contents go back to the last sync after a crash; when false,
  // content_rollback_note() says why not (heapd decides, per heap).
  bool content_rollback() const;
  const std::string& content_rollback_note() const;
  // With content_rollback(): true once heapd ended this session (it died or
  // reclaimed it) and the mapping was fenced; later stores stay in this
  // process and never reach the heap.
  bool fenced() const;
  // Takes the pre-images of the pages of [p, p + size) now: needed before a
  // system call writes there (read(2) into a heap buffer) when the kernel
  // lets this process track user-mode stores only.
  void prepare_write(void* p, uint64_t size);
  uint64_t session() const;
  uint64_t max_size() const;
  // A fixed-address heap: base() is the same in every process, so objects
  // may hold plain pointers into the heap (heapd/raw_allocator.h).
  bool fixed_address() const;
  ProcessHeader* process_header() const {
    return reinterpret_cast<ProcessHeader*>(base() - kProcessHeaderBytes);
  }

  // Names without a C++ type: what a name binds, whatever its type name.
  struct Named {
    void* object = nullptr;
    uint64_t size = 0;
    std::string type_name;
  };
  // NOT_FOUND if `name` is unbound.
  absl::StatusOr<Named> Lookup(const std::string& name);
  // Unbinds `name`; NOT_FOUND if unbound.
  absl::Status Unbind(const std::string& name);
  // Unbinds `name` and returns what it bound (the object stays allocated,
  // for the caller to free: the very object the name bound at the unbind).
  absl::StatusOr<Named> Remove(const std::string& name);
  // Binds `name` to the `size`-byte object at `object` of type `type_name`.
  absl::Status Bind(const std::string& name, const void* object, uint64_t size,
                    const std::string& type_name);
  // The object bound to `name`, checked to be a `type_name` of `size` bytes.
  absl::StatusOr<void*> Find(const std::string& name, const std::string& type_name, uint64_t size);

 protected:
  Heap() = default;
  char* base_ = nullptr;  // set by the implementation once the heap is mapped
};

}  // namespace heapd

#endif  // HEAPD_HEAPD_HEAP_H_
