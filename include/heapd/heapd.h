/* heapd's C API: persistent heaps shared by the processes of a node,
 * served by heapd (docs/api.md, "C API"). Shaped like Metall's C API.
 *
 *   #include <heapd/heapd.h>
 *   heapd_attach_options options;
 *   heapd_attach_options_init(&options);
 *   options.create_if_missing = 1;
 *   heapd_heap* heap = heapd_attach("fields", &options);
 *   if (heap == NULL) { fprintf(stderr, "%s\n", heapd_last_error()); exit(1); }
 *   double* u = heapd_named_malloc(heap, "u", n * sizeof(double));
 *   ...
 *   heapd_sync(heap);     // a persistent epoch: a crash goes back to here
 *   heapd_detach(heap);
 *
 * Link with -lheapd (pkg-config heapd, or CMake's heapd::heapd).
 *
 * Errors: a function that fails returns NULL (pointers), -1 (int) or
 * UINT64_MAX (offsets), sets errno and records heapd_last_error() for the
 * calling thread. errno by heapd's status code:
 *   INVALID_ARGUMENT EINVAL   NOT_FOUND ENOENT      ALREADY_EXISTS EEXIST
 *   RESOURCE_EXHAUSTED ENOMEM (the heap or its file system is full)
 *   PERMISSION_DENIED EACCES  FAILED_PRECONDITION EPERM (wrong state: a
 *   read-only heap, a name of another type or shape)  UNAVAILABLE
 *   ECONNREFUSED (no heapd)  DEADLINE_EXCEEDED ETIMEDOUT  anything else EIO.
 *
 * Thread-safe like the C++ client: any thread may use a heap, except that
 * nothing may run concurrently with heapd_detach. heapd_malloc and
 * heapd_free take no lock and make no call to heapd on their fast path.
 *
 * Pointers are this process's: each process maps a heap at its own
 * address. Link objects with links (heapd_offset / heapd_pointer): the same
 * number in every process, 0 for NULL.
 */
#ifndef HEAPD_HEAPD_HEAPD_H_
#define HEAPD_HEAPD_HEAPD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HEAPD_VERSION_MAJOR 0
#define HEAPD_VERSION_MINOR 4
#define HEAPD_VERSION_PATCH 0

/* "0.4.0": the release of the library this process runs with. */
const char* heapd_version(void);

typedef struct heapd_heap heapd_heap;

/* Options of heapd_attach. Fill with heapd_attach_options_init, then set
 * what differs: fields added in later releases come after these, and the
 * library reads only as much of the struct as `struct_size` says. */
typedef struct heapd_attach_options {
  size_t struct_size;    /* sizeof(heapd_attach_options), set by init */
  const char* socket;    /* heapd's socket; NULL: $HEAPD_SOCKET or heapd's default */
  int create_if_missing; /* create the heap if there is none of that name */
  int read_only;         /* map it read-only: allocation fails, stores fault */
  uint64_t max_size;     /* bytes, when creating; 0: heapd's default */
  uint32_t mode;         /* permission bits, when creating; 0: 0600 */
  /* What its clients map, when creating: HEAPD_IMAGE_DEFAULT (heapd's
   * choice: a working image on a file system), HEAPD_IMAGE_DIRECT (the data
   * file) or HEAPD_IMAGE_WORKING (docs/consistency.md, "Durable images"). */
  uint32_t image;
  /* The storage tier to make it on, when creating, as heapd's --storage
   * names them ("nvme"); NULL: heapd's default. */
  const char* storage;
  /* 1: a fixed-address heap (made as one when creating; one that is not
   * fails): every process maps it at one address, so objects in it may
   * hold plain pointers to each other (docs/api.md, "Fixed-address
   * heaps"). */
  int fixed_address;
} heapd_attach_options;

enum {
  HEAPD_IMAGE_DEFAULT = 0,
  HEAPD_IMAGE_DIRECT = 1,
  HEAPD_IMAGE_WORKING = 2,
};

/* Fills `options` with the defaults. A macro: it passes the size of the
 * struct the caller was built with, so a newer library never writes past
 * an older caller's struct. */
#define heapd_attach_options_init(options) \
  heapd_attach_options_init_sized((options), sizeof(*(options)))
void heapd_attach_options_init_sized(heapd_attach_options* options, size_t size);

/* Attaches heap `name` (NULL options: the default socket, read-write, no
 * create) and maps it. NULL on failure. */
heapd_heap* heapd_attach(const char* name, const heapd_attach_options* options);

/* Syncs, returns this process's leases and ends the session; frees
 * `heap` even when it fails (then the session ends at its last sync). Every
 * pointer into the heap is invalid afterwards. */
int heapd_detach(heapd_heap* heap);

/* Call in a child process after fork() for each heap it inherited: the
 * session belongs to the parent, so the child keeps the heap as its own
 * copy-on-write view (what it reads is the heap, what it writes stays in the
 * child) and lets go of the parent's session (heapd sees the parent's end
 * when it comes). Every call on `heap` but heapd_offset, heapd_pointer and
 * heapd_detach (which then only forgets it; a fixed-address heap's mapping
 * it also unmaps) fails with EPERM afterwards — as it does in a child that
 * did not call this, whose inherited mapping is then left as it is (on a
 * heap with content rollback: absent) until the child attaches that
 * fixed-address heap itself. To share writes, attach the heap in the
 * child: a fixed-address heap kept here only once this copy is detached. */
int heapd_forked_child(heapd_heap* heap);

