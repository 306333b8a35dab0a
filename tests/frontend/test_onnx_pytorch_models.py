"""The onnx package's own whole-model test data: ``pytorch-converted`` and ``pytorch-operator`` (small
torch modules exported to ONNX, 117 of them: Conv/pooling in 1-D, 2-D and 3-D, ConvTranspose, PReLU,
embeddings, softmax, ...), each run through ``kumiko.from_onnx`` on ``eval`` and ``cpu`` against the
stored expected outputs.

A model is expected to fail only for a reason listed in ``UNSUPPORTED`` (decided from its name before
anything runs), and then kumiko must say so with a KumikoError - at import or at the call - never with
a bare exception or a wrong answer. Every other model must run and match. ``python
tests/frontend/test_onnx_pytorch_models.py`` prints the pass count.
"""
from __future__ import annotations

import glob
import os
import re

import numpy as np
import pytest

import kumiko

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
KINDS = ("pytorch-converted", "pytorch-operator")
#: (model-name pattern, reason): these must end in a KumikoError. None today: the four test_operator_add models,
#: whose float64 inputs hold values beyond fp32 (uninitialised torch memory: denormals and 1e+300s), were listed
#: here while kumiko narrowed DOUBLE to fp32; they compute in float64 now.
UNSUPPORTED: list[tuple[str, str]] = []


def _cases() -> list[tuple[str, str]]:
    out = []
    for kind in KINDS:
        for d in sorted(glob.glob(os.path.join(DATA, kind, "test_*"))):
            if os.path.exists(os.path.join(d, "model.onnx")):
                out.append((kind, d))
    return out


CASES = _cases()


def why_unsupported(path: str) -> str | None:
    name = os.path.basename(path)
    return next((why for pat, why in UNSUPPORTED if re.match(pat, name)), None)


def _tensors(folder: str, prefix: str) -> list[np.ndarray]:
    files = sorted(glob.glob(os.path.join(folder, f"{prefix}_*.pb")), key=lambda f: int(f.rsplit("_", 1)[1][:-3]))
    return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]


def run_model(path: str, target: str) -> None:
    """Import, compile and run every stored data set; assert each output matches within fp32 rounding (float64
    rounding for a DOUBLE output)."""
    model = onnx.load(os.path.join(path, "model.onnx"))
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    exe = kumiko.compile(kumiko.from_onnx(model), target=target)
    sets = sorted(glob.glob(os.path.join(path, "test_data_set_*")))
    assert sets, f"{path} has no test data"
    for ds in sets:
        ins, want = _tensors(ds, "input"), _tensors(ds, "output")
        got = exe(**dict(zip(names, ins)))
        for o, w in zip(model.graph.output, want):
            y = got[o.name]
            assert y.shape == w.shape, f"{o.name}: shape {y.shape} != expected {w.shape}"
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(y.astype(w.dtype), w, err_msg=o.name)
            elif w.dtype == np.float64:            # DOUBLE outputs: computed in float64, so float64 rounding
                assert y.dtype == np.float64, f"{o.name}: {y.dtype}"
                np.testing.assert_allclose(y, w, rtol=1e-12, atol=0, equal_nan=True, err_msg=o.name)
            else:
                np.testing.assert_allclose(y.astype(np.float64), w.astype(np.float64), rtol=1e-4, atol=1e-5,
                                           equal_nan=True, err_msg=o.name)


def test_the_data_is_there() -> None:
    assert len(CASES) >= 100, f"expected the onnx package's 117 pytorch models, found {len(CASES)} under {DATA}"


@pytest.mark.parametrize("target", ["eval", "cpu"])
@pytest.mark.parametrize("path", [d for _, d in CASES], ids=[f"{k}/{os.path.basename(d)}" for k, d in CASES])
def test_model(path: str, target: str) -> None:
    why = why_unsupported(path)
    if why is None:
        run_model(path, target)
        return
    with pytest.raises(kumiko.KumikoError):
        run_model(path, target)
    pytest.skip(f"unsupported: {why}")


if __name__ == "__main__":
    passed = 0
    for _, d in CASES:
        try:
            run_model(d, "eval")
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"{os.path.basename(d)}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    print(f"{passed} of {len(CASES)} pass on eval")
