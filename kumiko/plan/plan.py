"""The Schedule Plan (seed 001 §8.1): a small, frozen, hashable record of how one region is run.

Both backends' plans carry the seed's ``arch``, ``bind``, ``cache``, ``vectorize``, ``predicate_tail``,
``epilogue``, ``layout_hints``, ``algo_choice`` and ``local_edges``; the rest belongs to one backend and a
plan of the other leaves it at its default (its JSON omits it, ``check_fields`` rejects it):

- CPU (``cpu-*`` arches), a packed contraction: ``cache_block`` (``CacheBlock``: MC, NC, KC, the cache
  blocks over the contraction's M, N and K), ``register_block`` (``RegisterBlock``: MR x NR, the
  register micro-tile) and ``k_blocks`` (how K is blocked: ``"kc"`` equal blocks of at most KC,
  ``"one"`` one block of all of K, ``"one_if_fits"`` one block when B's panels for all of K fit in 2 MiB,
  tested at run time; a skinny plan runs all of K at once and has none). ``bind`` names the loops OpenMP
  runs in parallel and, in ``bind.split``, the axis the packed kernel's threads split when they do not
  take whole batch points each: ``"m"`` (rows; N only where the rows split unevenly), ``"n"`` (N wherever
  that is as even), or ``"n_if_a_resident"``/``"n_if_small_a"`` (``"n"`` when A, Mp x K floats, is at most
  64 Ki / 512 Ki floats at run time, else ``"m"``). The chooser decides both from the sizes when they are
  known when compiling and from which operands are constants (pre-packed): ``kumiko.plan.packed``.
  ``cache`` names the packed panels.
- GPU (``sm80``/``sm90``), the seed's names: ``tile`` (BM, BN, BK, an MMA plan's CTA tile), ``warp_tile``
  (``"WMxWN"``), ``stages`` (the cp.async ring), ``async`` (``async_`` here), ``barrier_model``,
  ``threads`` (a CTA's threads), ``split_k`` (an MMA plan's CTAs per output tile, each summing a share of the
  K tiles; the last to finish adds the others' partial sums and runs the epilogue) and ``ptxas_fallback`` (set
  when ptxas rejected the chooser's plan and this one replaced it: the hazard, the GPU arch, how many steps
  down).

``layout_hints`` holds typed hints only (``LAYOUT_HINTS``: ``group_m``, a GPU MMA plan's CTA swizzle),
never notes. Mappings are stored as sorted tuples so plans hash and compare by value; JSON keeps the
seed's shape. ``PLAN_FORMAT`` 2 is this shape; a format-1 plan (``tile``/``micro`` on both backends) read
back is E1801 with what to do.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Mapping, NamedTuple

from kumiko.diagnostics import KumikoError

CPU_ARCHS = ("cpu-avx512", "cpu-avx2", "cpu-scalar")
GPU_ARCHS = ("sm80", "sm90")
#: per-block shared memory limits (bytes): what a GPU plan must fit, what the GPU IR verifiers check and the emulator
#: enforces
SMEM_LIMIT = {"sm80": 166912, "sm90": 232448}
ARCHS = CPU_ARCHS + GPU_ARCHS
#: the Plan's JSON shape (``--dump plan``, ``--plan``, the tuning cache): 2 named each backend's blocks
PLAN_FORMAT = 2


class CacheBlock(NamedTuple):
    """A packed CPU contraction's cache blocks: an MC x KC block of A stays in L2, a KC x NR panel of B in
    L1, NC columns of B are packed at a time (upper bounds: the kernel evens them out at run time)."""
    mc: int
    nc: int
    kc: int


class RegisterBlock(NamedTuple):
    """A packed CPU contraction's register micro-tile: MR rows x NR columns of C held in vector registers."""
    mr: int
    nr: int


#: the fields only one backend's plans set (the others are both backends')
CPU_FIELDS = ("cache_block", "register_block", "k_blocks")
GPU_FIELDS = ("tile", "warp_tile", "stages", "async_", "barrier_model", "threads", "split_k", "ptxas_fallback")
#: ``layout_hints``' keys and the backend whose kernels read each
LAYOUT_HINTS = {"group_m": "gpu"}
#: the fields that are mappings in JSON (``{}`` when empty)
MAPPINGS = ("bind", "vectorize", "layout_hints", "algo_choice", "async_", "ptxas_fallback")
#: ``ptxas_fallback``'s keys
FALLBACK_KEYS = ("gpu_arch", "hazard", "steps")
_BLOCKS = {"cache_block": CacheBlock, "register_block": RegisterBlock}


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw_map(v: tuple) -> dict:
    return {k: (_thaw_map(x) if _is_pairs(x) else list(x) if isinstance(x, tuple) else x) for k, x in v}


