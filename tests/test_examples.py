"""Every example graph, run through ``kumiko run`` and through the API, against plain numpy.

Each example's computation is written again here with numpy alone (float64), on the very inputs
``kumiko run --seed S`` draws (``Executable.random_inputs(S)``), at the file's default sizes and at
other sizes given with ``--shapes``. fp32 results must be within 1e-5 relative error.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko.cli import main

EXAMPLES_DIR = Path(__file__).parents[1] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.json"))


# ------------------------------------------------------------------------------------------------
# independent numpy formulas


def conv2d(x, w, stride, pad):
    """Cross-correlation, groups=1, symmetric padding: a loop over kernel taps, each an einsum."""
    x = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = np.asarray(w, np.float64)
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, co, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            patch = x[:, :, ky:ky + stride * (oh - 1) + 1:stride, kx:kx + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx])
    return out


def maxpool2x2(x):
    n, c, h, w = x.shape
    oh, ow = h // 2, w // 2
    return x[:, :, :2 * oh, :2 * ow].reshape(n, c, oh, 2, ow, 2).max(axis=(3, 5))


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def f64(x):
    return np.asarray(x, dtype=np.float64)


def ref_gemm_bias_relu(A, B, bias):
    return {"C2": np.maximum(f64(A) @ f64(B) + f64(bias), 0.0)}


def ref_attention_causal(Q, K, V):
    q, k, v = f64(Q), f64(K), f64(V)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    m, n = s.shape[-2:]
    s = np.where(np.tril(np.ones((m, n), dtype=bool)), s, -np.inf)
    return {"O": softmax(s) @ v}


def ref_attention_row_softmax(Q, K):
    return {"P": softmax(f64(Q) @ np.swapaxes(f64(K), -1, -2))}


def ref_conv3x3_s2_p1(X, Wt):
    return {"Y": conv2d(X, Wt, 2, 1)}


def ref_conv3x3_s2_p1_silu(X, Wt):
    y = conv2d(X, Wt, 2, 1)
    return {"Y": y / (1.0 + np.exp(-y))}


def ref_conv_relu_maxpool(X, Wt):
    return {"Y": maxpool2x2(np.maximum(conv2d(X, Wt, 1, 1), 0.0))}


REFERENCES = {
    "gemm_bias_relu": ref_gemm_bias_relu,
    "attention_causal": ref_attention_causal,
    "attention_row_softmax": ref_attention_row_softmax,
    "conv3x3_s2_p1": ref_conv3x3_s2_p1,
    "conv3x3_s2_p1_silu": ref_conv3x3_s2_p1_silu,
    "conv_relu_maxpool": ref_conv_relu_maxpool,
}

#: non-default sizes per example (odd sizes, size-1 batch, non-square)
OTHER_SHAPES = {
    "gemm_bias_relu": "M=5,N=3,K=7",
    "attention_causal": "B=1,H=2,S=7",
    "attention_row_softmax": "B=1,H=3,M=5,N=9,D=4",
    "conv3x3_s2_p1": "N=1,C=3,H=7,W=10,Co=5",
    "conv3x3_s2_p1_silu": "N=3,C=2,H=9,W=6,Co=4",
    "conv_relu_maxpool": "N=1,C=3,H=7,W=9,Co=2",
}


def assert_rel(got, want, tol=1e-5):
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == np.float32
    err = np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30)
    assert err < tol, f"relative error {err:.3g}"


def _shapes(text: str | None) -> dict:
    return {k: int(v) for k, v in (p.split("=") for p in text.split(","))} if text else {}


# ------------------------------------------------------------------------------------------------


def test_every_example_has_a_reference():
    assert EXAMPLES, "no examples found"
    assert {p.stem for p in EXAMPLES} == set(REFERENCES)


@pytest.mark.parametrize("shapes", [None, "other"], ids=["default-shapes", "other-shapes"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_cli_run_matches_numpy(path, shapes, tmp_path, capsys):
    shape_text = OTHER_SHAPES[path.stem] if shapes else None
    out = tmp_path / "out.npz"
    argv = ["run", str(path), "--out", str(out), "--seed", "3"] + (["--shapes", shape_text] if shape_text else [])
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert path.name in printed and "wrote" in printed
    exe = kumiko.compile(kumiko.load(path))
    inputs = exe.random_inputs(3, _shapes(shape_text))
    want = REFERENCES[path.stem](**inputs)
    with np.load(out) as z:
        assert sorted(z.files) == sorted(want)
        for name, ref in want.items():
            assert_rel(z[name], ref)
    if shape_text:   # the sizes asked for really were used
        g = kumiko.load(path)
        syms = _shapes(shape_text)
        for name, arr in inputs.items():
            for d, actual in zip(g.tensors[name].shape, arr.shape):
                assert actual == (d if isinstance(d, int) else syms[str(d)])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_api_run_matches_numpy(path):
    g = kumiko.load(path)
    assert isinstance(g, kumiko.Graph)
    exe = kumiko.compile(g)
    inputs = exe.random_inputs(3)
    for v in inputs.values():
        assert v.dtype == np.float32 and np.all(v != 0)
    out = exe(**inputs)
    want = REFERENCES[path.stem](**inputs)
    assert list(out) == [o for o in g.outputs]
    for name, ref in want.items():
        assert_rel(out[name], ref)
        assert g.output_types[name].dtype.np == out[name].dtype


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_api_with_fresh_inputs_and_the_graph_from_json(path):
    """Same example from the parsed JSON dict, own random inputs (not kumiko's) at the other sizes."""
    g = kumiko.Graph.from_json(json.loads(path.read_text()))
    syms = _shapes(OTHER_SHAPES[path.stem])
    rng = np.random.default_rng(11)
    inputs = {}
    for name, t in g.input_types.items():
        shape = tuple(d if isinstance(d, int) else syms[str(d)] for d in t.shape)
        inputs[name] = rng.uniform(-2, 2, size=shape).astype(np.float32)
    out = kumiko.compile(g)(**inputs)
    for name, ref in REFERENCES[path.stem](**inputs).items():
        assert_rel(out[name], ref)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_cli_run_with_given_inputs_and_json_summary(path, tmp_path, capsys):
    exe = kumiko.compile(kumiko.load(path))
    inputs = exe.random_inputs(5, _shapes(OTHER_SHAPES[path.stem]))
    ins, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(ins, **inputs)
    assert main(["run", str(path), "--inputs", str(ins), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    want = REFERENCES[path.stem](**inputs)
    with np.load(out) as z:
        for name, ref in want.items():
            assert_rel(z[name], ref)
            assert summary["outputs"][name]["shape"] == list(ref.shape)
