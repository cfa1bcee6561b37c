"""bindings/xla/xla_ffi.h (qq's own declarations of the XLA FFI C API, so that building qq
needs no jax) against jaxlib's xla/ffi/api/c_api.h: tests/cpp/xla_ffi_abi.cpp includes both
and static_asserts every size, field offset and enum value we rely on. Compiled with the
system C++ compiler; skipped without one or without jaxlib's headers (jax.ffi.include_dir()).
A negative control (one deliberately false assertion) must fail to compile: proof that the
checks are live and that jaxlib's header was the one included."""

import os
import shlex
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CXX = shlex.split(os.environ.get("CXX", "")) or [c for c in (shutil.which("c++") or shutil.which("g++")
                                                            or shutil.which("clang++"),) if c]
SRC = os.path.join(HERE, "cpp", "xla_ffi_abi.cpp")


def _jaxlib_include():
    try:
        import jax.ffi
        inc = jax.ffi.include_dir()
    except Exception:  # noqa: BLE001 - no jax, or a jax without jax.ffi
        return None
    return inc if os.path.isfile(os.path.join(inc, "xla", "ffi", "api", "c_api.h")) else None


INC = _jaxlib_include()
pytestmark = [
    pytest.mark.skipif(not CXX, reason="needs a C++ compiler (c++, g++ or clang++, or $CXX)"),
    pytest.mark.skipif(INC is None, reason="needs jaxlib's headers (jax.ffi.include_dir()/xla/ffi/api/c_api.h)"),
]


def _compile(*defines):
    cmd = [*CXX, "-std=c++17", "-fsyntax-only", "-Wall", *defines, "-I", INC,
           "-I", os.path.join(ROOT, "bindings", "xla"), SRC]
    return cmd, subprocess.run(cmd, capture_output=True, text=True)


def test_declarations_match_jaxlib_header():
    cmd, r = _compile()
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"


def test_negative_control_fails():
    """The false assertion (Buffer::dims at XLA_FFI_Buffer::rank's offset) is caught."""
    cmd, r = _compile("-DQQ_ABI_NEGATIVE_CONTROL")
    assert r.returncode != 0, f"{' '.join(cmd)} compiled although it asserts a false offset"
    assert "offset of Buffer::dims" in r.stderr, r.stderr


def test_every_declared_struct_is_checked():
    """Each struct of xla_ffi.h appears in a check of xla_ffi_abi.cpp (a struct added to the
    header without a check would go unverified)."""
    import re

    header = open(os.path.join(ROOT, "bindings", "xla", "xla_ffi.h")).read()
    checks = open(SRC).read()
    structs = re.findall(r"^struct (\w+) \{", header, re.M)
    assert len(structs) >= 15, structs
    missing = [s for s in structs if not re.search(rf"\(\s*{s}\s*,", checks)]
    assert not missing, f"structs of xla_ffi.h without an ABI check: {missing}"
