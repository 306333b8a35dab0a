"""IndexBook (seed 001 §4): per Tiny IR value its axes, piecewise domain, AxisMaps, reduce axes, flags.

Entry points: ``build_indexbook(tiny) -> IndexBook`` (``stage_indexbook(program)`` for a frontend Graph
or a TinyGraph, aligned to the graph signature), ``align_params``, ``IndexBook.verify``/``to_json``/
``from_json`` and ``play`` (evaluate a value through its map, for tests). See docs/indexbook.md.
"""
from __future__ import annotations

from kumiko.indexbook.align import align_params
from kumiko.indexbook.build import View, build_indexbook, reshape_map
from kumiko.indexbook.expr import (
    NonAffine,
    ParamTable,
    Range,
    aff_to_expr,
    axis_var,
    div_guard,
    pw_aff_to_expr,
    red_var,
    to_aff,
    to_multi_aff,
    to_pw_aff,
)
from kumiko.indexbook.model import Access, Axis, IndexBook, IndexInfo, Piece
from kumiko.indexbook.playback import play


def signature_shapes(program) -> dict:
    """Declared shapes of the signature tensors: the frontend's tensor table, else the INPUT nodes."""
    from kumiko.compiler import to_tiny
    from kumiko.frontend.graph import Graph
    if isinstance(program, Graph):
        out = {t: ty.shape for t, ty in program.input_types.items()}
        out.update({t: ty.shape for t, ty in program.output_types.items()})
        return out
    tiny = to_tiny(program)
    return {t: tiny[nid].shape for t, nid in tiny.inputs}


def stage_indexbook(program) -> IndexBook:
    from kumiko.compiler import to_tiny
    return build_indexbook(to_tiny(program), signature_shapes(program))


def _dump(program) -> dict:
    return stage_indexbook(program).to_json()


def _register() -> None:
    from kumiko.pipeline import register_stage
    register_stage("indexbook", _dump)


_register()

__all__ = ["Access", "Axis", "IndexBook", "IndexInfo", "NonAffine", "ParamTable", "Piece", "Range", "View",
           "aff_to_expr", "align_params", "axis_var", "build_indexbook", "div_guard", "play", "pw_aff_to_expr",
           "red_var", "reshape_map", "signature_shapes", "stage_indexbook", "to_aff", "to_multi_aff", "to_pw_aff"]
