"""The GPU IR verifier: the async-token discipline of the MMA skeleton and the plan's resource budget.

The ring's correctness is a property of the statement order, so the verifier *runs* the schedule for a
few K-tile counts (1, 2, stages, stages + 1, 2 * stages + 1) on an abstract machine that tracks, per
K tile, which cp.async group carries it, when a ``WaitGroup`` lands it, when a ``Barrier`` makes it
visible to every warp, which stage holds which tile, and which stages were read since the last barrier.
It rejects (E1801, ``details["hazard"]`` says which):

- ``unwaited_token``: a ``Compute`` reads a tile whose TokLoad no wait has delivered (missing wait, or a
  wait that leaves too many groups pending);
- ``no_barrier_after_wait``: the tile landed for this thread but no barrier made other threads' copies
  visible before the read;
- ``stage_not_released``: a ``LoadTile`` refills a stage that warps read with no barrier in between
  (missing trailing barrier), or that holds a tile not yet consumed;
- ``stale_stage``: a ``Compute`` reads a stage that holds another tile;
- ``fragment_order``: with fragments double-buffered (``LoadFrag`` / ``MmaFrag``), an MMA on a register buffer
  no ldmatrix filled, an ldmatrix over fragments not yet multiplied, or a k16 step of some tile multiplied
  other than exactly once;
- ``token_flow``: the epilogue / store do not consume the tokens the MMA / epilogue produce;
- ``epilogue_smem``: an epilogue that reuses the ring's shared memory starts before every group landed
  and a barrier passed;
- ``split_k``: a K split whose partial sums cannot be summed: the epilogue is not on the accumulator fragments (a
  window epilogue reads the tile through shared memory), fewer than 2 splits, or the workspace or counters are
  not kernel parameters;
- ``smem_budget``, ``register_budget``, ``shape``: the plan does not fit the arch or the MMA shape.

The emulator catches the same bugs at run time; the verifier catches them before any code exists.
"""
from __future__ import annotations

from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import Barrier, CommitGroup, Compute, KLoop, LoadFrag, LoadTile, MmaFrag, MmaKernel, WaitGroup
from kumiko.plan.gpu import MAX_REGISTERS, SMEM_LIMIT


def _fail(k: MmaKernel, hazard: str, why: str, suggestion: str | None = None) -> KumikoError:
    return KumikoError("E1801", at=f"gpu kernel {k.name}", why=why, suggestion=suggestion, hazard=hazard)


