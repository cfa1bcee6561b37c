"""Locate CUTLASS's headers for CMake: prints the include directory holding cutlass/ and
cute/, exit 1 if none was found.

Looked up in this order: $QQ_CUTLASS_DIR (a directory holding cutlass/ and cute/, or a
CUTLASS checkout with include/), then NVIDIA's nvidia-cutlass wheel (a build requirement of
a CUDA build, build_support/qq_build.py), whose headers lie under
cutlass_library/source/include. The package is found without importing it.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _holds_headers(d: str) -> bool:
    return os.path.isfile(os.path.join(d, "cutlass", "cutlass.h")) and os.path.isdir(os.path.join(d, "cute"))


def find() -> str | None:
    env = os.environ.get("QQ_CUTLASS_DIR", "")
    if env:
        for d in (env, os.path.join(env, "include")):
            if _holds_headers(d):
                return os.path.realpath(d)
        return None     # named but wrong: say so rather than pick another copy
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        d = os.path.join(root, "source", "include")
        if _holds_headers(d):
            return os.path.realpath(d)
    return None


if __name__ == "__main__":
    found = find()
    if not found:
        sys.exit(1)
    print(found)
