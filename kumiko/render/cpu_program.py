"""The C of a whole Program: every region's kernel, with the vector types and the micro-kernels its plans
need. Deterministic: the same program and plans give byte-identical source.

A region whose deferred output feeds the next region's contraction row by row is run together with it
in one kernel (``kumiko.kernel.stream``); the returned ``Step``s say which function runs which regions
with which buffers.

Kernels that are the same function are emitted once (ResNet repeats each conv shape several times, with
other weights: the ABI passes buffers by position, so one function serves them all). Two kernels are the
same when their C is equal after the function's name and the names their own statements declare
(parameters, locals, loop variables: the lowering names values after graph nodes, ``v_v_n515``) are renamed
in order of first appearance, comments and blank lines dropped (``canonical_kernel``), and they need the
same micro-kernels at the same vector width. The first one's text (its name, comments and locals) is
kept, and every region it serves calls it by that name.

``render_cpu_source`` gives the program both as one translation unit (``source``: what dumps show, what
``build_c`` can compile) and as ``units`` for a parallel build with a cache per object
(``kumiko.runtime.cpu.build_units``): one unit per distinct kernel, in its canonical form under a name made
from its content (``kumiko_k<hash>``; ``aliases`` lets the link export the readable name too), with the
header, the prelude and only the micro-kernels it calls (``static`` in each unit, so gcc inlines them as
before). A unit's text depends only on what its kernel computes, not on node names or on its place in the
network, so a network that shares kernels with another, or changes one layer, compiles only the new ones.
The pack functions of constant operands share one unit (per vector width, with the helpers and no
micro-kernel): each is small, and about 0.05 s of gcc per unit goes whatever the unit holds (starting gcc,
loading the precompiled header); ResNet-50's 27 pack units took 3.5-3.8 s of gcc CPU, as one 1.9 s, and its
cold compile 0.3-0.8 s less on a 2-core Zen 3 (a change of one layer's shapes recompiles all of them).
Where any kernel uses the contraction helpers, one more unit defines the state they share (``kk_scratch``'s
per-thread buffers, hidden in the library; ``kk_stage_blocks``) and every other unit declares it
``extern``: the kernels of a program keep sharing one set of scratch buffers per thread, as in one
translation unit."""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from kumiko.kernel.abi import Pack, Step, program_symbols
from kumiko.kernel.contract import lower_contraction_kernels
from kumiko.kernel.loops import Kernel
from kumiko.kernel.lower_cpu import CpuLowering
from kumiko.kernel.micro import astage_micro_kernel, micro_kernel, stage_micro_kernel, vector_types, winograd_helpers
from kumiko.kernel.skinny import SkinnyLowering
from kumiko.kernel.stream import find_pipe, lower_pipe, pipe_buffers
from kumiko.kernel.winograd import WinogradLowering
from kumiko.plan.plan import Plan
from kumiko.plan.winograd import TRANSFORMS
from kumiko.region.analysis import analyze
from kumiko.region.ssa import Program
from kumiko.render.c import HEADER, declared_names, render_kernel, render_unit

#: the header every unit includes (its names are never renamed when kernels are compared)
_CPU_HEADER = Path(__file__).resolve().parents[1] / "include" / "kumiko_cpu.h"
_IDENT = re.compile(r"\b[A-Za-z_]\w*")
_IDENT_SPLIT = re.compile(r"([A-Za-z_]\w*)")   # also the letters of a number (12LL): the caller checks
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
#: the names ``canonical_kernel`` gives the function and its locals
_PLACEHOLDERS = re.compile(r"\bkumiko_(?:fn|l\d+)\b")
_FN_PLACEHOLDER = re.compile(r"\bkumiko_fn\b")
_DIGIT = re.compile(r"\d")
#: a file-scope variable of the contraction helpers, at the start of a line: ``[static] DECL [= INIT];``
_STATE = re.compile(r"^(static[ \t]+)?(?!typedef\b|extern\b|return\b)([A-Za-z_][^()#;{}=\n]*?)[ \t]*(=[^;\n]*)?;(.*)$",
                    re.M)
_HIDDEN = '__attribute__((visibility("hidden"))) '

#: the contraction lowerings other than the packed path's, by plan algorithm
_LOWERINGS = {"skinny": SkinnyLowering, "winograd": WinogradLowering}


