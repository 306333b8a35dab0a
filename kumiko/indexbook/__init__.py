"""IndexBook (seed 001 §4): per Tiny IR value its axes, piecewise domain, AxisMaps, reduce axes, flags.

Entry points: ``build_indexbook(tiny, signature_shapes) -> IndexBook`` (``kumiko.pipeline.stage_indexbook``
for a frontend Graph or a TinyGraph, aligned to the graph signature), ``align_params``,
``IndexBook.verify``/``to_json``/ ``from_json`` and ``play`` (evaluate a value through its map, for tests).
See docs/indexbook.md.
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

__all__ = ["Access", "Axis", "IndexBook", "IndexInfo", "NonAffine", "ParamTable", "Piece", "Range", "View",
           "aff_to_expr", "align_params", "axis_var", "build_indexbook", "div_guard", "play", "pw_aff_to_expr",
           "red_var", "reshape_map", "to_aff", "to_multi_aff", "to_pw_aff"]
