"""``kumiko dump FILE --stage indexbook,poly_view``: the seeds' facts in the JSON, byte-identical runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kumiko.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def dump(tmp_path: Path, name: str, run: int = 0) -> tuple[dict, dict, str]:
    out = tmp_path / f"run{run}"
    assert main(["dump", str(EXAMPLES / f"{name}.json"), "--stage", "indexbook,poly_view", "--out", str(out)]) == 0
    ib = (out / f"{name}.indexbook.json").read_text()
    pv = (out / f"{name}.poly_view.json").read_text()
    return json.loads(ib), json.loads(pv), ib + pv


@pytest.mark.parametrize("name", ["gemm_bias_relu", "conv_relu_maxpool"])
def test_dumps_are_byte_identical(tmp_path, name):
    assert dump(tmp_path, name, 0)[2] == dump(tmp_path, name, 1)[2]


def test_gemm_dump_carries_the_seed_report(tmp_path):
    ib, pv, _ = dump(tmp_path, "gemm_bias_relu")
    assert ib["kumiko"] == "indexbook" and ib["params"] == ["M", "K", "N"]
    red = next(v for v in ib["index_book"].values() if v["uop"] == "REDUCE")
    assert red["reduce"][0]["size"] == "K" and red["inputs"][0]["map"] == ["i0", "i1", "r0"]
    (blk,) = [b for b in pv["poly_view"]["blocks"] if b["kind"] == "contraction_pattern"]
    assert blk["attrs"]["pattern"] == "matmul" and blk["attrs"]["reduce_idx"] == ["r0"]
    a = pv["analysis"]["blocks"][blk["name"]]
    assert (a["parallel_axes"], a["reduce_axes"], a["tail_axes"]) == (["i0", "i1"], ["r0"], ["i0", "i1", "r0"])
    last = pv["poly_view"]["blocks"][-1]["name"]
    epi = pv["analysis"]["blocks"][last]["compute_at"][blk["name"]]
    assert epi["ok"] and epi["halo"] == {"bytes": 0, "per_axis": {"i0": 0, "i1": 0}}
    assert epi["min_buffer"]["buffer"] == "reg"
    assert pv["diagnostics"] == [] and pv["analysis"]["dependences"]["flow"]


def test_conv_relu_maxpool_dump_reports_conv_inside_pool(tmp_path):
    _, pv, _ = dump(tmp_path, "conv_relu_maxpool")
    conv, relu, pool = (b["name"] for b in pv["poly_view"]["blocks"])
    ca = pv["analysis"]["blocks"][pool]["compute_at"]
    assert set(ca) == {conv, relu}
    entry = ca[conv]
    assert entry["ok"] is True and entry["group"] == [conv, relu]
    x = entry["footprints"]["X"]["per_axis"]
    assert x["i2"] == {"lo": "2*o_i2 - 1", "hi": "2*T_i2 + 2*o_i2", "extent": "2*T_i2 + 2", "halo": 2}
    assert entry["min_buffer"]["buffer"] == "reg"
