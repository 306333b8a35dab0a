"""The memory arena: every intermediate buffer of a Program gets an offset into one allocation.

Why: a program of many kernels would otherwise allocate (and page-fault) one array per intermediate on
every call; one arena is allocated once per shape and buffers whose lifetimes do not overlap share
bytes (seed 001 §12, "Memory Arena: reuse by liveness analysis").

Liveness is over the region order: a buffer is live from its first writer to its last reader, both
inclusive (a region that reads ``a`` and writes ``b`` needs both at once, so they never share bytes).
Placement is greedy first-fit: buffers in a fixed order (largest first, then by first use, then name),
each at the lowest aligned offset (64 bytes, or the MemRef's own ``alignment`` when larger) where it
overlaps no already-placed buffer that is live at the same time. Sizes are concrete: the plan is made
for one symbol environment. The arena's base must be aligned to ``ArenaPlan.align``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kumiko.region.ssa import MemRef, Program
from kumiko.symbolic import dim_eval

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    nbytes: int
    first: int        # index of the region that writes the buffer first
    last: int         # index of the region that reads it last (== first when nothing reads it)
    align: int = ALIGN

    def live_with(self, other: "Slot") -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps(self, other: "Slot") -> bool:
        return self.offset < other.offset + other.nbytes and other.offset < self.offset + self.nbytes


@dataclass(frozen=True)
class ArenaPlan:
    slots: tuple          # Slot, ... in Program.buffers order
    size: int             # bytes the arena needs (a multiple of ALIGN)
    align: int = ALIGN    # the alignment the arena's base needs (the largest any slot asked for)

    def slot(self, name: str) -> Slot:
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def naive_size(self) -> int:
        """What separate allocations would take (for reports: the reuse the plan found)."""
        return sum(_round_up(s.nbytes, s.align) for s in self.slots)


def memref_nbytes(m: MemRef, env: Mapping[str, int]) -> int:
    n = m.dtype.itemsize
    for d in m.shape:
        n *= dim_eval(d, env)
    return n


def lifetimes(program: Program, step_of: Mapping[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """Buffer name -> (first writer, last reader) as region indices, or as indices of the calls that run
    them (``step_of``: region name -> call; regions fused into one kernel share a call, so their buffers
    are live together)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for j, r in enumerate(program.regions):
        k = step_of[r.name] if step_of is not None else j
        for o in r.outputs:
            first.setdefault(o.name, k)
        for name, _ in r.inputs:
            last[name] = k
    out = {}
    for name, _ in program.buffers:
        f = first.get(name, 0)
        out[name] = (f, max(f, last.get(name, f)))
    return out


def plan_arena(program: Program, env: Mapping[str, int], align: int = ALIGN,
               step_of: Mapping[str, int] | None = None) -> ArenaPlan:
    """Offsets for ``program.buffers`` at the sizes ``env`` gives; deterministic for a given program."""
    life = lifetimes(program, step_of)
    sizes = {name: memref_nbytes(m, env) for name, m in program.buffers}
    aligns = {name: max(align, m.alignment) for name, m in program.buffers}
    order = sorted(program.buffers, key=lambda b: (-sizes[b[0]], life[b[0]][0], b[0]))
    placed: list[Slot] = []
    for name, _ in order:
        first, last = life[name]
        probe = Slot(name, 0, sizes[name], first, last)
        busy = sorted((s for s in placed if s.live_with(probe) and s.nbytes), key=lambda s: s.offset)
        offset = 0
        for s in busy:
            if offset + sizes[name] <= s.offset:
                break
            offset = max(offset, _round_up(s.offset + s.nbytes, aligns[name]))
        placed.append(Slot(name, offset, sizes[name], first, last, aligns[name]))
    by_name = {s.name: s for s in placed}
    slots = tuple(by_name[name] for name, _ in program.buffers)
    size = max((_round_up(s.offset + s.nbytes, align) for s in slots), default=0)
    return ArenaPlan(slots, size, max(aligns.values(), default=align))


def _round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align
