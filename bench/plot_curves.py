#!/usr/bin/python3
"""Draws the CSV files of scale_bench (B12), reservation_bench (B13) and
raw_pointer_bench (B3 over raw pointers) as PNG files, one per CSV: each
column of a curve against its first column; B13's reserved and allocated
bytes per workload with the bound (and the reserved bytes of the build
before, from reservations_before.csv); B3's ingest rates, medians of the
reps, in DRAM and in a fixed-address heap.

    /usr/bin/python3 bench/plot_curves.py CSV_DIR OUT_DIR

Uses Debian's python3-matplotlib (installed here when missing, as root).
The PNGs carry no software version or date, so the same figures draw the
same files.
"""
import csv
import os
import subprocess
import sys

try:
    import matplotlib
except ImportError:
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                    "python3-matplotlib"], check=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

MIB = 1 << 20
GIB = 1 << 30

# What each column is, and how to show it: (label, scale divisor).
COLUMNS = {
    "max_size_bytes": ("heap maximum size (GiB)", GIB),
    "names": ("names in the heap", 1),
    "heaps": ("heaps on the node", 1),
    "attach_us": ("attach + detach (µs)", 1),
    "find_us": ("find by name (µs)", 1),
    "sync_us": ("sync of one object (µs)", 1),
    "bind_us": ("bind a name (µs)", 1),
    "create_us": ("create a heap (µs)", 1),
    "list_us": ("list heaps (µs)", 1),
    "heapd_rss_bytes": ("heapd resident memory (MiB)", MIB),
    "heapd_fds": ("heapd's file descriptors", 1),
    "metric_series": ("metric series", 1),
    "restart_s": ("heapd restart until served (s)", 1),
    "clients": ("sessions attached to the heap", 1),
    "stat_us": ("stat of the heap (µs)", 1),
    "reclaim_all_s": ("end as many sessions killed at once (s)", 1),
    "versions": ("versions in the store", 1),
    "create_ms": ("store one version (ms)", 1),
    "ls_ms": ("ls the store (ms)", 1),
    "du_ms": ("du of the store (ms)", 1),
    "gc_ms": ("gc of the store (ms)", 1),
    "restore_ms": ("restore the newest version (ms)", 1),
    "store_bytes": ("store on disk (MiB)", MIB),
}


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def save(figure, path):
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
    print("wrote", path)


def plot_curve(rows, title, path):
    x_name, *y_names = rows[0].keys()
    x_label, x_div = COLUMNS[x_name]
    xs = [float(r[x_name]) / x_div for r in rows]
    columns = 3
    lines = (len(y_names) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(4 * columns, 3 * lines), squeeze=False)
    for i, y_name in enumerate(y_names):
        axis = axes[i // columns][i % columns]
        y_label, y_div = COLUMNS[y_name]
        axis.plot(xs, [float(r[y_name]) / y_div for r in rows], marker="o")
        axis.set_xscale("log")
        axis.set_xlabel(x_label)
        axis.set_title(y_label, fontsize=10)
        axis.set_ylim(bottom=0)
        axis.grid(True, which="both", alpha=0.3)
    for i in range(len(y_names), lines * columns):
        axes[i // columns][i % columns].axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    save(figure, path)


def plot_reservations(rows, before, path):
    """`before`: the same workloads' rows from the build before (or None)."""
    names = [r["workload"] for r in rows]
    at = range(len(rows))
    figure, axis = plt.subplots(figsize=(10, 4))
    bars = [("allocated", rows, "allocated_bytes"), ("reserved", rows, "reserved_bytes")]
    if before is not None:
        bars.append(("reserved, build before", before, "reserved_bytes"))
    width = 0.8 / len(bars)
    for k, (label, source, column) in enumerate(bars):
        offset = (k - (len(bars) - 1) / 2) * width
        axis.bar([i + offset for i in at], [int(r[column]) / MIB for r in source], width,
                 label=label)
    axis.scatter(list(at), [int(r["bound_bytes"]) / MIB for r in rows], marker="_", s=400,
                 color="black", label="target: 2 x allocated + 32 MiB", zorder=3)
    for i, r in enumerate(rows):
        if r["error"]:
            axis.annotate("failed: heap full", (i, 1), rotation=90, ha="center", va="bottom",
                          fontsize=8)
    axis.set_yscale("log")
    axis.set_ylabel("MiB")
    axis.set_xticks(list(at))
    axis.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    axis.legend(fontsize=8)
    axis.set_title("B13: reserved against allocated bytes per workload (tmpfs)")
    figure.tight_layout()
    save(figure, path)


TITLES = {
    "heap_size": "B12: costs against a heap's maximum size (64 MiB of objects in it)",
    "names": "B12: costs against names in one heap",
    "heaps": "B12: costs against heaps on one node",
    "clients": "B12: costs against sessions on one heap",
    "versions": "B12: a snapshot store against its versions (1 MiB changed in each)",
}


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def plot_raw_pointers(rows, path):
    containers = list(dict.fromkeys(row["container"] for row in rows))
    places = [("dram_s", "DRAM, std::allocator (cold)"),
              ("warm_dram_s", "DRAM, std::allocator (warm)"),
              ("heap_s", "fixed-address heap, heapd::raw_allocator")]
    figure, axes = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(places)
    for i, (column, label) in enumerate(places):
        rates = []
        for container in containers:
            of = [row for row in rows if row["container"] == container]
            rates.append(int(of[0]["edges"]) / median(float(r[column]) for r in of) / 1e6)
        positions = [c + (i - 1) * width for c in range(len(containers))]
        bars = axes.bar(positions, rates, width, label=label)
        axes.bar_label(bars, fmt="%.1f")
    axes.set_xticks(range(len(containers)), containers)
    axes.set_ylabel("ingest (M edges/s, median)")
    axes.set_title("B3 over raw pointers: 2^22 R-MAT edges, same run")
    axes.set_ylim(0, axes.get_ylim()[1] * 1.3)
    axes.legend(loc="upper left")
    save(figure, path)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    csv_dir, out_dir = sys.argv[1:]
    os.makedirs(out_dir, exist_ok=True)
    for name, title in TITLES.items():
        path = os.path.join(csv_dir, name + ".csv")
        if os.path.exists(path):
            plot_curve(read(path), title, os.path.join(out_dir, "b12-" + name + ".png"))
    path = os.path.join(csv_dir, "reservations.csv")
    before = os.path.join(csv_dir, "reservations_before.csv")
    if os.path.exists(path):
        plot_reservations(read(path), read(before) if os.path.exists(before) else None,
                          os.path.join(out_dir, "b13-reservations.png"))
    path = os.path.join(csv_dir, "raw_pointers.csv")
    if os.path.exists(path):
        plot_raw_pointers(read(path), os.path.join(out_dir, "b3-raw-pointers.png"))


if __name__ == "__main__":
    main()
