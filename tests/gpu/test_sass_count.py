"""bench/sass_count.py: its SASS walk on a hand-written kernel (a K loop whose copy block is laid out after
the loop, a drain, an epilogue with a pair-store branch), and its run without nvdisasm."""
from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest

from .conftest import EXAMPLES

SCRIPT = EXAMPLES.parent / "bench" / "sass_count.py"


@pytest.fixture(scope="module")
def sass_count():
    spec = importlib.util.spec_from_file_location("kumiko_sass_count", SCRIPT)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def _sass(*lines: str) -> str:
    out, addr = [], 0
    for ln in lines:
        if ln.endswith(":"):
            out.append(ln)
        else:
            out.append(f"        /*{addr:04x}*/                   {ln} ;")
            addr += 16
    return "\n".join(out)


KERNEL = _sass(
    "S2R R0, SR_TID.X",
    ".L_x_0:",                                   # the K loop's head
    "ISETP.GE.AND P0, PT, R1, R2, PT",
    "BAR.SYNC.DEFER_BLOCKING 0x0",
    "@P0 BRA `(.L_x_1)",                         # past K: no copy
    "BRA `(.L_x_2)",                             # the copy block, laid out after the loop
    ".L_x_1:",
    "LDSM.16.M88.4 R4, [R3]",
    "HMMA.16816.F32 R8, R4, R6, R8",
    "HMMA.16816.F32 R12, R4, R6, R12",
    "IADD3 R1, R1, 0x1, RZ",
    "ISETP.NE.AND P1, PT, R1, R5, PT",
    "@P1 BRA `(.L_x_0)",                         # the back edge
    "DEPBAR.LE SB0, 0x0",                        # the drain
    "F2FP.F16.F32.PACK_AB R20, R9, R8",
    "@P2 BRA `(.L_x_3)",
    "STG.E.U16 desc[UR4][R30.64], R20",          # one element at a time
    "STG.E.U16 desc[UR4][R32.64], R21",
    "EXIT",
    ".L_x_3:",
    "STG.E desc[UR4][R30.64], R20",              # the pair
    "EXIT",
    ".L_x_2:",
    "@!PT LDS RZ, [RZ]",
    "LDGSTS.E.BYPASS.128 [R7], desc[UR6][R10.64], P1",
    "LDGSTS.E.BYPASS.128 [R7+0xa00], desc[UR6][R12.64], P2",
    "BRA `(.L_x_1)")


def test_walk_counts_the_copying_iteration_and_the_pair_store_path(sass_count):
    s = sass_count.Sass.parse(KERNEL)
    c = sass_count.k_loop(s)
    # ISETP (the head), BAR, @P0 BRA, BRA, NOP, 2 LDGSTS, BRA, LDSM, 2 HMMA, IADD3, ISETP, @P1 BRA
    assert (c["HMMA"], c["LDSM"], c["LDGSTS"], c["NOP"], c["other"]) == (2, 1, 2, 1, 8), c
    assert sass_count.epilogue(s) == (1, 5)      # DEPBAR, F2FP, @P2 BRA, STG.E, EXIT


def test_without_nvdisasm_it_says_so(sass_count, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert sass_count.main(["--tiles", "64x64x32/32x32/3"]) == 2
    assert "no nvdisasm" in capsys.readouterr().err


def test_an_unknown_workload_is_refused(sass_count, capsys):
    assert sass_count.main(["--workload", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no workload 'nope'" in err and "conv3x3" in err


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvdisasm") is None or shutil.which("nvcc") is None, reason="needs nvcc and nvdisasm")
def test_counts_the_generated_gemm(sass_count, capsys):
    assert sass_count.main(["--tiles", "128x128x32/64x64/4/g8/merged", "--arch", "sm_90a"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split("|")
    assert [c.strip() for c in row[4:7]] == ["64", "16", "8"]      # HMMA, LDSM, LDGSTS per warp and K tile
