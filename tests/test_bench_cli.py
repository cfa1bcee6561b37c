"""`python -m qq bench` (qq/_bench.py, docs/benchmarks.md) runs from the installed package:
a quick CPU run exits 0 and writes rows with the documented fields, one per op and mode,
each with a peer measured in the same run; `python -m qq` keeps its own behaviour."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FIELDS = {"op", "variant", "shape", "metric", "value", "peer", "peer_value", "ratio", "device"}


def test_bench_quick_cpu(tmp_path):
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, "-m", "qq", "bench", "--quick", "--device", "cpu", "--json", str(out),
                        "--no-plot"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {(x["op"], x["variant"]) for x in rows} == {
        ("quantize", "nvfp4"), ("quantize", "mxfp8"), ("quantized_matmul", "nvfp4"), ("quantized_matmul", "mxfp4"),
        ("quantized_matmul", "mxfp8"), ("qqmm", "nvfp4"), ("qqmm", "mxfp8")}
    for x in rows:
        assert FIELDS <= set(x), x
        assert x["value"] > 0 and x["peer_value"] > 0 and x["metric"] in ("GBps", "TFLOPs")
        assert x["ratio"] == pytest.approx(x["value"] / x["peer_value"], rel=1e-2, abs=1e-3)
    assert "quantized_matmul" in r.stdout and "ratio" in r.stdout


def test_bench_plot_when_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    r = subprocess.run([sys.executable, "-m", "qq", "bench", "--quick", "--device", "cpu", "--plot",
                        str(tmp_path / "p.png")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_bad_device_argument():
    r = subprocess.run([sys.executable, "-m", "qq", "bench", "--device", "tpu"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--device" in r.stderr


def test_main_job_unchanged():
    r = subprocess.run([sys.executable, "-m", "qq", "--no-demo"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bench" not in r.stdout.splitlines()[0]
