"""fields: the arrays the C and Fortran examples keep in heap "fields",
read as numpy arrays (zero-copy), and one of Python's own.

    python fields.py        (with HEAPD_SOCKET set, after ../c and ../fortran wrote)
"""
import numpy as np

import heapd

with heapd.attach("fields", create=True, max_size="1G") as heap:
    f_u = heap["f_u"]  # Fortran's: float64, shape (3, 4), Fortran order
    c_u = heap["c_u"]  # C's: float64, shape (4, 3), C order
    assert f_u.flags["F_CONTIGUOUS"] and c_u.flags["C_CONTIGUOUS"]
    print(f"f_u {f_u.dtype}{f_u.shape}, sum {f_u.sum():g}; c_u {c_u.dtype}{c_u.shape}, sum {c_u.sum():g}")
    p_v = heap.array("p_v", (2, 5), np.int32)  # made zero-filled, or found
    p_v += 1  # in place, in the heap
    heap.sync()
    print(f"p_v now holds {int(p_v[0, 0])} in every element (one more each run)")