def _is_pairs(x: Any) -> bool:
    return isinstance(x, tuple) and bool(x) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                                  for p in x)


def _value(name: str, v: Any) -> Any:
    """A field's stored form: a block as given (``Plan`` makes it a ``CacheBlock``/``RegisterBlock``), any
    other mapping or list frozen."""
    return v if name in _BLOCKS else _freeze(v)


def _block(name: str, v: Any) -> Any:
    """``v`` (a mapping of its names, a sequence, or None) as the block type of field ``name``; E1801 unless
    it has exactly that block's whole numbers."""
    cls = _BLOCKS[name]
    if v is None or type(v) is cls:
        return v
    try:
        b = cls(**v) if isinstance(v, Mapping) else cls(*v)
    except TypeError:
        b = None
    if b is None or not all(type(x) is int for x in b):
        names = ", ".join(cls._fields)
        form = ", ".join('"%s": N' % n for n in cls._fields)
        raise KumikoError("E1801", at="plan", why=f"{name} {v!r} is not {{{names}}} (whole numbers)",
                          suggestion=f"write {name} as {{{form}}}")
    return b


def _key(name: str) -> str:
    return "async" if name == "async_" else name


@dataclass(frozen=True)
class Plan:
    arch: str
    # both backends ------------------------------------------------------------------------------------
    bind: tuple = ()                   # (("m.o", "omp"), ...) or (("m.o", "block.y"), ...)
    cache: tuple = ()                  # ((("at", "k.o"), ("tensor", "A"), ("where", "pack")), ...)
    vectorize: tuple = ()              # (("axis", "n.i"), ("width", 8))
    predicate_tail: tuple = ()         # axis names whose extent may not divide the tile
    epilogue: tuple = ()               # ops applied to the accumulator (from SRNF R3)
    layout_hints: tuple = ()           # typed hints only (LAYOUT_HINTS): (("group_m", 8),)
    algo_choice: tuple = ()            # (("contraction", "packed"),) or (("region", "loops"),)
    local_edges: tuple = ()
    # CPU: a packed contraction's blocks -----------------------------------------------------------------
    cache_block: CacheBlock | None = None          # (MC, NC, KC)
    register_block: RegisterBlock | None = None    # (MR, NR)
    k_blocks: str | None = None                    # "kc", "one" or "one_if_fits" (kumiko.plan.packed)
    # GPU (seed 001 §8.1) --------------------------------------------------------------------------------
    tile: tuple = ()                   # an MMA plan's CTA tile (BM, BN, BK)
    warp_tile: str | None = None       # "WMxWN"
    stages: int = 1                    # the cp.async ring's stages
    async_: tuple = ()                 # (("enable", True), ("prefetch_depth", 2), ("release", "merged"), ...)
    barrier_model: str | None = None
    threads: int = 0                   # a CTA's threads (0: the SIMT default)
    split_k: int = 1                   # an MMA plan's CTAs per output tile, each over a share of K (gpu_ir.SplitK)
    ptxas_fallback: tuple = ()         # (("gpu_arch", "sm_90a"), ("hazard", "spill"), ("steps", 2))

    def __post_init__(self) -> None:
        for name in _BLOCKS:
            object.__setattr__(self, name, _block(name, getattr(self, name)))

    # access ----------------------------------------------------------------------------------------
    def get(self, name: str, key: str, default: Any = None) -> Any:
        return dict(getattr(self, name)).get(key, default)

    @property
    def backend(self) -> str:
        return backend_of(self.arch)

    @property
    def algo(self) -> str:
        return self.get("algo_choice", "contraction", self.get("algo_choice", "region", "loops"))

    @property
    def vector_width(self) -> int:
        return int(self.get("vectorize", "width", 1))

    @property
    def split(self) -> str | None:
        """The axis a packed plan's threads split (``bind.split``, ``kumiko.plan.packed.SPLITS``)."""
        return self.get("bind", "split", None)

    @property
    def lanes(self) -> str | None:
        """Which side of a contraction the vector lanes hold (``vectorize.axis``): ``"m"`` the M axes (the
        first operand's rows), ``"n"`` the N axes; None: the region's own rule (``region.operands.orient``)."""
        axis = self.get("vectorize", "axis", None)
        return axis if axis in ("m", "n") else None

    # JSON --------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The seed's shape, with this backend's fields only."""
        d: dict = {}
        for f in fields(self):
            if f.name in _foreign(self.backend):
                continue
            v = getattr(self, f.name)
            if isinstance(v, (CacheBlock, RegisterBlock)):
                d[_key(f.name)] = v._asdict()
            elif _is_pairs(v) or (f.name in MAPPINGS and not v):
                d[_key(f.name)] = _thaw_map(v)
            elif isinstance(v, tuple):
                d[_key(f.name)] = [(_thaw_map(x) if _is_pairs(x) else x) for x in v]
            else:
                d[_key(f.name)] = v
        return d

    @staticmethod
    def from_json(d: Any, at: str = "plan") -> "Plan":
        """The plan ``to_json`` wrote; E1801 for anything else (a format-1 plan says how to get a new one)."""
        if not isinstance(d, Mapping):
            raise KumikoError("E1801", at=at, why=f"a plan is a JSON object, not {type(d).__name__}")
        if "micro" in d:
            raise KumikoError(
                "E1801", at=at, why="a plan of format 1 (its 'tile' and 'micro' meant a CPU plan's cache and "
                f"register blocks); format {PLAN_FORMAT} names them 'cache_block' {{mc, nc, kc}} and "
                "'register_block' {mr, nr}, keeps 'tile' for a GPU plan's CTA tile [BM, BN, BK] and has no "
                "notes in 'layout_hints'",
                suggestion="dump the plan again (kumiko compile FILE --dump plan --out DIR) and edit that")
        known = {_key(f.name): f.name for f in fields(Plan)}
        bad = sorted(set(d) - set(known))
        if bad:
            raise KumikoError("E1801", at=at, why=f"unknown plan fields {bad}",
                              suggestion=f"a plan's fields: {', '.join(sorted(known))}")
        arch = d.get("arch")
        if arch not in ARCHS:
            raise KumikoError("E1801", at=at, why=f"arch {arch!r} is not one of {ARCHS}")
        other = sorted(k for k, name in known.items() if k in d and name in _foreign(backend_of(arch)))
        if other:
            raise KumikoError("E1801", at=at, why=f"{other} are not fields of a {arch} plan", suggestion=_own(arch))
        try:
            p = Plan(**{known[k]: _value(known[k], v) for k, v in d.items()})
        except KumikoError as e:
            raise KumikoError("E1801", at=at, why=e.why, suggestion=e.suggestion) from None
        return check_fields(p, at)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def with_(self, **kw: Any) -> "Plan":
        """A copy with fields replaced; mappings and lists are frozen as ``make_plan`` does."""
        return replace(self, **{k: _value(k, v) for k, v in kw.items()})


