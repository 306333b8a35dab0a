"""Poly Core's compute-at verdicts asked of a producer/consumer pair's own subgraph (``region.pairview``):
the same answers as the whole graph's Poly-View, and repeated blocks analysed once."""
from pathlib import Path

import pytest

import kumiko
from kumiko import Tensor
from kumiko.indexbook import build_indexbook
from kumiko.poly import compute_at, poly_view
from kumiko.region import form as form_mod
from kumiko.region import pairview
from kumiko.region.form import form_regions

EXAMPLES = Path(__file__).parents[2] / "examples"


def _whole_graph_verdict(view, producer, consumer):
    """The verdict as region formation took it from the whole graph's view before ``pairview``."""
    pb = view.blocks.get(producer) or view.block_of_value(producer)
    cb = view.blocks.get(consumer) or view.block_of_value(consumer)
    if pb is None or cb is None or pb.name == cb.name:
        return None
    try:
        ca = compute_at(view, producer, consumer, all_footprints=False)
    except Exception:    # noqa: BLE001 - outside the SCoP
        return None
    buf = dict(ca.min_buffer).get("buffer") if ca.min_buffer else None
    return ca.ok and buf == "reg"


def _asked(monkeypatch, g):
    """The (producer, consumer) pairs region formation asks about while forming ``g``'s regions."""
    asked = []
    real = form_mod.compute_at_verdict

    def spy(tg, p, c, users=None):
        assert users is None or users == tg.consumers()
        v = real(tg, p, c, users)
        asked.append((p, c, v))
        return v
    monkeypatch.setattr(form_mod, "compute_at_verdict", spy)
    form_regions(g.tiny)
    return asked


def _resnet_like():
    """Two identical conv -> ReLU -> conv blocks with residual adds, a 2x2 max pool of a conv (fused: legal)
    and a 3x3 stride-1 max pool of another (overlapping windows: not fused)."""
    x = Tensor.input("x", (1, 4, 10, 10))
    h = x
    for k in range(2):
        w1 = Tensor.input(f"w1_{k}", (4, 4, 3, 3))
        w2 = Tensor.input(f"w2_{k}", (4, 4, 3, 3))
        h = (h.conv2d(w1, padding=1).relu().conv2d(w2, padding=1) + h).relu()
    w3 = Tensor.input("w3", (4, 4, 3, 3))
    w4 = Tensor.input("w4", (4, 4, 3, 3))
    pooled = h.conv2d(w4, padding=1).max_pool2d(3, stride=1, padding=1)
    y = h.conv2d(w3, padding=1).relu().max_pool2d(2) + pooled[:, :, :5, :5]
    return y.graph("y")


@pytest.mark.parametrize("make", [
    _resnet_like,
    lambda: kumiko.load(EXAMPLES / "conv_relu_maxpool.json"),
], ids=["resnet_like", "conv_relu_maxpool"])
def test_pair_verdicts_equal_the_whole_graph_view(monkeypatch, make):
    g = make()
    pairview._cache.clear()
    asked = _asked(monkeypatch, g)
    assert any(v is not None for _, _, v in asked), "Poly Core gave no verdict: the test would compare nothing"
    view = poly_view(build_indexbook(g.tiny))
    for p, c, v in asked:
        assert (None if v is None else v[0]) == _whole_graph_verdict(view, p, c), (p, c, v)


def test_repeated_blocks_are_analysed_once(monkeypatch):
    g = _resnet_like()
    pairview._cache.clear()
    runs = []
    real = pairview._analyse
    monkeypatch.setattr(pairview, "_analyse", lambda sub, p, c: runs.append((p, c)) or real(sub, p, c))
    asked = _asked(monkeypatch, g)
    assert {v[0] for _, _, v in asked if v is not None} == {True, False}
    assert len(runs) < len(asked)       # the two identical blocks share their pairs' analyses
    keys = {pairview.pair_graph(g.tiny, p, c)[1] for p, c, _ in asked}
    assert len(runs) == len(keys)
    runs.clear()
    form_regions(g.tiny)                # a second compile asks the cache only
    assert runs == []


def test_a_product_read_outside_the_pair_stays_its_own_block():
    """A MUL its REDUCE sums and another node reads is a block of its own in the whole graph's view (Poly-View
    merges a MUL into its REDUCE only when that is its one reader): the pair's subgraph keeps it so."""
    x, y = Tensor.input("x", (4, 5)), Tensor.input("y", (4, 5))
    m = x * y
    g = m.sum(1).graph("s", outputs={"z": m + 1.0})
    t = g.tiny
    mul = next(nid for nid, n in t.nodes.items() if n.uop == "MUL")
    red = next(nid for nid, n in t.nodes.items() if n.uop == "REDUCE")
    assert mul in poly_view(build_indexbook(t), emit=False).blocks      # the whole graph: its own block
    sub, _ = pairview.pair_graph(t, mul, red)
    assert mul in poly_view(build_indexbook(sub), emit=False).blocks
