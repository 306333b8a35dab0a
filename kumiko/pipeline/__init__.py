"""The pipeline driver: one ordered list of stages, each a function from the artifacts before it to the next,
run in order for every compile (``compile_program``; ``kumiko.compile`` and every CLI command go through it).

    frontend -> tiny -> indexbook -> poly_view -> region -> plan -> kernel -> source -> binary

Every artifact is kept on the ``Compilation`` record. ``frontend`` is the Graph (absent when the program is
a Tiny IR); ``tiny`` its lowering; ``indexbook`` and ``poly_view`` are analyses nothing later reads, computed
when asked (a dump, ``KUMIKO_DEBUG=5``, ``KUMIKO_SPEC=2``); ``region`` is region formation; the rest are the
target's backend (``kumiko.backend``: which of them it has, and how each is made). A stage can be given
instead of computed (``start``: ``--resume STAGE.json`` reads a dumped tiny or region stage, ``read_stage``;
``--plan PLAN.json`` replaces the plans, ``read_plans``). A given stage is verified when ``KUMIKO_SPEC`` is
on, every stage at ``KUMIKO_SPEC=2`` (``verify``): regions by ``region.verify`` (types, neutral inits,
C-CON1, every read in bounds), the analyses by the IndexBook's and Poly-View's verifiers; plans are always
validated by the backend.

Each stage is dumpable (``stage_dumps``: ``kumiko compile --dump all`` and ``KUMIKO_DUMP`` write the same
files, ``dumps.DUMPS`` names them) and reported on stderr by ``KUMIKO_DEBUG``'s levels (``report``). Stage
packages never import the driver: it names them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from kumiko import knobs
from kumiko.backend import Backend, backend
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.frontend.layout import channels_last
from kumiko.indexbook import IndexBook, build_indexbook
from kumiko.pipeline import cache as program_cache
from kumiko.pipeline.dumps import (  # noqa: F401
    DRAWINGS,
    DUMPS,
    draw,
    draw_stages,
    dump_path,
    dumps,
    to_dot,
    to_tiny,
    write_dumps,
    write_files,
)
from kumiko.plan.plan import Plan
from kumiko.poly import PolyView, poly_view
from kumiko.poly import report as poly_report
from kumiko.region import form_regions
from kumiko.region.serial import program_from_json, program_json
from kumiko.region.ssa import Program
from kumiko.region.verify import verify as verify_region
from kumiko.tiny import ir as tiny_ir
from kumiko.tiny.build import load as load_tiny
from kumiko.tiny.ir import TinyGraph
from kumiko.util.log import enabled, log, stage

#: the stages, in order
STAGES: tuple[str, ...] = ("frontend", "tiny", "indexbook", "poly_view", "region", "plan", "kernel", "source",
                           "binary")
#: analysis stages: computed only when wanted (nothing later reads them)
ANALYSES: tuple[str, ...] = ("indexbook", "poly_view")
#: the stages a compile can start from (``--resume``)
RESUMABLE: tuple[str, ...] = ("tiny", "region")


@dataclass(eq=False)
class Compilation:
    """One compile: the target, its backend and typed options, and every stage's artifact (None until made)."""
    target: str
    backend: Backend
    options: Any
    constants: Mapping = field(default_factory=dict)   # the Executable's bound params (the cpu target packs them)
    frontend: Graph | None = None
    tiny: TinyGraph | None = None
    indexbook: IndexBook | None = None
    poly_view: PolyView | None = None
    region: Program | None = None
    plan: dict[str, Plan] | None = None
    kernel: Any = None
    source: Any = None
    binary: Any = None
    machine: Any = None          # what the backend resolved about the machine it compiles for (the cuda device)
    given: frozenset = frozenset()       # the stages read from a file, not computed

    @property
    def name(self) -> str:
        return self.tiny.name if self.tiny is not None else self.frontend.name

    def has(self, s: str) -> bool:
        """Whether this compile has stage ``s`` (a Tiny IR program has no frontend; eval forms no regions)."""
        if s == "frontend":
            return self.frontend is not None
        return s in ("tiny", *ANALYSES) or s in self.backend.stages

    def runner(self):
        """``(inputs, env) -> outputs`` of the built program."""
        return self.backend.runner(self)


