/* heapd._heapd: the C extension under the heapd package, over libheapd's C
 * API (heapd/heapd.h). Two types:
 *   Handle   an attached heap (heapd_heap*), with the calls heapd/__init__.py
 *            builds the Python API from;
 *   Mapping  the bytes of one array, as a buffer (read-only when the heap
 *            is attached read-only: no numpy flag can make it writable). It
 *            holds its Handle, and a Handle closed while Mappings live
 *            stays attached until the last one goes: no view outlives its
 *            mapping.
 * Errors are heapd.HeapdError (an OSError: errno by heapd/heapd.h's table,
 * `code` the status code's name). Calls that may wait for heapd release the
 * GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>

#include "heapd/heapd.h"

static PyObject* HeapdError;

/* Text from heapd, which may quote names other processes chose (any
 * bytes): decoded without failing. */
static PyObject* Text(const char* text) {
  return PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "surrogateescape");
}

/* Raises HeapdError from this thread's heapd_last_error() and errno. */
static PyObject* RaiseLast(void) {
  const int error_number = errno != 0 ? errno : EIO;
  const char* said = heapd_last_error();
  const char* colon = strstr(said, ": ");
  PyObject* code = colon != NULL ? PyUnicode_FromStringAndSize(said, colon - said)
                                 : PyUnicode_FromString("UNKNOWN");
  PyObject* message = PyUnicode_DecodeUTF8(said, (Py_ssize_t)strlen(said), "replace");
  PyObject* error =
      message == NULL ? NULL : PyObject_CallFunction(HeapdError, "iO", error_number, message);
  Py_XDECREF(message);
  if (error != NULL && code != NULL) {
    PyObject_SetAttrString(error, "code", code);
    PyErr_SetObject(HeapdError, error);
  }
  Py_XDECREF(code);
  Py_XDECREF(error);
  return NULL;
}

typedef struct Handle {
  PyObject_HEAD heapd_heap* heap; /* NULL once detached */
  int read_only;
  int closed;          /* close() was called: no new calls */
  Py_ssize_t mappings; /* Mappings alive that point into the heap */
  Py_ssize_t busy;     /* calls under way without the GIL */
  /* Every Handle of this process, for a forked child (ForkedChildAll). */
  struct Handle* previous;
  struct Handle* next;
} Handle;

static Handle* handles; /* the list's head; changed under the GIL */

typedef struct {
  PyObject_HEAD Handle* owner; /* a reference: keeps the heap attached */
  void* memory;
  Py_ssize_t bytes;
} Mapping;

static PyTypeObject HandleType;
static PyTypeObject MappingType;

/* Detaches once closed, no Mapping points into the heap and no call is
 * under way. */
static int DetachIfDone(Handle* self) {
  if (self->heap == NULL || !self->closed || self->mappings != 0 || self->busy != 0) return 0;
  heapd_heap* heap = self->heap;
  self->heap = NULL;
  int rc;
  PyThreadState* unlocked = PyEval_SaveThread();
  rc = heapd_detach(heap);
  PyEval_RestoreThread(unlocked);
  return rc;
}

static int Usable(Handle* self) {
  if (self->heap != NULL && !self->closed) return 1;
  PyErr_SetString(PyExc_ValueError, "the heap is closed");
  return 0;
}

/* Detaches as DetachIfDone, where no exception can go: a failure is
 * reported as unraisable, and an exception already set is kept. */
static void DetachQuietly(Handle* self, PyObject* context) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (DetachIfDone(self) != 0) {
    RaiseLast();
    PyErr_WriteUnraisable(context);
  }
  PyErr_Restore(type, value, traceback);
}

/* A call that lets go of the GIL: Enter (the heap, or NULL with an
 * exception set), the call, Leave. A close() meanwhile waits for Leave. */
static heapd_heap* Enter(Handle* self) {
  if (!Usable(self)) return NULL;
  self->busy++;
  return self->heap;
}

static void Leave(Handle* self) {
  self->busy--;
  DetachQuietly(self, (PyObject*)self);
}

/* ---- Mapping ---------------------------------------------------------- */

static int MappingGetBuffer(Mapping* self, Py_buffer* view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject*)self, self->memory, self->bytes, self->owner->read_only,
                           flags);
}