def backend_of(arch: str) -> str:
    """``"gpu"`` for a GPU arch, else ``"cpu"``."""
    return "gpu" if arch in GPU_ARCHS else "cpu"


def _foreign(backend: str) -> tuple:
    return GPU_FIELDS if backend == "cpu" else CPU_FIELDS


def _own(arch: str) -> str:
    own = CPU_FIELDS if backend_of(arch) == "cpu" else GPU_FIELDS
    return f"a {arch} plan's own fields are {', '.join(_key(n) for n in own)} (with the fields both backends share)"


def check_fields(plan: Plan, at: str = "plan") -> Plan:
    """E1801 unless ``plan`` sets only fields of its backend and ``layout_hints``/``ptxas_fallback`` hold only
    their known keys; returns it."""
    defaults = {f.name: f.default for f in fields(Plan) if f.default is not MISSING}
    other = [_key(n) for n in _foreign(plan.backend) if getattr(plan, n) != defaults[n]]
    if other:
        raise KumikoError("E1801", at=at, why=f"{other} are not fields of a {plan.arch} plan",
                          suggestion=_own(plan.arch))
    for key in dict(plan.layout_hints):
        if LAYOUT_HINTS.get(key) != plan.backend:
            hints = [k for k, b in LAYOUT_HINTS.items() if b == plan.backend]
            raise KumikoError("E1801", at=at, why=f"layout_hints.{key} is not a layout hint of a {plan.arch} plan "
                              "(layout_hints holds typed hints only)",
                              suggestion=f"a {plan.arch} plan's layout hints: {hints or 'none'}")
    bad = sorted(set(dict(plan.ptxas_fallback)) - set(FALLBACK_KEYS))
    if bad:
        raise KumikoError("E1801", at=at, why=f"ptxas_fallback has unknown keys {bad}",
                          suggestion=f"its keys: {', '.join(FALLBACK_KEYS)}")
    return plan


def make_plan(arch: str, **kw: Any) -> Plan:
    return Plan(arch=arch, **{k: _value(k, v) for k, v in kw.items()})
