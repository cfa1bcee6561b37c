"""The C ABI from a C program: examples/c is built against the installed libqq through
CMake's find_package(qq) (qq.cmake_prefix_path()) and run. It quantizes one NVFP4 group
and checks the golden packing 0x97654321 and a named error for K=10."""

import os
import shutil
import subprocess

import pytest

import qq

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "c")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_c_program_through_find_package(tmp_path):
    build = tmp_path / "build"
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)  # libqq must be found through its install, not the env
    cfg = subprocess.run(["cmake", "-S", EXAMPLE, "-B", str(build),
                          f"-DCMAKE_PREFIX_PATH={qq.cmake_prefix_path()}"],
                         capture_output=True, text=True, env=env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    bld = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, env=env)
    assert bld.returncode == 0, bld.stdout + bld.stderr
    run = subprocess.run([str(build / "quantize_demo")], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "packed word 0x97654321" in run.stdout
    assert "K=10: QQ_STATUS_INVALID_VALUE" in run.stdout and "group_size 16" in run.stdout
