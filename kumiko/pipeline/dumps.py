"""Dumps and pictures of the pipeline's stages: deterministic JSON text (``dumps``: anything that fits in 100
columns on one line), file names made safe from the graph's name (``dump_path``: every file lands inside the
directory given), atomic writes (``write_files``: E1502 when one cannot be written), and the pictures of the
stages that have one (``DRAWINGS``, ``to_dot``, ``draw``). What each stage's JSON is, is the driver's
(``kumiko.pipeline.stage_dumps``)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.frontend.visualize import frontend_stage_drawing, tiny_stage_drawing
from kumiko.region import form_regions
from kumiko.region.draw import draw_program
from kumiko.region.ssa import Program
from kumiko.tiny.ir import TinyGraph
from kumiko.util.drawing import Cluster, Drawing, render_dot, to_svg
from kumiko.util.files import safe_stem, write_file


def to_tiny(program: Graph | TinyGraph) -> TinyGraph:
    """The Tiny IR of a frontend Graph (its lowering), or the TinyGraph itself."""
    if isinstance(program, TinyGraph):
        return program
    if isinstance(program, Graph):
        return program.tiny
    raise TypeError(f"expected a kumiko Graph or TinyGraph, got {type(program).__name__}")


#: stage name -> the Drawing of a program at that stage (``to_dot``, ``draw``)
DRAWINGS: dict[str, Callable[[Graph | TinyGraph], Drawing]] = {
    "frontend": frontend_stage_drawing,
    "tiny": tiny_stage_drawing,
    # a Program: the target's regions as its driver formed them (``draw_stages``); a program: target-neutral
    "region": lambda p: draw_program(p if isinstance(p, Program) else form_regions(to_tiny(p))),
}
#: what ``--dump`` / ``KUMIKO_DUMP`` write, in pipeline order: dump name -> the driver's stage it shows. Every
#: one is JSON (``<name>.<dump>.json``) but ``c``: the generated source (``.c``, or ``.cu`` with the cubin
#: for the cuda target). ``gpu_ir`` is the CUDA backends' kernel stage.
DUMPS: dict[str, str] = {"frontend": "frontend", "tiny": "tiny", "indexbook": "indexbook", "poly_view": "poly_view",
                         "region": "region", "plan": "plan", "gpu_ir": "kernel", "c": "source"}


def to_dot(program: Graph | TinyGraph | Program, stage: str | None = None, clusters: Sequence[Cluster] = ()) -> str:
    """DOT text of a program at ``stage`` (default: frontend for a Graph, tiny for a TinyGraph);
    ``clusters`` draws boxes around groups of the drawing's nodes."""
    stage = stage or ("frontend" if isinstance(program, Graph) else "tiny")
    if stage not in DRAWINGS:
        why = f"the {stage!r} stage has no picture yet" if stage in DUMPS else f"unknown stage {stage!r}"
        raise KumikoError("E1010", at="dump --format", why=why,
                          suggestion=f"draw one of: {', '.join(DRAWINGS)}; or dump the stage as JSON")
    d = DRAWINGS[stage](program)
    if clusters:
        d = replace(d, clusters=d.clusters + tuple(clusters))
    return render_dot(d)


def draw(program: Graph | TinyGraph | Program, stage: str, fmt: str) -> str:
    """The picture of one stage as ``dot`` or ``svg`` text."""
    if fmt not in ("dot", "svg"):
        raise KumikoError("E1010", at="dump --format", why=f"unknown picture format {fmt!r}",
                          suggestion="use --format dot or --format svg")
    text = to_dot(program, stage)
    return to_svg(text) if fmt == "svg" else text


def draw_stages(program: Graph | TinyGraph, stages: Sequence[str], fmt: str,
                region: Callable[[], Program] | None = None) -> dict[str, str]:
    """Pictures of several stages: stage -> text, all drawn before the caller writes any (a failure writes
    nothing; the CLI writes them under file names ``dump_path`` makes safe). ``region``: the target's region
    stage (``kumiko.pipeline.draw_target_stages``), else target-neutral formation draws it."""
    return {s: draw(region() if s == "region" and region is not None else program, s, fmt) for s in stages}


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
