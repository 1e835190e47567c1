"""Issue 23's Python figures, on a heapd of its own (tmpfs), same run:
a named 1 GiB array created (on a heap whose space is reserved already, and
on a new heap) and found from another process; numpy read and write
bandwidth on a heap array whose pages were written since the last sync,
against an ordinary numpy array. Medians of --reps.

    python3 bench/python_bench.py --heapd=PREFIX/bin/heapd [--reps=5]
(with the heapd package installed in the Python that runs it)
"""
import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np

import heapd

GIB = 1 << 30


def find_in_child(socket, heap, name, result):
    start = time.perf_counter()
    with heapd.attach(heap, socket=socket) as h:
        a = h[name]
        result.put(((time.perf_counter() - start) * 1e3, a.nbytes))


def bandwidth(a, reps):
    """GB/s of a read (sum) and a write (fill) over `a`, medians."""
    reads, writes = [], []
    for _ in range(reps):
        start = time.perf_counter()
        a.sum()
        reads.append(a.nbytes / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        a.fill(1.5)
        writes.append(a.nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(reads), statistics.median(writes)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--heapd", required=True)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="heapd-pybench-", dir="/dev/shm")
    socket = os.path.join(work, "run", "heapd.sock")
    daemon = subprocess.Popen([args.heapd, f"--state_dir={work}/state", f"--runtime_dir={work}/run",
                               "--log_level=warn"])
    try:
        for _ in range(200):
            if os.path.exists(socket.replace("heapd.sock", "heapd.fd.sock")):
                break
            time.sleep(0.02)
        context = multiprocessing.get_context("spawn")
        new_heap, reserved, found = [], [], []
        for rep in range(args.reps):
            name = f"new{rep}"
            with heapd.attach(name, create=True, max_size="4G", socket=socket) as h:
                start = time.perf_counter()
                a = h.array("u", GIB // 8, np.float64)
                new_heap.append((time.perf_counter() - start) * 1e3)
                del h["u"], a
                start = time.perf_counter()  # its space is reserved now
                a = h.array("v", GIB // 8, np.float64)
                reserved.append((time.perf_counter() - start) * 1e3)
                h.sync()
                result = context.Queue()
                p = context.Process(target=find_in_child, args=(socket, name, "v", result))
                p.start()
                found.append(result.get(timeout=60)[0])
                p.join()
                del a
        print(f"1 GiB array created: {statistics.median(new_heap):.1f} ms on a new heap, "
              f"{statistics.median(reserved):.1f} ms with its space reserved; found from "
              f"another process (attach + find) {statistics.median(found):.1f} ms "
              f"(medians of {args.reps})")
        with heapd.attach("bw", create=True, max_size="2G", socket=socket) as h:
            a = h.array("bw", (256 << 20) // 8, np.float64)
            a.fill(0.5)  # every page written since the last sync: no first-store cost
            heap_read, heap_write = bandwidth(a, args.reps)
            plain = np.full(a.shape, 0.5)
            plain_read, plain_write = bandwidth(plain, args.reps)
            del a
        print(f"256 MiB numpy sum/fill: heap array {heap_read:.2f} / {heap_write:.2f} GB/s, "
              f"ordinary array {plain_read:.2f} / {plain_write:.2f} GB/s "
              f"({heap_read / plain_read:.2f}x / {heap_write / plain_write:.2f}x)")
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