def signature_shapes(program: Graph | TinyGraph) -> dict:
    """Declared shapes of the signature tensors: the frontend's tensor table, else the INPUT nodes."""
    if isinstance(program, Graph):
        out = {t: ty.shape for t, ty in program.input_types.items()}
        out.update({t: ty.shape for t, ty in program.output_types.items()})
        return out
    tiny = to_tiny(program)
    return {t: tiny[nid].shape for t, nid in tiny.inputs}


def stage_indexbook(program: Graph | TinyGraph) -> IndexBook:
    """The IndexBook of a program, aligned to its signature."""
    return build_indexbook(to_tiny(program), signature_shapes(program))


def _binary(c: Compilation) -> Any:
    """The backend's build; a build that refuses the chosen plans (ptxas spills) lowers again with the
    plans the backend gives instead (``Backend.replan``)."""
    while True:
        try:
            return c.backend.build(c)
        except KumikoError as e:
            plans = c.backend.replan(c, e)
            if plans is None:
                raise
            log(1, f"replan: {e.at}: {e.why}")
            c.plan = plans
            c.kernel = c.backend.lower(c)
            c.source = c.backend.render(c)


#: stage -> the function that makes its artifact from the Compilation (the ones before it)
STAGE_FNS = {
    "tiny": lambda c: c.frontend.tiny,
    "indexbook": lambda c: stage_indexbook(c.frontend or c.tiny),
    "poly_view": lambda c: poly_view(c.indexbook),
    "region": lambda c: form_regions(c.tiny, **(c.backend.formation() if c.backend is not None else {})),
    "plan": lambda c: c.backend.choose_plans(c),
    "kernel": lambda c: c.backend.lower(c),
    "source": lambda c: c.backend.render(c),
    "binary": _binary,
}


def verify(c: Compilation, s: str) -> None:
    """The checks of stage ``s`` at ``KUMIKO_SPEC``: 0 none; 1 (the default) a given stage - a region dump is
    checked against the program's signature and by the region verifier; 2 every stage: the regions formed
    too, and the analyses, which are then made for every compile. The verifiers are strict: a read must be in
    bounds for every size (a slice of a symbolic dimension is in bounds only for the sizes the compiled
    program checks when it is called, ``check_sizes``), so level 2 can refuse such a program."""
    level = knobs.spec()
    if level < 1 or (level < 2 and s not in c.given):
        return
    if s == "region":
        if "region" in c.given:
            check_resumed(c.tiny, c.region)
        for r in c.region.regions:
            verify_region(r)
    elif s == "poly_view":
        c.poly_view.verify()            # the IndexBook's verifier, then Poly-View's bounds and div guards


def check_resumed(tiny: TinyGraph, program: Program) -> None:
    """E1009 unless a region dump computes the program's signature (names, dtypes): the Tiny IR binds its
    inputs and is the reference ``--check`` compares with."""
    def sig(pairs, dtype) -> list:
        return [(n, str(dtype(x))) for n, x in pairs]
    want = (sig(tiny.inputs, lambda nid: tiny[nid].dtype), sig(tiny.outputs, lambda nid: tiny[nid].dtype))
    got = (sig(program.inputs, lambda m: m.dtype), sig(program.outputs, lambda m: m.dtype))
    if want != got:
        raise KumikoError("E1009", at=f"region dump of {program.name}", why=f"its signature {got} is not the "
                          f"program's {want}", suggestion="resume from a region dump of this program")


def arrange(program: Graph | TinyGraph, target: str = "cpu", options: Mapping[str, Any] | None = None
            ) -> Graph | TinyGraph:
    """The program ``target`` compiles for ``program``: a Graph with channels-last activations between its
    convolutions where the target wants them (``Backend.channels_last``, ``kumiko.frontend.layout``), else
    ``program`` itself. ``kumiko.compile`` arranges once and compiles what it got (its signature, params
    and checks are the arranged graph's)."""
    be = backend(target)
    if isinstance(program, Graph) and be.channels_last(be.options(dict(options or {}))):
        with stage("frontend layout (channels-last)"):
            return channels_last(program)
    return program


