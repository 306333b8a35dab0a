"""The ordered stage list, and dumps of each stage in the seeds' JSON shape.

Every stage is a pure function of the previous one. ``dump`` writes ``<name>.<stage>.json`` files
that are byte-identical across runs; a dumped stage can be loaded again and compiled from
(``kumiko.load`` recognises a Tiny IR dump), which is how tests start mid-pipeline. ``<name>`` is the
graph's name made a plain file name (``dump_path``), so every file lands inside the directory given.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from kumiko.diagnostics import KumikoError
from kumiko.frontend.graph import Graph
from kumiko.runtime.files import safe_stem, write_file
from kumiko.tiny import ir as tiny_ir
from kumiko.tiny.ir import TinyGraph


def _frontend(program) -> dict:
    if not isinstance(program, Graph):
        raise KumikoError("E1009", at="dump", why="the frontend stage needs a frontend graph, not a Tiny IR dump")
    return program.to_json()


def _tiny(program) -> dict:
    return tiny_ir.to_json(program if isinstance(program, TinyGraph) else program.tiny)


#: stage name -> producer of its JSON dump (later stages append themselves here)
STAGES: dict[str, Callable[[Graph | TinyGraph], dict]] = {"frontend": _frontend, "tiny": _tiny}


def register_stage(name: str, producer: Callable[[Graph | TinyGraph], dict]) -> None:
    STAGES[name] = producer


def stage_json(program: Graph | TinyGraph, stage: str) -> dict:
    if stage not in STAGES:
        raise KumikoError("E1010", at="dump", why=f"unknown stage {stage!r}",
                          suggestion=f"stages: {', '.join(STAGES)}")
    return STAGES[stage](program)


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
    paths = []
    for stage, text in texts.items():
        path = dump_path(out_dir, name, stage, ext)
        write_file(path, text, f"the {stage} dump")
        paths.append(path)
    return paths


def dump(program: Graph | TinyGraph, stages: list[str], out_dir: Path | None) -> dict[str, str]:
    """Render each stage; write ``<name>.<stage>.json`` into ``out_dir`` when given. Returns texts."""
    texts = {s: dumps(stage_json(program, s)) for s in stages}
    if out_dir is not None:
        write_dumps(texts, program.name, out_dir)
    return texts


# Stages past Tiny IR register themselves when their package is imported.
import kumiko.indexbook  # noqa: E402,F401
import kumiko.poly  # noqa: E402,F401
import kumiko.region  # noqa: E402,F401
