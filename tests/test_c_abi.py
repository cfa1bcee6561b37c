"""The C ABI from a C program: examples/c is built against the installed libqq through
CMake's find_package(qq) (qq.cmake_prefix_path()) and run. It quantizes one NVFP4 group
and checks the golden packing 0x97654321 and a named error for K=10.

tests/c/test_abi.c, built the same way, throws hostile input at the C ABI (NULL shapes,
empty batches, int64 overflow, out-of-range enums, bogus devices, misaligned data, NULL
structs); each check runs in its own child process and prints one line."""

import os
import re
import shutil
import subprocess

import pytest

import qq

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "c")
C_TESTS = os.path.join(HERE, "c")


def _build_with_find_package(src, build):
    """Configure and build the CMake project `src` against the installed libqq."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)  # libqq must be found through its install, not the env
    cfg = subprocess.run(["cmake", "-S", src, "-B", str(build),
                          f"-DCMAKE_PREFIX_PATH={qq.cmake_prefix_path()}"],
                         capture_output=True, text=True, env=env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    bld = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, env=env)
    assert bld.returncode == 0, bld.stdout + bld.stderr
    return env


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_c_program_through_find_package(tmp_path):
    build = tmp_path / "build"
    env = _build_with_find_package(EXAMPLE, build)
    run = subprocess.run([str(build / "quantize_demo")], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "packed word 0x97654321" in run.stdout
    assert "K=10: QQ_STATUS_INVALID_VALUE" in run.stdout and "group_size 16" in run.stdout


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_c_abi_hostile_input(tmp_path):
    """tests/c/test_abi.c: every check passes (its output is shown on failure)."""
    build = tmp_path / "build"
    env = _build_with_find_package(C_TESTS, build)
    run = subprocess.run([str(build / "test_abi")], capture_output=True, text=True, env=env, timeout=300)
    lines = run.stdout.strip().splitlines()
    assert lines and re.fullmatch(r"\d+ passed, \d+ failed", lines[-1]), run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + "\n--- stderr ---\n" + run.stderr[-20000:]
    assert lines[-1].endswith(" 0 failed")