static void MappingDealloc(Mapping* self) {
  Handle* owner = self->owner;
  owner->mappings--;
  DetachQuietly(owner, (PyObject*)self);
  Py_DECREF(owner);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyBufferProcs MappingBuffer = {(getbufferproc)MappingGetBuffer, NULL};

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "heapd._heapd.Mapping",
    .tp_basicsize = sizeof(Mapping),
    .tp_dealloc = (destructor)MappingDealloc,
    .tp_as_buffer = &MappingBuffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The bytes of one array in a heap, as a buffer.",
};

static PyObject* NewMapping(Handle* owner, void* memory, uint64_t bytes) {
  Mapping* mapping = PyObject_New(Mapping, &MappingType);
  if (mapping == NULL) return NULL;
  Py_INCREF(owner);
  owner->mappings++;
  mapping->owner = owner;
  mapping->memory = memory;
  mapping->bytes = (Py_ssize_t)bytes;
  return (PyObject*)mapping;
}

/* ---- Handle ----------------------------------------------------------- */

static void HandleDealloc(Handle* self) {
  self->closed = 1;
  DetachQuietly(self, (PyObject*)self);
  if (self->previous != NULL) self->previous->next = self->next;
  if (self->next != NULL) self->next->previous = self->previous;
  if (handles == self) handles = self->next;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* (Mapping, dtype, fortran_order, shape) of an array found or made. */
static PyObject* ArrayResult(Handle* self, void* memory, const heapd_array_info* info) {
  uint64_t bytes = heapd_dtype_size(info->dtype);
  PyObject* shape = PyTuple_New(info->rank);
  if (shape == NULL) return NULL;
  for (int i = 0; i < info->rank; ++i) {
    bytes *= info->shape[i];
    PyTuple_SET_ITEM(shape, i, PyLong_FromUnsignedLongLong(info->shape[i]));
  }
  PyObject* mapping = NewMapping(self, memory, bytes);
  if (mapping == NULL) {
    Py_DECREF(shape);
    return NULL;
  }
  return Py_BuildValue("(NiiN)", mapping, (int)info->dtype, info->fortran_order, shape);
}

static PyObject* HandleArray(Handle* self, PyObject* args) {
  const char* name;
  int dtype, fortran_order, create;
  PyObject* shape;
  if (!PyArg_ParseTuple(args, "siO!pp", &name, &dtype, &PyTuple_Type, &shape, &fortran_order,
                        &create)) {
    return NULL;
  }
  heapd_array_info info;
  memset(&info, 0, sizeof(info));
  info.dtype = dtype;
  info.fortran_order = fortran_order;
  info.rank = (int)PyTuple_GET_SIZE(shape);
  if (info.rank < 1 || info.rank > HEAPD_MAX_RANK) {
    return PyErr_Format(PyExc_ValueError, "an array has 1 to %d dimensions, not %d", HEAPD_MAX_RANK,
                        info.rank);
  }
  for (int i = 0; i < info.rank; ++i) {
    info.shape[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape, i));
    if (PyErr_Occurred()) return NULL;
  }
  heapd_heap* heap = Enter(self);
  if (heap == NULL) return NULL;
  PyThreadState* unlocked = PyEval_SaveThread();
  void* memory = heapd_array(heap, name, &info, create);
  PyEval_RestoreThread(unlocked);
  PyObject* result = memory == NULL ? RaiseLast() : ArrayResult(self, memory, &info);
  Leave(self);
  return result;
}

static PyObject* HandleFindArray(Handle* self, PyObject* args) {
  const char* name;
  if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
  heapd_heap* heap = Enter(self);
  if (heap == NULL) return NULL;
  heapd_array_info info;
  PyThreadState* unlocked = PyEval_SaveThread();
  void* memory = heapd_find_array(heap, name, &info);
  PyEval_RestoreThread(unlocked);
  PyObject* result = memory == NULL ? RaiseLast() : ArrayResult(self, memory, &info);
  Leave(self);
  return result;
}