def check_shape(k: MmaKernel) -> None:
    bm, bn, bk = k.tile
    wm, wn = k.warp_tile
    if bm % k.warps[0] or bn % k.warps[1] or wm % 16 or wn % 16 or bk % 16:
        raise _fail(k, "shape", f"tile {k.tile} with warp tile {wm}x{wn}: warp tiles must be multiples of 16x16 "
                    "(m16n8k16, B fragments two n8 tiles at a time) and BK a multiple of 16")
    if not 2 <= k.stages <= 4:
        raise _fail(k, "shape", f"{k.stages} stages: the ring needs 2 to 4")
    for ring in k.rings:
        chunks = ring.rows * ring.cols // 8
        if ring.cols % 8 or chunks % k.threads or k.threads % (ring.cols // 8):
            raise _fail(k, "shape", f"{ring.name}: {ring.rows}x{ring.cols} halves is not a whole number of 16-byte "
                        f"chunks per thread, or {k.threads} threads do not cover whole rows of {ring.cols // 8} chunks")
    if k.epilogue.mode == "smem_window" and (k.m_rows % k.epilogue.window or not 0 < k.m_rows <= bm):
        raise _fail(k, "shape", f"a tile's {k.m_rows} output rows (BM={bm}) are not whole windows of "
                    f"{k.epilogue.window} rows within the tile")
    if k.m_step and k.epilogue.mode != "smem_window":
        raise _fail(k, "shape", f"m_step={k.m_step}: only a window epilogue starts M tiles other than BM apart")


def check_budget(k: MmaKernel) -> None:
    limit = SMEM_LIMIT.get(k.arch)
    if limit is None:
        raise _fail(k, "shape", f"arch {k.arch!r} has no MMA skeleton (sm80, sm90)")
    if k.smem_bytes > limit:
        raise _fail(k, "smem_budget", f"the ring needs {k.smem_bytes} bytes of shared memory, {k.arch} has {limit}",
                    suggestion="use fewer stages or a smaller tile")
    regs = k.estimated_registers()
    if regs > min(k.regs_budget, MAX_REGISTERS):
        raise _fail(k, "register_budget", f"about {regs} registers per thread (accumulators of a "
                    f"{k.warp_tile[0]}x{k.warp_tile[1]} warp tile), budget {min(k.regs_budget, MAX_REGISTERS)}",
                    suggestion="use a smaller warp tile")


class _Machine:
    """Abstract state of one thread's view of the ring (all threads run the same schedule)."""

    def __init__(self, k: MmaKernel, kt_count: int):
        self.k, self.kt_count = k, kt_count
        self.groups: list[set] = []          # committed, not yet landed
        self.open: set = set()
        self.landed: set = set()
        self.visible: set = set()
        self.stage: dict[int, int] = {}     # stage -> tile it holds (issued)
        self.consumed: set = set()
        self.read_since_barrier: set = set()
        self.steps = k.tile[2] // 16            # k16 steps per tile
        self.frags: dict[int, tuple] = {}       # register buffer -> (tile, step) loaded, not yet multiplied
        self.done: list[tuple] = []             # (tile, step) multiplied, in order

    def read(self, t: int, tokens: tuple, what: str) -> int:
        """A read of tile ``t``'s stage: it must have landed, be visible to every thread, and hold tile t."""
        k = self.k
        st = t % k.stages
        for ld in k.loads:
            key = (t, ld.operand)
            if key not in self.landed and key not in self.visible:
                raise _fail(k, "unwaited_token", f"{what} reads tile {t} of {ld.operand} (token "
                            f"{tokens[0].name if tokens else '?'}[{t}]) before a wait delivers it "
                            f"(KT={self.kt_count}, {len(self.groups)} groups pending)",
                            suggestion=f"wait_group {k.stages - 1} before the tile's first read")
            if key not in self.visible:
                raise _fail(k, "no_barrier_after_wait", f"tile {t} of {ld.operand} landed but no barrier "
                            "made the other threads' copies visible before the read")
        if self.stage.get(st) != t:
            raise _fail(k, "stale_stage", f"{what} reads tile {t} from stage {st}, which holds tile "
                        f"{self.stage.get(st)}")
        self.read_since_barrier.add(st)
        return st

    def run(self, stmts, kt: int | None) -> None:
        k = self.k
        for s in stmts:
            if isinstance(s, LoadTile):
                t = s.tile.at(kt if kt is not None else 0)
                if t >= self.kt_count:
                    continue
                st = t % k.stages
                if st in self.read_since_barrier:
                    raise _fail(k, "stage_not_released", f"tile {t} refills stage {st} while warps may still read "
                                f"it (no barrier since its last read, KT={self.kt_count})",
                                suggestion="put a Barrier('release') between the Compute and the LoadTile")
                old = self.stage.get(st)
                if old is not None and old not in self.consumed:
                    raise _fail(k, "stage_not_released", f"tile {t} overwrites tile {old} in stage {st} before it "
                                f"is computed on (KT={self.kt_count})")
                self.stage[st] = t
                for ld in k.loads:
                    if ld.vec is None:              # a gather's stores land at once (still need a barrier)
                        self.landed.add((t, ld.operand))
                    else:
                        self.open.add((t, ld.operand))
            elif isinstance(s, CommitGroup):
                self.groups.append(self.open)
                self.open = set()
            elif isinstance(s, WaitGroup):
                keep = self.groups[max(0, len(self.groups) - s.pending):] if s.pending else []
                for g in self.groups[:len(self.groups) - len(keep)]:
                    self.landed |= g
                self.groups = keep
            elif isinstance(s, Barrier):
                self.visible |= self.landed
                self.read_since_barrier = set()
            elif isinstance(s, Compute):
                t = s.tile.at(kt)
                self.read(t, s.in_tokens, "Compute")
                self.consumed.add(t)
                self.done += [(t, j) for j in range(self.steps)]
            elif isinstance(s, LoadFrag):
                t = s.tile.at(kt if kt is not None else 0)
                if t >= self.kt_count:
                    continue
                if s.buf in self.frags:
                    raise _fail(k, "fragment_order", f"ldmatrix of tile {t} step {s.kstep} into register buffer "
                                f"{s.buf} overwrites tile {self.frags[s.buf][0]} step {self.frags[s.buf][1]} before "
                                f"its MMAs (KT={self.kt_count})")
                self.read(t, s.in_tokens, f"ldmatrix of step {s.kstep}")
                self.frags[s.buf] = (t, s.kstep)
                if s.kstep == self.steps - 1:
                    self.consumed.add(t)
            elif isinstance(s, MmaFrag):
                if s.buf not in self.frags:
                    raise _fail(k, "fragment_order", f"mma.sync on register buffer {s.buf}, which no ldmatrix "
                                f"filled since its last MMAs (KT={self.kt_count})")
                self.done.append(self.frags.pop(s.buf))
            elif isinstance(s, KLoop):
                for it in range(self.kt_count):
                    self.run(s.body, it)


def check_schedule(k: MmaKernel) -> None:
    computes = [s for s in k.loop.body if isinstance(s, Compute)]
    split = [s for s in k.loop.body if isinstance(s, (LoadFrag, MmaFrag))]
    if len(computes) + bool(split) != 1:
        raise _fail(k, "shape", "the K loop must compute exactly one tile per iteration (one Compute, or "
                    "LoadFrag / MmaFrag steps)")
    for kt_count in sorted({1, 2, k.stages, k.stages + 1, 2 * k.stages + 1}):
        m = _Machine(k, kt_count)
        m.run(k.prologue, None)
        m.run((k.loop,), None)
        missing = set(range(kt_count)) - m.consumed
        if missing:
            raise _fail(k, "unwaited_token", f"tiles {sorted(missing)} are never computed (KT={kt_count})")
        want = [(t, j) for t in range(kt_count) for j in range(m.steps)]
        if sorted(m.done) != want or m.frags:
            raise _fail(k, "fragment_order", f"k16 steps multiplied {sorted(m.done)}, want each of {want} once "
                        f"(KT={kt_count}; loaded, never multiplied: {sorted(m.frags.values())})")
        m.run(k.drain, None)
        if k.epilogue.mode == "smem_window":
            pending = [g for g in m.groups if g] + ([m.open] if m.open else [])
            if pending or not k.drain or not isinstance(k.drain[-1], Barrier):
                raise _fail(k, "epilogue_smem", "the epilogue reuses the ring's shared memory before every cp.async "
                            "group landed and a barrier passed", suggestion="end the drain with WaitGroup(0), Barrier")


def check_tokens(k: MmaKernel) -> None:
    stmts = k.prologue + k.loop.body
    consumed = {t for s in stmts if isinstance(s, (Compute, LoadFrag)) for t in s.in_tokens}
    outs = {s.out_token for s in stmts if isinstance(s, (Compute, MmaFrag))}
    produced = {s.out_token for s in stmts if isinstance(s, LoadTile)}
    if not consumed <= produced or any(t.kind != "TokLoad" for t in consumed):
        raise _fail(k, "token_flow", f"the MMAs consume {sorted(t.name for t in consumed)}, the loads produce "
                    f"{sorted(t.name for t in produced)}")
    if len(outs) != 1:
        raise _fail(k, "token_flow", f"the MMAs produce {sorted(t.name for t in outs)}, not one TokCompute")
    (out,) = outs
    if k.epilogue.in_token != out or out.kind != "TokCompute":
        raise _fail(k, "token_flow", f"the epilogue consumes {k.epilogue.in_token}, the MMA produces {out}")
    if k.store.in_token != k.epilogue.out_token or k.epilogue.out_token.kind != "TokEpilogue":
        raise _fail(k, "token_flow", f"the store consumes {k.store.in_token}, the epilogue produces "
                    f"{k.epilogue.out_token}")


def check_split(k: MmaKernel) -> None:
    sp = k.split
    if sp is None:
        return
    params = {p.name: p for p in k.params}
    ws, cnt = params.get(sp.workspace), params.get(sp.counters)
    if k.epilogue.mode != "fragment" or sp.splits < 2:
        raise _fail(k, "split_k", f"{sp.splits} K splits with a {k.epilogue.mode} epilogue: a split kernel sums "
                    "2 or more partial accumulators in registers, then runs a fragment epilogue")
    if ws is None or cnt is None or (ws.ctype, cnt.ctype) != ("float", "int") or not (ws.pointer and cnt.pointer):
        raise _fail(k, "split_k", f"the split's workspace {sp.workspace!r} (float*) and counters {sp.counters!r} "
                    "(int*) must be kernel parameters")


def verify_mma(k: MmaKernel) -> MmaKernel:
    """Raise E1801 (with ``hazard``) unless the kernel's schedule and budget are sound; return it."""
    check_shape(k)
    check_split(k)
    check_budget(k)
    check_tokens(k)
    check_schedule(k)
    return k