def compile_program(program: Graph | TinyGraph, target: str = "cpu", options: Mapping[str, Any] | None = None, *,
                    constants: Mapping | None = None, start: Mapping[str, Any] | None = None,
                    until: str = "binary", want: Sequence[str] = (), arranged: bool = False) -> Compilation:
    """Run the stages of ``target`` in order up to ``until``. ``start``: stage -> artifact given instead of
    computed (a resumed stage); ``want``: analysis stages to make too; ``arranged``: ``program`` is
    ``arrange``'s already (else it is arranged here). A compile that reaches ``binary`` is reported
    (``KUMIKO_DEBUG``) and dumped (``KUMIKO_DUMP``)."""
    be = backend(target)
    if not arranged and not start:
        program = arrange(program, target, options)
    c = Compilation(target, be, be.options(dict(options or {})), dict(constants or {}))
    if isinstance(program, Graph):
        c.frontend = program
    else:
        c.tiny = to_tiny(program)
    for s, artifact in (start or {}).items():
        if s not in RESUMABLE:
            raise KumikoError("E1010", at="--resume", why=f"a compile cannot start from the {s} stage",
                              suggestion=f"resume from one of: {', '.join(RESUMABLE)}")
        setattr(c, s, artifact)
    c.given = frozenset(start or ())
    cached = until == "binary" and program_cache.usable(target, c.options, start, tuple(want))
    if cached:
        if c.tiny is None:
            advance(c, "tiny")
        k = program_cache.key(c.tiny, target, c.options, c.constants)
        with stage("program cache"):
            hit = program_cache.lookup(k, c.constants)
        if hit is not None:
            log(1, f"program cache: {c.name} for {target} from the cache, no stage run")
            c.region, c.plan, c.binary = hit.program, hit.plans, hit
            report(c)
            return c
    if knobs.dump_dir() is not None or enabled(5) or knobs.spec() >= 2:
        want = (*want, *ANALYSES)
    if until == "binary" and "binary" not in c.given:
        c.backend.prepare(c)
    advance(c, until, want)
    if until == "binary":
        report(c)
        if cached:
            program_cache.store(k, c.binary)
        elif getattr(c.options, "tune", False):
            program_cache.forget_programs()     # the tuned winners may change plans of cached programs
    return c


def advance(c: Compilation, until: str = "binary", want: Sequence[str] = ()) -> Compilation:
    """Make every stage of ``c`` up to ``until`` that is not made yet (analyses only when in ``want``, with the
    analyses before them: Poly-View is made from the IndexBook)."""
    wanted = [a for a in ANALYSES if a in want]
    want = ANALYSES[:ANALYSES.index(wanted[-1]) + 1] if wanted else ()
    for s in STAGES[:STAGES.index(until) + 1]:
        if not c.has(s) or (s in ANALYSES and s not in want and getattr(c, s) is None):
            continue
        if getattr(c, s) is None:
            note = getattr(c.backend, "notes", {}).get(s)
            with stage(f"{s} ({note})" if note else s):
                setattr(c, s, STAGE_FNS[s](c))
            verify(c, s)
        elif s in c.given:
            verify(c, s)
    return c