/* Runs `call(heap)` without the GIL; None, or the error it reports. */
static PyObject* Call(Handle* self, int (*call)(heapd_heap*)) {
  heapd_heap* heap = Enter(self);
  if (heap == NULL) return NULL;
  PyThreadState* unlocked = PyEval_SaveThread();
  const int rc = call(heap);
  PyEval_RestoreThread(unlocked);
  PyObject* result = rc != 0 ? RaiseLast() : Py_NewRef(Py_None);
  Leave(self);
  return result;
}

static PyObject* HandleNamedFree(Handle* self, PyObject* args) {
  const char* name;
  if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
  heapd_heap* heap = Enter(self);
  if (heap == NULL) return NULL;
  PyThreadState* unlocked = PyEval_SaveThread();
  const int rc = heapd_named_free(heap, name);
  PyEval_RestoreThread(unlocked);
  PyObject* result = rc != 0 ? RaiseLast() : Py_NewRef(Py_None);
  Leave(self);
  return result;
}

static void AddName(const char* name, uint64_t size, const char* type_name, void* arg) {
  if (PyErr_Occurred()) return; /* an earlier entry failed: the call fails */
  PyObject* entry = Py_BuildValue("(NKN)", Text(name), (unsigned long long)size, Text(type_name));
  if (entry != NULL) {
    PyList_Append((PyObject*)arg, entry);
    Py_DECREF(entry);
  }
}

static PyObject* HandleNames(Handle* self, PyObject* args) {
  const char* prefix = NULL;
  if (!PyArg_ParseTuple(args, "|z", &prefix) || !Usable(self)) return NULL;
  PyObject* names = PyList_New(0);
  if (names == NULL) return NULL;
  /* The list grows under the GIL: kept through the call (a listing is
   * short), so no close() can run meanwhile. */
  if (heapd_list_names(self->heap, prefix, AddName, names) < 0) {
    Py_DECREF(names);
    return RaiseLast();
  }
  if (PyErr_Occurred()) {
    Py_DECREF(names);
    return NULL;
  }
  return names;
}

static PyObject* HandleSync(Handle* self, PyObject* unused) { return Call(self, heapd_sync); }

static PyObject* HandleStats(Handle* self, PyObject* unused) {
  heapd_heap* heap = Enter(self);
  if (heap == NULL) return NULL;
  heapd_heap_stats stats;
  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  PyThreadState* unlocked = PyEval_SaveThread();
  const int rc = heapd_stats(heap, &stats);
  PyEval_RestoreThread(unlocked);
  Leave(self);
  if (rc != 0) return RaiseLast();
  return Py_BuildValue("{sKsKsKsKsKsKsIsOsK}", "max_size", (unsigned long long)stats.max_size,
                       "reserved_bytes", (unsigned long long)stats.reserved_bytes,
                       "allocated_bytes", (unsigned long long)stats.allocated_bytes, "live_objects",
                       (unsigned long long)stats.live_objects, "names",
                       (unsigned long long)stats.names, "epoch", (unsigned long long)stats.epoch,
                       "clients", (unsigned int)stats.clients, "content_rollback",
                       stats.content_rollback ? Py_True : Py_False, "fixed_address",
                       (unsigned long long)stats.fixed_address);
}

/* Syncs (unless read-only) and closes; the detach waits for the Mappings. */
static PyObject* HandleClose(Handle* self, PyObject* unused) {
  if (self->heap == NULL || self->closed) Py_RETURN_NONE;
  if (!self->read_only) {
    PyObject* synced = Call(self, heapd_sync);
    if (synced == NULL) return NULL;
    Py_DECREF(synced);
  }
  self->closed = 1;
  if (DetachIfDone(self) != 0) return RaiseLast();
  Py_RETURN_NONE;
}

/* In a forked child, for every Handle the parent had (os.register_at_fork
 * calls it): each keeps its mapping as the child's own copy and lets go of
 * the parent's session (heapd_forked_child). */
static PyObject* ForkedChildAll(PyObject* module, PyObject* unused) {
  for (Handle* handle = handles; handle != NULL; handle = handle->next) {
    if (handle->heap != NULL) (void)heapd_forked_child(handle->heap);
    handle->closed = 1;
    handle->busy = 0; /* the parent's threads' calls are not this process's */
  }
  Py_RETURN_NONE;
}

static PyObject* HandleClosed(Handle* self, void* unused) {
  return PyBool_FromLong(self->heap == NULL || self->closed);
}

