"""C linking without Python: a plain CMake build of libqq (`cmake -S . -B build && cmake
--build build && cmake --install build --prefix P`; CPU-only in CI, the CUDA backend with
QQ_TEST_INSTALL_CUDA=<archs> on the device), then examples/c built against the install tree,
once through find_package(qq) and once through pkg-config, and run. docs/build.md, "C
linking without Python"."""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None,
                                reason="needs cmake and a C compiler")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    # QQ_TEST_INSTALL_CUDA=<archs> builds the CUDA backend instead (scripts/gpu_session.sh
    # clink, on the device: libqq then loads cuBLASLt at run time, nothing more to link)
    cuda = os.environ.get("QQ_TEST_INSTALL_CUDA")
    flags = ["-DQQ_CUDA=ON", f"-DQQ_CUDA_ARCHS={cuda}"] if cuda else ["-DQQ_CUDA=OFF"]
    run(["cmake", "-S", ROOT, "-B", str(tmp / "build"), *flags, "-DCMAKE_BUILD_TYPE=Release"], env=env)
    run(["cmake", "--build", str(tmp / "build"), "--parallel", str(os.cpu_count() or 2)], env=env)
    run(["cmake", "--install", str(tmp / "build"), "--prefix", str(tmp / "P")], env=env)
    return tmp / "P"


def check_demo(exe):
    out = run([str(exe)], env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"})
    assert "packed word 0x97654321" in out
    assert "K=10: QQ_STATUS_INVALID_VALUE" in out


def test_install_tree_layout(prefix):
    libdir = next(p for p in (prefix / "lib", prefix / "lib64") if p.is_dir())
    assert (prefix / "include" / "qq" / "qq.h").is_file()
    assert (libdir / "cmake" / "qq" / "qqConfig.cmake").is_file()
    assert (libdir / "pkgconfig" / "qq.pc").is_file()
    assert any(p.name.startswith("libqq.so") for p in libdir.iterdir())


def test_example_through_find_package(prefix, tmp_path):
    run(["cmake", "-S", os.path.join(ROOT, "examples", "c"), "-B", str(tmp_path / "ex"),
         f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", str(tmp_path / "ex")])
    check_demo(tmp_path / "ex" / "quantize_demo")


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="needs pkg-config")
def test_example_through_pkg_config(prefix, tmp_path):
    libdir = next(p for p in (prefix / "lib", prefix / "lib64") if p.is_dir())
    env = dict(os.environ, PKG_CONFIG_PATH=str(libdir / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "qq"], env=env).split()
    exe = tmp_path / "demo"
    run(["cc", os.path.join(ROOT, "examples", "c", "quantize_demo.c"), *flags, "-o", str(exe)])
    check_demo(exe)
