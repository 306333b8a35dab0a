"""The CUDA emulator's precompiled header (``kumiko.runtime.pch``): built once per config into the cache, used
by every later build of that config whatever its kernel or macros, rebuilt when damaged, and never the
reason for a different answer."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kumiko.runtime import pch
from kumiko.runtime.emu import build

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")

SRC = ('#include "kumiko_cuda.cuh"\n'
       'extern "C" __global__ void scale(float* x, int n) {\n'
       '  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
       '  if (i < n) x[i] = x[i] * SCALE + OFFSET;\n'
       '}\nKUMIKO_ENTRY(scale)\n')


def _run(scale: float, offset: float, **kw) -> None:
    mod = build(SRC.replace("OFFSET", f"{offset}f"), name="scale", defines={"SCALE": f"{scale}f"}, **kw)
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    want = x * np.float32(scale) + np.float32(offset)
    mod.launch("scale", 4, 32, args=[x, 100])
    np.testing.assert_array_equal(x, want)


@pytest.fixture
def counts(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    monkeypatch.setattr(pch, "STATS", {"built": 0, "used": 0})
    return pch.STATS


def test_one_header_serves_every_kernel_and_macro_of_a_config(counts, tmp_path):
    _run(2.0, 1.0)
    assert counts == {"built": 1, "used": 1}
    _run(3.0, -1.0)                                 # another kernel, another -DSCALE: the same header
    assert counts == {"built": 1, "used": 2}
    assert len(list((tmp_path / "emu").glob("pch-*.gch"))) == 1
    assert len(list((tmp_path / "emu").glob("*.so"))) == 2
    _run(2.0, 0.5, extra_flags=["-O2"])             # other flags that reach the header: one of their own
    assert counts == {"built": 2, "used": 3}


def test_a_damaged_header_is_built_again(counts, tmp_path):
    _run(2.0, 1.0)
    (gch,) = (tmp_path / "emu").glob("pch-*.gch")
    data = bytearray(gch.read_bytes())
    data[len(data) // 2] ^= 0xFF
    gch.unlink()                                    # a new file (publish_entry never writes in place)
    gch.write_bytes(bytes(data))
    _run(4.0, 1.0)
    assert counts == {"built": 2, "used": 2}
    _run(5.0, 1.0)
    assert counts == {"built": 2, "used": 3}


def test_a_header_that_does_not_build_is_left_out(counts, monkeypatch):
    monkeypatch.setattr(pch, "_build", lambda *a: False)
    _run(2.0, 1.0)
    assert counts == {"built": 0, "used": 0}


def test_an_edited_emulator_header_makes_a_new_library_and_header(counts, tmp_path, monkeypatch):
    """The headers are read once per build, for the library's key and the precompiled header's: a change to
    any of them (here a comment appended to a copy of ``kumiko_cuda.cuh``) gives both new keys, so nothing
    built from the old text is loaded."""
    from kumiko.runtime import emu
    inc = tmp_path / "include"
    shutil.copytree(emu.INCLUDE_DIR, inc)
    monkeypatch.setattr(emu, "INCLUDE_DIR", inc)
    _run(2.0, 1.0)
    with open(inc / "kumiko_cuda.cuh", "a") as f:
        f.write("\n/* edited */\n")
    _run(2.0, 1.0)
    assert counts == {"built": 2, "used": 2}
    assert len(list((tmp_path / "emu").glob("*.so"))) == 2