static PyMethodDef HandleMethods[] = {
    {"array", (PyCFunction)HandleArray, METH_VARARGS,
     "array(name, dtype, shape, fortran_order, create) -> (mapping, dtype, fortran, shape)"},
    {"find_array", (PyCFunction)HandleFindArray, METH_VARARGS,
     "find_array(name) -> (mapping, dtype, fortran, shape)"},
    {"named_free", (PyCFunction)HandleNamedFree, METH_VARARGS, "unbinds name and frees it"},
    {"names", (PyCFunction)HandleNames, METH_VARARGS, "[(name, size, type_name)]"},
    {"sync", (PyCFunction)HandleSync, METH_NOARGS, "makes the heap's state persistent"},
    {"stats", (PyCFunction)HandleStats, METH_NOARGS, "the heap's usage"},
    {"close", (PyCFunction)HandleClose, METH_NOARGS, "syncs and detaches (once arrays are gone)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef HandleGetSet[] = {{"closed", (getter)HandleClosed, NULL, NULL, NULL},
                                     {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "heapd._heapd.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_dealloc = (destructor)HandleDealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An attached heap.",
    .tp_methods = HandleMethods,
    .tp_getset = HandleGetSet,
};

/* attach(name, create, max_size, read_only, socket, mode, image, storage, fixed_address)
 * -> Handle */
static PyObject* Attach(PyObject* module, PyObject* args) {
  const char* name;
  int create, read_only;
  unsigned long long max_size;
  const char* socket = NULL;
  const char* storage = NULL;
  unsigned int mode, image;
  int fixed_address;
  if (!PyArg_ParseTuple(args, "spKpzIIzp", &name, &create, &max_size, &read_only, &socket, &mode,
                        &image, &storage, &fixed_address)) {
    return NULL;
  }
  heapd_attach_options options;
  heapd_attach_options_init(&options);
  options.create_if_missing = create;
  options.read_only = read_only;
  options.max_size = max_size;
  options.mode = mode;
  options.image = image;
  options.socket = socket;
  options.storage = storage;
  options.fixed_address = fixed_address;
  heapd_heap* heap;
  PyThreadState* unlocked = PyEval_SaveThread();
  heap = heapd_attach(name, &options);
  PyEval_RestoreThread(unlocked);
  if (heap == NULL) return RaiseLast();
  Handle* handle = PyObject_New(Handle, &HandleType);
  if (handle == NULL) {
    heapd_detach(heap);
    return NULL;
  }
  handle->heap = heap;
  handle->read_only = read_only;
  handle->closed = 0;
  handle->mappings = 0;
  handle->busy = 0;
  handle->previous = NULL;
  handle->next = handles;
  if (handles != NULL) handles->previous = handle;
  handles = handle;
  return (PyObject*)handle;
}

static PyMethodDef ModuleMethods[] = {
    {"attach", Attach, METH_VARARGS, "attach(name, create, max_size, read_only, socket, mode)"},
    {"forked_child_all", ForkedChildAll, METH_NOARGS,
     "in a forked child: every heap kept as the child's own copy, the parent's sessions let go"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef Module = {PyModuleDef_HEAD_INIT, "heapd._heapd",
                                    "heapd's C API for the heapd package.", -1, ModuleMethods};

PyMODINIT_FUNC PyInit__heapd(void) {
  if (PyType_Ready(&HandleType) < 0 || PyType_Ready(&MappingType) < 0) return NULL;
  PyObject* module = PyModule_Create(&Module);
  if (module == NULL) return NULL;
  HeapdError = PyErr_NewExceptionWithDoc(
      "heapd.HeapdError",
      "An error heapd reported: an OSError whose errno follows heapd/heapd.h's table and whose "
      "`code` is the status code's name (NOT_FOUND, RESOURCE_EXHAUSTED, ...).",
      PyExc_OSError, NULL);
  if (HeapdError == NULL || PyModule_AddObject(module, "HeapdError", HeapdError) < 0 ||
      PyModule_AddStringConstant(module, "version", heapd_version()) < 0) {
    Py_DECREF(module);
    return NULL;
  }
  Py_INCREF(HeapdError);
  return module;
}
