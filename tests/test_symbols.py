"""What libqq's shared libraries export: their C ABI and nothing else (libqq/src/libqq.map,
bindings/xla/libqq_xla.map; docs/build.md, "Exported symbols").

A symbol exported beside the C ABI is one another library in the process can bind to. The
GPU machine's build carried a static libstdc++ whose symbols libqq.so exported, 106 of them
GNU_UNIQUE (locale and facet ids, shared process-wide whatever the dlopen flags): `import
qq` then `import torch` crashed inside torch's import. The dynamic symbol table is read
here from the ELF file itself (no binutils needed)."""

import os
import struct
import subprocess
import sys

import pytest

import qq
from helpers import libqq_path

STB = {1: "GLOBAL", 2: "WEAK", 10: "GNU_UNIQUE"}


def exported(path):
    """Names and bindings of the symbols an ELF64 little-endian shared library defines in
    its dynamic symbol table (GLOBAL, WEAK or GNU_UNIQUE; undefined ones left out)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not ELF64 little-endian"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for _name, kind, _fl, _addr, off, size, link, _info, _al, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        stroff = sections[link][4]
        for i in range(1, size // entsize):
            st_name, st_info, _other, st_shndx, _v, _s = struct.unpack_from("<IBBHQQ", data, off + i * entsize)
            bind = STB.get(st_info >> 4)
            if bind is None or st_shndx == 0:  # local, or undefined here
                continue
            end = data.index(b"\0", stroff + st_name)
            out[data[stroff + st_name:end].decode()] = bind
    assert out, f"{path}: no defined dynamic symbols found (no .dynsym?)"
    return out


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF: Linux")


@linux
def test_exported_reads_the_dynamic_symbols():
    """The reader itself: the C ABI functions are there (a reader that found nothing would
    pass the tests below)."""
    names = exported(libqq_path())
    for fn in ("qqQuantize", "qqDequantize", "qqQqmm", "qqGetLastErrorMessage", "qqGetVersion"):
        assert names.get(fn) == "GLOBAL", fn


@linux
def test_libqq_exports_only_the_c_abi():
    other = {n: b for n, b in exported(libqq_path()).items() if not n.startswith("qq")}
    assert not other, f"{len(other)} symbols besides the C ABI, e.g. {sorted(other.items())[:10]}"


@linux
def test_libqq_xla_exports_only_its_handlers():
    path = os.path.join(os.path.dirname(libqq_path()), "libqq_xla.so")  # (qq/_jax_ffi.py's place)
    if not os.path.exists(path):
        pytest.skip("no libqq_xla.so in this build")
    names = exported(path)
    assert "qq_xla_api_version" in names and "qq_xla_quantize_cpu" in names
    other = {n: b for n, b in names.items() if not n.startswith("qq_xla_")}
    assert not other, f"{len(other)} symbols besides the handlers, e.g. {sorted(other.items())[:10]}"


def test_import_qq_then_torch():
    """qq imported first, then torch, then a qq call on a torch tensor, in a fresh
    interpreter: the crash happened in torch's import. It reproduces only where the toolchain
    links libstdc++ statically (the GPU machine's); elsewhere the two tests above are what
    would fail without the version script."""
    pytest.importorskip("torch")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(qq.__file__)))
    code = ("import qq, torch\n"
            f"assert qq.__file__ == {qq.__file__!r}, qq.__file__\n"
            "x = torch.linspace(-3, 3, 64).reshape(2, 32)\n"
            "assert float(qq.amax(x)) == 3.0\n"
            "assert qq.dequantize(qq.quantize(x, mode='mxfp8')).shape == (2, 32)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([pkg, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}"
