"""The seven bug kinds of the emulator feasibility study, injected into a generated kernel by mutating
its GPU IR (never the renderer or the emulator). Shared by the tests and by docs/cuda.md's table."""
from __future__ import annotations

from dataclasses import replace

from kumiko.kernel.gpu_ir import Barrier, Compute, KLoop, LoadTile, MmaKernel, WaitGroup


def _loads(k: MmaKernel, **kw) -> MmaKernel:
    def fix(body):
        return tuple(replace(s, **kw) if isinstance(s, LoadTile) else s for s in body)
    return replace(k, prologue=fix(k.prologue), loop=KLoop(k.loop.var, fix(k.loop.body)))


def _body(k: MmaKernel, f) -> MmaKernel:
    return replace(k, loop=KLoop(k.loop.var, tuple(x for s in k.loop.body for x in f(s))))


BUGS = {
    "missing_wait": lambda k: _body(k, lambda s: () if isinstance(s, WaitGroup) else (s,)),
    "wrong_wait_depth": lambda k: _body(k, lambda s: (replace(s, pending=k.stages),) if isinstance(s, WaitGroup)
                                        else (s,)),
    "missing_trailing_barrier": lambda k: _body(k, lambda s: () if isinstance(s, Barrier) and s.why == "release"
                                                else (s,)),
    "missing_row_predicate": lambda k: _loads(k, pred_rows=False),
    "missing_k_predicate": lambda k: _loads(k, pred_k=False),
    "wrong_ldmatrix_lane_address": lambda k: _body(k, lambda s: (replace(s, lda=replace(s.lda, row_lanes=8)),)
                                                   if isinstance(s, Compute) else (s,)),
    "missing_epilogue_column_check": lambda k: replace(k, store=replace(k.store, pred_cols=False)),
}
#: bugs the GPU IR verifier rejects before any code exists (the others are address/predicate bugs)
VERIFIER_HAZARD = {"missing_wait": "unwaited_token", "wrong_wait_depth": "unwaited_token",
                   "missing_trailing_barrier": "stage_not_released"}
#: GEMM sizes of the study: M, N not tile multiples, N and K multiples of 8 (cp.async rows aligned)
SIZES = {"M": 200, "N": 136, "K": 200}
