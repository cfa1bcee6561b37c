"""Locate cuBLASLt from NVIDIA's pip wheel for CMake.

Prints "include_dir;library_path;rpath_rel" where rpath_rel is the library
directory relative to site-packages (for libqq's $ORIGIN RPATH). Exit 1 if
not found. argv[1] is the CUDA major version (13 -> nvidia/cu13, 12 ->
nvidia/cublas).
"""

import glob
import os
import site
import sys


def main() -> int:
    major = sys.argv[1] if len(sys.argv) > 1 else "13"
    rels = [f"nvidia/cu{major}", "nvidia/cublas"]
    roots = []
    for p in list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]:
        if p and os.path.isdir(p) and p not in roots:
            roots.append(p)
    for root in roots:
        for rel in rels:
            inc = os.path.join(root, rel, "include")
            libs = sorted(glob.glob(os.path.join(root, rel, "lib", f"libcublasLt.so.{major}*")))
            if os.path.isfile(os.path.join(inc, "cublasLt.h")) and libs:
                print(f"{inc};{libs[0]};{rel}/lib")
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
