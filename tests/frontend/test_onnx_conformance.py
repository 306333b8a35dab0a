"""ONNX conformance: onnx's own backend node tests, run through ``kumiko.from_onnx`` on every built
target (the evaluator now; ``cpu`` joins by itself once it is registered).

Scope: the node tests of the ops the importer supports (docs/onnx.md), plus their ``_expanded``
function bodies when those use only supported ops. Each test's inputs, expected outputs and
tolerances come from the pinned onnx package (the ``[dev]`` extra pins it: expected outputs move
between releases). A test is skipped only for a reason decided *before* import -- a dtype kumiko
does not have, or a listed feature gap -- and then the importer must also reject it with a
KumikoError, so "unsupported" is checked, never assumed. Everything else must import, run and
match. The per-op pass/fail/skip table prints at the end of the module (and ``python
tests/frontend/test_onnx_conformance.py`` prints it as markdown for docs/onnx.md).
"""
from __future__ import annotations

import collections
import re
import warnings

import numpy as np
import pytest

import kumiko
from kumiko.compiler import TARGETS as BUILT_TARGETS  # noqa: N811
from kumiko.frontend.onnx_import import supported_ops

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

#: the ONNX ops of issue 7's import list
OPS = {"MatMul", "Gemm", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Relu", "LeakyRelu",
       "Sigmoid", "Tanh", "Erf", "Gelu", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Add", "Sub", "Mul", "Div",
       "Pow", "Max", "Min", "Clip", "Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Cast",
       "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "Softmax", "LogSoftmax", "LayerNormalization", "Attention",
       "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Pad", "Expand", "Concat", "Gather",
       "CumSum", "Identity", "Constant", "Shape",
       # indexing and shape ops of exported transformers (onnx_index.py)
       "Split", "Trilu", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Range", "ArgMax", "ArgMin",
       "Einsum", "TopK"}
#: activations, trigonometry and normalisations that exported CNNs and transformers use (onnx_act, onnx_norm)
OPS |= {"Elu", "Selu", "Celu", "Softplus", "Softsign", "HardSwish", "HardSigmoid", "Mish", "PRelu", "ThresholdedRelu",
        "Sin", "Cos", "Tan", "Dropout", "ReduceLogSumExp", "BatchNormalization", "InstanceNormalization",
        "GroupNormalization", "LRN"}
#: resampling (onnx_resize.py)
OPS |= {"Resize", "Upsample"}
#: N-D windows and the rest of the real exports' ops (onnx_nn.py, onnx_index.py)
OPS |= {"ConvTranspose", "Tile"}
#: ONNX elem types kumiko imports (INT64 narrowed to i32)
DTYPES = {1: "FLOAT", 10: "FLOAT16", 16: "BFLOAT16", 6: "INT32", 7: "INT64", 9: "BOOL", 11: "DOUBLE"}
#: features outside the list's scope: (test-name pattern, reason); the importer must reject these
KNOWN = [
    (r"test_resize_.*cubic", "Resize mode cubic"),
    (r"test_resize_.*antialias", "Resize antialias"),
    (r"test_resize_tf_crop_and_resize", "Resize tf_crop_and_resize (roi)"),
    (r"test_div_int32", "integer Div (Tiny IR has no integer division)"),
    (r"test_pow_types_int(32|64)_", "integer Pow (Tiny IR has no integer powers)"),
    (r"test_einsum_batch_diagonal", "Einsum with '...' and a diagonal"),
    (r"test_batchnorm_.*_training_mode", "BatchNormalization in training mode"),
    (r"test_training_dropout(_mask)?$|test_training_dropout_default", "Dropout in training mode (random)"),
]
IMPORTED = set(supported_ops())
TARGETS = [t for t in ("eval", "cpu") if t in BUILT_TARGETS]
RESULTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
REASONS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def _load() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = load_model_tests(kind="node")
    ops = {t.name: t.model.graph.node[0].op_type for t in tests
           if "_expanded" not in t.name and len(t.model.graph.node) == 1}
    cases = []
    for t in tests:
        op = ops.get(re.sub(r"_expanded.*$", "", t.name))
        if op in OPS:
            cases.append((op, t))
    return cases


CASES = _load()


def _arr(x) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def expected_unsupported(t) -> str | None:
    """Why kumiko cannot run this test, decided from the model alone (None: it must pass)."""
    g = t.model.graph
    for v in (*g.input, *g.output):
        kind = v.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"non-tensor type ({kind})"
        et = v.type.tensor_type.elem_type
        if et not in DTYPES:
            return f"dtype {onnx.TensorProto.DataType.Name(et)}"
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and n.op_type == "Cast" and a.i not in DTYPES:
                return f"dtype {onnx.TensorProto.DataType.Name(a.i)}"
    for ins, _ in t.data_sets:
        for v in map(_arr, ins):
            if v.dtype == np.int64 and v.size and (v.min() < -2**31 or v.max() >= 2**31):
                return "int64 values outside the i32 range"
    for n in g.node:
        if n.op_type == "Attention" and len(n.input) > 6 and n.input[6]:
            return "Attention's nonpad_kv_seqlen input (opset 24)"
        if n.op_type == "Attention" and any(a.name.endswith("_window_size") and a.i != -1 for a in n.attribute):
            return "Attention's sliding window (opset 25)"
    outside = sorted({n.op_type for n in g.node} - IMPORTED)
    if outside:
        return f"expansion uses ops the importer lacks: {', '.join(outside)}"
    for pat, why in KNOWN:
        if re.match(pat, t.name):
            return why
    return None


