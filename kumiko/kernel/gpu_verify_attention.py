"""The GPU IR verifier for the fused streaming attention kernel (``kumiko.kernel.gpu_attention``): its async-token
discipline and budgets, as ``gpu_verify`` checks the MMA skeleton's.

The schedule is run for 1 to 4 key blocks on an abstract machine (cp.async groups, landed and visible blocks,
stage contents per ring, reads since the last barrier, tokens); a double-buffered K or V stage is refilled only
after a barrier that follows every read of the block it held. The online softmax must rescale the running
output and sum whenever more than one key block can run.
"""
from __future__ import annotations

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_attention import AttentionKernel, LoadBlock, LoadQFrag, OnlineSoftmax, PvMma, ScoreMma
from kumiko.kernel.gpu_ir import Barrier, CommitGroup, WaitGroup
from kumiko.plan.gpu import MAX_REGISTERS, SMEM_LIMIT, WARP_ROWS


def _fail(k: AttentionKernel, hazard: str, why: str) -> KumikoError:
    return KumikoError("E1801", at=f"gpu kernel {k.name}", why=why, hazard=hazard)


def verify_attention(k: AttentionKernel) -> AttentionKernel:
    """Run the schedule for 1 to 4 key blocks on an abstract machine (cp.async groups, landed and visible blocks,
    stage contents, reads since the last barrier, tokens) and check the budgets; E1801 with
    ``details["hazard"]`` as ``gpu_verify``'s: ``unwaited_token``, ``no_barrier_after_wait``,
    ``stage_not_released``, ``stale_stage``, ``token_flow``, ``online_softmax`` (a loop over several key blocks
    without the rescale), ``smem_budget``, ``register_budget``, ``shape``."""
    bm, bn, bk = k.tile
    d, dv = k.head
    if bm % WARP_ROWS or bn % 16 or d % 16 or dv % 16 or bk != 16:
        raise _fail(k, "shape", f"tile {k.tile}, head dims {k.head}: BM a multiple of 16, BN, D, DV of 16")
    for r in k.rings:
        if (r.rows * r.cols // 8) % k.threads:
            raise _fail(k, "shape", f"{r.name}: {r.rows}x{r.cols} halves is not whole 16-byte chunks per thread")
    if k.smem_bytes > SMEM_LIMIT.get(k.arch, 0):
        raise _fail(k, "smem_budget", f"{k.smem_bytes} bytes of shared memory, {k.arch} has {SMEM_LIMIT.get(k.arch)}")
    if k.estimated_registers() > MAX_REGISTERS:
        raise _fail(k, "register_budget", f"about {k.estimated_registers()} registers per thread")
    for n in (1, 2, 3, 4):
        _Machine(k, n).run()
    return k


class _Machine:
    def __init__(self, k: AttentionKernel, blocks: int):
        self.k, self.n = k, blocks
        self.groups: list[set] = []
        self.open: set = set()
        self.landed: set = set()
        self.visible: set = set()
        self.stage: dict = {}              # (ring, stage) -> block it holds
        self.read: set = set()             # (ring, stage) read since the last barrier
        self.tokens: set = set()
        self.stages = {r.name: r.stages for r in k.rings}

    def run(self) -> None:
        self.stmts(self.k.prologue, None)
        for kt in range(self.n):
            self.tokens -= {"tS", "tP"}
            self.stmts(self.k.loop.body, kt)
        self.stmts(self.k.drain, None)
        if self.k.epilogue.in_token.name not in self.tokens and self.n:
            raise _fail(self.k, "token_flow", f"the epilogue consumes {self.k.epilogue.in_token.name}, which no MMA "
                        "produced")
        if self.n > 1 and not any(isinstance(s, OnlineSoftmax) and s.rescale for s in self.k.loop.body):
            raise _fail(self.k, "online_softmax", f"{self.n} key blocks: the running output and sum are not "
                        "rescaled when the row max grows, so earlier blocks keep a stale max")

    def read_block(self, ring: str, blk: int, why: str) -> None:
        key = (ring, blk % self.stages[ring])
        if (ring, blk) not in self.landed:
            raise _fail(self.k, "unwaited_token", f"{why} reads {ring} block {blk} before a wait delivers it")
        if (ring, blk) not in self.visible:
            raise _fail(self.k, "no_barrier_after_wait", f"{why} reads {ring} block {blk} with no barrier after its "
                        "wait (other threads' copies are not visible)")
        if self.stage.get(key) != blk:
            raise _fail(self.k, "stale_stage", f"{why} reads {ring} stage {key[1]}, which holds block "
                        f"{self.stage.get(key)}, not {blk}")
        self.read.add(key)

    def stmts(self, body, kt) -> None:  # noqa: C901 - one case per statement kind
        for s in body:
            if isinstance(s, LoadBlock):
                blk = s.tile.at(kt if kt is not None else 0)
                if s.ring != "sQ" and blk >= self.n:
                    continue
                key = (s.ring, blk % self.stages[s.ring])
                if key in self.read:
                    raise _fail(self.k, "stage_not_released", f"block {blk} of {s.ring} refills stage {key[1]} "
                                "that warps read with no barrier since")
                old = self.stage.get(key)
                if old is not None and (s.ring, old) not in self.landed:
                    raise _fail(self.k, "stage_not_released", f"block {blk} of {s.ring} refills a stage whose copy "
                                "has not landed")
                self.stage[key] = blk
                self.visible.discard((s.ring, blk))
                self.open.add((s.ring, blk))
            elif isinstance(s, CommitGroup):
                self.groups.append(self.open)
                self.open = set()
            elif isinstance(s, WaitGroup):
                keep = max(0, s.pending)
                done, self.groups = (self.groups[:len(self.groups) - keep], self.groups[len(self.groups) - keep:]) \
                    if keep else (self.groups, [])
                for g in done:
                    self.landed |= g
            elif isinstance(s, Barrier):
                self.visible |= self.landed
                self.read = set()
            elif isinstance(s, LoadQFrag):
                self.read_block("sQ", 0, "the Q fragments")
                self.tokens.add("tQf")
            elif isinstance(s, ScoreMma):
                if "tQf" not in self.tokens:
                    raise _fail(self.k, "token_flow", "S = Q K^T before the Q fragments are loaded")
                self.read_block("sK", s.tile.at(kt), "S = Q K^T")
                self.tokens.add(s.out_token.name)
            elif isinstance(s, OnlineSoftmax):
                if s.in_token.name not in self.tokens:
                    raise _fail(self.k, "token_flow", "the online softmax runs before S is computed")
                self.tokens.add(s.out_token.name)
            elif isinstance(s, PvMma):
                missing = [t.name for t in s.in_tokens if t.kind != "TokLoad" and t.name not in self.tokens]
                if missing:
                    raise _fail(self.k, "token_flow", f"O += P V consumes {missing}, not produced in this block")
                self.read_block("sV", s.tile.at(kt), "O += P V")
                self.tokens.add(s.out_token.name)
            else:
                raise TypeError(s)