@dataclass(frozen=True)
class CpuSource:
    """A program's C. ``source``: one translation unit, each distinct kernel once. ``units``: the same kernels
    as translation units for ``build_units`` (the shared-state unit first, when there is one), each kernel
    in its canonical form under a name made from its content. ``names``: region name -> C function;
    ``syms``: the ABI's symbol order; ``steps``: the calls in execution order; ``aliases``: (the name
    ``names`` and ``steps`` call, the name in the units), for the link to export both."""
    source: str
    units: tuple[str, ...]
    names: dict[str, str]
    syms: tuple
    steps: tuple[Step, ...]
    aliases: tuple[tuple[str, str], ...] = ()
    prefix: str = ""        # the text every unit starts with (``build_units`` precompiles it)
    #: what each unit holds: "shared" (the contraction helpers' state), "contraction" (a packed or skinny
    #: contraction kernel with a pointwise epilogue), "contraction+reduce" (one whose epilogue reduces: a
    #: softmax's rows, a pooling window), "pack" (a constant operand's packing), "stream" (a row-block
    #: pipeline), "loops" (a loop nest); the build gives each kind its flags (``kumiko.runtime.cpu.UNIT_FLAGS``)
    unit_kinds: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Piece:
    kernel: Kernel
    micros: tuple       # (kind, mr, nr, vw) of the micro-kernels it calls: kind "p" packed, "r" a_rows, "s" stage,
    #                     "l" B in place, "a"/"au" A from a stage, "w<m>" Winograd F(m x m, 3x3)'s transforms;
    #                     the packed path's kinds + "o": their sums handed back to an epilogue on them; any of
    #                     those + "t": (kind, mr, nr, vw, rows), a tail kernel of the last M tile
    vw: int             # the vector width of its types (kk_vf)
    kind: str = "loops"     # its unit's kind (``CpuSource.unit_kinds``)


def kernel_name(program: Program, k: int) -> str:
    safe = "".join(ch if ch.isalnum() else "_" for ch in program.regions[k].name)
    return f"kumiko_{k}_{safe}"


def render_cpu_source(program: Program, plans: dict[str, Plan], fuse: bool = True,
                      constants: frozenset = frozenset()) -> CpuSource:
    """The program's kernels, each distinct one once, as one translation unit and as units (module docstring)."""
    return render_cpu_kernels(lower_cpu_kernels(program, plans, fuse, constants))


@dataclass(frozen=True)
class CpuKernels:
    """A program's CPU kernel IR, before any text: the kernels (``_Piece``: loop nests, contraction kernels,
    pack functions) and the calls in execution order, (piece, regions, buffers, ((pack piece, Prepack,
    buffer), ...)) each; ``syms``: the ABI's symbol order."""
    pieces: tuple
    calls: tuple
    syms: tuple


