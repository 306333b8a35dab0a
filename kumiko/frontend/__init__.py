"""Frontend IR: the Graph with its signature, and the lowering of its high-level ops to Tiny IR."""
from kumiko.frontend.graph import Graph, OpNode, SigInput, TensorType

__all__ = ["Graph", "OpNode", "SigInput", "TensorType"]
