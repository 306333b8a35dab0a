"""The ordered stage list, and dumps and pictures of each stage in the seeds' JSON shape.

The stage table lives here, not in the stages: a stage package never imports the driver (``STAGES`` and
``DRAWINGS`` name each stage's producer; ``stage_indexbook``/``stage_poly_view`` run the analysis stages on a
frontend Graph or a TinyGraph).

Every stage is a pure function of the previous one. ``dump`` writes ``<name>.<stage>.json`` files
that are byte-identical across runs; a dumped stage can be loaded again and compiled from
(``kumiko.load`` recognises a Tiny IR dump), which is how tests start mid-pipeline. ``<name>`` is the
graph's name made a plain file name (``dump_path``), so every file lands inside the directory given.

What a compile shows and writes is decided here too, once for every target (``report_compile``, which
``kumiko.compile`` calls): ``KUMIKO_DEBUG``'s kernels, plans, source and IRs, and ``KUMIKO_DUMP``'s files,
which are exactly ``kumiko compile --dump`` 's (``compiled_dumps``). The stage times are printed by the
targets, which alone know where their stages begin and end.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.frontend.visualize import frontend_stage_drawing, tiny_stage_drawing
from kumiko.indexbook import IndexBook, build_indexbook
from kumiko.poly import PolyView, poly_view
from kumiko.poly import report as poly_report
from kumiko.region import form_regions
from kumiko.region.draw import draw_program
from kumiko.region.serial import program_json
from kumiko.tiny import ir as tiny_ir
from kumiko.tiny.ir import TinyGraph
from kumiko.util.drawing import Cluster, Drawing, render_dot, to_svg
from kumiko.util.files import safe_stem, write_file
from kumiko.util.log import enabled, log


def to_tiny(program: Graph | TinyGraph) -> TinyGraph:
    """The Tiny IR of a frontend Graph (its lowering), or the TinyGraph itself."""
    if isinstance(program, TinyGraph):
        return program
    if isinstance(program, Graph):
        return program.tiny
    raise TypeError(f"expected a kumiko Graph or TinyGraph, got {type(program).__name__}")


def _frontend_graph(program: Graph | TinyGraph) -> Graph:
    if not isinstance(program, Graph):
        raise KumikoError("E1009", at="dump", why="the frontend stage needs a frontend graph, not a Tiny IR dump")
    return program


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


def stage_poly_view(program: Graph | TinyGraph) -> PolyView:
    return poly_view(stage_indexbook(program))


def _gpu_ir(program: Graph | TinyGraph) -> dict:
    """The ``gpu_ir`` dump: every kernel's GPU IR under the chosen sm80 plans, and the launches."""
    from kumiko.kernel.gpu_ir import ir_json
    from kumiko.runtime.target_cuda import compile_cuda
    c = compile_cuda(to_tiny(program))
    return {"program": c.program.name, "arch": c.arch, "kernels": [ir_json(k) for k in c.kernels],
            "launches": [ln.to_json() for ln in c.launches]}


#: stage name -> producer of its JSON dump, in pipeline order (the stage packages know nothing of this table)
STAGES: dict[str, Callable[[Graph | TinyGraph], dict]] = {
    "frontend": lambda p: _frontend_graph(p).to_json(),
    "tiny": lambda p: tiny_ir.to_json(to_tiny(p)),
    "indexbook": lambda p: stage_indexbook(p).to_json(),
    "poly_view": lambda p: poly_report(stage_poly_view(p)),
    "region": lambda p: program_json(form_regions(to_tiny(p))),
    "gpu_ir": _gpu_ir,
}

#: stage name -> the Drawing of a program at that stage (``to_dot``, ``draw``)
DRAWINGS: dict[str, Callable[[Graph | TinyGraph], Drawing]] = {
    "frontend": frontend_stage_drawing,
    "tiny": tiny_stage_drawing,
    "region": lambda p: draw_program(form_regions(to_tiny(p))),
}


