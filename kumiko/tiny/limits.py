"""Size limits, checked before anything is allocated: symbol values and the bytes buffers would take.

Every path that turns symbols into arrays comes through here: ``tiny.evaluate.bind_symbols`` (the
evaluator and ``compiler.Executable.bind``, so every target) checks the symbol values, and the
callers that allocate check the bytes: ``Executable.bind`` (a compiled target's inputs and outputs),
``Executable.random_inputs`` (before making them) and ``evaluate`` (every value the evaluator keeps).
Without the check numpy answers a size of 10^12, 2^70 or -5 with a MemoryError, an OverflowError or a
ValueError, or the machine swaps; here it is E1015 (a negative size) or E1017 (too large), naming the
bytes needed and the limit (``kumiko.knobs.max_bytes``, ``KUMIKO_MAX_BYTES``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim_eval
from kumiko.tiny.ir import TinyGraph, is_ref

#: sizes and byte counts must fit a signed 64-bit integer (numpy's and the kernels' index type)
INT64_MAX = (1 << 63) - 1

#: uops whose evaluator value is a numpy view of their source (no new buffer); an INPUT is counted (the caller's
#: array, or the one ``random_inputs`` is about to make)
_VIEWS = ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK", "FLIP")


def check_symbols(env: Mapping[str, object]) -> None:
    """Each bound symbol is an integer in [0, 2^63): E1015 for a negative or non-integer one, E1017 for
    one too large for int64."""
    for name, v in env.items():
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                ok = int(v) == v    # numpy integers pass; 2.5 or "M" do not
            except (TypeError, ValueError, OverflowError):
                ok = False
            if not ok:
                raise KumikoError("E1015", at=f"symbol {name}", why=f"a size must be an integer, got {v!r}")
            v = int(v)
        if v < 0:
            raise KumikoError("E1015", at=f"symbol {name}", why=f"size {name} = {v} is negative",
                              suggestion="Sizes are element counts: give 0 or more.")
        if v > INT64_MAX:
            raise KumikoError("E1017", at=f"symbol {name}", why=f"size {name} = {v} does not fit a 64-bit integer "
                              f"(at most {INT64_MAX})", limit=INT64_MAX)


def value_bytes(g: TinyGraph, nid: str, env: Mapping[str, int]) -> int:
    """Bytes node ``nid``'s value takes at these sizes (Python integers: no overflow; a negative extent,
    which ``check_sizes`` reports, counts as empty)."""
    n = g.nodes[nid]
    try:
        count = 1
        for d in n.shape:
            count *= max(0, dim_eval(d, env))
    except KeyError as e:
        raise KumikoError("E1014", at=f"tiny:{nid} ({n.uop})", why=f"size symbol {e.args[0]} has no value",
                          suggestion="Bind it through an input's shape (or give it with --shapes).") from None
    return count * n.dtype.np.itemsize


@dataclass(frozen=True)
class EvalSchedule:
    """How the evaluator walks a graph: ``fused``, the float MULs whose only reader is a float SUM (a
    contraction: the SUM computes from the MUL's operands, the product is never materialised);
    ``free_after``, node id -> the values no later node reads (dropped once it is computed; a view's reads
    keep its source alive, since numpy's view holds it)."""
    fused: frozenset
    free_after: Mapping[str, tuple]


def eval_schedule(g: TinyGraph, keep: bool = False) -> EvalSchedule:
    """The evaluator's schedule; ``keep=True`` (every value returned) fuses nothing and frees nothing."""
    if keep:
        return EvalSchedule(frozenset(), {})
    readers: dict[str, list[str]] = {nid: [] for nid in g.nodes}
    for nid, n in g.nodes.items():
        for s in n.src:
            if is_ref(s):
                readers[s].append(nid)
    outs = {nid for _, nid in g.outputs}
    fused = frozenset(m for m, rs in readers.items()
                      if m not in outs and len(rs) == 1 and contraction_mul(g, g.nodes[rs[0]]) == m)
    pos = {nid: i for i, nid in enumerate(g.nodes)}
    last: dict[str, int] = {nid: pos[nid] for nid in g.nodes}
    for nid, n in g.nodes.items():
        if nid in fused:
            continue
        srcs = [s for s in n.src if is_ref(s)]
        mul = contraction_mul(g, n)
        if mul is not None:
            srcs += [s for s in g.nodes[mul].src if is_ref(s)]    # the SUM reads the MUL's operands
        for s in srcs:
            last[s] = max(last[s], pos[nid])
    for nid in reversed(list(g.nodes)):               # a view keeps its source alive while it lives
        n = g.nodes[nid]
        if n.uop in _VIEWS and n.src and is_ref(n.src[0]):
            last[n.src[0]] = max(last[n.src[0]], last[nid])
    order = list(g.nodes)
    free: dict[str, list[str]] = {}
    for nid, at in last.items():
        if nid not in outs and nid not in fused:
            free.setdefault(order[at], []).append(nid)
    return EvalSchedule(fused, {k: tuple(v) for k, v in free.items()})


def contraction_mul(g: TinyGraph, n) -> str | None:
    """The float MUL node ``n`` sums over axes when ``n`` is a contraction (a float SUM of a float MUL, which
    the evaluator computes from the MUL's operands), else None."""
    if n.uop != "REDUCE" or n.arg.get("op") != "SUM" or not n.dtype.is_float or not n.arg.get("axes"):
        return None
    src = n.src[0]
    return src if is_ref(src) and g.nodes[src].uop == "MUL" and g.nodes[src].dtype.is_float else None


def _elems(g: TinyGraph, nid: str, env: Mapping[str, int]) -> int:
    return value_bytes(g, nid, env) // g.nodes[nid].dtype.np.itemsize


def _evaluator_bytes(g: TinyGraph, nid: str, env: Mapping[str, int]) -> tuple[int, int]:
    """What the evaluator allocates for one node: (its value unless numpy gives a view, the temporaries it
    needs while it is computed): a float SUM's float64 terms and running sum (``evaluate._sequential_sum``),
    a contraction's operands in float64 and its result (``evaluate._contract``), a VIEW's int64 coordinates."""
    n = g.nodes[nid]
    own = 0 if n.uop in _VIEWS else value_bytes(g, nid, env)
    temp = 0
    mul = contraction_mul(g, n)
    if mul is not None:
        operands = [_base(g, s) for s in g.nodes[mul].src if is_ref(s)]
        temp = 2 * 8 * (sum(_elems(g, s, env) for s in operands) + own // n.dtype.np.itemsize)
    elif n.uop == "REDUCE" and n.arg.get("op") == "SUM" and n.dtype.is_float:
        temp = 2 * 8 * _elems(g, n.src[0], env)
    elif n.uop == "VIEW":
        temp = 8 * len(n.arg["index_map"]) * (own // n.dtype.np.itemsize)
    return own, temp


def _base(g: TinyGraph, nid: str) -> str:
    """The value a chain of broadcasts and reshapes reads (``evaluate._unbroadcast`` converts only that)."""
    while g.nodes[nid].uop in ("EXPAND", "RESHAPE") and is_ref(g.nodes[nid].src[0]):
        nid = g.nodes[nid].src[0]
    return nid


def evaluator_peak(g: TinyGraph, env: Mapping[str, int], schedule: EvalSchedule | None = None) -> int:
    """The most bytes the evaluator holds at once, walking the graph in its order with its frees."""
    schedule = schedule or eval_schedule(g)
    live = peak = 0
    owned: dict[str, int] = {}
    for nid in g.nodes:
        if nid in schedule.fused:
            continue
        own, temp = _evaluator_bytes(g, nid, env)
        owned[nid] = own
        live += own
        peak = max(peak, live + temp)
        for dead in schedule.free_after.get(nid, ()):
            live -= owned.pop(dead, 0)
    return peak


def check_limits(g: TinyGraph, env: Mapping[str, int], every_node: bool = False, at: str = "sizes",
                 schedule: EvalSchedule | None = None) -> int:
    """E1017 when the buffers a call needs at these sizes exceed ``knobs.max_bytes()``; returns the bytes.

    ``every_node=False`` counts the graph's inputs and outputs (what a compiled target's caller holds;
    its intermediate buffers are the runtime's to check), ``True`` the most the evaluator holds at once
    (``schedule``: its walk, ``eval_schedule(g)`` by default). Either
    way every value's byte count must fit int64, which the kernels index with, fused or not."""
    for nid in g.nodes:
        size = value_bytes(g, nid, env)
        if size > INT64_MAX:
            n = g.nodes[nid]
            raise KumikoError("E1017", at=f"tiny:{nid} ({n.uop})", why=f"at sizes {dict(env)} this value has "
                              f"{size // n.dtype.np.itemsize:,} elements ({size:,} bytes), more than a 64-bit "
                              f"index can address", bytes=size, limit=INT64_MAX)
    if every_node:
        schedule = schedule or eval_schedule(g)
        nids = [nid for nid in g.nodes if nid not in schedule.fused]
        need = evaluator_peak(g, env, schedule)
    else:
        nids = list(dict.fromkeys([nid for _, nid in g.inputs + g.outputs]))
        need = sum(value_bytes(g, nid, env) for nid in nids)
    limit = knobs.max_bytes()
    if need > limit:
        big = max(nids, key=lambda nid: value_bytes(g, nid, env))
        n = g.nodes[big]
        shape = [max(0, dim_eval(d, env)) for d in n.shape]
        what = "the reference evaluator's live values" if every_node else "the inputs and outputs"
        raise KumikoError("E1017", at=at, why=f"{what} need {need:,} bytes at sizes {dict(env)}, over the limit "
                          f"of {limit:,} bytes (KUMIKO_MAX_BYTES); the largest is {big} ({n.uop}) "
                          f"{n.dtype.name}{shape}", bytes=need, limit=limit)
    return need
