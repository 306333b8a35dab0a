"""Poly-View and Poly Core (seed 001 §5, §7; seed 003): the SCoP of a graph in ISL and its analyses.

Entry points: ``poly_view(book) -> PolyView`` (blocks, accesses, ContractionPatterns, edges; the book of a
program: ``kumiko.pipeline.stage_indexbook``), ``dependences(view)``, ``axis_roles``, ``tail_axes``,
``compute_at(view, producer, consumer, tile=..., placement=...)`` (backward slice, footprints, halo,
schedule check, minimum buffer), ``analyse(view)`` and ``report(view)`` (the ``poly_view`` stage dump). See
docs/poly.md.
"""
from __future__ import annotations

from kumiko.poly.computeat import ComputeAt, Footprint, between, compute_at, default_tile
from kumiko.poly.contraction import ContractionPattern, detect
from kumiko.poly.core import Dependences, axis_roles, carried_axes, dependences, tail_axes
from kumiko.poly.report import analyse, chains, fusion_report, report
from kumiko.poly.view import AccessRel, Array, Block, Edge, PolyView, poly_view

__all__ = ["AccessRel", "Array", "Block", "ComputeAt", "ContractionPattern", "Dependences", "Edge", "Footprint",
           "PolyView", "analyse", "axis_roles", "between", "carried_axes", "chains", "compute_at", "default_tile",
           "dependences", "detect", "fusion_report", "poly_view", "report", "tail_axes"]
