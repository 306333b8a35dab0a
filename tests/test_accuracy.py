"""kumiko.accuracy: the relative L2 error every comparison with the evaluator uses, and the bounds per dtype;
Graph.with_float_dtype, which ``--dtype`` uses to retype a graph."""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import kumiko
from kumiko import Tensor, dtypes
from kumiko.accuracy import BOUNDS, bound, compare, judged_as, raise_on_mismatch, rel_l2
from kumiko.diagnostics import KumikoError


def test_rel_l2_measures_relative_error():
    want = np.array([3.0, 4.0], np.float32)                  # |want| = 5
    assert rel_l2(want, want) == 0.0
    assert rel_l2(np.array([3.0, 4.5], np.float32), want) == pytest.approx(0.1)
    assert rel_l2(np.zeros(3), np.zeros(3)) == 0.0            # no division by zero


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_the_reference_does_not_have_is_infinite_error(bad):
    got = np.array([1.0, bad, 3.0])
    assert rel_l2(got, np.array([1.0, 2.0, 3.0])) == float("inf")


def test_non_finite_values_the_reference_shares_are_equal():
    want = np.array([1.0, np.nan, np.inf, -np.inf])
    assert rel_l2(want.copy(), want) == 0.0
    # which NaN or inf an overflow gives depends on summation order and FMA use: any is accepted there
    assert rel_l2(np.array([1.0, np.inf, np.nan, np.inf]), want) == 0.0
    assert rel_l2(np.array([1.0, 2.0, np.inf, -np.inf]), want) == float("inf")   # a finite value is not
    assert rel_l2(np.array([1.1, np.nan, np.inf, -np.inf]), want) == pytest.approx(0.1)


def test_shape_mismatch_is_infinite_error():
    assert rel_l2(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")


def test_bounds_follow_the_dtype():
    assert bound("fp32") == 1e-4 and bound(dtypes.fp16) == 1e-2 and bound(np.dtype(ml_dtypes.bfloat16)) == 2e-2
    assert bound("i32") == 0.0 and bound(np.dtype(np.bool_)) == 0.0
    assert bound("fp64") == 1e-12 and bound(np.dtype(np.float64)) == 1e-12
    assert set(BOUNDS) == set(dtypes.USER)
    with pytest.raises(ValueError):
        bound("int8")


def test_an_output_is_judged_by_the_loosest_float_dtype_behind_it():
    # fp32 math cast up to fp64 carries fp32 rounding: the fp32 bound; an all-fp64 chain: the fp64 bound
    x = Tensor.input("x", (4, 8), "fp32")
    d = Tensor.input("d", (4, 8), "fp64")
    up = (x.exp() * 2).cast("fp64")
    tiny = up.graph("up").tiny
    assert judged_as(tiny) == {"up": "fp32"}
    assert judged_as((d * d).sum(1).graph("s").tiny) == {"s": "fp64"}
    assert judged_as((d > 0).cast("i32").graph("i").tiny) == {"i": "fp64"}
    want = {"up": np.float64(1) + np.arange(4.0)}
    off = {"up": want["up"] * (1 + 1e-9)}
    assert compare(off, want)[0].bound == 1e-12 and not compare(off, want)[0].ok
    assert compare(off, want, judged_as(tiny))[0].ok


def test_compare_and_the_mismatch_diagnostic():
    rng = np.random.default_rng(0)
    want = {"y": rng.standard_normal(64).astype(np.float16), "i": np.arange(4, dtype=np.int32)}
    close = {"y": (want["y"].astype(np.float32) * 1.001).astype(np.float16), "i": want["i"].copy()}
    checks = compare(close, want)
    assert [c.name for c in checks] == ["y", "i"] and all(c.ok for c in checks)
    raise_on_mismatch(checks, "cpu", {"M": 64})             # nothing to report

    off = {"y": want["y"].copy(), "i": want["i"] + np.array([0, 0, 1, 0], np.int32)}
    off["y"][5] = np.nan
    checks = compare(off, want)
    assert [c.ok for c in checks] == [False, False] and checks[0].nonfinite == 1
    assert checks[0].to_json()["rel_l2"] == "inf"
    with pytest.raises(KumikoError) as e:
        raise_on_mismatch(checks, "cuda-emu", {"M": 64})
    d = e.value.to_dict()
    assert d["code"] == "E1705" and d["kind"] == "ResultMismatch" and d["at"] == "output y on cuda-emu"
    assert "bound 0.01 for this fp16 output" in d["why"] and "1 element(s) are NaN or inf" in d["why"]
    assert d["sizes"] == {"M": 64} and d["outputs"]["i"]["ok"] is False


def test_a_missing_output_fails_the_comparison():
    (c,) = compare({}, {"y": np.ones(3, np.float32)})
    assert not c.ok and c.nonfinite == 3


def test_with_float_dtype_retypes_floats_and_refuses_the_rest():
    g = kumiko.load(Path(__file__).parents[1] / "examples" / "gemm_bias_relu.json")
    h = g.with_float_dtype("bf16")
    assert {str(t.dtype) for t in h.tensors.values()} == {"bf16"} and h.name == g.name
    assert {str(t.dtype) for t in g.tensors.values()} == {"fp32"}              # the original is unchanged
    with pytest.raises(KumikoError) as e:
        g.with_float_dtype("i32")
    assert e.value.code == "E1012"


def test_hypothesis_is_derandomized_exactly_under_ci():
    """tests/conftest.py: the CI profile derandomizes the draws, and is the one in force when CI=true."""
    import os

    from hypothesis import settings
    assert settings.get_profile("ci").derandomize
    under_ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
    assert settings.default.derandomize == under_ci