def lower_cpu_kernels(program: Program, plans: dict[str, Plan], fuse: bool = True,
                      constants: frozenset = frozenset()) -> CpuKernels:
    """Every region's kernel under its plan; a region whose deferred output feeds the next one's contraction
    row by row is one kernel with it (``fuse``). A contraction operand that reads only ``constants`` (inputs
    the Executable binds once: the weights) is packed by a function of its own, once, and read in place by
    its kernel (``kumiko.kernel.contract.Prepack``; its step lists the panels after its buffers)."""
    syms = program_symbols(program)
    pieces: list[_Piece] = []
    calls: list[tuple] = []      # (piece, regions, buffers, ((pack piece, Prepack, buffer), ...)) in execution order
    fused_into: set = set()
    for k, r in enumerate(program.regions):
        if r.name in fused_into:
            continue
        name = kernel_name(program, k)
        plan = plans[r.name]
        pipe = find_pipe(program, k, syms, plans) if fuse else None
        if pipe is not None:
            r1 = program.regions[k + 1]
            name = f"{name}__{kernel_name(program, k + 1).split('_', 2)[2]}"
            cname = {n: f"b{i}" for i, n in enumerate(pipe_buffers(pipe))}
            plan1 = plans[r1.name]
            kern = lower_pipe(pipe, plan, plan1, syms, name, cname, r.notes + r1.notes)
            micros = (("p", *plan.register_block, plan.vector_width),
                      ("r", *plan1.register_block, plan1.vector_width))
            pieces.append(_Piece(kern, micros, plan.vector_width, "stream"))
            fused_into.add(r1.name)
            calls.append((len(pieces) - 1, (r.name, r1.name), pipe_buffers(pipe), ()))
            continue
        facts = analyze(r)
        kern, micros, packs, kind = None, (), [], "loops"
        if plan.algo in ("packed", "skinny", "winograd") and facts.contraction is not None:
            c = facts.contraction
            kind = "contraction" if c.pointwise and c.outer is None else "contraction+reduce"
            lo = CpuLowering(r, syms, name, facts=facts)
            kern, prepacks = lower_contraction_kernels(lo, plan, constants, _LOWERINGS.get(plan.algo))
            m = (*plan.register_block, plan.vector_width)
            micros = ((("p", *m),) + ((("s", *m),) if lo.staged else ()) + ((("l", *m),) if lo.b_ld else ())
                      + ((("a", *m),) if lo.a_staged is True else (("au", *m),) if lo.a_staged else ()))
            if lo.tile_epilogue:    # the kinds that hand their accumulators back (kind + "o")
                micros += tuple((k + "o", *m) for k, *_ in micros if k in _PACKED)
            if lo.m_tail:       # the packed path's kinds for the last M tile's rows (kind + "t", the rows last)
                micros += tuple((k + "t", *m, lo.m_tail) for k, *_ in micros if k.removesuffix("o") in _PACKED)
            if plan.algo == "winograd":
                micros += (("r", *m), (f"w{plan.get('algo_choice', 'tile', 2)}", *m))
            for pk in prepacks:
                pieces.append(_Piece(pk.kernel, (("p", *m),), plan.vector_width, "pack"))
                packs.append((len(pieces) - 1, pk, f"{r.name}.pack_{pk.key}"))
        if kern is None:
            kern = CpuLowering(r, syms, name, facts=facts).lower()
        pieces.append(_Piece(kern, micros, plan.vector_width, kind))
        calls.append((len(pieces) - 1, (r.name,), tuple(n for n, _ in r.inputs) + tuple(o.name for o in r.outputs)
                      + tuple(b for _, _, b in packs), tuple(packs)))
    return CpuKernels(tuple(pieces), tuple(calls), syms)


def render_cpu_kernels(lowered: CpuKernels) -> CpuSource:
    """The C of lowered kernels: one translation unit and the units (module docstring)."""
    pieces, calls, syms = lowered.pieces, lowered.calls, lowered.syms
    texts = [render_kernel(p.kernel) for p in pieces]
    # a pack function's integer constants come from a buffer of its own, after its step's (``lift_constants``)
    n_bufs = {j: len(buffers) for _, _, buffers, packs in calls for j, _, _ in packs}
    consts: dict[int, tuple] = {}
    for j, n in n_bufs.items():
        texts[j], consts[j] = lift_constants(texts[j], pieces[j].kernel.name, n)
    # the program-wide extra of one translation unit: every micro-kernel, the vector types of the last
    # kernel that has any (a program's packed plans share one vector width)
    all_micros = {m for p in pieces for m in p.micros}
    vw = next((p.vw for p in reversed(pieces) if p.micros), 4)
    extra = vector_types(vw) + "\n".join(_micro_texts(all_micros)) if all_micros else ""

    reserved = _reserved_names(extra)
    first: dict[tuple, int] = {}
    same_as: list[int] = []               # piece -> the piece whose function it calls
    canon: list[str | None] = []
    for i, (p, t) in enumerate(zip(pieces, texts)):
        c = canonical_kernel(t, p.kernel, reserved)
        canon.append(c)
        same_as.append(first.setdefault((p.micros, p.vw, c if c is not None else i), i))
    kept = sorted(set(same_as))

    names: dict[str, str] = {}
    steps = []
    for i, regions, buffers, packs in calls:
        fn = pieces[same_as[i]].kernel.name
        names.update((rn, fn) for rn in regions)
        steps.append(Step(fn, regions, buffers, tuple(Pack(pieces[same_as[j]].kernel.name, b, pk.floats, pk.sources,
                                                           consts[j]) for j, pk, b in packs)))

    source = render_unit([texts[i] for i in kept], extra)
    units, aliases, kinds = [], [], []
    pack_bodies: dict[int, list] = {}         # vector width -> the pack functions' bodies: one unit for them
    for i in kept:
        p, body = pieces[i], texts[i]
        if canon[i] is not None:
            digest = hashlib.sha256(f"{p.micros}|{p.vw}|{canon[i]}".encode()).hexdigest()[:24]
            fn = f"kumiko_k{digest}"
            body = _FN_PLACEHOLDER.sub(fn, canon[i])
            aliases.append((p.kernel.name, fn))
        if p.kind == "pack":
            pack_bodies.setdefault(p.vw, []).append(body)
            continue
        units.append(render_unit([body], _unit_extra(p)))
        kinds.append(p.kind)
    for pack_vw, bodies in pack_bodies.items():      # the helpers and vector types, no micro-kernel: they call none
        units.append(render_unit(bodies, _shared_state(vector_types(pack_vw), define=False)))
        kinds.append("pack")
    if all_micros:
        units.insert(0, render_unit([], _shared_state(vector_types(vw), define=True)))
        kinds.insert(0, "shared")
    prefix = render_unit([])                      # the header and the prelude: what every unit starts with
    assert all(u.startswith(prefix) for u in units)
    return CpuSource(source, tuple(units) or (source,), names, syms, tuple(steps), tuple(aliases), prefix,
                     tuple(kinds) if units else ("loops",))


