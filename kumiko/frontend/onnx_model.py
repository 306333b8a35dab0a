"""Reading an ONNX model for the importer: ``load_model`` (a path or a ModelProto, model-local functions
inlined, opsets older than ``MIN_OPSET`` converted), ``OnnxNode`` (a node with its attributes decoded
and the names diagnostics give it), ``tensor_array`` (a TensorProto's value, checked against its
dims), ``dim_param`` names as size symbols and the check of a node's input/output count against its
schema. Nothing here knows kumiko's ops; ``onnx_import`` walks the graph these describe.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.symbolic import Expr

#: the oldest default-domain opset imported as is; older models go through the version converter
MIN_OPSET = 13
#: metadata key under which load_model records a converted model's original opset (Resize before opset 11
#: meant another coordinate mapping, which the version converter does not carry over)
SOURCE_OPSET = "kumiko.source_opset"


@dataclass
class OnnxNode:
    """One ONNX node with its attributes decoded, plus what diagnostics need to name it."""
    proto: Any
    index: int
    opset: int
    attrs: dict

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def name(self) -> str:
        return self.proto.name or f"{self.op_type}_{self.index}"

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)

    def input(self, k: int) -> str:
        """The k-th input's name, '' when it is absent (ONNX's optional inputs)."""
        return self.proto.input[k] if k < len(self.proto.input) else ""

    def wants_output(self, k: int) -> bool:
        return k < len(self.proto.output) and self.proto.output[k] != ""

    def where(self) -> str:
        return f"onnx node {self.name!r} ({self.op_type})"

    def err(self, code: str, why: str, **kw) -> KumikoError:
        return KumikoError(code, at=self.where(), why=why, **kw)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def ints(self, key: str, default: Any = None) -> list[int] | None:
        v = self.attrs.get(key)
        return default if v is None else [int(x) for x in v]


def _decode_attrs(proto) -> dict:
    from onnx import AttributeProto, helper
    out = {}
    for a in proto.attribute:
        if a.type == AttributeProto.TENSOR:
            out[a.name] = tensor_array(a.t, f"onnx node {proto.name or proto.op_type!r} attribute {a.name!r}")
        elif a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR,
                        AttributeProto.TENSORS, AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTO,
                        AttributeProto.TYPE_PROTOS):
            out[a.name] = a   # kept raw; the converters that meet one reject it by name
        else:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode() for x in v]
            out[a.name] = v
    return out


def tensor_array(t, where: str) -> np.ndarray:
    """An ONNX TensorProto's value, checked against its dims first: a negative dim, or data that does
    not hold exactly prod(dims) elements, is E1010 (numpy_helper would reshape some of these into a
    silently different array, and raise a plain ValueError for others)."""
    from onnx import numpy_helper
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise KumikoError("E1010", at=where, why=f"tensor {t.name!r} has negative dims {dims}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # onnx raises ValueError, TypeError or its own errors on inconsistent data
        raise KumikoError("E1010", at=where, why=f"tensor {t.name!r}: its data does not match its dims {dims} "
                          f"({type(e).__name__}: {e})") from None
    if list(arr.shape) != dims:
        raise KumikoError("E1010", at=where, why=f"tensor {t.name!r} holds {arr.size} elements, its dims {dims} "
                          f"say {int(np.prod(dims, dtype=object))}")
    return arr


def _symbol(name: str) -> Expr:
    """An ONNX ``dim_param`` as a kumiko size symbol (non-identifier characters become '_')."""
    s = re.sub(r"\W", "_", name)
    return Expr.sym(s if s and not s[0].isdigit() else f"d_{s}")


def _check_arity(node: "OnnxNode") -> None:
    """E1009 when a node has fewer or more inputs or outputs than its ONNX schema allows at the model's opset
    (a converter indexes its inputs by position)."""
    try:
        from onnx import defs
        schema = defs.get_schema(node.op_type, node.opset, "")
    except Exception:   # noqa: BLE001 - no schema for this op/opset: the converter's own checks apply
        return
    n_in = len(node.inputs)
    n_out = len(node.outputs)
    for what, n, lo, hi in (("inputs", n_in, schema.min_input, schema.max_input),
                            ("outputs", n_out, schema.min_output, schema.max_output)):
        if not lo <= n <= hi:
            allowed = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < 2 ** 30 else f"at least {lo}"
            raise node.err("E1009", f"{node.op_type} has {n} {what}; opset {node.opset} allows {allowed}",
                           suggestion="fix the node's input/output list (onnx.checker.check_model reports it)")


def _default_opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def load_model(model):
    """A ModelProto from a path or a ModelProto, converted to opset >= 13 if it is older."""
    import onnx
    if isinstance(model, (str, Path)):
        try:
            model = onnx.load(str(model))
        except Exception as e:  # onnx raises OSError, DecodeError or its own errors here
            raise KumikoError("E1502", at=str(model), why=f"cannot read the ONNX model: {e}") from None
    if not isinstance(model, onnx.ModelProto):
        raise KumikoError("E1010", at="from_onnx", why=f"from_onnx takes a path or an onnx.ModelProto, got "
                          f"{type(model).__name__}")
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= _default_opset(model) <= newest:
        raise KumikoError("E1010", at="onnx model", why=f"default-domain opset {_default_opset(model)} is not one "
                          f"kumiko imports: opsets 1 to {newest} (the newest the installed onnx {onnx.__version__} "
                          f"defines; opsets older than {MIN_OPSET} are converted to {MIN_OPSET} first)",
                          suggestion=f"export the model with an opset from {MIN_OPSET} to {newest}")
    if model.functions:      # exporters wrap layers in model-local functions; import their bodies
        from onnx import inliner
        model = inliner.inline_local_functions(model)
    if _default_opset(model) < MIN_OPSET:
        from onnx import version_converter
        old = _default_opset(model)
        try:
            model = version_converter.convert_version(model, MIN_OPSET)
        except Exception as e:  # the converter raises plain RuntimeErrors
            raise KumikoError("E1010", at="onnx model", why=f"opset {old} could not be converted to opset "
                              f"{MIN_OPSET}: {e}", suggestion=f"convert the model to opset {MIN_OPSET} or newer "
                              "(kumiko imports those as they are)") from None
        model.metadata_props.add(key=SOURCE_OPSET, value=str(old))
    return model
