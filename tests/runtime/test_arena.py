"""The arena plan: simultaneously live buffers never overlap, dead ones are reused, offsets are aligned,
and the plan is deterministic. Random programs check the invariants; small ones pin the reuse."""
import random

import pytest

from kumiko import dtypes
from kumiko.region.ssa import Axis, MemRef, Output, Program, Region
from kumiko.runtime.arena import lifetimes, plan_arena
from kumiko.symbolic import Expr

from .handmade import chain_program, two_region_program


def _region(name, reads, writes, sizes):
    return Region(name, (Axis("i0", 1),), tuple((r, MemRef((sizes[r],), dtypes.fp32)) for r in reads),
                  tuple(Output(w, MemRef((sizes[w],), dtypes.fp32)) for w in writes), (), ())


def random_program(seed: int) -> Program:
    """Regions in order; each writes 1-2 new buffers and reads 0-3 buffers written earlier."""
    rnd = random.Random(seed)
    sizes = {"x": 100}
    regions, written = [], ["x"]
    for k in range(rnd.randint(1, 12)):
        writes = [f"b{k}_{j}" for j in range(rnd.randint(1, 2))]
        for w in writes:
            sizes[w] = rnd.choice([1, 3, 16, 17, 100, 1000, 4096]) * rnd.choice([1, 2])
        reads = rnd.sample(written, min(len(written), rnd.randint(0, 3)))
        regions.append(_region(f"r{k}", reads, writes, sizes))
        written += writes
    bufs = tuple((n, MemRef((sizes[n],), dtypes.fp32)) for n in written[1:])
    return Program(f"rand{seed}", tuple(regions), (("x", MemRef((100,), dtypes.fp32)),), (), bufs)


@pytest.mark.parametrize("seed", range(60))
def test_live_buffers_never_overlap(seed):
    prog = random_program(seed)
    plan = plan_arena(prog, {})
    assert plan == plan_arena(prog, {})                              # deterministic
    assert [s.name for s in plan.slots] == [n for n, _ in prog.buffers]
    for s in plan.slots:
        assert s.offset % 64 == 0 and s.offset % s.align == 0 and s.offset + s.nbytes <= plan.size
    for a in plan.slots:
        for b in plan.slots:
            if a.name < b.name and a.live_with(b) and a.nbytes and b.nbytes:
                assert not a.overlaps(b), (a, b)
    assert plan.size % 64 == 0 and plan.size <= plan.naive_size


def test_lifetimes_are_first_writer_to_last_reader():
    life = lifetimes(chain_program(4))
    assert life == {"b0": (0, 1), "b1": (1, 2), "b2": (2, 3)}


def test_dead_buffers_are_reused():
    plan = plan_arena(chain_program(5), {"M": 10, "N": 10})   # b0..b3, 400 bytes each, 128-byte aligned
    off = {s.name: s.offset for s in plan.slots}
    assert off["b0"] == off["b2"] == 0 and off["b1"] == off["b3"] == 512
    assert plan.size == 512 + 448 and plan.naive_size == 4 * 512


def test_a_region_reading_one_buffer_and_writing_another_keeps_them_apart():
    sizes = {"x": 8, "a": 64, "b": 64}
    prog = Program("p", (_region("r0", ["x"], ["a"], sizes), _region("r1", ["a"], ["b"], sizes),
                         _region("r2", ["b"], [], sizes)), (), (), (("a", MemRef((64,), dtypes.fp32)),
                                                                     ("b", MemRef((64,), dtypes.fp32))))
    plan = plan_arena(prog, {})
    assert not plan.slot("a").overlaps(plan.slot("b"))


def test_symbolic_sizes_and_larger_memref_alignment():
    M = Expr.lift("M")
    prog = two_region_program()
    plan = plan_arena(prog, {"M": 3, "N": 5})
    assert plan.slot("t").nbytes == 60 and plan.size == 64
    big = Program("p", prog.regions, prog.inputs, prog.outputs,
                  (("t", MemRef((M, Expr.lift("N")), dtypes.fp32, alignment=256)),))
    assert plan_arena(big, {"M": 3, "N": 5}).align == 256


def test_empty_program_needs_no_arena():
    plan = plan_arena(Program("e", (), (), ()), {})
    assert plan.size == 0 and plan.slots == ()
