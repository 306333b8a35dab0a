"""A Graph pickles and deep-copies (a frozen node argument refused to be rebuilt item by item), dtypes stay the
singletons the compiler compares with ``is``, and Tensor API params built with data are bound by compile."""
import copy
import pickle

import numpy as np
import pytest

import kumiko
from kumiko import Tensor, dtypes


def _graph():
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((6, 5)).astype(np.float32), name="w", role="param")
    b = Tensor(rng.standard_normal(5).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", ("B", 6))
    return ((x @ w) + b).relu().graph("y", symbols={"B": 3})


@pytest.mark.parametrize("clone", [lambda g: pickle.loads(pickle.dumps(g)), copy.deepcopy], ids=["pickle", "deepcopy"])
def test_a_graph_pickles_and_deep_copies(clone):
    g = _graph()
    g2 = clone(g)
    assert g2.tiny == g.tiny and set(g2.params) == {"w", "b"}
    assert all(n.dtype is dtypes.ALL[n.dtype.name] for n in g2.tiny.nodes.values())
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    want = np.maximum(x @ g.params["w"] + g.params["b"], 0)
    np.testing.assert_allclose(kumiko.compile(g2, "eval")(x=x)["y"], want, rtol=1e-5, atol=1e-6)


def test_tensor_params_with_data_are_bound_by_compile():
    g = _graph()
    exe = kumiko.compile(g, "eval")
    x = np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32)
    np.testing.assert_allclose(exe(x=x)["y"], np.maximum(x @ g.params["w"] + g.params["b"], 0), rtol=1e-5, atol=1e-6)
    # the bound values are the Executable's own read-only copies: changing the caller's array changes nothing
    assert not exe.params["w"].flags.writeable and exe.params["w"] is not g.params["w"]


def test_an_onnx_graph_pickles():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    w = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    m = h.make_model(h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                                  [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                                  [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])], [nh.from_array(w, "w")]),
                     opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    g = pickle.loads(pickle.dumps(kumiko.from_onnx(m)))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(kumiko.compile(g, "eval")(x=x)["y"], x @ w, rtol=1e-5)
