"""A packed CPU plan's K blocking (``k_blocks``) and thread split (``bind.split``): chosen from the sizes and
the constant (pre-packed) operands, in the plan's JSON, validated, and overridable, with the kernel doing
what each says (checked against the Tiny IR evaluator at odd sizes on 1, 2 and 3 threads)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.plan import Plan
from kumiko.plan.choose import choose_plan
from kumiko.plan.packed import K_BLOCKS, SPLITS, k_blocks_rule, n_block_padded, split_rule
from kumiko.plan.validate import validate
from kumiko.region import form_regions

AVX2 = {"vector_width_f32": 8, "cores": 2}


def region(g):
    (r,) = [r for r in form_regions(g.tiny).regions]
    return r


def weights(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_the_rules_decide_when_the_sizes_are_known():
    assert k_blocks_rule(False, 64, 100) == "kc"
    assert k_blocks_rule(True, 64, 8192) == "one" and k_blocks_rule(True, 64, 8193) == "kc"
    assert k_blocks_rule(True, None, 100) == k_blocks_rule(True, 64, None) == "one_if_fits"
    assert split_rule(False, 16, 4096) == "n" and split_rule(False, 16, 4097) == "m"
    assert split_rule(True, 16, 32768) == "n" and split_rule(True, 16, 32769) == "m"
    assert split_rule(False, None, 8) == "n_if_a_resident" and split_rule(True, 16, None) == "n_if_small_a"
    # a pre-packed B narrower than A has M rows: a channels-last conv's pixels x channels against its weights
    # (every thread would read all of A for a share of a small B); a wide one (a transformer's FFN) still N
    assert split_rule(True, 3138, 96, n=24) == "m" and split_rule(True, 128, 768, n=3072) == "n"
    assert n_block_padded(70, 2048, 16, None) == 80 and n_block_padded(5000, 2048, 16, None) == 2048
    assert n_block_padded(7 * 49, 2048, 16, 49) == 352 and n_block_padded(0, 2048, 16, 0) == 0


def test_the_chooser_reads_the_constants_and_the_sizes():
    """x @ w: w bound makes B pre-packed (split N while A is at most 2 MiB, else M); unbound, the split
    tests what a thread keeps resident (64 Ki floats). w @ x with w bound: pre-packed A, one K block when B
    fits. Symbolic sizes leave the test to the kernel and the plan names it."""
    x, w = Tensor.input("x", (40, 3000)), Tensor.input("w", (3000, 70))
    r = region((x @ w).graph("y"))
    bound = choose_plan(r, (), AVX2, frozenset({"w"}))
    assert bound.split == "n" and bound.k_blocks == "kc" and bound.cache_block.kc == 256   # A <= 512 Ki
    assert choose_plan(r, (), AVX2).split == "m"                                           # A > 64 Ki
    big = region((Tensor.input("x", (200, 3000)) @ w).graph("y"))
    assert choose_plan(big, (), AVX2, frozenset({"w"})).split == "m"                      # A > 512 Ki
    sym = region((Tensor.input("x", ("M", 3000)) @ w).graph("y"))
    assert choose_plan(sym, ("M",), AVX2, frozenset({"w"})).split == "n_if_small_a"
    assert choose_plan(sym, ("M",), AVX2).split == "n_if_a_resident"
    a = region((Tensor.input("w", (40, 3000)) @ Tensor.input("x", (3000, 70))).graph("y"))
    one = choose_plan(a, (), AVX2, frozenset({"w"}))
    assert one.k_blocks == "one" and one.cache_block.kc == 3000                          # B <= 512 Ki
    assert choose_plan(a, (), AVX2).k_blocks == "kc"
    wide = region((Tensor.input("w", (40, 3000)) @ Tensor.input("x", (3000, 700))).graph("y"))
    assert choose_plan(wide, (), AVX2, frozenset({"w"})).k_blocks == "kc"                # B > 512 Ki
    syn = region((Tensor.input("w", (40, 3000)) @ Tensor.input("x", (3000, "N"))).graph("y"))
    p = choose_plan(syn, ("N",), AVX2, frozenset({"w"}))
    assert p.k_blocks == "one_if_fits" and p.cache_block.kc == 256


def test_a_fused_window_counts_whole_window_groups():
    """Under a fused pooling window (the conv's bound weights pre-packed on the A side) the N block holds
    whole window groups, and the plan's one-block rule counts them (256 pixels x K = 576 fit)."""
    x = Tensor.input("x", (1, 64, 16, 16))
    g = x.conv2d(Tensor.input("w", (64, 64, 3, 3)), padding=1).relu().max_pool2d(2, 2).graph("y")
    p = choose_plan(region(g), (), AVX2, frozenset({"w"}))
    assert p.algo == "packed" and p.k_blocks == "one" and p.cache_block.kc == 576       # 256 cols x 576
    sym = Tensor.input("x", (1, 64, "H", "W")).conv2d(Tensor.input("w", (64, 64, 3, 3)), padding=1)
    p = choose_plan(region(sym.relu().max_pool2d(2, 2).graph("y")), ("H", "W"), AVX2, frozenset({"w"}))
    assert p.k_blocks == "one_if_fits"


def test_the_rules_round_trip_through_json():
    r = region((Tensor.input("w", (40, 3000)) @ Tensor.input("x", (3000, 70))).graph("y"))
    p = choose_plan(r, (), AVX2, frozenset({"w"}))
    d = p.to_json()
    assert d["k_blocks"] == "one" and d["bind"]["split"] == p.split and d["cache_block"]["kc"] == 3000
    again = Plan.from_json(d)
    assert again == p and hash(again) == hash(p)
    for kb in K_BLOCKS:
        for split in SPLITS:
            q = Plan.from_json({**d, "k_blocks": kb, "bind": {**d["bind"], "split": split}})
            assert (q.k_blocks, q.split) == (kb, split) and Plan.from_json(q.to_json()) == q
            assert validate(q, r, (), AVX2) == q


@pytest.mark.parametrize("edit,why", [
    (dict(k_blocks="two"), "k_blocks 'two'"),
    (dict(k_blocks=1), "k_blocks 1"),
    (dict(bind={"m.o": "omp", "split": "k"}), "bind.split 'k'"),
])
def test_a_bad_rule_is_e1801(edit, why):
    r = region((Tensor.input("x", (40, 300)) @ Tensor.input("w", (300, 70))).graph("y"))
    p = Plan.from_json({**choose_plan(r, (), AVX2).to_json(), **edit})
    with pytest.raises(KumikoError) as e:
        validate(p, r, (), AVX2)
    assert e.value.code == "E1801" and why in e.value.why and e.value.suggestion


def test_a_plan_that_is_not_packed_drops_the_rules():
    """A loops plan (no contraction) or a skinny one (all of K at once, N split) has nothing that reads them:
    the validated plan leaves them out (a packed plan's file edited to loops keeps working), but an unknown
    value is still E1801."""
    loops = region(Tensor.input("x", (4, 5)).softmax().graph("y"))
    skinny = region((Tensor.input("x", (3, 300)) @ Tensor.input("w", (300, 700))).graph("y"))
    for r in (loops, skinny):
        p = choose_plan(r, (), AVX2)
        assert p.algo in ("loops", "skinny") and p.k_blocks is None and p.split is None
        q = validate(p.with_(k_blocks="one", bind={**dict(p.bind), "split": "n"}), r, (), AVX2)
        assert q == p and "split" not in q.to_json()["bind"] and q.to_json()["k_blocks"] is None
        with pytest.raises(KumikoError) as e:
            validate(p.with_(k_blocks="all"), r, (), AVX2)
        assert e.value.code == "E1801" and "k_blocks 'all'" in e.value.why


def test_a_plan_without_the_rules_gets_the_plain_ones_and_says_so():
    r = region((Tensor.input("x", (40, 300)) @ Tensor.input("w", (300, 70))).graph("y"))
    d = choose_plan(r, (), AVX2).to_json()
    d.pop("k_blocks")
    d["bind"].pop("split")
    p = validate(Plan.from_json(d), r, (), AVX2)
    assert p.k_blocks == "kc" and p.split == "m" and p.to_json()["bind"]["split"] == "m"


_OVERRIDES = r"""
import sys
import numpy as np, kumiko
from kumiko import Tensor
from kumiko.plan.packed import K_BLOCKS, SPLITS

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

rng = np.random.default_rng(5)
# pre-packed B (x @ w): every split; pre-packed A (w @ x): every K blocking. Symbolic sizes, so the run-time
# rules take both of their branches: K = 9000 puts A (M = 13 rows: 18-24 x 9000) between 64 Ki and 512 Ki
# floats and the B panels (N = 300, w @ x: 29 rows, not a skinny GEMM) past 2 MiB; K = 70 keeps everything
# small. NC of 4 panels so N runs in several blocks (K blocks of 64 under "kc").
W1 = (rng.standard_normal((9000, 300)) * 0.02).astype(np.float32)
W2 = (rng.standard_normal((29, 9000)) * 0.02).astype(np.float32)
cases = []
for split in SPLITS:
    cases.append(("b", "kc", split))
for kb in K_BLOCKS:
    cases.append(("a", kb, "m"))
seen = set()
for side, kb, split in cases:
    for k, n in ((9000, 300), (70, 301)):
        if side == "b":
            w = Tensor(W1[:k, :n].copy(), name="w", role="param")
            g = (Tensor.input("x", ("M", k)) @ w).relu().graph("y")
            shapes = {"M": 13}
        else:
            w = Tensor(W2[:, :k].copy(), name="w", role="param")
            g = (w @ Tensor.input("x", (k, "N"))).graph("y")
            shapes = {"N": n}
        exe = kumiko.compile(g, "cpu")
        (name, p), = [(r, p) for r, p in exe._run.plans.items() if p.algo == "packed"]
        mr, nr = p.register_block
        forced = p.with_(k_blocks=kb, bind={**dict(p.bind), "split": split},
                         cache_block=(p.cache_block.mc, 4 * nr, 64 if kb == "kc" else p.cache_block.kc))
        exe = kumiko.compile(g, "cpu", plans={name: forced})
        got = exe._run.plans[name]
        assert (got.k_blocks, got.split) == (kb, split), (got.k_blocks, got.split)
        src = exe._run.source
        assert ("kk_nkb = 1;" in src) == (kb == "one") and ("kk_ncp * kk_K <=" in src) == (kb == "one_if_fits")
        assert ("kk_wn * 10 <= kk_wm * 11" in src) == (split != "m")
        ins = {a: v for a, v in exe.random_inputs(7, shapes).items() if a != "w"}
        out, want = exe(**ins)["y"], kumiko.compile(g, "eval")(**ins)["y"]
        assert rel(out, want) < 1e-5, (side, kb, split, k, rel(out, want))
        seen.add((side, kb, split))
assert len(seen) == len(cases)
print("OK")
"""


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_an_override_forces_each_rule(threads):
    """A plan override forcing each k_blocks and each bind.split (with symbolic sizes, so the run-time rules
    take both branches) compiles to what it says and matches the evaluator on 1, 2 and 3 threads."""
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    r = subprocess.run([sys.executable, "-c", _OVERRIDES], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
