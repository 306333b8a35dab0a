"""Sizes are checked before anything is allocated (issue 20): E1015 for a negative size, E1017 for buffers
over KUMIKO_MAX_BYTES or sizes beyond int64, never a MemoryError, OverflowError or ValueError from numpy;
and deep chains of ops form regions of bounded depth (R-depth) instead of a RecursionError."""
import numpy as np
import pytest

import kumiko
from kumiko.diagnostics import KumikoError
from kumiko.region import form_regions
from kumiko.region.form import MAX_DEPTH
from kumiko.tensor import Tensor

GEMM = "examples/gemm_bias_relu.json"


@pytest.mark.parametrize("target", ["eval", "cpu"])
@pytest.mark.parametrize("m, code", [(10**9, "E1017"), (10**12, "E1017"), (2**70, "E1017"), (-5, "E1015")])
def test_random_inputs_check_sizes_first(target, m, code):
    exe = kumiko.compile(kumiko.load(GEMM), target=target)
    with pytest.raises(KumikoError) as e:
        exe.random_inputs(0, {"M": m})
    assert e.value.code == code


def test_the_limit_is_the_knob(monkeypatch):
    exe = kumiko.compile(kumiko.load(GEMM), target="cpu")
    monkeypatch.setenv("KUMIKO_MAX_BYTES", "100")
    with pytest.raises(KumikoError) as e:
        exe.random_inputs(0, {"M": 4, "N": 4, "K": 4})
    assert e.value.code == "E1017" and e.value.details["limit"] == 100 and "bytes" in e.value.why


def test_broadcast_to_a_huge_output_is_refused_before_running():
    a, b = Tensor.input("a", (10**6, 1)), Tensor.input("b", (1, 10**6))
    exe = kumiko.compile((a + b).graph("c"), target="eval")
    with pytest.raises(KumikoError) as e:
        exe.random_inputs(0)
    assert e.value.code == "E1017"


@pytest.mark.parametrize("target", ["eval", "cpu"])
def test_an_intermediate_beyond_int64_is_refused(target):
    x = Tensor.input("x", (2, 2))
    exe = kumiko.compile(x.pad(((0, 0), (0, 10**20))).sum(1).graph("y"), target=target)
    with pytest.raises(KumikoError) as e:
        exe(x=np.ones((2, 2), np.float32))
    assert e.value.code == "E1017"


def test_the_evaluator_counts_its_intermediates(monkeypatch):
    # the evaluator never holds a GEMM's M*N*K product, but its float64 sum over K and the values live
    # beside it (8 MiB and more at 1024 x 1024) are counted: over 6 MiB, where the compiled kernels fit
    g = kumiko.load(GEMM)
    monkeypatch.setenv("KUMIKO_MAX_BYTES", str(6 << 20))
    ins = kumiko.compile(g, target="cpu").random_inputs(0, {"M": 1024, "N": 1024, "K": 8})
    kumiko.compile(g, target="cpu")(**ins)
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, target="eval")(**ins)
    assert e.value.code == "E1017"


def test_compiled_intermediate_buffers_count_too(monkeypatch):
    """The arena of a program with intermediates (a reduction read by two kernels) is checked before it is
    allocated: small inputs and outputs, a big intermediate."""
    x = Tensor.input("x", ("N", 64))
    h = (x @ x.T).exp()                        # N x N, stored: the softmax-like rows read it twice
    g = (h / h.sum(1, keepdim=True)).sum(1).graph("y")
    exe = kumiko.compile(g, target="cpu")
    xv = np.random.default_rng(0).standard_normal((256, 64), dtype=np.float32)
    exe(x=xv)
    monkeypatch.setenv("KUMIKO_MAX_BYTES", str(150_000))   # inputs and outputs fit (~67 KB), N x N does not
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, target="cpu")(x=xv)
    assert e.value.code == "E1017" and "intermediate" in e.value.why


def test_a_zero_size_is_fine_and_a_negative_extent_is_e1015():
    g = kumiko.load(GEMM)
    for target in ("eval", "cpu"):
        exe = kumiko.compile(g, target=target)
        assert exe(**exe.random_inputs(0, {"M": 0}))["C2"].shape == (0, 128)
    s = Tensor.input("s", ("S",))
    exe = kumiko.compile(s.shrink(((1, "S"),)).graph("t"), target="eval")
    with pytest.raises(KumikoError) as e:
        exe(s=np.ones(0, np.float32))
    assert e.value.code == "E1015"


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_a_chain_of_2000_ops_compiles_and_matches_the_evaluator(target):
    x = Tensor.input("x", (4, 4))
    for i in range(2000):
        x = (x.neg(), x.relu(), x * 0.5)[i % 3]
    g = x.graph("y")
    assert max(len(r.lets) for r in form_regions(g.tiny).regions) <= MAX_DEPTH + 1
    xs = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32) * 1e30
    got = kumiko.compile(g, target=target)(x=xs)["y"]
    assert np.array_equal(got, kumiko.compile(g, target="eval")(x=xs)["y"])


def test_a_chain_of_2000_movement_ops_compiles():
    x = Tensor.input("x", (4, 6))
    for i in range(2000):
        x = x.permute((1, 0)) if i % 3 else x.flip(0)
    g = x.graph("y")
    xs = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert np.array_equal(kumiko.compile(g, target="cpu")(x=xs)["y"], kumiko.compile(g, target="eval")(x=xs)["y"])


def test_a_huge_declared_input_is_refused_before_random_inputs_are_made(tmp_path):
    """Found by the malformed-graph fuzz: a weight declared with 2^31 rows passed the evaluator's byte count
    (inputs were counted as views of nothing) and numpy failed allocating 12 TiB."""
    import json
    d = json.loads(open("examples/conv3x3_s2_p1.json").read())
    d["tensors"]["Wt"]["shape"][2] = 2 ** 31
    (tmp_path / "g.json").write_text(json.dumps(d))
    g = kumiko.load(tmp_path / "g.json")
    for target in ("eval", "cpu"):
        with pytest.raises(KumikoError) as e:
            kumiko.compile(g, target).random_inputs(0)
        assert e.value.code == "E1017"
