"""heapd's Python package against a real heapd ($HEAPD_SOCKET; heapd's
state directory on tmpfs, so that contents roll back after a crash).
Run by tests/consumers_test.sh from an installed prefix."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import heapd

HEAP = "py-" + str(os.getpid())


@pytest.fixture
def heap():
    with heapd.attach(HEAP, create=True, max_size="256M") as h:
        yield h


def writer(heap, name, value, start, stop):
    """In another process: attach, write value into [start, stop), sync."""
    with heapd.attach(heap) as h:
        a = h[name]
        a[start:stop] = value
        h.sync()


def test_arrays_are_named_zero_filled_and_shared_across_processes(heap):
    a = heap.array("shared", 1000, np.int64)
    assert a.dtype == np.int64 and a.shape == (1000,) and not a.any()
    assert heap.array("shared", (1000,), np.int64) is not a  # found again: a new view
    context = multiprocessing.get_context("spawn")
    halves = [context.Process(target=writer, args=(HEAP, "shared", v, s, s + 500))
              for v, s in ((1, 0), (2, 500))]
    for p in halves:
        p.start()
    for p in halves:
        p.join(30)
        assert p.exitcode == 0
    # Two processes wrote one array; this one sees both, without a copy.
    assert (a[:500] == 1).all() and (a[500:] == 2).all()
    assert "shared" in heap and "shared" in heap.names()


def test_records_are_checked(heap):
    heap.array("grid", (3, 4), np.float32, order="F")
    found = heap["grid"]
    assert found.shape == (3, 4) and found.dtype == np.float32
    assert found.flags["F_CONTIGUOUS"]
    with pytest.raises(heapd.HeapdError) as mismatch:
        heap.array("grid", (4, 3), np.float32, order="F")
    assert mismatch.value.code == "FAILED_PRECONDITION"
    assert "float32[3,4]" in str(mismatch.value)
    with pytest.raises(KeyError):
        heap["nosuch"]
    with pytest.raises(TypeError):
        heap.array("strings", 3, np.str_)
    del heap["grid"]
    assert "grid" not in heap


def sync_then_die(heap, name):
    """Writes 1, syncs, writes 2, and dies without a sync (SIGKILL)."""
    h = heapd.attach(heap)
    a = h[name]
    a[:] = 1
    h.sync()
    a[:] = 2
    os.kill(os.getpid(), signal.SIGKILL)


def make_array(heap, name, size):
    with heapd.attach(heap) as h:
        h.array(name, size, np.uint8)


def test_a_crash_after_a_sync_rolls_contents_back(heap):
    if not heap.stats()["content_rollback"]:
        pytest.skip("this heap does not roll contents back (heapd's state is not on tmpfs)")
    # Made by another process that is gone, so that no live session here
    # could have written its pages (docs/consistency.md: a page a live
    # session also wrote is handed over, not put back).
    context = multiprocessing.get_context("spawn")
    maker = context.Process(target=make_array, args=(HEAP, "rolled", 4096))
    maker.start()
    maker.join(30)
    assert maker.exitcode == 0
    clients = heap.stats()["clients"]
    p = context.Process(target=sync_then_die, args=(HEAP, "rolled"))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    # heapd puts the dead client's pages back to its last sync.
    deadline = time.time() + 30
    while heap.stats()["clients"] > clients and time.time() < deadline:
        time.sleep(0.05)
    a = heap["rolled"]
    assert (a == 1).all(), np.unique(a)


def test_a_read_only_attach_cannot_write(heap):
    heap.array("ro", 8, np.float64)[:] = 3.0
    heap.sync()
    with heapd.attach(HEAP, read_only=True) as reader:
        ro = reader["ro"]
        assert not ro.flags.writeable
        with pytest.raises(ValueError):
            ro.setflags(write=True)
        with pytest.raises(ValueError):
            ro[0] = 1.0
        assert ro.sum() == 24.0


def test_an_array_keeps_its_heap_attached(heap):
    before = heap.stats()["clients"]
    with heapd.attach(HEAP) as other:
        kept = other.array("kept", 16, np.int32)
        kept[:] = 5
    assert other.closed
    assert heap.stats()["clients"] == before + 1  # still attached: `kept` lives
    assert kept.sum() == 80  # its memory is still mapped
    del kept
    assert heap.stats()["clients"] == before


def test_a_forked_child_reads_its_inherited_arrays_and_writes_privately(heap):
    a = heap.array("forked", 10, np.int64)
    a[:] = 4
    heap.sync()
    context = multiprocessing.get_context("fork")
    result = context.Queue()

    def child():
        result.put(int(a.sum()))
        a[:] = 9
        result.put(int(a.sum()))

    p = context.Process(target=child)
    p.start()
    assert result.get(timeout=30) == 40
    assert result.get(timeout=30) == 90
    p.join(30)
    assert p.exitcode == 0
    assert a.sum() == 40  # the child's writes did not reach the heap


def test_forked_children_attach_the_heap_themselves(heap):
    # Each child connects to heapd itself (gRPC stops its threads for the
    # fork and starts them again in the child) and writes the heap through
    # its own session.
    a = heap.array("by-children", 8, np.int64)
    a[:] = 0
    heap.sync()
    context = multiprocessing.get_context("fork")

    def child(i):
        with heapd.attach(HEAP) as own:
            b = own.array("by-children", 8, np.int64)
            b[i] = i + 1
            del b
            own.sync()

    for i in range(8):
        p = context.Process(target=child, args=(i,))
        p.start()
        p.join(60)
        if p.exitcode is None:
            p.kill()  # hung: killed, and the test fails
            p.join()
        assert p.exitcode == 0, f"child {i}"
    assert list(a) == list(range(1, 9))


def test_a_forked_child_of_arrays_whose_heap_object_is_gone():
    # Only the array holds its heap attached here: the Heap object is gone.
    a = heapd.attach(HEAP, create=True, max_size="256M").array("orphan", 4, np.int64)
    a[:] = 3
    context = multiprocessing.get_context("fork")
    result = context.Queue()

    def child():
        result.put(int(a.sum()))
        a[:] = 8
        result.put(int(a.sum()))

    p = context.Process(target=child)
    p.start()
    assert result.get(timeout=30) == 12
    assert result.get(timeout=30) == 32
    p.join(30)
    assert p.exitcode == 0
    assert a.sum() == 12  # the child's writes stayed in the child


def test_one_dimension_has_no_order(heap):
    a = heap.array("line", 5, np.int32, order="F")
    b = heap.array("line", 5, np.int32, order="C")
    assert np.shares_memory(a, b)


def test_dlpack_shares_memory(heap):
    a = heap.array("dl", 6, np.float64)
    b = np.from_dlpack(a)  # (numpy's import is read-only; torch's is not)
    a[2] = 7.0
    assert b[2] == 7.0 and np.shares_memory(a, b)


def test_find_arrays_other_languages_made():
    """Arrays the C and Fortran examples made (tests/consumers_test.sh runs
    them first): found with their type, shape and order."""
    try:
        fields = heapd.attach("fields", read_only=True)
    except heapd.HeapdError as error:
        pytest.skip(f"no heap 'fields' from the C and Fortran examples: {error}")
    with fields:
        f_u = fields["f_u"]
        assert f_u.dtype == np.float64 and f_u.shape == (3, 4)
        assert f_u.flags["F_CONTIGUOUS"]
        assert f_u[0, 0] == 11 and f_u[2, 3] == 34  # f_u(i, j) = i * 10 + j, 1-based
        c_u = fields["c_u"]
        assert c_u.shape == (4, 3) and c_u.flags["C_CONTIGUOUS"]
        assert c_u[3, 2] == 32


def test_bad_sizes_and_missing_heaps_are_errors():
    with pytest.raises(ValueError):
        heapd.attach("x", create=True, max_size="1GB")
    with pytest.raises(heapd.HeapdError) as missing:
        heapd.attach("no-such-heap-" + str(os.getpid()))
    assert missing.value.code == "NOT_FOUND"


def test_a_new_heap_goes_on_the_storage_tier_asked():
    # This heapd has one tier, "default" (its --state_dir).
    with pytest.raises(heapd.HeapdError, match="no tier named 'nvme'"):
        heapd.attach("py-tier-" + str(os.getpid()), create=True, storage="nvme")
    with heapd.attach("py-tier-" + str(os.getpid()), create=True, storage="default") as h:
        assert h.name == "py-tier-" + str(os.getpid())
    with pytest.raises(TypeError):
        heapd.attach("py-tier-" + str(os.getpid()), create=True, storage=7)


def test_a_new_heap_chooses_its_image():
    with pytest.raises(ValueError):
        heapd.attach("py-image-" + str(os.getpid()), create=True, image="mirror")
    # heapd's state is on tmpfs here: a working image is refused, saying why.
    with pytest.raises(heapd.HeapdError) as refused:
        heapd.attach("py-working-" + str(os.getpid()), create=True, image="working")
    assert "tmpfs" in str(refused.value)
    with heapd.attach("py-direct-" + str(os.getpid()), create=True, image="direct") as h:
        assert h.stats()["content_rollback"]


def test_a_fixed_address_heap_is_mapped_at_one_address():
    name = "py-fixed-" + str(os.getpid())
    with heapd.attach(name, create=True, max_size="64M", fixed_address=True) as h:
        at = h.stats()["fixed_address"]
        assert at != 0
        h.array("a", (4,), np.int64)[:] = 7
    with heapd.attach(name, fixed_address=True) as h:
        assert h.stats()["fixed_address"] == at
        assert h["a"].tolist() == [7, 7, 7, 7]
    heapd.attach(HEAP + "-plain", create=True, max_size="64M").close()
    with pytest.raises(heapd.HeapdError) as refused:
        heapd.attach(HEAP + "-plain", fixed_address=True)
    assert refused.value.code == "FAILED_PRECONDITION"
    assert "not a fixed-address heap" in str(refused.value)
