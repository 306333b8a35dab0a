"""The constant pool on the cpu target: an Executable's bound params (ONNX initializers, Tensor params built
with data) are packed into the micro-kernel's panels once, not on every call; a call that passes other
arrays in their place gets them packed for that call alone; results match the evaluator either way."""
import threading

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import rel_l2


def _packer(exe):
    return exe._run.runner


def _dense(m=5, k=37, n=70, batch=None, seed=0):
    """relu(x @ W + b), W a bound param: W is the B (N) side of the GEMM (its rows along N are contiguous)."""
    rng = np.random.default_rng(seed)
    w = Tensor(rng.standard_normal((k, n)).astype(np.float32), name="w", role="param")
    b = Tensor(rng.standard_normal(n).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", (batch, m, k) if batch else (m, k))
    return ((x @ w) + b).relu().graph("y")


def _conv(n=2, c=5, o=19, hw=9, k=3, stride=1, seed=1):
    """A conv whose weights are the A (M) side (the pixels' rows are contiguous along W)."""
    rng = np.random.default_rng(seed)
    w = Tensor(rng.standard_normal((o, c, k, k)).astype(np.float32), name="w", role="param")
    b = Tensor(rng.standard_normal(o).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", (n, c, hw, hw))
    return x.conv2d(w, b, stride=stride, padding=k // 2).relu().graph("y")


def _alike_layers(n=4, c=8, hw=10, seed=4):
    """Convs of one shape with different weights: one compiled function serves the ones between the first
    (which reads the image as given) and the last (which writes the graph's output channels-first), each with
    its own packed weights (packed panels were once looked up by function: every layer got the first one's)."""
    rng = np.random.default_rng(seed)
    h = Tensor.input("x", (1, c, hw, hw))
    for k in range(n):
        w = Tensor(rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3, name=f"w{k}", role="param")
        h = h.conv2d(w, padding=1).relu()
    return h.graph("y")


GRAPHS = {
    "alike-layers": lambda: _alike_layers(),
    "dense": lambda: _dense(),
    "dense-two-rows": lambda: _dense(m=2, k=300, n=257),
    "dense-batched": lambda: _dense(m=3, k=20, n=33, batch=2),
    "conv3x3": lambda: _conv(),
    "conv1x1-s2": lambda: _conv(n=1, c=24, o=40, hw=14, k=1, stride=2),
    "conv-big-k": lambda: _conv(n=1, c=70, o=36, hw=12, k=3),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_constants_are_packed_once_and_results_match(name):
    g = GRAPHS[name]()
    ref = kumiko.compile(g, "eval")
    exe = kumiko.compile(g, "cpu")
    runner = _packer(exe)
    assert any(st.packs for st in runner.steps), "a bound weight operand should be pre-packed"
    packs = sum(len(st.packs) for st in runner.steps)
    if name == "alike-layers":
        assert len({st.fn for st in runner.steps}) < len(runner.steps)      # a function shared by layers
    for seed in range(3):
        ins = {k: v for k, v in exe.random_inputs(seed).items() if k not in exe.params}
        assert rel_l2(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5
    assert runner.pack_calls == packs          # packed on the first call only


def test_other_weights_in_a_call_are_packed_for_that_call():
    g = _dense(m=4, k=30, n=50)
    exe = kumiko.compile(g, "cpu")
    ref = kumiko.compile(g, "eval")
    x = np.random.default_rng(7).standard_normal((4, 30)).astype(np.float32)
    w2 = np.random.default_rng(8).standard_normal((30, 50)).astype(np.float32)
    base = exe(x=x)["y"].copy()
    assert rel_l2(exe(x=x, w=w2)["y"], ref(x=x, w=w2)["y"]) < 1e-5
    np.testing.assert_array_equal(exe(x=x)["y"], base)        # the bound weights' panels are untouched
    assert rel_l2(exe(x=x, w=w2.copy())["y"], ref(x=x, w=w2)["y"]) < 1e-5
    # the bias (bound, not packed): a call passes its address by identity once it is in place; another array
    # takes its place for one call, and the next call puts the bound one back
    b2 = np.random.default_rng(9).standard_normal(50).astype(np.float32)
    np.testing.assert_array_equal(exe(x=x)["y"], base)
    assert rel_l2(exe(x=x, b=b2)["y"], ref(x=x, b=b2)["y"]) < 1e-5
    np.testing.assert_array_equal(exe(x=x)["y"], base)
    np.testing.assert_array_equal(exe(x=x)["y"], base)
    (frame,) = _packer(exe)._primary.frames.values()      # x alone is checked per call; the constants by identity
    assert frame.const_placed and [e[0] for _, e in frame.var_inputs] == ["x"]
    assert set(frame.const_names) == {"w", "b"}

def test_the_bound_weights_cannot_change_under_their_panels():
    exe = kumiko.compile(_dense(), "cpu")
    with pytest.raises(ValueError):
        exe.params["w"][0, 0] = 1.0


def test_packed_constants_from_many_threads():
    g = _conv(n=1, c=8, o=16, hw=12)
    exe = kumiko.compile(g, "cpu")
    ref = kumiko.compile(g, "eval")
    x = np.random.default_rng(3).standard_normal((1, 8, 12, 12)).astype(np.float32)
    want = ref(x=x)["y"]
    errors = []

    def work():
        for _ in range(20):
            if rel_l2(exe(x=x)["y"], want) > 1e-5:
                errors.append("wrong")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _packer(exe).pack_calls == sum(len(st.packs) for st in _packer(exe).steps)


def test_unbound_params_are_not_pre_packed():
    x, w = Tensor.input("x", (4, 8)), Tensor.input("w", (8, 16), role="param")
    exe = kumiko.compile((x @ w).graph("y"), "cpu")
    assert not any(st.packs for st in _packer(exe).steps)


def test_a_param_passed_in_place_of_a_constant_is_still_checked():
    """Bound constants skip their per-call checks only when passed as themselves: another array is checked."""
    from kumiko.diagnostics import KumikoError
    exe = kumiko.compile(_dense(m=4, k=30, n=50), "cpu")
    x = np.ones((4, 30), np.float32)
    with pytest.raises(KumikoError) as e:
        exe(x=x, w=np.ones((30, 49), np.float32))
    assert e.value.code == "E1015"
    with pytest.raises(KumikoError) as e:
        exe(x=x, w=np.ones((30, 50), np.float64))
    assert e.value.code == "E1015"


def test_weights_of_other_sizes_share_one_pack_function():
    """Dense layers of other sizes: their weights' pack functions read their sizes and strides from a buffer
    of constants (``lift_constants``), so alike ones are one function, called with each one's own values;
    every layer's panels are its own (the answers are the evaluator's)."""
    rng = np.random.default_rng(7)
    h, k = Tensor.input("x", (40, 37)), 37
    for i, n in enumerate((70, 50, 33, 21)):
        w = Tensor((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), name=f"w{i}", role="param")
        h, k = (h @ w).relu(), n
    g = h.graph("y")
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    packs = [pk for st in _packer(exe).steps for pk in st.packs]
    assert len(packs) == 4 and len({pk.fn for pk in packs}) < len(packs)
    assert len({pk.consts for pk in packs}) == len(packs) and all(pk.consts for pk in packs)
    source = exe._run.source
    assert "kk_cst = (const long long*)bufs[" in source
    for seed in range(2):
        ins = {k: v for k, v in exe.random_inputs(seed).items() if k not in exe.params}
        assert rel_l2(exe(**ins)["y"], ref(**ins)["y"]) < 1e-5