#: what ``kumiko compile --dump`` takes besides ``STAGES``: the plans (``plan``) and the generated source
#: (``c``: ``.c``, or ``.cu`` with the cubin for the cuda target), which exist only once a target compiled
COMPILED: tuple[str, ...] = ("plan", "c")
#: what ``KUMIKO_DUMP`` writes for every compile (each one the compile built: frontend only for a Graph;
#: region, plan and c only for a target that forms regions, not ``eval``)
COMPILE_DUMPS: tuple[str, ...] = ("frontend", "tiny", "region", *COMPILED)
_IRS = ("frontend", "tiny", "region")          # KUMIKO_DEBUG=5


def stage_json(program: Graph | TinyGraph, stage: str) -> dict:
    if stage not in STAGES:
        raise KumikoError("E1010", at="dump", why=f"unknown stage {stage!r}",
                          suggestion=f"stages: {', '.join(STAGES)}")
    return STAGES[stage](program)


def to_dot(program: Graph | TinyGraph, stage: str | None = None, clusters: Sequence[Cluster] = ()) -> str:
    """DOT text of a program at ``stage`` (default: frontend for a Graph, tiny for a TinyGraph);
    ``clusters`` draws boxes around groups of the drawing's nodes."""
    stage = stage or ("frontend" if isinstance(program, Graph) else "tiny")
    if stage not in DRAWINGS:
        why = f"the {stage!r} stage has no picture yet" if stage in STAGES else f"unknown stage {stage!r}"
        raise KumikoError("E1010", at="dump --format", why=why,
                          suggestion=f"draw one of: {', '.join(DRAWINGS)}; or dump the stage as JSON")
    d = DRAWINGS[stage](program)
    if clusters:
        d = replace(d, clusters=d.clusters + tuple(clusters))
    return render_dot(d)


def draw(program: Graph | TinyGraph, stage: str, fmt: str) -> str:
    """The picture of one stage as ``dot`` or ``svg`` text."""
    if fmt not in ("dot", "svg"):
        raise KumikoError("E1010", at="dump --format", why=f"unknown picture format {fmt!r}",
                          suggestion="use --format dot or --format svg")
    text = to_dot(program, stage)
    return to_svg(text) if fmt == "svg" else text


def draw_stages(program: Graph | TinyGraph, stages: Sequence[str], fmt: str) -> dict[str, str]:
    """Pictures of several stages: stage -> text, all drawn before the caller writes any (a failure writes
    nothing; the CLI writes them under file names ``dump_path`` makes safe)."""
    return {s: draw(program, s, fmt) for s in stages}