def canonical_kernel(text: str, kernel: Kernel, reserved: frozenset = frozenset()) -> str | None:
    """``text`` (the kernel rendered) with comments and blank lines dropped, the function's name made
    ``kumiko_fn`` and the names its statements declare (``declared_names``, less the ``reserved`` file-scope
    names) that hold a digit made ``kumiko_l1``, ``kumiko_l2``, ... in order of first appearance: C that
    compiles, and two kernels with the same canonical text are the same function up to the spelling of its
    locals. The lowering's fixed names (``kk_acc``, ``kk_M``) stay as they are, readable: renaming any subset
    of the declared names is exact, and the names that differ between two copies of a kernel are the ones
    made from graph nodes (``v_v_n515``) and numbered ones (``b0``, ``i3``). None when the text already holds
    a placeholder name (then the kernel is compared and compiled as it is)."""
    if ("kumiko_fn" in text or "kumiko_l" in text) and _PLACEHOLDERS.search(text):
        return None
    rename = {kernel.name: "kumiko_fn"}
    wanted = {w for w in declared_names(kernel) - reserved if _DIGIT.search(w)} | {kernel.name}
    parts = _IDENT_SPLIT.split(_COMMENT.sub(_blank, text))    # text, word, text, word, ..., text
    for j in range(1, len(parts), 2):
        w = parts[j]
        if w not in wanted:
            continue
        before = parts[j - 1][-1:]
        if before.isalnum() or before == "_":
            continue                    # the letters of a number (12LL): not a name
        new = rename.get(w)
        if new is None:
            new = rename[w] = f"kumiko_l{len(rename)}"
        parts[j] = new
    return "\n".join(ln.rstrip() for ln in "".join(parts).splitlines() if ln.strip())


#: an integer literal of the lowering's (``12LL``), not a part of a name or of a float
_LL = re.compile(r"(?<![\w.])(\d+)LL\b")


def lift_constants(text: str, name: str, n_bufs: int) -> tuple[str, tuple[int, ...]]:
    """A pack function with its integer literals (``12LL``: sizes, strides, offsets) read from
    ``kk_cst = bufs[n_bufs]`` instead, in order of appearance, and their values: the packing functions of a
    network's weights differ mostly in those, so most of them become one (``canonical_kernel``), called with
    each one's values (``Pack.consts``). They run once per Executable, where constants folded into the code
    save nothing: ResNet-50's 28 pack functions are 10, their unit's gcc time 1.72 -> 0.68 s. Preprocessor
    lines keep theirs; a function without any reads no buffer more."""
    values: list[int] = []

    def lift(m: re.Match) -> str:
        values.append(int(m.group(1)))
        return f"kk_cst[{len(values) - 1}]"
    head = f"int {name}(void** bufs, const long long* syms) {{"
    assert text.count(head) == 1, f"lift_constants: {name} does not open as an ABI function"
    lines = [ln if ln.lstrip().startswith("#") else _LL.sub(lift, ln) for ln in text.split("\n")]
    if values:
        lines.insert(lines.index(head) + 1,
                     f"  const long long* KUMIKO_RESTRICT kk_cst = (const long long*)bufs[{n_bufs}];")
    return "\n".join(lines), tuple(values)


