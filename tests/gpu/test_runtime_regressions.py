"""Regression tests for the CUDA runtimes (found by the whole-network ONNX tests), on the emulator and
through ``CudaProgram`` (the real-GPU runner, driven by the emulator's launches):

- every region names its accumulator scratch ``a_out``; both runtimes kept one array per name, so a later,
  larger contraction wrote past an earlier, smaller one's array (an out-of-bounds write; on a GPU, silent);
- a run-time gather index made CUDA kernels that did not build (``kk_bad`` undeclared); the kernels now
  check the index and report an out-of-range one through a status word (E1015, as on the CPU).
"""
from __future__ import annotations

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import bound, rel_l2
from kumiko.diagnostics import KumikoError
from kumiko.pipeline import compile_cuda
from kumiko.runtime.cuda_program import CudaProgram

from .conftest import needs_gxx
from .test_runtime_cuda import EmuLaunches

pytestmark = needs_gxx

TWO_CONTRACTIONS = """
graph main(a: f16[1, 2, 8], b: f16[8, 2], c: f16[1, 8, 8], d: f16[8, 8])
    -> (y: f16[1, 2, 2], z: f16[1, 8, 8]) { y = a @ b; z = c @ d; return y, z }
"""
GATHER = """
graph main(table: f32[4, 3], ids: i32[2]) -> (y: f32[2, 3]) {
    y = gather(table, ids, axis=0, mode="take"); return y }
"""


def _load(tmp_path, text: str):
    p = tmp_path / "g.kumiko"
    p.write_text(text)
    return kumiko.load(p)


def _gpu_runner(g) -> CudaProgram:
    c = compile_cuda(g.tiny)
    be = EmuLaunches(c.module("deferred"))   # loaded in this process: not the ASan build
    return CudaProgram(c, be, be.functions({ln.kernel for ln in c.launches}))


def test_each_region_has_its_own_accumulator_scratch(tmp_path, gpu_cache):
    g = _load(tmp_path, TWO_CONTRACTIONS)
    ref = kumiko.compile(g, "eval")
    ins = ref.random_inputs(1)
    want = ref(**ins)
    for run in (lambda: kumiko.compile(g, "cuda-emu", emu="asan")(**ins),
                lambda: _gpu_runner(g)(ins, ref.bind(ins))):
        got = run()
        assert all(rel_l2(got[k], want[k]) <= bound("fp16") for k in want)


def test_a_run_time_gather_builds_and_reports_a_bad_index(tmp_path, gpu_cache):
    g = _load(tmp_path, GATHER)
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    good, bad = np.array([3, 1], np.int32), np.array([3, 7], np.int32)
    exe = kumiko.compile(g, "cuda-emu")
    np.testing.assert_array_equal(exe(table=table, ids=good)["y"], table[[3, 1]])
    with pytest.raises(KumikoError) as e:
        exe(table=table, ids=bad)
    assert e.value.code == "E1015"
    prog = _gpu_runner(g)
    np.testing.assert_array_equal(prog({"table": table, "ids": good}, {})["y"], table[[3, 1]])
    with pytest.raises(KumikoError) as e:
        prog({"table": table, "ids": bad}, {})
    assert e.value.code == "E1015"
    np.testing.assert_array_equal(prog({"table": table, "ids": good}, {})["y"], table[[3, 1]])  # reset per run


def test_emulated_modules_give_their_thread_stacks_back():
    """Fiber stacks stayed mapped per loaded module (two mappings per thread of its largest block): a few
    hundred emulated programs in one process hit the mapping limit. Now a module keeps a handful."""
    def mappings() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    from kumiko import Tensor
    before = None
    for k in range(3):
        x = Tensor.input("x", (300, 5 + k))                 # 256-thread blocks: 512 mappings of stacks each
        exe = kumiko.compile((x.relu() * (k + 2)).sum(1).graph("y"), "cuda-emu")
        xv = np.random.default_rng(k).standard_normal((300, 5 + k), dtype=np.float32)
        np.testing.assert_allclose(exe(x=xv)["y"], np.maximum(xv, 0).sum(1) * (k + 2), rtol=1e-5)
        if before is None:
            before = mappings()
    assert mappings() - before < 100