def _fmt(v, indent: int) -> str:
    one = json.dumps(v, ensure_ascii=False)
    if len(one) + indent <= 100 or not isinstance(v, (dict, list)) or not v:
        return one
    pad = " " * (indent + 2)
    if isinstance(v, list):
        items = [pad + _fmt(x, indent + 2) for x in v]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [pad + json.dumps(k, ensure_ascii=False) + ": " + _fmt(x, indent + 2) for k, x in v.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def dumps(d: dict) -> str:
    """JSON where anything that fits in 100 columns stays on one line (shapes, maps, axes), for reading."""
    return _fmt(d, 0) + "\n"


def dump_path(out_dir: Path | str, name: str, *parts: str) -> Path:
    """``<out_dir>/<name>.<part>...`` for a file written about the program ``name`` (``plan``, ``json``):
    the graph name is user text, so it is made a plain file name first (``../../x`` stays in ``out_dir``)."""
    return Path(out_dir) / ".".join([safe_stem(name), *parts])


def write_dumps(texts: dict[str, str], name: str, out_dir: Path | str, ext: str = "json") -> list[Path]:
    """Write each stage's text to ``dump_path(out_dir, name, stage, ext)``; E1502 when one cannot be written
    (``out_dir`` is a file, no permission). Returns the paths written."""
    return write_files({(stage, ext): text for stage, text in texts.items()}, name, out_dir)


def write_files(files: dict[tuple[str, ...], str | bytes], name: str, out_dir: Path | str) -> list[Path]:
    """Write each file to ``dump_path(out_dir, name, *parts)`` (E1502 when one cannot be written)."""
    paths = []
    for parts, data in files.items():
        path = dump_path(out_dir, name, *parts)
        write_file(path, data, f"the {parts[0]} dump")
        paths.append(path)
    return paths


def dump(program: Graph | TinyGraph, stages: list[str], out_dir: Path | None) -> dict[str, str]:
    """Render each stage; write ``<name>.<stage>.json`` into ``out_dir`` when given. Returns texts."""
    texts = {s: dumps(stage_json(program, s)) for s in stages}
    if out_dir is not None:
        write_dumps(texts, program.name, out_dir)
    return texts



def check_compile_stages(stages: Sequence[str]) -> None:
    """E1010 for a ``--dump`` stage that is neither in ``STAGES`` nor ``COMPILED`` (before compiling)."""
    bad = [s for s in stages if s not in STAGES and s not in COMPILED]
    if bad:
        raise KumikoError("E1010", at="compile --dump", why=f"unknown stage{'s' * (len(bad) > 1)} "
                          f"{', '.join(map(repr, bad))}", suggestion=f"stages: {', '.join([*STAGES, *COMPILED])}")


def compiled_dumps(program: Graph | TinyGraph, built, target: str, stages: Sequence[str]) -> dict[tuple, str | bytes]:
    """The files ``kumiko compile --dump STAGES`` writes and ``KUMIKO_DUMP`` writes, as name parts after the
    graph's name -> content, all made before any is written. ``built`` is what the target's factory made:
    the region stage is its program when it formed one (the JSON ``STAGES`` would form again), plan and c
    are its plans and source, absent for a target without them (``eval``)."""
    out: dict[tuple, str | bytes] = {}
    for s in stages:
        if s == "plan" and hasattr(built, "plans"):
            out["plan", "json"] = json.dumps({n: p.to_json() for n, p in built.plans.items()}, indent=2) + "\n"
        elif s == "c" and hasattr(built, "source"):
            out[("cu" if target in ("cuda", "cuda-emu") else "c",)] = built.source
            cubin = getattr(built, "cubin", None)
            if cubin is not None:
                out[cubin.arch, "cubin"] = cubin.data
        elif s == "region" and hasattr(built, "program"):
            out["region", "json"] = dumps(program_json(built.program))
        elif s not in COMPILED:
            out[s, "json"] = dumps(stage_json(program, s))
    return out


def report_compile(program: Graph | TinyGraph, built, target: str) -> None:
    """What every ``kumiko.compile`` shows on stderr (``KUMIKO_DEBUG`` 2 to 5; level 1's stage times come
    from the targets) and writes into ``KUMIKO_DUMP``; the levels are ``knobs.py``'s. Nothing is made for
    a level that is off or without a dump directory."""
    name = program.name
    if enabled(2):
        for ln in getattr(built, "launches", ()):
            log(2, f"kernel {ln.kernel}: region {ln.region}, block {ln.block}, dynamic smem {ln.smem} B")
        for st in getattr(getattr(built, "runner", None), "steps", ()):
            log(2, f"kernel {st.fn}: region{'s' * (len(st.regions) > 1)} {' + '.join(st.regions)}")
    if enabled(3) and hasattr(built, "plans"):
        from kumiko.plan.gpu import describe_plan
        for region, p in built.plans.items():
            log(3, f"plan {region}: {describe_plan(p)}")
    out_dir = knobs.dump_dir()
    stages = [s for s in COMPILE_DUMPS if (s != "frontend" or isinstance(program, Graph))
              and (s in ("frontend", "tiny") or hasattr(built, "program"))]
    if out_dir is None:
        stages = [s for s in stages if (s == "c" and enabled(4)) or (s in _IRS and enabled(5))]
    files = compiled_dumps(program, built, target, stages)
    for parts, data in files.items():
        if parts[0] in ("c", "cu") and enabled(4):
            log(4, f"generated source of {name} ({target}):\n{data}")
        elif parts[0] in _IRS and enabled(5):
            log(5, f"{parts[0]} IR of {name}:\n{data}")
    if out_dir is not None:
        paths = write_files(files, name, out_dir)
        log(1, f"KUMIKO_DUMP: wrote {len(paths)} file(s) for {name} into {out_dir}")
