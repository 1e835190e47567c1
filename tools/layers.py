#!/usr/bin/env python3
"""The layers of heapd's tree, checked on every #include.

Each package may include its own headers and those of the packages below
it, never one above (a "wrong-way" include). Bazel's visibility says the
same for deps (each BUILD's default_visibility), but with gcc a header of a
transitive dependency can be included without naming it: this checks the
sources themselves. Tests (*_test.cc, *_fuzz.cc) may also include
what tests are built on (testing/, tests/, tools/fuzz's seeds, the
examples' data structures); tests/, testing/, bench/ and tools/ may
include anything.

    python3 tools/layers.py          # prints each wrong-way include; exit 1 if any
"""
import os
import re
import subprocess
import sys

# Package -> the packages it may include, besides itself (docs/architecture.md).
LOWER = {
    "util": [],
    "allocator": ["util"],
    "heap": ["allocator", "util"],
    "protocol": ["proto", "heap", "allocator", "util"],
    "snapshot": ["protocol", "proto", "heap", "allocator", "util"],
    "include": [],
    "client": ["include", "protocol", "proto", "heap", "allocator", "util"],
    "client/examples": ["client", "include", "protocol", "util"],
    "daemon": ["snapshot", "protocol", "proto", "heap", "allocator", "util"],
}
# Anything goes above the library layers.
TOP = ("tests", "testing", "bench", "tools", "examples", "fortran", "python", "third_party")
TEST_HELPERS = ["testing", "tests", "tools", "client/examples"]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def package_of(path, packages):
    """The deepest known package holding `path`."""
    best = None
    for package in packages:
        if path.startswith(package + "/") and (best is None or len(package) > len(best)):
            best = package
    return best


def included_package(header, packages):
    """The package a project header belongs to; None for a library's."""
    if header.startswith("heapd/"):
        return "include"  # <heapd/...> is include/heapd/
    first = header.split("/")[0]
    if first == "proto":
        return "proto"
    return package_of(header, packages)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    files = subprocess.run(["git", "ls-files", "*.cc", "*.h"], capture_output=True, text=True,
                           check=True).stdout.split()
    packages = sorted(set(LOWER) | set(TOP) | {"proto"})
    wrong = []
    for path in files:
        if path.startswith(TOP):
            continue
        package = package_of(path, LOWER)
        if package is None:
            wrong.append(f"{path}: in no known layer (add its package to tools/layers.py)")
            continue
        allowed = {package, *LOWER[package]}
        if re.search(r"_(test|fuzz)\.cc$", path):
            allowed.update(TEST_HELPERS)
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if match is None:
                    continue
                included = included_package(match.group(1), packages)
                if included is not None and included not in allowed:
                    wrong.append(f"{path}:{number}: {package}/ includes {match.group(1)} "
                                 f"({included}/ is not below it)")
    for line in wrong:
        print(f"layers: {line}")
    print(f"layers: {len(files)} files, {len(wrong)} wrong-way includes")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