# -- stages read from files --------------------------------------------------------------------------

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise KumikoError("E1502", at=str(path), why=f"cannot read the file: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise KumikoError("E1009", at=str(path), why=f"not a JSON file ({e})") from None


def read_stage(path: str | Path) -> tuple[str, Any]:
    """(stage, artifact) of a dumped stage a compile can start from: a Tiny IR (``"uops"``) or a region
    program (``"kumiko": "region"``, ``region.serial``); E1009 for anything else."""
    p = Path(path)
    d = _read_json(p)
    if isinstance(d, Mapping) and "uops" in d:
        return "tiny", load_tiny(d)
    if isinstance(d, Mapping) and d.get("kumiko") == "region":
        try:
            return "region", program_from_json(d)
        except KumikoError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise KumikoError("E1009", at=str(p), why=f"malformed region dump ({type(e).__name__}: {e})") from None
    raise KumikoError("E1009", at=str(p), why="not a dumped stage a compile can start from",
                      suggestion=f"give a {' or '.join(RESUMABLE)} dump: kumiko compile FILE --dump tiny,region "
                      "--out DIR")


def tiny_beside(region_dump: str | Path) -> Path:
    """The Tiny IR dump written beside a region dump (``<name>.tiny.json``): what resuming it runs against."""
    p = Path(region_dump)
    stem = p.name[:-len(".region.json")] if p.name.endswith(".region.json") else p.stem
    return p.with_name(f"{stem}.tiny.json")


def read_plans(path: str | Path) -> dict[str, Plan]:
    """The plans of a plan dump (region name -> plan JSON, what ``--dump plan`` writes); E1801 for a file that
    is not one. Each plan is validated against its region when the compile uses it (E1801)."""
    d = _read_json(Path(path))
    if not isinstance(d, Mapping):
        raise KumikoError("E1801", at=str(path), why="a plan file maps region names to plans",
                          suggestion="start from a dump: kumiko compile FILE --dump plan --out DIR")
    out = {}
    for name, pj in d.items():
        try:
            out[name] = Plan.from_json(pj, at=f"plan of {name} in {path}")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise KumikoError("E1801", at=f"plan of {name} in {path}",
                              why=f"not a plan ({type(e).__name__}: {e})") from None
    return out


# -- dumps and reports -------------------------------------------------------------------------------

def dump_names(c: Compilation | None, requested: Sequence[str], at: str = "compile --dump") -> list[str]:
    """The dumps of ``requested`` (``all``: every one this compile has), checked: E1010 for an unknown name
    or, when ``c`` is given, one its target does not make."""
    names = [n for n in requested if n != "all"]
    bad = [n for n in names if n not in DUMPS]
    if bad:
        raise KumikoError("E1010", at=at, why=f"unknown stage{'s' * (len(bad) > 1)} {', '.join(map(repr, bad))}",
                          suggestion=f"stages: {', '.join([*DUMPS, 'all'])}")
    if c is None:
        return names
    if "all" in requested:
        names += [n for n in DUMPS if n not in names and _dumpable(c, n)]
    missing = [n for n in names if not _dumpable(c, n)]
    if missing:
        raise KumikoError("E1010", at=at, why=f"the {c.target} target makes no {', '.join(missing)} stage"
                          + (" (the program is a Tiny IR)" if missing == ["frontend"] else ""),
                          suggestion="dump the stages it has, or --dump all")
    return [n for n in DUMPS if n in names]


def _dumpable(c: Compilation, n: str) -> bool:
    s = DUMPS[n]
    if n == "gpu_ir":
        return hasattr(c.backend, "kernel_json") and c.has("kernel")
    return c.has(s)


def stage_dumps(c: Compilation, names: Sequence[str]) -> dict[tuple, str | bytes]:
    """The files of dumps ``names`` (file name parts after the graph's name -> content), all made before any
    is written; the stages they show are made first when they are not (the analyses)."""
    advance(c, max((DUMPS[n] for n in names), key=STAGES.index, default="tiny"), want=[DUMPS[n] for n in names])
    out: dict[tuple, str | bytes] = {}
    for n in names:
        if n == "c":
            out.update(c.backend.source_files(c))
        elif n == "plan":
            out["plan", "json"] = json.dumps({r: p.to_json() for r, p in c.plan.items()}, indent=2) + "\n"
        else:
            out[n, "json"] = dumps(_stage_json(c, n))
    return out


def _stage_json(c: Compilation, n: str) -> dict:
    return {"frontend": lambda: c.frontend.to_json(), "tiny": lambda: tiny_ir.to_json(c.tiny),
            "indexbook": lambda: c.indexbook.to_json(), "poly_view": lambda: poly_report(c.poly_view),
            "region": lambda: program_json(c.region), "plan": lambda: {r: p.to_json() for r, p in c.plan.items()},
            "gpu_ir": lambda: c.backend.kernel_json(c)}[n]()


def stage_json(program: Graph | TinyGraph, name: str, target: str | None = None) -> dict:
    """The JSON dump ``name`` of a program (``kumiko dump``): the driver run up to the stage it shows, for
    ``target`` (default cpu; cuda-emu for ``gpu_ir``)."""
    (name,) = dump_names(None, [name], at="dump")
    if name == "c":
        raise KumikoError("E1010", at="dump", why="the generated source is not JSON",
                          suggestion="write it with: kumiko compile FILE --dump c --out DIR")
    target = target or ("cuda-emu" if name == "gpu_ir" else "cpu")
    c = compile_program(program, target, until=DUMPS[name], want=[DUMPS[name]])
    (n,) = dump_names(c, [name], at="dump")
    return _stage_json(c, n)


def draw_target_stages(program: Graph | TinyGraph, stages: Sequence[str], fmt: str,
                       target: str | None = None) -> dict[str, str]:
    """``draw_stages`` with the region stage's picture the ``target``'s (default cpu): the regions its driver
    forms, as its JSON dump shows them (the cpu target's layout and R-pool), not a target-neutral formation."""
    def region() -> Program:
        return compile_program(program, target or "cpu", until="region", want=["region"]).region
    return draw_stages(program, stages, fmt, region)


def dump(program: Graph | TinyGraph, stages: list[str], out_dir: Path | None,
         target: str | None = None) -> dict[str, str]:
    """Render each stage's JSON (``target``'s: ``stage_json``); write ``<name>.<stage>.json`` into ``out_dir``
    when given. Returns texts."""
    texts = {s: dumps(stage_json(program, s, target)) for s in stages}
    if out_dir is not None:
        write_dumps(texts, program.name, out_dir)
    return texts


def report(c: Compilation) -> None:
    """What every compile shows on stderr (``KUMIKO_DEBUG`` 2 to 5; level 1's stage times are ``advance``'s)
    and writes into ``KUMIKO_DUMP`` (every stage it has). Nothing is made for a level that is off."""
    built = c.binary
    if enabled(2):
        for ln in getattr(built, "launches", ()):
            log(2, f"kernel {ln.kernel}: region {ln.region}, block {ln.block}, dynamic smem {ln.smem} B")
        for st in getattr(getattr(built, "runner", None), "steps", ()):
            log(2, f"kernel {st.fn}: region{'s' * (len(st.regions) > 1)} {' + '.join(st.regions)}")
    if enabled(3) and c.plan is not None:
        from kumiko.plan.gpu import describe_plan
        for region, p in c.plan.items():
            log(3, f"plan {region}: {describe_plan(p)}")
    out_dir = knobs.dump_dir()
    names = dump_names(c, ["all"])
    if out_dir is None:
        names = [n for n in names if (n == "c" and enabled(4)) or (n not in ("c", "plan") and enabled(5))]
    files = stage_dumps(c, names)
    for parts, data in files.items():
        if parts[0] in ("c", "cu") and enabled(4):
            log(4, f"generated source of {c.name} ({c.target}):\n{data}")
        elif parts[-1] == "json" and parts[0] != "plan" and enabled(5):
            log(5, f"{parts[0]} IR of {c.name}:\n{data}")
    if out_dir is not None:
        paths = write_files(files, c.name, out_dir)
        log(1, f"KUMIKO_DUMP: wrote {len(paths)} file(s) for {c.name} into {out_dir}")


def compile_cuda(program: Graph | TinyGraph, arch: str = "sm80", plans: Mapping[str, Plan] | None = None,
                 emu: str = "deferred") -> Any:
    """The cuda-emu target's artifact (``runtime.emu_program.CompiledCuda``: program, plans, GPU IR, source,
    launches; the emulator built on its first call), for tests and benchmarks that read or mutate them."""
    return compile_program(program, "cuda-emu", {"arch": arch, "plans": plans, "emu": emu}).binary
