"""The SM90 GPU IR verifier: mbarrier phases, TMA transaction bytes, wgmma groups, the async proxy, ring stages.

Like the SM80 verifier (``gpu_verify``) it *runs* the schedule, here for every combination of the kernel's
``verify_sizes`` (K-tile counts 1, 2, S, S + 1, 2S + 1 for a ring), on an abstract machine: each ``Role``
(warp specialisation) is a coroutine, the rest of the kernel one role of all its threads; an ``Elect`` body
arrives as one thread. mbarriers count arrivals and transaction bytes per phase; a TMA load delivers its
box's bytes to its barrier at once (the order of delivery does not change which phase it belongs to). It
raises E1801 with ``details["hazard"]``:

- ``mbar_parity``: a role's wait observes a phase it already observed, or skips one (a wrong parity);
- ``expect_tx``: the bytes ``arrive.expect_tx`` announced for a phase differ from what the TMA loads
  signalling that barrier deliver;
- ``mbar_deadlock``: every role waits on a barrier phase that cannot complete (arrivals missing);
- ``mbar_overarrive`` / ``mbar_init``: more arrivals than the barrier's count, a barrier never initialised;
- ``unwaited_tma``: wgmma (or a TMA store) reads a stage whose TMA load no wait of the reading role observed;
- ``desc_swizzle``: a wgmma descriptor's swizzle differs from the tensor map's that filled the buffer;
- ``acc_in_flight``: an accumulator read or written before ``wgmma.wait_group`` retired its group (or never), or A
  registers rewritten while a wgmma reading them is in flight;
- ``wgmma_fence``: ``wgmma.mma_async`` on accumulators with no ``wgmma.fence`` since they were last accessed;
- ``proxy_fence``: shared memory written by threads' stores read by a TMA store or wgmma without a
  ``fence.proxy.async`` in between; ``no_barrier``: ... or without a barrier after other threads wrote it;
- ``stage_not_released``: a TMA load refills a stage its consumers did not release (the producer did not
  observe the empty barrier's phase for it, or a wgmma reading it is in flight); ``release_in_flight``: a
  consumer arrives on the empty barrier before its wgmma reading the stage retired;
- ``bulk_not_waited``, ``bulk_source_reused``: a TMA store group never waited for, its source overwritten first;
- ``setmaxnreg``, ``register_budget``, ``smem_budget``, ``smem_align``, ``shape``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kumiko.kernel import gpu_ir_sm90 as ir
from kumiko.kernel.gpu_verify import _fail
from kumiko.plan.gpu import SMEM_LIMIT

_REPEAT = {"none": 16, "32B": 256, "64B": 512, "128B": 1024}  # the swizzle pattern's repeat (bytes)


@dataclass
class _Bar:
    name: str
    count: int
    pending: int
    tx: int = 0
    phase: int = 0                               # completed phases
    expect: dict = field(default_factory=dict)   # phase -> bytes announced
    delivered: dict = field(default_factory=dict)


@dataclass
class _Role:
    name: str
    threads: int
    regs: int
    observed: dict = field(default_factory=dict)  # barrier -> last observed phase
    open: list = field(default_factory=list)      # wgmma ops (acc, keys) not committed
    groups: list = field(default_factory=list)
    fenced: bool = False
    bulk_open: list = field(default_factory=list)
    bulk_groups: list = field(default_factory=list)

    def in_flight(self) -> list:
        return self.open + [op for g in self.groups for op in g]


@dataclass
class _Block:
    ready: object                                  # () -> bool
    what: str


class _Machine:
    def __init__(self, k: ir.Sm90Kernel, env: dict):
        self.k, self.env = k, env
        self.bars: dict = {}
        self.fills: dict = {}                      # (buf, stage) -> {byte offset: (barrier key, phase, map)}
        self.nfills: dict = {}                     # (buf, stage, byte offset) -> TMA loads so far
        self.dirty: dict = {}                      # (buf, stage) -> {"fenced": bool, "synced": bool}
        self.read_since_sync: set = set()
        self.ring_of = {b: r for r in k.rings for b in r.buffers}
        self.where = ""

    def fail(self, hazard: str, why: str, suggestion: str | None = None):
        return _fail(self.k, hazard, f"{why} ({self.where})", suggestion)

    def bar(self, ref, env) -> tuple:
        key = (ref.name, ref.index.eval(env))
        if key not in self.bars:
            raise self.fail("mbar_init", f"{key[0]}[{key[1]}] is used but never initialised")
        return key

    def tx_mismatch(self, key) -> str:
        b = self.bars[key]
        for ph in sorted(set(b.expect) | set(b.delivered)):
            e, d = b.expect.get(ph, 0), b.delivered.get(ph, 0)
            if e != d:
                return (f"phase {ph} of {key[0]}[{key[1]}]: arrive.expect_tx announced {e} bytes, the TMA loads "
                        f"signalling it delivered {d}")
        return ""

    def complete(self, key) -> None:
        b = self.bars[key]
        while b.pending == 0 and b.tx == 0:
            b.phase += 1
            b.pending = b.count

    def arrive(self, key, n: int) -> None:
        b = self.bars[key]
        b.pending -= n
        if b.pending < 0:
            raise self.fail("mbar_overarrive", f"{n} arrivals on {key[0]}[{key[1]}] exceed its count {b.count} in "
                            f"phase {b.phase}")
        self.complete(key)

    def observe(self, role: _Role, key, observed: int, parity: int) -> None:
        last = role.observed.get(key)
        ok = observed in (-1, 0) if last is None else observed == last + 1
        if not ok:
            want = 0 if last is None else last + 1
            raise self.fail("mbar_parity", f"role {role.name} waits on {key[0]}[{key[1]}] with parity {parity} and "
                            f"observes phase {observed}, but the phase it waits for next is {want} (parity {want & 1})",
                            suggestion="wait with parity (use / stages) & 1 of the barrier's use count")
        role.observed[key] = observed

    def check_read(self, role: _Role, key, what: str, desc: ir.MatDesc | None = None) -> None:
        d = self.dirty.get(key)
        if d is not None:
            if not d["fenced"]:
                raise self.fail("proxy_fence", f"{what} reads {key[0]}[{key[1]}], which threads wrote with ordinary "
                                "stores and no fence.proxy.async since",
                                suggestion="fence.proxy.async after the stores")
            if not d["synced"]:
                raise self.fail("no_barrier", f"{what} reads {key[0]}[{key[1]}], which other threads wrote, with no "
                                "barrier since", suggestion="a __syncthreads (or named barrier) after the fence")
            return
        if not self.fills.get(key):
            raise self.fail("unwaited_tma", f"{what} reads {key[0]}[{key[1]}], which nothing filled")
        for bkey, phase, tmap in self.fills[key].values():
            if role.observed.get(bkey, -2) < phase:
                why = self.tx_mismatch(bkey)
                if why:
                    raise self.fail("expect_tx", why, suggestion="announce exactly the boxes' bytes")
                raise self.fail("unwaited_tma", f"{what} reads {key[0]}[{key[1]}], whose TMA load completes phase "
                                f"{phase} of {bkey[0]}[{bkey[1]}], but role {role.name} observed only phase "
                                f"{role.observed.get(bkey, 'none')}", suggestion="mbar_wait with that phase's parity")
            if desc is not None and desc.swizzle != tmap.swizzle:
                raise self.fail("desc_swizzle", f"{what}: the descriptor of {key[0]} says {desc.swizzle} swizzle, the "
                                f"tensor map {tmap.name} that filled it {tmap.swizzle}")
        self.read_since_sync.add(key)

    # -- statements ------------------------------------------------------------------------------
    def run(self, stmts, env: dict, role: _Role, threads: int):
        for s in stmts:
            self.where = f"{type(s).__name__} in role {role.name}, " + ", ".join(f"{v}={x}" for v, x in env.items())
            if isinstance(s, ir.For):
                for i in range(s.start.eval(env), s.stop.eval(env)):
                    yield from self.run(s.body, {**env, s.var: i}, role, threads)
            elif isinstance(s, ir.If):
                if s.cond.eval(env):
                    yield from self.run(s.body, env, role, threads)
            elif isinstance(s, ir.Let):
                try:
                    env = {**env, s.var: s.value.eval(env)}
                except KeyError:
                    pass        # a value of sizes the schedule does not depend on (a tile's coordinates)
            elif isinstance(s, ir.Elect):
                yield from self.run(s.body, env, role, 1)
            elif isinstance(s, ir.Roles):
                yield from self.roles(s, env)
            elif isinstance(s, ir.MbarInit):
                key = (s.bar.name, s.bar.index.eval(env))
                self.bars[key] = _Bar(f"{key[0]}[{key[1]}]", s.count, s.count)
            elif isinstance(s, (ir.MbarArrive, ir.MbarArriveTx)):
                key = self.bar(s.bar, env)
                if isinstance(s, ir.MbarArriveTx):
                    b = self.bars[key]
                    b.expect[b.phase] = b.expect.get(b.phase, 0) + s.bytes
                    b.tx += s.bytes
                self.release_check(role, key)
                self.arrive(key, threads)
            elif isinstance(s, ir.MbarWait):
                key, parity = self.bar(s.bar, env), s.parity.eval(env) & 1
                b = self.bars[key]
                if ((b.phase - 1) & 1) != parity:
                    target = b.phase + 1
                    last = role.observed.get(key)
                    want = 0 if last is None else last + 1
                    if want < b.phase:  # the phase it should wait for completed: this parity skips it
                        raise self.fail("mbar_parity", f"role {role.name} waits on {key[0]}[{key[1]}] with parity "
                                        f"{parity}, i.e. for phase {b.phase}, but the phase it waits for next is "
                                        f"{want} (parity {want & 1}), which has completed",
                                        suggestion="wait with parity (use / stages) & 1 of the barrier's use count")
                    what = (f"role {role.name} waits on {key[0]}[{key[1]}] with parity {parity} in phase {b.phase} "
                            f"({b.pending} of {b.count} arrivals missing, {b.tx} transaction bytes outstanding)")
                    while b.phase < target:
                        yield _Block(lambda b=b, t=target: b.phase >= t, what)
                    self.observe(role, key, target - 1, parity)
                else:
                    self.observe(role, key, b.phase - 1, parity)
                if b.count >= role.threads > 1:  # every thread of the role arrived: a barrier among them
                    for d in self.dirty.values():
                        d["synced"] |= d["role"] == role.name
            elif isinstance(s, ir.TmaLoad):
                self.tma_load(s, env, role)
            elif isinstance(s, ir.TmaStore):
                key = (s.src.buf, s.src.stage.eval(env))
                self.check_read(role, key, "TMA store")
                role.bulk_open.append(key)
            elif isinstance(s, ir.BulkCommit):
                role.bulk_groups.append(role.bulk_open)
                role.bulk_open = []
            elif isinstance(s, ir.BulkWait):
                role.bulk_groups = role.bulk_groups[len(role.bulk_groups) - s.pending:] if s.pending else []
            elif isinstance(s, ir.FenceProxyAsync):
                for d in self.dirty.values():
                    d["fenced"] = True
            elif isinstance(s, ir.SyncThreads):
                if role.name != "cta":
                    raise self.fail("shape", "__syncthreads inside a role (the other roles never reach it)")
                for d in self.dirty.values():
                    d["synced"] = True
                self.read_since_sync = set()
            elif isinstance(s, ir.WgmmaFence):
                role.fenced = True
            elif isinstance(s, ir.FenceMbarInit):
                pass
            elif isinstance(s, ir.WgmmaMma):
                self.wgmma(s, env, role)
            elif isinstance(s, ir.WgmmaCommit):
                role.groups.append(role.open)
                role.open = []
            elif isinstance(s, ir.WgmmaWait):
                role.groups = role.groups[len(role.groups) - s.pending:] if s.pending else []
                role.fenced = False
            elif isinstance(s, (ir.SoftmaxInit, ir.SoftmaxStep, ir.RescalePack)):
                accs = (s.out, s.acc) if isinstance(s, ir.RescalePack) else (s.acc,)
                for op in role.in_flight():
                    if op[0] in accs:
                        raise self.fail("acc_in_flight", f"accumulator {op[0]} is accessed by {type(s).__name__} "
                                        "before wgmma.wait_group retired the wgmma writing it",
                                        suggestion="wgmma_wait before touching the accumulator")
                    if isinstance(s, ir.RescalePack) and op[2] == s.regs:
                        raise self.fail("acc_in_flight", f"A registers {s.regs} are rewritten while a wgmma reading "
                                        "them is in flight", suggestion="wgmma_wait before packing the next P")
            elif isinstance(s, (ir.FragEpilogue, ir.AccToSmem, ir.SplitKSum)):
                if any(op[0] == s.acc for op in role.in_flight()):
                    raise self.fail("acc_in_flight", f"accumulator {s.acc} is read before wgmma.wait_group retired the "
                                    "wgmma writing it", suggestion="wgmma_wait<0> before the epilogue")
                if isinstance(s, ir.SplitKSum):     # the last thread of the tile runs the body
                    yield from self.run(s.body, env, role, threads)
                if isinstance(s, ir.AccToSmem):
                    key = (s.dst.buf, s.dst.stage.eval(env))
                    self.written(role, key, "threads' stores")
                    self.dirty[key] = {"fenced": False, "synced": False, "role": role.name}
            elif isinstance(s, ir.SetMaxNReg):
                if not 24 <= s.regs <= 256 or s.regs % 8 or (s.regs < role.regs if s.inc else s.regs > role.regs):
                    raise self.fail("setmaxnreg", f"setmaxnreg.{'inc' if s.inc else 'dec'} {s.regs} in role "
                                    f"{role.name} holding {role.regs} (a multiple of 8 in [24, 256], up for inc, "
                                    "down for dec)")
                role.regs = s.regs
            else:
                raise self.fail("shape", f"not an SM90 statement: {type(s).__name__}")

    def roles(self, s: ir.Roles, env: dict):
        k = self.k
        per_thread = min(256, (65536 // k.threads) & ~7)
        states = [_Role(r.name, 128 * r.count, per_thread) for r in s.roles]
        self.all_roles += states
        gens = [self.run(r.body, dict(env), st, st.threads) for r, st in zip(s.roles, states)]
        waits: list = [None] * len(gens)
        live = list(range(len(gens)))
        while live:
            moved = False
            for i in list(live):
                while waits[i] is None or waits[i].ready():
                    try:
                        waits[i] = next(gens[i])
                    except StopIteration:
                        live.remove(i)
                        self.end_role(states[i])
                        moved = True
                        break
                    moved = True
            if live and not moved:
                yield _Block(lambda: any(waits[i].ready() for i in live), "; ".join(waits[i].what for i in live))
        total = sum(st.regs * st.threads for st in states)
        if total > 65536:
            held = ", ".join(f"{st.name}: {st.threads} x {st.regs}" for st in states)
            raise self.fail("register_budget", f"after setmaxnreg the roles hold {total} registers ({held}), the SM "
                            "has 65536")

    def end_role(self, role: _Role) -> None:
        if role.in_flight():
            raise self.fail("acc_in_flight", f"role {role.name} ends with wgmma groups no wgmma.wait_group retired")
        if role.bulk_groups or role.bulk_open:
            raise self.fail("bulk_not_waited", f"role {role.name} ends with TMA stores not waited for "
                            "(cp.async.bulk.wait_group)")

    def written(self, role: _Role, key, what: str) -> None:
        for r in self.all_roles:
            if any(key in g for g in r.bulk_groups) or key in r.bulk_open:
                raise self.fail("bulk_source_reused", f"{what} overwrite {key[0]}[{key[1]}] while a TMA store reading "
                                "it was not waited for", suggestion="bulk_wait_read before reusing the buffer")

    def release_check(self, role: _Role, key) -> None:
        for ring in self.k.rings:
            if key[0] != ring.empty:
                continue
            for op in role.in_flight():
                if any(r == (b, key[1]) for b in ring.buffers for r in op[1]):
                    raise self.fail("release_in_flight", f"role {role.name} releases stage {key[1]} (arrives on "
                                    f"{ring.empty}[{key[1]}]) while its wgmma reading the stage is in flight",
                                    suggestion="wgmma_wait before the release")

    def tma_load(self, s: ir.TmaLoad, env: dict, role: _Role) -> None:
        tmap = self.k.map(s.map)
        key = (s.dst.buf, s.dst.stage.eval(env))
        buf = self.k.buf(s.dst.buf)
        if s.dst.offset + tmap.box_bytes > buf.stage_bytes or not 0 <= key[1] < buf.stages or s.dst.offset % 128:
            raise self.fail("shape", f"the {tmap.box_bytes}-byte box of {tmap.name} into stage {key[1]} of {buf.name} "
                            f"at byte {s.dst.offset} ({buf.stages} stages of {buf.stage_bytes} bytes; boxes start at "
                            "multiples of 128 bytes)")
        for r in self.all_roles:
            if any(key in op[1] for op in r.in_flight()):
                raise self.fail("stage_not_released", f"TMA load refills {key[0]}[{key[1]}] while a wgmma of role "
                                f"{r.name} reading it is in flight")
        self.written(role, key, "a TMA load")
        n = self.nfills.get(key + (s.dst.offset,), 0)
        ring = self.ring_of.get(key[0])
        if ring is not None and n >= 1:
            ekey = (ring.empty, key[1])
            if role.observed.get(ekey, -2) < n - 1:
                raise self.fail("stage_not_released", f"TMA load {n} into stage {key[1]} of {key[0]}: its consumers "
                                f"release fill {n - 1} in phase {n - 1} of {ekey[0]}[{ekey[1]}], which role "
                                f"{role.name} did not wait for (observed {role.observed.get(ekey, 'none')})",
                                suggestion="mbar_wait on the empty barrier before refilling the stage")
        elif ring is None and key in self.read_since_sync and n >= 1:
            raise self.fail("stage_not_released", f"TMA load refills {key[0]}[{key[1]}] read since the last barrier")
        bkey = self.bar(s.bar, env)
        b = self.bars[bkey]
        self.fills.setdefault(key, {})[s.dst.offset] = (bkey, b.phase, tmap)
        self.nfills[key + (s.dst.offset,)] = n + 1
        self.dirty.pop(key, None)
        b.delivered[b.phase] = b.delivered.get(b.phase, 0) + tmap.box_bytes
        b.tx -= tmap.box_bytes
        self.complete(bkey)

    def wgmma(self, s: ir.WgmmaMma, env: dict, role: _Role) -> None:
        k = self.k
        accs = dict(k.accs)
        if s.acc not in accs or accs[s.acc] != s.n or not (8 <= s.n <= 256 and s.n % 8 == 0) or \
                s.dtype not in ("fp16", "bf16") or (isinstance(s.a, str) and s.a not in dict(k.regs)):
            raise self.fail("shape", f"wgmma m64n{s.n}k16 {s.dtype} into {s.acc}: N is 8..256 in steps of 8, the "
                            "accumulator must be declared with that N, A registers declared, inputs fp16 or bf16")
        in_flight = any(op[0] == s.acc for op in role.in_flight())
        if not in_flight and not role.fenced:
            raise self.fail("wgmma_fence", f"wgmma.mma_async on {s.acc} with no wgmma.fence since its registers were "
                            "last accessed", suggestion="WgmmaFence before the first mma_async of a batch")
        keys = []
        for d in ((s.a,) if isinstance(s.a, ir.MatDesc) else ()) + (s.b,):
            key = (d.ref.buf, d.ref.stage.eval(env))
            self.check_read(role, key, f"wgmma ({s.acc})", d)
            keys.append(key)
        role.open.append((s.acc, tuple(keys), s.a if isinstance(s.a, str) else None))

    def verify(self) -> None:
        top = _Role("cta", self.k.threads, min(256, (65536 // self.k.threads) & ~7))
        self.all_roles = [top]
        for blk in self.run(self.k.body, dict(self.env), top, self.k.threads):
            for key in self.bars:
                why = self.tx_mismatch(key)
                if why and self.bars[key].pending == 0:
                    raise self.fail("expect_tx", why, suggestion="announce exactly the boxes' bytes")
            raise self.fail("mbar_deadlock", f"no role can make progress: {blk.what}")
        self.end_role(top)


def check_static(k: ir.Sm90Kernel) -> None:
    if k.threads % 128 or not 128 <= k.threads <= 1024:
        raise _fail(k, "shape", f"{k.threads} threads: SM90 kernels run whole warpgroups (128 threads)")
    if k.smem_bytes > SMEM_LIMIT["sm90"]:
        raise _fail(k, "smem_budget", f"{k.smem_bytes} bytes of shared memory, sm90 has {SMEM_LIMIT['sm90']}",
                    suggestion="fewer stages or a smaller tile")
    rep = max((_REPEAT[m.swizzle] for m in k.maps), default=16)
    for b in (k.buf(name) for r in k.rings for name in r.buffers):
        if b.offset % rep or b.stage_bytes % rep:
            raise _fail(k, "smem_align", f"{b.name} at byte {b.offset}, {b.stage_bytes} bytes a stage: swizzled "
                        f"stages must start at multiples of {rep} bytes (the swizzle pattern's repeat)")


def verify_sm90(k: ir.Sm90Kernel) -> ir.Sm90Kernel:
    """Raise E1801 (with ``hazard``) unless the kernel's async schedule and budget are sound; return it."""
    check_static(k)
    names = [n for n, _ in k.verify_sizes]
    for values in itertools.product(*(v for _, v in k.verify_sizes)):
        env = {"blockIdx.x": 0, "blockIdx.y": 0, "blockIdx.z": 0, "gridDim.x": 1, **dict(zip(names, values))}
        _Machine(k, env).verify()
    return k
