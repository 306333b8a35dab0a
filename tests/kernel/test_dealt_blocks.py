"""Where the plan splits M under pre-packed weights, the threads of a packed contraction take its M blocks as
they come (``kumiko.kernel.contract``, ``_dealt_blocks``; ``kk_take``: each thread its own share first, then
what is left of the others'), each block all of K and its epilogue on one thread. Checked against the
evaluator on 1-3 threads (a fresh process each, the kernels built with -DKUMIKO_TRACE_STAGE so that they count
the blocks taken): every block is taken once a call, at sizes with K blocks, two N blocks, a short last
block, a transposed epilogue. A block's C rows are the thread's own few (MC + MR rows a thread, not all of
M: the tile stays in L1/L2 until its epilogue, and a 112x112 conv no longer keeps megabytes of it)."""
import json
import os
import subprocess
import sys

import pytest

_CASES = r'''
import ctypes, json, re, numpy as np, kumiko
from kumiko import Tensor
from kumiko.runtime import cpu as cpu_rt
cpu_rt.DEFAULT_FLAGS = tuple(cpu_rt.DEFAULT_FLAGS) + ("-DKUMIKO_TRACE_STAGE",)
rng = np.random.default_rng(5)
def param(shape, name):
    return Tensor(rng.standard_normal(shape).astype(np.float32) * 0.1, name=name, role="param")
def conv(x, w, layout, padding):
    return Tensor._record("Conv2D", (x, w), stride=[1, 1], padding=[padding] * 2, dilation=[1, 1], groups=1,
                          x_layout=layout, y_layout=layout)
graphs = {
    # M 203 (a short last block), K 300 (two K blocks), N 72
    "linear": (Tensor.input("x", (203, 300)) @ param((300, 72), "w") + param((72,), "b")).relu(),
    # two N blocks (NC 2048): the threads meet between them and take the second one's blocks afresh
    "wide": Tensor.input("x", (2200, 64)) @ param((64, 2100), "w"),
    # the output's innermost axis on the M side: the epilogue runs down the columns
    "transposed": (Tensor.input("x", (203, 300)) @ param((300, 72), "w")).relu().permute((1, 0)),
    # channels-last 3x3: A read from the padded stage, the residual in the epilogue (odd sizes: not Winograd)
    "conv_nhwc": (conv(Tensor.input("x", (1, 27, 27, 16)), param((24, 16, 3, 3), "w"), "channels_last", 1)
                  + Tensor.input("r", (1, 27, 27, 24))).relu(),
}
out = {}
for name, y in graphs.items():
    g = y.graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    counter = ctypes.c_longlong.in_dll(exe._run.module.lib, "kk_dealt")
    plan = next(iter(exe._run.plans.values()))
    for seed in (0, 1):
        ins = exe.random_inputs(seed)
        counter.value = 0
        a, b = np.asarray(exe(**ins)["y"], np.float64), np.asarray(ref(**ins)["y"], np.float64)
        assert np.linalg.norm(a - b) <= 2e-5 * np.linalg.norm(b), name
    out[name] = {"dealt": counter.value, "mr": plan.register_block[0], "nr": plan.register_block[1],
                 "mc": plan.cache_block[0],
                 "pre": "kk_take(" in exe._run.source,
                 "c_rows": re.search(r"kk_scratch\(0, sizeof\(float\) \* \(size_t\)\((?:kk_T|kk_nbuf) \* (\w+) \* "
                                     r"kk_ldc\)\)", exe._run.source).group(1)}
print(json.dumps(out))
'''


def _run(threads: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", _CASES], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _blocks(rows: int, mr: int, mc: int, threads: int) -> int:
    """The M blocks of ``rows`` rows the kernel deals to ``threads`` threads: of at most MC rows, as even as
    MR allows, and at least 4 a thread where MC permits (``DYN_BLOCKS``)."""
    mp = (rows + mr - 1) // mr * mr
    nmb = (mp + mc - 1) // mc
    even = ((mp + nmb - 1) // nmb + mr - 1) // mr * mr
    dealt = (mp // (4 * threads) + mr - 1) // mr * mr
    size = max(mr, min(dealt, even))
    return (mp + size - 1) // size


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_threads_deal_the_m_blocks(threads):
    got = _run(threads)
    t = int(threads)
    for name, r in got.items():
        assert r["pre"], name              # weights bound: B pre-packed, the dealing code is there
        assert r["c_rows"] == str(r["mc"] + r["mr"]), (name, r)     # C rows of one block a thread
        if t == 1:
            assert r["dealt"] == 0, name    # one thread walks its own range
    if t == 1:
        return
    mr, mc = got["linear"]["mr"], got["linear"]["mc"]
    # each block taken exactly once a call, in each N block
    assert got["linear"]["dealt"] == _blocks(203, mr, mc, t)
    assert got["wide"]["dealt"] == 2 * _blocks(2200, mr, mc, t)
    assert got["transposed"]["dealt"] == _blocks(203, mr, mc, t)
    assert got["conv_nhwc"]["dealt"] == _blocks(27 * 27, got["conv_nhwc"]["mr"], got["conv_nhwc"]["mc"], t)
