"""codec.h's fast scalar forms against the forms they replaced (tests/cpp/codec_proofs.cpp,
which says what is proved). The program is compiled with the system C++ compiler against
libqq/src/codec.h, once with the host forms and once with the GPU-only forms
(-DQQ_CODEC_GPU_FORMS), with the library's own numerics flags (-ffp-contract=off, no
fast-math). The normal suite runs a sample (about a second each: every bit pattern near the
edges the forms are built on, plus a stride walk and random patterns); QQ_TEST_EXHAUSTIVE=1
runs the proof over all 2^32 fp32 inputs (minutes)."""

import os
import platform
import shlex
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CXX = shlex.split(os.environ.get("CXX", "")) or [c for c in (shutil.which("c++") or shutil.which("g++")
                                                            or shutil.which("clang++"),) if c]

pytestmark = pytest.mark.skipif(not CXX, reason="needs a C++ compiler (c++, g++ or clang++, or $CXX)")

EXHAUSTIVE = os.environ.get("QQ_TEST_EXHAUSTIVE", "") not in ("", "0")


@pytest.mark.parametrize("forms", ["host", "gpu"])
def test_codec_fast_forms_equal_their_oracles(forms, tmp_path):
    exe = tmp_path / "codec_proofs"
    cmd = [*CXX, "-O2", "-std=c++17", "-ffp-contract=off", "-I", os.path.join(ROOT, "libqq", "src"),
           os.path.join(HERE, "cpp", "codec_proofs.cpp"), "-o", str(exe)]
    if forms == "gpu":
        cmd.insert(len(CXX), "-DQQ_CODEC_GPU_FORMS")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    r = subprocess.run([str(exe)] + (["--exhaustive"] if EXHAUSTIVE else []), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "mismatches" in ln]
    # every check ran (the CPU's AVX2 fp4 and fp8 encoders are compiled on x86-64 only)
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert len(lines) == (10 if forms == "gpu" else 9) + 2 * x86, r.stdout
    assert all(ln.endswith(" 0 mismatches") for ln in lines), r.stdout


@pytest.mark.gpu
def test_affine_quotient_fma_proof_on_the_gpu(tmp_path):
    """codec.h's affine_quotient_fma (the GPU affine encoders' exact quotient) equals IEEE
    division for every 1024th fp32 significand b against every a (2^36 pairs; all 2^46 pairs
    with QQ_TEST_EXHAUSTIVE=1, about a minute): tests/cpp/quotient_proof.cu."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc to build tests/cpp/quotient_proof.cu")
    exe = tmp_path / "quotient_proof"
    cmd = [nvcc, "-O3", "-arch=native", os.path.join(HERE, "cpp", "quotient_proof.cu"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    r = subprocess.run([str(exe)] + (["--exhaustive"] if EXHAUSTIVE else []), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    want = (1 << 46) if EXHAUSTIVE else (1 << 36)
    assert f"affine_quotient_fma: {want} pairs, 0 mismatches" in r.stdout, r.stdout
