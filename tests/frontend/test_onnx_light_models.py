"""The nine classic CNNs of onnx's own test data (``backend/test/data/light``: AlexNet, DenseNet-121,
Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, opset 9 exports) import, compile
for ``cpu`` and match their stored outputs.

The inputs are the ones onnx's own backend runner makes for these models (``Runner.generate_dummy_data``
with seed 0, not random); the stored output is what onnx's reference evaluator gives for them. The
"light" models keep the graphs (BatchNormalization, LRN, Dropout, Concat, grouped convs, pooling with
ceil mode ...) with small constant weights, so these check that every node of a real exported CNN imports
and runs at full size; the numerics of whole networks are checked against onnxruntime by the
bench-network and pytorch-model tests."""
from __future__ import annotations

import os

import numpy as np
import pytest

import kumiko
from kumiko.accuracy import rel_l2

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512"]


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_its_stored_output(name):
    path = os.path.join(DATA, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"this onnx package has no {path}")
    model = onnx.load(path)
    inits = {i.name for i in model.graph.initializer}
    feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=name, random=False)
             for x in model.graph.input if x.name not in inits}
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(DATA, f"light_{name}_output_0.pb")))
    exe = kumiko.compile(kumiko.from_onnx(path), target="cpu")
    (got,) = exe(**feeds).values()
    assert got.shape == want.shape and np.isfinite(got).all()
    assert rel_l2(got, want) <= 1e-4, name