def _tolerance(dt: np.dtype, t) -> tuple[float, float]:
    """The test's own rtol/atol for fp32; one ulp-ish more for 16-bit floats (kumiko rounds per op)."""
    if dt == np.float16:
        return max(t.rtol, 4e-3), max(t.atol, 2e-3)
    if dt.name == "bfloat16":
        return max(t.rtol, 3e-2), max(t.atol, 1e-2)
    return t.rtol, max(t.atol, 1e-6)


def _input_names(t) -> list[str]:
    inits = {i.name for i in t.model.graph.initializer}
    return [i.name for i in t.model.graph.input if i.name not in inits]


def import_case(t, ins: list) -> kumiko.Graph:
    """Import with the test's inputs offered as static values (used only where a constant is needed:
    the node tests feed Reshape's shape, Slice's starts, Pad's pads... as graph inputs)."""
    return kumiko.from_onnx(t.model, static_inputs=dict(zip(_input_names(t), ins)))


def run_case(t, target: str) -> None:
    """Import, compile and run one node test; assert every output matches onnx's expected one."""
    g = t.model.graph
    names = _input_names(t)
    for ins, want in t.data_sets:
        ins = [_arr(x) for x in ins]
        graph = import_case(t, ins)
        exe = kumiko.compile(graph, target=target)
        feed = {n: (v.astype(np.int32) if v.dtype == np.int64 else v) for n, v in zip(names, ins)
                if n in exe.input_names}
        got = exe(**feed)
        for o, w in zip(g.output, want):
            w, y = _arr(w), got[o.name]
            assert y.shape == w.shape, f"{o.name}: shape {y.shape} != expected {w.shape}"
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(y.astype(w.dtype), w, err_msg=o.name)
            else:
                rtol, atol = _tolerance(w.dtype, t)
                np.testing.assert_allclose(y.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                           equal_nan=True, err_msg=o.name)


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    cap = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None or cap is None or not RESULTS:
        return
    with cap.global_and_fixture_disabled():   # teardown output is captured otherwise
        tr.write_line("")
        for line in table().splitlines():
            tr.write_line(line)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op,case", CASES, ids=[t.name for _, t in CASES])
def test_node(op: str, case, target: str) -> None:
    why = expected_unsupported(case)
    if why is not None:
        with pytest.raises(kumiko.KumikoError):      # the importer must say so itself
            import_case(case, [_arr(x) for x in case.data_sets[0][0]])
    key = op if target == "eval" else f"{op} [{target}]"
    if why is not None:
        RESULTS[key]["skip"] += 1
        REASONS[key][why] += 1
        pytest.skip(f"unsupported: {why}")
    try:
        run_case(case, target)
    except BaseException:
        RESULTS[key]["fail"] += 1
        raise
    RESULTS[key]["pass"] += 1
    RESULTS[key]["expanded"] += "_expanded" in case.name


def table() -> str:
    """The per-op counts as a markdown table (skips with their reasons)."""
    lines = ["| op | pass | (of which `_expanded`) | fail | skip | skip reasons |", "|---|---:|---:|---:|---:|---|"]
    total = collections.Counter()
    for op in sorted(RESULTS):
        c = RESULTS[op]
        total.update(c)
        why = "; ".join(f"{r} ({n})" for r, n in sorted(REASONS[op].items()))
        lines.append(f"| {op} | {c['pass']} | {c['expanded'] or ''} | {c['fail']} | {c['skip']} | {why} |")
    lines.append(f"| **total** | {total['pass']} | {total['expanded']} | {total['fail']} | {total['skip']} | |")
    return "\n".join(lines)


if __name__ == "__main__":      # python tests/frontend/test_onnx_conformance.py -> the table for docs/onnx.md
    import traceback
    for op, case in CASES:
        why = expected_unsupported(case)
        try:
            if why is not None:
                import_case(case, [_arr(x) for x in case.data_sets[0][0]])
                print(f"IMPORTED DESPITE {why}: {case.name}")
            run_case(case, "eval")
            RESULTS[op]["pass" if why is None else "fail"] += 1
            RESULTS[op]["expanded"] += why is None and "_expanded" in case.name
        except kumiko.KumikoError as e:
            if why is None:
                RESULTS[op]["fail"] += 1
                print(f"FAIL {case.name}: {e.render().splitlines()[0]}")
            else:
                RESULTS[op]["skip"] += 1
                REASONS[op][why] += 1
        except Exception as e:  # noqa: BLE001
            RESULTS[op]["fail"] += 1
            print(f"FAIL {case.name}: {type(e).__name__}: {str(e).strip().splitlines()[:6]}")
            if "-v" in __import__("sys").argv:
                traceback.print_exc()
    print(table())
