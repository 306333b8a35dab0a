"""Tiny IR (seed 002): NodeId-only UOp DAG, its builder/loader and the numpy reference evaluator."""
from kumiko.tiny.build import TinyBuilder, load
from kumiko.tiny.evaluate import evaluate
from kumiko.tiny.ir import Node, TinyGraph, to_json

__all__ = ["Node", "TinyBuilder", "TinyGraph", "evaluate", "load", "to_json"]
