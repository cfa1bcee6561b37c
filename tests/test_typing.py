"""qq ships type information (py.typed, python/qq/__init__.pyi): every public name of
qq.__all__ is in the stub, and each function's parameters (names, kinds, defaults) are the
runtime's, so the stub cannot drift from the API silently."""

from __future__ import annotations

import ast
import inspect
import os

import pytest

import qq

PKG = os.path.dirname(qq.__file__)


def stub():
    with open(os.path.join(PKG, "__init__.pyi")) as f:
        return ast.parse(f.read())


def stub_names(tree):
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                names[a.asname or a.name] = node
    return names


def test_py_typed_and_stub_shipped():
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    assert os.path.exists(os.path.join(PKG, "__init__.pyi"))


def test_every_public_name_in_stub():
    names = stub_names(stub())
    missing = [n for n in qq.__all__ if n not in names]
    assert not missing, f"qq.__all__ names missing from __init__.pyi: {missing}"


def _stub_params(fn: ast.FunctionDef):
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for p, d in zip(pos, defaults):
        out.append((p.arg, "POSITIONAL_OR_KEYWORD", None if d is None else ast.literal_eval(d)))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, "KEYWORD_ONLY", None if d is None else ast.literal_eval(d)))
    return out


@pytest.mark.parametrize("name", [n for n in qq.__all__ if inspect.isroutine(getattr(qq, n))])
def test_signature_matches_runtime(name):
    fn = stub_names(stub())[name]
    assert isinstance(fn, ast.FunctionDef), f"{name} is not a function in the stub"
    sig = inspect.signature(getattr(qq, name))
    runtime = [(p.name, p.kind.name, None if p.default is p.empty else p.default) for p in sig.parameters.values()]
    assert _stub_params(fn) == runtime, f"{name}: stub {_stub_params(fn)} != runtime {runtime}"


def test_mypy_accepts_typical_use(tmp_path):
    api = pytest.importorskip("mypy.api")
    src = tmp_path / "use.py"
    src.write_text(
        "import numpy as np\nimport qq\n"
        "w = np.zeros((32, 64), np.float32)\n"
        "q: qq.QuantizedArray = qq.quantize(w, mode='nvfp4')\n"
        "route: str | None = qq.last_route()\n"
        "n: int = qq.device_count()\n"
        "y = qq.quantized_matmul(w, q)\n")
    out, err, status = api.run([str(src), "--ignore-missing-imports", "--no-incremental"])
    assert status == 0, out + err
