"""The Poly Core report (seed 001 §7) and the ``poly_view`` stage dump.

Per block: ``parallel_axes``, ``reduce_axes`` (+ ``carried_axes``: dims ISL found a dependence on),
``tail_axes``, ``affine`` (is every access piecewise affine), hints, and ``compute_at`` entries keyed
by producer: one per direct edge, plus one per single-consumer chain (UCC, seed 001 §0.1) from a
producer to the block the chain ends in — that is the fusion a Region would try (GEMM -> bias ->
ReLU; conv -> ReLU -> pool). Each entry carries ``ok``, ``halo`` (per axis and bytes, for the default
symbolic tile ``T_<dim>``) and ``min_buffer``; chain entries also the footprints and placements.

Hints are hints: the Plan layer decides. Barrier hints name the synchronisation an edge or a
contraction's operand staging needs on SM80 (cp.async groups) and SM90 (mbarrier); bank hints say
which operand dim is contiguous in memory (``k``-major or ``mn``-major, so ``ldmatrix.trans``), and
when a strided read of a staged tile conflicts on the 32 four-byte shared-memory banks.
"""
from __future__ import annotations

import math

from kumiko.poly.computeat import compute_at
from kumiko.poly.core import Dependences, axis_roles, dependences, tail_axes
from kumiko.poly.view import Block, PolyView, to_json

BANKS, BANK_BYTES = 32, 4

_SYNC = {"sm80": "cp.async.commit_group / cp.async.wait_group + __syncthreads",
         "sm90": "mbarrier.arrive.expect_tx / mbarrier.try_wait.parity"}


def chains(view: PolyView) -> list[tuple[str, str]]:
    """(producer, end) for every single-consumer chain of two or more edges."""
    succ: dict[str, list[str]] = {b: [] for b in view.blocks}
    for e in view.edges:
        succ[e.producer].append(e.consumer)
    out = []
    for b in view.blocks:
        cur, hops = b, 0
        while len(succ[cur]) == 1:
            cur, hops = succ[cur][0], hops + 1
        if hops >= 2:
            out.append((b, cur))
    return out


def bank_hints(view: PolyView, b: Block) -> list[dict]:
    out = []
    if b.contraction is None:
        return out
    for r in b.reads:
        if r.accumulate or r.map is None or not r.map:
            continue
        arr = view.arrays[r.array]
        last = r.map[-1]
        dims = [d for d in reversed(b.dims) if last.coeff(d)]
        if not dims:
            continue
        outs = [x for x in dims if x in b.out_dims]
        # a sliding window (conv): neighbouring threads differ in the output dim, which strides the row
        d = max(outs, key=lambda x: abs(last.coeff(x))) if outs and len(outs) < len(dims) else dims[0]
        stride = abs(last.coeff(d))
        ways = math.gcd(max(1, stride * arr.itemsize // BANK_BYTES), BANKS)
        h = {"tensor": arr.name, "contiguous_dim": d, "major": "k" if d in b.reduce_dims else "mn",
             "ldmatrix_trans": d not in b.reduce_dims, "swizzle": "xor",
             "why": "tiles staged in shared memory are read across rows by ldmatrix/wgmma; an xor swizzle keeps "
                    "the rows on distinct banks"}
        if stride > 1:
            h["stride"] = stride
            h["conflict_ways"] = ways
            h["why"] = f"the staged tile is read with stride {stride} along {d}: {ways}-way bank conflicts; pad " \
                       "each row or swizzle"
        out.append(h)
    return out


def barrier_hints(view: PolyView, b: Block, entries: dict) -> list[dict]:
    out = []
    if b.contraction is not None:
        out.append({"where": "mainloop", **_SYNC, "why": "operand tiles are staged in shared memory per reduce step; "
                    "a stage is read only after its copy landed and overwritten only after all warps read it"})
    for prod, e in sorted(entries.items()):
        buf = e.get("min_buffer", {}).get("buffer")
        if buf == "smem_ring":
            out.append({"where": f"edge {prod}->{b.name}", **_SYNC, "why": "the producer's values are shared "
                        "through a shared-memory ring; consumers wait for the slot, producers for its release"})
        elif buf == "gmem":
            out.append({"where": f"edge {prod}->{b.name}", "sm80": "kernel boundary", "sm90": "kernel boundary",
                        "why": "the value goes through global memory: the consumer runs after the producer's kernel"})
    return out


def analyse(view: PolyView, deps: Dependences | None = None, detail_chains: bool = True) -> dict:
    deps = deps if deps is not None else dependences(view)
    entries: dict[str, dict[str, dict]] = {b: {} for b in view.blocks}
    for e in view.edges:
        if view.blocks[e.producer].kind == "non_scop" or view.blocks[e.consumer].kind == "non_scop":
            continue
        ca = compute_at(view, e.producer, e.consumer, deps=deps, all_footprints=False)
        entries[e.consumer][e.producer] = ca.to_json(detail=False)
    for prod, end in chains(view):
        if view.blocks[prod].kind == "non_scop" or view.blocks[end].kind == "non_scop":
            continue
        ca = compute_at(view, prod, end, deps=deps, all_footprints=detail_chains)
        entries[end][prod] = ca.to_json(detail=detail_chains)
    blocks = {}
    for b in view.blocks.values():
        d = {"kind": b.kind}
        d.update(axis_roles(view, b, deps))
        d["tail_axes"] = tail_axes(view, b)
        d["affine"] = all(r.map is not None for r in b.reads)
        d["compute_at"] = dict(sorted(entries[b.name].items()))
        d["hints"] = {"barrier": barrier_hints(view, b, entries[b.name]), "bank": bank_hints(view, b)}
        blocks[b.name] = d
    return {"blocks": blocks, "dependences": deps.to_json()}


def fusion_report(view: PolyView, producer: str, consumer: str, tile=None, deps: Dependences | None = None) -> dict:
    """Seed 001 §7's report for fusing ``producer`` (its loops: parallel/reduce/tail axes) with the
    blocks down to ``consumer`` (compute-at legality, halo, minimum buffer)."""
    deps = deps if deps is not None else dependences(view)
    p = view.blocks[producer]
    ca = compute_at(view, producer, consumer, tile=tile, deps=deps, all_footprints=False)
    roles = axis_roles(view, p, deps)
    return {"analysis": {"parallel_axes": roles["parallel_axes"], "reduce_axes": roles["reduce_axes"],
                         "tail_axes": tail_axes(view, p), "compute_at": {"ok": ca.ok, "halo": ca.halo()},
                         "min_buffer": {k: v for k, v in ca.min_buffer.items() if k != "why"}}}


def report(view: PolyView) -> dict:
    """The ``poly_view`` stage dump: the Poly-View (seed 001 §5.2) and the Poly Core analysis (§7)."""
    book = view.book
    return {
        "kumiko": "poly_view", "version": 1, "name": view.name,
        "params": list(book.params), "derived_params": {k: str(v) for k, v in book.derived},
        "context": str(view.context),
        "poly_view": to_json(view),
        "analysis": analyse(view),
        "diagnostics": [d.to_dict() for d in book.diagnostics + view.diagnostics],
    }
