# Builds heapd._heapd, a small C extension over libheapd's C API
# (heapd/heapd.h). It finds heapd's headers and library, in this order:
#   $HEAPD_PREFIX (the prefix tools/install.sh installed into);
#   heapd_prefix.txt (in the sdist tools/install.sh makes:
#     PREFIX/share/heapd/python/heapd-VERSION.tar.gz);
#   the prefix this source was installed under (PREFIX/share/heapd/python);
#   pkg-config heapd.
import os
import shlex
import subprocess

from setuptools import Extension, setup


def heapd_prefix():
    if os.environ.get("HEAPD_PREFIX"):
        return os.environ["HEAPD_PREFIX"]
    here = os.path.dirname(os.path.abspath(__file__))
    recorded = os.path.join(here, "heapd_prefix.txt")
    if os.path.exists(recorded):
        with open(recorded) as f:
            return f.read().strip()
    installed = os.path.abspath(os.path.join(here, "..", "..", ".."))
    if os.path.exists(os.path.join(installed, "include", "heapd", "heapd.h")):
        return installed
    return None


def build_flags():
    prefix = heapd_prefix()
    if prefix is not None:
        lib = os.path.join(prefix, "lib")
        return [os.path.join(prefix, "include")], [lib], [lib]
    try:
        cflags = subprocess.check_output(["pkg-config", "--cflags-only-I", "heapd"], text=True)
        libs = subprocess.check_output(["pkg-config", "--libs-only-L", "heapd"], text=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(
            "heapd's C library was not found: install heapd (bash tools/install.sh "
            "--prefix=DIR) and set HEAPD_PREFIX=DIR, or put DIR/lib/pkgconfig on "
            "PKG_CONFIG_PATH") from error
    includes = [flag[2:] for flag in shlex.split(cflags) if flag.startswith("-I")]
    libdirs = [flag[2:] for flag in shlex.split(libs) if flag.startswith("-L")]
    return includes, libdirs, libdirs


includes, libdirs, rpath = build_flags()
setup(
    ext_modules=[
        Extension(
            "heapd._heapd",
            sources=["heapd/_heapd.c"],
            include_dirs=includes,
            library_dirs=libdirs,
            runtime_library_dirs=rpath,
            libraries=["heapd"],
            extra_compile_args=["-O2", "-Wall"],
        )
    ]
)
