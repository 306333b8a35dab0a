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

from typing import Mapping

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.symbolic import dim_eval
from kumiko.tiny.ir import TinyGraph

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


def _evaluator_bytes(g: TinyGraph, nid: str, env: Mapping[str, int]) -> int:
    """What the evaluator allocates for one node: its value unless numpy gives a view, plus a float SUM's
    float64 terms and running sum (``evaluate._sequential_sum``) and a VIEW's int64 coordinates."""
    n = g.nodes[nid]
    own = 0 if n.uop in _VIEWS else value_bytes(g, nid, env)
    if n.uop == "REDUCE" and n.arg.get("op") == "SUM" and n.dtype.is_float:
        src = value_bytes(g, n.src[0], env) // g.nodes[n.src[0]].dtype.np.itemsize
        own += 2 * 8 * src        # the float64 terms and their row-major copy; chunk temporaries are bounded
    elif n.uop == "VIEW":
        own += 8 * len(n.arg["index_map"]) * (own // n.dtype.np.itemsize)
    return own


def check_limits(g: TinyGraph, env: Mapping[str, int], every_node: bool = False, at: str = "sizes") -> int:
    """E1017 when the buffers a call needs at these sizes exceed ``knobs.max_bytes()``; returns the bytes.

    ``every_node=False`` counts the graph's inputs and outputs (what a compiled target's caller holds;
    its intermediate buffers are the runtime's to check), ``True`` every value the evaluator keeps. Either
    way every value's byte count must fit int64, which the kernels index with, fused or not."""
    for nid in g.nodes:
        size = value_bytes(g, nid, env)
        if size > INT64_MAX:
            n = g.nodes[nid]
            raise KumikoError("E1017", at=f"tiny:{nid} ({n.uop})", why=f"at sizes {dict(env)} this value has "
                              f"{size // n.dtype.np.itemsize:,} elements ({size:,} bytes), more than a 64-bit "
                              f"index can address", bytes=size, limit=INT64_MAX)
    nids = list(g.nodes) if every_node else list(dict.fromkeys([nid for _, nid in g.inputs + g.outputs]))
    need = sum(_evaluator_bytes(g, nid, env) if every_node else value_bytes(g, nid, env) for nid in nids)
    limit = knobs.max_bytes()
    if need > limit:
        big = max(nids, key=lambda nid: value_bytes(g, nid, env))
        n = g.nodes[big]
        shape = [max(0, dim_eval(d, env)) for d in n.shape]
        what = "the reference evaluator's values" if every_node else "the inputs and outputs"
        raise KumikoError("E1017", at=at, why=f"{what} need {need:,} bytes at sizes {dict(env)}, over the limit "
                          f"of {limit:,} bytes (KUMIKO_MAX_BYTES); the largest is {big} ({n.uop}) "
                          f"{n.dtype.name}{shape}", bytes=need, limit=limit)
    return need