def _blank(m: re.Match) -> str:
    """A comment as a space, with the line breaks it spanned (the lines of what follows stay lines)."""
    return " " + "\n" * m.group().count("\n")


#: micro-kernel kinds (``_Piece.micros``), in the order one translation unit has always had them: the generator
#: and its arguments (the "o" kinds hand their accumulators back to an epilogue on them); kind + "t" is the kind's
#: tail kernel of the last M tile's rows
_MICROS = {"p": (micro_kernel, {}), "r": (micro_kernel, {"a_rows": True}), "s": (stage_micro_kernel, {}),
           "l": (micro_kernel, {"b_ld": True}), "a": (astage_micro_kernel, {}),
           "au": (astage_micro_kernel, {"unit": True}), "po": (micro_kernel, {"out": True}),
           "so": (stage_micro_kernel, {"out": True}), "ao": (astage_micro_kernel, {"out": True}),
           "auo": (astage_micro_kernel, {"unit": True, "out": True})}
#: the packed path's kinds (packed A and B, B or A from a stage): each has an "o" and a tail twin
_PACKED = ("p", "s", "a", "au")


def _micro_texts(micros) -> list[str]:
    """The micro-kernels, in the order one translation unit has always had them: packed, a_rows, stage, B in
    place, A from a stage, then the tail kernels of these kinds (the last M tile's rows)."""
    out = [_MICROS[k][0](*m[1:], **_MICROS[k][1]) for k in _MICROS for m in sorted(m for m in micros if m[0] == k)]
    out += [_MICROS[m[0][:-1]][0](*m[1:4], rows=m[4], **_MICROS[m[0][:-1]][1])
            for m in sorted(m for m in micros if m[0][:-1] in _MICROS and m[0].endswith("t"))]
    for kind, vw in sorted({(m[0], m[3]) for m in micros if m[0].startswith("w")}):   # "w<m>": F(m x m, 3x3)
        bt, _, at = TRANSFORMS[int(kind[1:])]
        out.append(winograd_helpers(int(kind[1:]), vw, bt, at))
    return out


def _unit_extra(p: _Piece) -> str:
    """A kernel unit's declarations: none for a loop nest; for a contraction the vector types, the helpers
    with their state ``extern`` (defined once, in the shared-state unit) and its own micro-kernels."""
    if not p.micros:
        return ""
    return _shared_state(vector_types(p.vw), define=False) + "\n".join(_micro_texts(p.micros))


def _shared_state(helpers: str, define: bool) -> str:
    """The contraction helpers with their file-scope variables shared across units: the one definition
    (``define``) or an ``extern`` declaration; a ``static`` one becomes hidden in the library instead. A
    variable that spans lines or is ``const`` stays as it is (a copy in each unit)."""
    def sub(m: re.Match) -> str:
        static, decl, init, rest = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        if re.search(r"\bconst\b", decl):
            return m.group(0)           # read-only data: a copy per unit is the same, and folds into the code
        vis = _HIDDEN if static else ""
        init = f" {init}" if init else ""
        return f"{vis}{decl}{init};{rest}" if define else f"extern {vis}{decl};{rest}"
    return _STATE.sub(sub, helpers)


def _reserved_names(extra: str) -> frozenset:
    """File-scope names a kernel may use (the header, the prelude, the program's extra): never renamed."""
    return _base_reserved() | frozenset(_IDENT.findall(_COMMENT.sub("", extra)))


@functools.lru_cache(maxsize=1)
def _base_reserved() -> frozenset:
    from kumiko.kernel import cexpr
    text = HEADER + cexpr.PRELUDE
    try:
        text += _CPU_HEADER.read_text()
    except OSError:
        pass
    return frozenset(_IDENT.findall(_COMMENT.sub("", text)))
