"""heapd for Python: named, persistent numpy arrays in a heap that heapd
serves, shared writable and without a copy by every process attached,
and back to their last sync after a crash.

    import heapd, numpy as np
    with heapd.attach("fields", create=True) as heap:
        u = heap.array("u", (100, 200), np.float64)   # made zero-filled, or found
        u[:, 0] = 1.0
        heap.sync()                                   # a crash goes back to here
    # later, any process:
    with heapd.attach("fields", read_only=True) as heap:
        print(heap["u"].sum())

Arrays are numpy arrays over the heap's shared mapping. Each carries a
record of its element type, shape and order that C (heapd_array) and
Fortran (module heapd) share: an array made by one is found by the others
as it is. An array keeps its heap attached while it lives: close() (or
leaving the `with`) syncs at once and detaches when the last array goes.

From a read-only attach, arrays sit on a read-only buffer: no flag change
makes them writable. Arrays export DLPack (numpy's __dlpack__), so torch
and jax take them without a copy (writable ones: DLPack cannot say
read-only).

Processes: a child made with fork inherits the parent's arrays as its own
copy (it reads the heap, its writes stay in the child; the session is the
parent's); to share writes, attach the heap in the child, as a child made
with spawn must.

Errors are HeapdError, an OSError whose `code` names heapd's status
(NOT_FOUND, RESOURCE_EXHAUSTED, PERMISSION_DENIED, ...); heap[name] of a
missing name is a KeyError.
"""

import os

import numpy as np

from . import _heapd
from ._heapd import HeapdError

__all__ = ["attach", "Heap", "HeapdError"]
__version__ = _heapd.version

# heapd_dtype of heapd/heapd.h, by numpy type.
_DTYPE_CODES = {
    np.dtype(np.int8): 1,
    np.dtype(np.int16): 2,
    np.dtype(np.int32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint8): 5,
    np.dtype(np.uint16): 6,
    np.dtype(np.uint32): 7,
    np.dtype(np.uint64): 8,
    np.dtype(np.float32): 9,
    np.dtype(np.float64): 10,
    np.dtype(np.complex64): 11,
    np.dtype(np.complex128): 12,
}
_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}

# A forked child keeps every heap its parent had (arrays included, whether
# or not their Heap object lives) as its own copy, and lets go of the
# parent's sessions (heapd/heapd.h, heapd_forked_child).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_heapd.forked_child_all)


def _parse_size(max_size):
    """Bytes from an int or a string with a unit ("64G" = 64 x 2**30)."""
    if max_size is None:
        return 0
    if isinstance(max_size, int):
        if max_size <= 0:
            raise ValueError(f"max_size {max_size}: a heap needs a positive size")
        return max_size
    text = str(max_size).strip().upper()
    units = {"K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
    number, unit = text.rstrip("KMGTPIB"), text[len(text.rstrip("KMGTPIB")):]
    if unit.endswith("IB"):
        unit = unit[:-2]
    elif unit == "B":
        unit = ""
    if not number.isdigit() or (unit and unit not in units):
        raise ValueError(f"max_size {max_size!r}: bytes, or with a unit K, M, G, T, P (64G)")
    return int(number) << units.get(unit, 0)


_IMAGES = {None: 0, "direct": 1, "working": 2}


def attach(name, create=False, max_size=None, read_only=False, socket=None, mode=0, image=None,
           storage=None, fixed_address=False):
    """Attaches heap `name` and maps it: a Heap, to use as a context manager.

    create: make the heap if there is none (max_size: bytes or "64G", else
    heapd's default; mode: its permission bits, else 0o600; image: what its
    clients map, "working" (a working image in memory: the data file
    changes only at syncs) or "direct" (the data file), else heapd's
    choice; storage: the tier to make it on, as heapd's --storage names it,
    else heapd's default). fixed_address: a heap every process maps at one
    address (made as one with create; HeapdError FAILED_PRECONDITION if it
    is not one), for C, C++ and Fortran structures that hold plain
    pointers. socket: heapd's socket, else $HEAPD_SOCKET or heapd's
    default.
    """
    if image not in _IMAGES:
        raise ValueError(f"image {image!r}: 'working', 'direct' or None (heapd's choice)")
    handle = _heapd.attach(name, bool(create), _parse_size(max_size), bool(read_only), socket,
                           int(mode), _IMAGES[image], storage, bool(fixed_address))
    return Heap(handle, name, bool(read_only))


class Heap:
    """An attached heap: named arrays, sync, close (see the module's doc)."""

    def __init__(self, handle, name, read_only):
        self._handle = handle
        self._name = name
        self._read_only = read_only

    @property
    def name(self):
        return self._name

    @property
    def read_only(self):
        return self._read_only

    @property
    def closed(self):
        return self._handle.closed

    def _view(self, found):
        mapping, code, fortran_order, shape = found
        flat = np.frombuffer(mapping, dtype=_DTYPES[code])
        return flat.reshape(shape, order="F" if fortran_order else "C")

    def array(self, name, shape, dtype=np.float64, order="C"):
        """The array `name`: made zero-filled with this shape, type and order
        ('C' or 'F') if the heap has none, else found, and then it must have
        them (HeapdError FAILED_PRECONDITION otherwise)."""
        dtype = np.dtype(dtype)
        if dtype not in _DTYPE_CODES:
            raise TypeError(f"heapd arrays hold {', '.join(str(t) for t in _DTYPE_CODES)}; "
                            f"not {dtype}")
        if order not in ("C", "F"):
            raise ValueError(f"order {order!r}: 'C' or 'F'")
        shape = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
        create = not self._read_only
        return self._view(self._handle.array(name, _DTYPE_CODES[dtype], shape, order == "F",
                                             create))

    def __getitem__(self, name):
        try:
            return self._view(self._handle.find_array(name))
        except HeapdError as error:
            if error.code == "NOT_FOUND":
                raise KeyError(name) from error
            raise

    def __delitem__(self, name):
        try:
            self._handle.named_free(name)
        except HeapdError as error:
            if error.code == "NOT_FOUND":
                raise KeyError(name) from error
            raise

    def __contains__(self, name):
        return any(entry[0] == name for entry in self._handle.names(name))

    def names(self, prefix=None):
        """The names bound in the heap (arrays and other objects), sorted."""
        return [entry[0] for entry in self._handle.names(prefix)]

    def sync(self):
        """Makes the heap's state persistent: after a crash, arrays read as now."""
        self._handle.sync()

    def stats(self):
        """The heap's usage: max_size, reserved_bytes, allocated_bytes,
        live_objects, names, epoch, clients, content_rollback, fixed_address
        (where every process maps it; 0: not a fixed-address heap)."""
        return self._handle.stats()

    def close(self):
        """Syncs (unless read-only); detaches once no array of it is alive."""
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else ("read-only" if self._read_only else "read-write")
        return f"<heapd.Heap {self._name!r} {state}>"
