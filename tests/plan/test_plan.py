"""The Plan record (JSON, hashing), its validation against region and machine, the cost model's
candidates and pruning, and autotuning with its on-disk cache."""
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.plan import Plan, make_plan
from kumiko.plan import tune as tuning
from kumiko.plan.choose import choose_plan
from kumiko.plan.cost import Machine, candidates, estimate, flops
from kumiko.plan.validate import validate
from kumiko.region import form_regions

AVX2 = {"vector_width_f32": 8, "cores": 2}
EX = Path(__file__).parents[2] / "examples"


def gemm_region():
    g = kumiko.load(EX / "gemm_bias_relu.json")
    return g, form_regions(g.tiny).regions[0]


def test_plan_json_round_trip_and_hash():
    _, r = gemm_region()
    p = choose_plan(r, ("K", "M", "N"), AVX2)
    again = Plan.from_json(p.to_json())
    assert again == p and hash(again) == hash(p)
    assert p.to_json()["async"] == {} or isinstance(p.to_json()["async"], (dict, list))
    assert p.algo == "packed" and p.micro == (6, 16) and p.vector_width == 8
    assert p.epilogue == ("add", "relu")
    with pytest.raises(KumikoError):
        Plan.from_json({**p.to_json(), "bogus": 1})


def test_non_contraction_region_gets_loops():
    x = Tensor.input("x", (4, 5))
    r = form_regions(x.softmax().graph("y").tiny).regions[0]
    assert choose_plan(r, (), AVX2).algo == "loops"


@pytest.mark.parametrize("bad,why", [
    (dict(arch="sm80"), "not a CPU arch"),
    (dict(vectorize=(("width", 16),)), "exceeds"),
    (dict(tile=(100, 2048, 256)), "multiples"),
    (dict(micro=(6, 12)), "whole number"),
])
def test_validation_diagnostics(bad, why):
    _, r = gemm_region()
    p = replace(choose_plan(r, ("K", "M", "N"), AVX2), **bad)
    with pytest.raises(KumikoError) as e:
        validate(p, r, ("K", "M", "N"), AVX2)
    assert e.value.code == "E1801" and why in e.value.why


def test_packed_plan_on_a_non_contraction_is_refused():
    x = Tensor.input("x", (4, 5))
    r = form_regions(x.softmax().graph("y").tiny).regions[0]
    p = make_plan("cpu-avx2", algo_choice={"contraction": "packed"}, micro=(6, 16), tile=(120, 1024, 256),
                  vectorize={"width": 8})
    with pytest.raises(KumikoError) as e:
        validate(p, r, (), AVX2)
    assert "no" in e.value.why


def test_user_plan_is_used_and_checked():
    g, r = gemm_region()
    p = replace(choose_plan(r, ("K", "M", "N"), AVX2), tile=(48, 64, 32))
    exe = kumiko.compile(g, "cpu", plans={r.name: p})
    assert exe._run.plans[r.name].tile == (48, 64, 32)
    ins = exe.random_inputs(2, {"M": 100, "N": 70, "K": 45})
    np.testing.assert_allclose(exe(**ins)["C2"], kumiko.compile(g, "eval")(**ins)["C2"], rtol=1e-5, atol=1e-5)
    with pytest.raises(KumikoError):
        kumiko.compile(g, "cpu", plans={"nope": p})


def test_cost_model_counts_and_prunes():
    _, r = gemm_region()
    env = {"M": 64, "N": 32, "K": 16}
    assert flops(r, env) >= 2 * 64 * 32 * 16          # multiply-add plus the epilogue
    m = Machine(l1_bytes=32 * 1024, l2_bytes=512 * 1024)
    p = choose_plan(r, ("K", "M", "N"), AVX2)
    cands = candidates(p, m)
    assert 10 <= len(cands) <= 20 and cands[0] == p
    for c in cands:
        mc, _, kc = c.tile
        assert mc * kc * 4 <= 0.8 * m.l2_bytes or c == p
        assert kc * 16 * 4 <= 0.8 * m.l1_bytes
    e = estimate(r, p, env, m, (64, 32, 16))
    assert e.seconds > 0 and e.flops == flops(r, env)


def test_tune_picks_the_fastest_scores_failures_inf_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    g, r = gemm_region()
    p = choose_plan(r, ("K", "M", "N"), AVX2)
    program = form_regions(g.tiny)
    cands = candidates(p, Machine())
    target = cands[3]
    calls = []

    def fake_time(plans):
        q = plans[r.name]
        calls.append(q)
        if q == cands[1]:
            raise KumikoError("E1701", at="gcc", why="injected build failure")
        return 0.5 if q == target else 1.0 + len(calls) * 1e-3

    env = {"M": 256, "N": 128, "K": 64}
    out = tuning.tune(program, {r.name: p}, env, AVX2, "gcc-test", fake_time, report=lambda *a: None)
    assert out[r.name] == target and len(calls) == len(cands)
    key = tuning.tune_key(r, env, p.arch, "gcc-test")
    assert tuning.cached_plan(key) == target
    calls.clear()
    again = tuning.tune(program, {r.name: p}, env, AVX2, "gcc-test", fake_time, report=lambda *a: None)
    assert again[r.name] == target and not calls                   # served from the cache
    (tmp_path / "tune" / f"{key}.json").write_text("{ corrupted")
    assert tuning.cached_plan(key) is None
    assert tuning.shape_cluster({"M": 100, "N": 3}) == "M=128,N=4"
    assert math.isinf(float("inf"))
