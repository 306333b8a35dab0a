"""Diagnostics: every user-facing failure is a ``KumikoError`` with code, kind, at, why, suggestion.

The code table below is the single list of codes (seed 001 §6.10, §14; seed 002 §4). Codes are
stable: tests, docs and users refer to them. ``E`` codes are errors, ``W`` codes warnings.
"""
from __future__ import annotations

import json
import warnings
from typing import Any

#: code -> (kind, default suggestion)
CODES: dict[str, tuple[str, str]] = {
    # Frontend and Tiny IR (seed 002 §4)
    "E1001": ("BroadcastMismatch", "Expand one side explicitly so the sizes agree, or fix the shapes."),
    "E1002": ("AxisSizeMismatch", "A reshape must keep the total number of elements; check the target shape."),
    "E1003": ("InvalidPermutation", "Give every axis exactly once, e.g. [1, 0] for a 2-D transpose."),
    "E1004": ("AccDtypeMissing", "Give the REDUCE an accumulator dtype, e.g. \"dtype\": \"fp32\"."),
    "E1005": ("ImplicitCast", "Insert an explicit Cast so both operands have the same dtype."),
    "E1006": ("UnknownOp", "Use one of the supported ops (see `kumiko check --help` and docs/frontend.md)."),
    "E1007": ("DanglingNodeId", "Every src/input must name a node or tensor defined before it."),
    "E1008": ("Cycle", "The graph must be a DAG; break the cycle."),
    "E1009": ("MalformedGraph", "Check the file against the format in docs/frontend.md."),
    "E1010": ("InvalidAttribute", "Check the op's attributes against docs/frontend.md."),
    "E1011": ("ShapeMismatch", "Check the operand shapes of this op."),
    "E1012": ("UnsupportedDtype", "Use fp16, bf16, fp32, fp64, i32 or bool (or cast first)."),
    "E1013": ("SignatureError", "Every signature input and output must be a tensor of the graph, listed once."),
    "E1014": ("UnboundSymbol", "Pass an input whose shape fixes the symbol, or give it with --shapes SYM=VALUE."),
    "E1015": ("InputMismatch", "Pass arrays with the dtype and shape the graph signature declares."),
    "E1016": ("DuplicateDefinition", "Give each tensor and node a unique name."),
    "E1017": ("SizeLimitExceeded", "Use smaller sizes: the buffers these sizes need exceed kumiko's limit "
                                   "(docs/guarantees.md)."),
    "E1018": ("NestingLimitExceeded", "Flatten the input: it nests deeper than kumiko's limit "
                                      "(docs/guarantees.md)."),
    "E1102": ("NegativeStrideUnsupported", "Use FLIP (negative strides are expressed with FLIP, seed 001 §3.4)."),
    "E1203": ("MissingDivGuard", "Expand `%` into div and a guard by linearising and re-splitting the reshape."),
    "W2101": ("ExcessivePiecewise", "Simplify the pad/slice chain; kumiko already applied gist/coalesce."),
    "E1304": ("AxisAlignmentMismatch", "Check the signature's symbol names and sizes and the tensor views."),
    "E1305": ("IllegalComputeAt", "Keep the producer in its own kernel; a dependence would run backwards."),
    "E1401": ("UnguardedAccess", "Wrap the out-of-bounds part of the access in a Select with the neutral."),
    "E1402": ("NonAssociativeTransform", "Do not merge or reorder reductions of different ops."),
    "E1403": ("NeutralInvalid", "Use the op's neutral: 0 for sum, -inf for max, +inf for min."),
    "E1501": ("TargetUnavailable", "Use one of the available targets (see `kumiko run --help`)."),
    "E1502": ("FileError", "Check the path and that the file is readable."),
    "E1601": ("ParseError", "Fix the syntax at the marked position."),
    "E1801": ("PlanMismatch", "Let kumiko choose the plan, or fix the plan's fields for this region and machine."),
    # Kernel builds and the CUDA emulator (kumiko/runtime/emu.py, docs/emulator.md)
    "E1701": ("KernelBuildFailed", "Read the compiler log in the diagnostic and fix the source (or the generator "
                                   "that wrote it)."),
    "E1702": ("EmulatorFault", "Read the kernel, block, thread and source line in the diagnostic; docs/emulator.md "
                               "explains each fault kind."),
    "E1703": ("KernelLaunchInvalid", "Check the kernel name, the grid/block/shared-memory sizes and the arguments "
                                     "against the kernel's signature."),
    "E1704": ("KernelFailed", "A compiled kernel reported an internal error (non-zero status): a code generator "
                              "bug, or sizes the kernel was not built for; report it with the graph and sizes."),
    "E1706": ("BuildTimeout", "The external compiler did not finish within KUMIKO_BUILD_TIMEOUT seconds: raise "
                              "the limit, or report the graph if the generated source is pathological."),
    "E1705": ("ResultMismatch", "The compiled kernels disagree with the reference evaluator: a compiler bug. "
                                "On cuda-emu, --emu asan and --emu eager look for an out-of-bounds access or a "
                                "missing barrier; KUMIKO_DEBUG=4 prints the source; report the graph, target and "
                                "sizes."),
}


class KumikoError(Exception):
    """A diagnostic. ``at`` names where (a node, a value, a stage); ``details`` carries extra facts."""

    def __init__(self, code: str, *, at: str = "", why: str = "", suggestion: str | None = None,
                 **details: Any):
        if code not in CODES:
            raise ValueError(f"unknown diagnostic code {code}")
        self.code = code
        self.kind, default_suggestion = CODES[code]
        self.at = at
        self.why = why
        self.suggestion = suggestion if suggestion is not None else default_suggestion
        self.details = details
        super().__init__(self.render())

    @property
    def is_warning(self) -> bool:
        return self.code.startswith("W")

    def to_dict(self) -> dict[str, Any]:
        d = {"code": self.code, "kind": self.kind, "at": self.at, "why": self.why, "suggestion": self.suggestion}
        d.update({k: _jsonable(v) for k, v in self.details.items()})
        return d

    def render(self) -> str:
        head = f"{'warning' if self.is_warning else 'error'}[{self.code} {self.kind}]"
        lines = [f"{head} at {self.at}: {self.why}" if self.at else f"{head}: {self.why}"]
        for k, v in self.details.items():
            if k != "excerpt":
                lines.append(f"  {k}: {_jsonable(v)}")
        if "excerpt" in self.details:
            lines.append(str(self.details["excerpt"]))
        lines.append(f"  suggestion: {self.suggestion}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"diagnostics": [self.to_dict()]}, indent=2, ensure_ascii=False)


class KumikoWarning(UserWarning):
    pass


def warn(code: str, **kw: Any) -> KumikoError:
    """Emit a W-code diagnostic as a Python warning and return it (so callers may also collect it)."""
    d = KumikoError(code, **kw)
    warnings.warn(d.render(), KumikoWarning, stacklevel=2)
    return d


def _jsonable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)