/* `size` bytes aligned to 16 (as malloc's), uninitialized; NULL when the
 * heap is full (ENOMEM), read-only (EPERM), or `size` is above its maximum
 * size (EINVAL). size 0 gives a unique object (but heapd_named_malloc of 0
 * bytes is EINVAL: a name binds at least a byte). */
void* heapd_malloc(heapd_heap* heap, size_t size);

/* Frees what heapd_malloc gave. NULL is a no-op. A pointer outside the heap
 * fails at once (EINVAL); a double free of another thread's or process's
 * object is reported by the next heapd_sync (EINVAL). */
int heapd_free(heapd_heap* heap, void* p);

/* Allocates `size` bytes (16-byte aligned, uninitialized) and binds `name`
 * to them, in one step: after it returns, the name survives a crash of this
 * process with the heap's next epoch. NULL with EEXIST if `name` is taken
 * (nothing stays allocated). */
void* heapd_named_malloc(heapd_heap* heap, const char* name, size_t size);

/* The object `name` binds, made by any language; its size in *size when
 * size is not NULL. NULL with ENOENT if the name is unbound. */
void* heapd_find(heapd_heap* heap, const char* name, size_t* size);

/* Unbinds `name` and frees its object. */
int heapd_named_free(heapd_heap* heap, const char* name);

/* Makes this process's allocations, frees, names and object contents
 * persistent: after a crash the heap reads as at the last sync. */
int heapd_sync(heapd_heap* heap);

/* The link of `p`: its offset in the heap plus one, the same in every
 * process; 0 for NULL; UINT64_MAX with EINVAL if `p` is outside the heap. */
uint64_t heapd_offset(heapd_heap* heap, const void* p);
/* The address of `link` in this process; NULL for 0 (the null link) and,
 * with EINVAL, for a link beyond the heap's maximum size. Links come from
 * heapd_offset; one another process wrote is trusted as far as that bound:
 * check what it points to before following it further. */
void* heapd_pointer(heapd_heap* heap, uint64_t link);

/* Calls each(name, size, type_name, arg) for every name bound in the heap
 * that starts with `prefix` (NULL: every name), in name order; returns how
 * many, or -1. type_name is the C++ type's, "heapd::bytes/v1" for objects
 * of heapd_named_malloc, or an array's record. */
typedef void (*heapd_name_visitor)(const char* name, uint64_t size, const char* type_name,
                                   void* arg);
int64_t heapd_list_names(heapd_heap* heap, const char* prefix, heapd_name_visitor each, void* arg);

/* The heap's usage, as heapd sees it now (heapctl heap stat). Set
 * struct_size to sizeof(heapd_heap_stats) first: later releases add fields
 * after these. */
typedef struct heapd_heap_stats {
  size_t struct_size;
  uint64_t max_size;        /* the most it may grow to */
  uint64_t reserved_bytes;  /* of its data file, reserved on disk */
  uint64_t allocated_bytes; /* in live objects */
  uint64_t live_objects;
  uint64_t names;
  uint64_t epoch;       /* its last persisted sync point */
  uint32_t clients;     /* sessions attached */
  int content_rollback; /* 1: contents go back to the last sync after a crash */
  /* Where every process maps a fixed-address heap; 0: each maps it where
   * it likes (link objects with heapd_offset and heapd_pointer). */
  uint64_t fixed_address;
} heapd_heap_stats;
int heapd_stats(heapd_heap* heap, heapd_heap_stats* stats);

/* What the last failed call of this thread said: "CODE: message" (e.g.
 * "RESOURCE_EXHAUSTED: heap h: ..."), or "" if none failed. Valid until
 * this thread's next heapd call. */
const char* heapd_last_error(void);

/* Named arrays: one record of element type, shape and order goes with the
 * name, shared by C, Fortran (module heapd) and Python (heapd.Heap.array):
 * an array one language makes, the others find with the same type, shape
 * and order. */
typedef enum heapd_dtype {
  HEAPD_INT8 = 1,
  HEAPD_INT16 = 2,
  HEAPD_INT32 = 3,
  HEAPD_INT64 = 4,
  HEAPD_UINT8 = 5,
  HEAPD_UINT16 = 6,
  HEAPD_UINT32 = 7,
  HEAPD_UINT64 = 8,
  HEAPD_FLOAT32 = 9,
  HEAPD_FLOAT64 = 10,
  HEAPD_COMPLEX64 = 11,
  HEAPD_COMPLEX128 = 12
} heapd_dtype;

#define HEAPD_MAX_RANK 8

typedef struct heapd_array_info {
  int dtype;         /* a heapd_dtype (an int: a wrong value is an error, not undefined) */
  int rank;          /* 1 .. HEAPD_MAX_RANK */
  int fortran_order; /* 1: column-major (Fortran's), 0: row-major (C's) */
  uint64_t shape[HEAPD_MAX_RANK];
} heapd_array_info;

/* The bytes of one element of `dtype`; 0 for no such type. */
size_t heapd_dtype_size(int dtype);

/* The array `name` binds if its record equals *info; else, with `create`,
 * a new zero-filled array of that record (64-byte aligned), bound to
 * `name`. Several processes may call it at once: one creates, the others
 * find. NULL with ENOENT (absent, no create), EPERM (another type, shape or
 * order, named in heapd_last_error), EINVAL (a bad record). */
void* heapd_array(heapd_heap* heap, const char* name, const heapd_array_info* info, int create);

/* The array `name` binds, its record in *info. NULL with ENOENT if unbound,
 * EPERM if the name binds something that is not an array. */
void* heapd_find_array(heapd_heap* heap, const char* name, heapd_array_info* info);

#ifdef __cplusplus
}
#endif

#endif /* HEAPD_HEAPD_HEAPD_H_ */
