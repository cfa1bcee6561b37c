"""pytest configuration of libqq's test suite.

* `gpu` marker: tests that need a CUDA device. They are skipped when `qq` sees none
  (`qq.device_count() == 0`, a CPU-only build, or qq not importable at all). A
  `qq.NotSupportedError` inside one is a failure like any other error: a test that meets a
  path this GPU or build lacks skips by name (session az removed the hook that turned every
  NotSupportedError into a skip: with every GPU path built, it could only hide regressions).
* `rng` fixture: a NumPy Generator with a fresh seed each run. The seed is printed (and
  attached to the failure report as "random seed"); set QQ_TEST_SEED=<seed> to replay it.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

# JAX (when installed with CUDA) must not grab most of the GPU's memory at import.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Test modules import `reference` and `helpers` from this directory.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml's addopts): one worker a core, at most 8 - each worker that
    runs GPU tests holds its own CUDA context and buffers on the one device; none on a
    single core (0: no worker processes)."""
    cores = os.cpu_count() or 1
    return 0 if cores < 2 else min(cores, 8)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpu: needs a CUDA device visible to qq (skipped otherwise)",
    )


_cuda_devices = None


def _cuda_device_count() -> int:
    global _cuda_devices
    if _cuda_devices is None:
        try:
            import qq

            _cuda_devices = int(qq.device_count())
        except Exception:  # qq missing, CPU-only build, no driver: no GPU tests
            _cuda_devices = 0
    return _cuda_devices


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and _cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device visible to qq (qq.device_count() == 0)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A NumPy Generator with a fresh random seed (QQ_TEST_SEED overrides it)."""
    env = os.environ.get("QQ_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(8), "little")
    request.node._qq_seed = seed
    print(f"random seed: QQ_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    seed = getattr(item, "_qq_seed", None)
    if seed is not None and report.failed:
        report.sections.append(("random seed", f"rerun with QQ_TEST_SEED={seed}"))
    return report
