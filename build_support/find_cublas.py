"""Locate cuBLASLt (NVIDIA's nvidia-cublas wheel, or wherever cuda.pathfinder finds it) for CMake.

Prints "include_dir;library_path;rpath_rel": the directory holding cublasLt.h, the
libcublasLt.so.<major> file ("" if only the headers were found: libqq loads the library
at run time, so the build needs just the headers), and that file's directory relative to
the site-packages directory that holds it ("" when it is not inside one), for libqq's
$ORIGIN RUNPATH. Exit 1 if no cublasLt.h was found. argv[1] is the CUDA major version
(13 -> nvidia/cu13, 12 -> nvidia/cublas).

With cuda-pathfinder installed (a build requirement of a CUDA build, see qq_build.py) it
asks cuda.pathfinder: find_nvidia_header_directory("cublas") and
load_nvidia_dynamic_lib("cublasLt") (which loads the library into this short-lived
process to learn its path). Without it, or when it finds nothing, it globs the
site-packages directories on sys.path for the wheel's layout, as before.
"""

from __future__ import annotations

import glob
import os
import site
import sys


def _site_dirs() -> list[str]:
    roots = []
    for p in list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]:
        if p and os.path.isdir(p) and p not in roots:
            roots.append(os.path.realpath(p))
    return roots


def _rel_to_site(path: str) -> str:
    """`path` relative to the site-packages directory that holds it, or ""."""
    real = os.path.realpath(path)
    for root in _site_dirs():
        if real.startswith(root + os.sep):
            return os.path.relpath(real, root)
    return ""


def _major_matches(lib: str, major: str) -> bool:
    return os.path.basename(os.path.realpath(lib)).startswith(f"libcublasLt.so.{major}") or \
        os.path.basename(lib) == f"libcublasLt.so.{major}"


def with_pathfinder(major: str) -> tuple[str, str] | None:
    """(include_dir, library_path or "") through cuda.pathfinder, or None."""
    try:
        import cuda.pathfinder as pf
    except ImportError:
        return None
    try:
        inc = pf.find_nvidia_header_directory("cublas")
    except Exception:  # noqa: BLE001 - an old pathfinder without "cublas" headers: fall back
        return None
    if not inc or not os.path.isfile(os.path.join(inc, "cublasLt.h")):
        return None
    lib = ""
    try:
        loaded = pf.load_nvidia_dynamic_lib("cublasLt")
        if loaded.abs_path and _major_matches(loaded.abs_path, major):
            lib = loaded.abs_path
    except Exception:  # noqa: BLE001 - headers without the library still build libqq
        pass
    return inc, lib


def by_glob(major: str) -> tuple[str, str] | None:
    """(include_dir, library_path or "") from the wheel's layout under site-packages, or None."""
    rels = [f"nvidia/cu{major}", "nvidia/cublas"]
    found = None
    for root in _site_dirs():
        for rel in rels:
            inc = os.path.join(root, rel, "include")
            if not os.path.isfile(os.path.join(inc, "cublasLt.h")):
                continue
            libs = sorted(glob.glob(os.path.join(root, rel, "lib", f"libcublasLt.so.{major}*")))
            if libs:
                return inc, libs[0]
            found = found or (inc, "")
    return found


def main() -> int:
    major = sys.argv[1] if len(sys.argv) > 1 else "13"
    r = with_pathfinder(major) or by_glob(major)
    if not r:
        return 1
    inc, lib = r
    if not lib:  # headers from pathfinder but no library: the wheel's own lib/ may still be there
        g = by_glob(major)
        if g and g[1]:
            lib = g[1]
    rpath_rel = _rel_to_site(os.path.dirname(lib)) if lib else ""
    print(f"{inc};{lib};{rpath_rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
