"""The region stage's picture: one cluster per kernel, every edge between declared nodes."""
import re
import shutil
from pathlib import Path

import pytest

import kumiko
from kumiko.pipeline import to_dot
from kumiko.region import form_regions
from kumiko.util.drawing import to_svg

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_region_picture_has_a_cluster_per_kernel(path):
    g = kumiko.load(path)
    dot = to_dot(g, "region")
    assert dot == to_dot(g, "region")                      # deterministic
    kernels = form_regions(g.tiny).regions
    assert dot.count('subgraph "cluster_') == len(kernels)
    declared = set(re.findall(r'^\s*"([^"]+)" \[', dot, re.M))
    for a, b in re.findall(r'^\s*"([^"]+)" -> "([^"]+)"', dot, re.M):
        assert a in declared and b in declared
    assert dot.count("{") == dot.count("}")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (apt-get install graphviz)")
def test_region_svg():
    svg = to_svg(to_dot(kumiko.load(EXAMPLES[0]), "region"))
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg
