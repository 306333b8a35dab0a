"""The last tile of an M that the micro-tile's MR rows do not divide runs a micro-kernel of its rows alone
(``kumiko.kernel.micro``'s ``rows``, ``ContractionLowering.m_tail``), its A panel still MR rows wide: 128 rows
had been 22 tiles of 6 rows' work, 132 rows, and a 7x7 conv's 49 pixels 54. Every variant the packed path
calls has its tail twin (packed A, B from a stage, A from a stage with its rows one or a unit apart); each
computes and stores those rows only; contractions with every remainder of M, K blocks (the tail tile adds
to its C rows), bound and passed weights, convs with A or B from a stage, match the evaluator with poisoned
outputs; and an M that MR divides has no tail kernel."""
import re

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.kernel import micro

_VARIANTS = [lambda r: micro.micro_kernel(6, 16, 8, rows=r), lambda r: micro.stage_micro_kernel(6, 16, 8, rows=r),
             lambda r: micro.astage_micro_kernel(6, 16, 8, rows=r),
             lambda r: micro.astage_micro_kernel(6, 16, 8, True, rows=r)]


@pytest.mark.parametrize("variant", range(len(_VARIANTS)))
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_a_tail_kernel_computes_its_rows_alone(variant, rows):
    text, full = _VARIANTS[variant](rows), _VARIANTS[variant](None)
    name = re.match(r"static void (\w+)\(", text).group(1)
    assert name.endswith(f"_r{rows}") and name != re.match(r"static void (\w+)\(", full).group(1)
    stored = {int(i) for i in re.findall(r"\*\(kk_vfu\*\)\(c \+ (\d+)\*ldc", text)}
    assert stored == set(range(rows))                          # only its rows of C are written
    assert {int(i) for i in re.findall(r"kk_vf c(\d+)_0 =", text)} == set(range(rows))
    assert re.search(r"a\[p\*6 \+ \d\]", text) or "ko[p]" in text     # A panels still 6 rows apart
    assert _VARIANTS[variant](6) == full                       # all MR rows: the kernel itself


def _check(g):
    """The kernels against the evaluator; the source, MR, and the tail kernels' (name, rows)."""
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    for seed in (0, 1):
        ins = exe.random_inputs(seed)
        out, want = np.asarray(exe(**ins)["y"], np.float64), np.asarray(ref(**ins)["y"], np.float64)
        assert np.linalg.norm(out - want) <= 2e-5 * max(np.linalg.norm(want), 1e-30)
    src, plan = exe._run.source, next(iter(exe._run.plans.values()))
    tails = set(re.findall(r"(kk_micro\w*)_r(\d+)\(kk_kcb", src))
    for base, _ in tails:      # each called beside its full twin, on the last tile alone
        assert f"{base}(kk_kcb" in src
    assert len(re.findall(rf"kk_ic \+ kk_ir \+ {plan.register_block[0]} <= kk_M", src)) == (1 if tails else 0)
    return src, plan, {int(r) for _, r in tails}


@pytest.mark.parametrize("m", [7, 8, 9, 10, 11, 12, 49, 128, 203])
@pytest.mark.parametrize("k", [5, 300])
def test_every_remainder_of_m(m, k):
    rng = np.random.default_rng(m + k)
    x = Tensor.input("x", (m, k))
    w = Tensor(rng.standard_normal((k, 40)).astype(np.float32), name="w", role="param") if m % 2 else \
        Tensor.input("w", (k, 40))
    _, plan, tails = _check((x @ w + Tensor.input("b", (40,))).relu().graph("y"))
    if plan.algo == "packed":
        mr = plan.register_block[0]
        assert tails == ({m % mr} if m % mr else set())


def _conv(x, w, layout, padding=1, stride=1):
    return Tensor._record("Conv2D", (x, w), stride=[stride] * 2, padding=[padding] * 2, dilation=[1, 1], groups=1,
                          x_layout=layout, y_layout=layout)


@pytest.mark.parametrize("layout,hw,cin,cout", [("channels_last", 7, 16, 24), ("channels_last", 5, 8, 20),
                                                ("channels_first", 9, 8, 20), ("channels_first", 7, 3, 13),
                                                ("channels_first", 30, 16, 20)])
def test_convs_with_stages(layout, hw, cin, cout):
    rng = np.random.default_rng(hw * cout)
    shape = (1, hw, hw, cin) if layout == "channels_last" else (1, cin, hw, hw)
    w = Tensor(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.2, name="w", role="param")
    _, plan, tails = _check(_conv(Tensor.input("x", shape), w, layout).relu().graph("y"))
    mr = plan.register_block[0]
    # M is the pixels or the output channels (the chooser picks the sides)
    assert tails <= {hw * hw % mr, cout % mr} - {0} and len(tails) <= 1


@pytest.mark.parametrize("rows,nh", [(1, 4), (2, 2), (3, 2), (4, 1), (5, 1)])
def test_a_short_tail_splits_k_among_accumulator_sets(rows, nh):
    """A tail of few rows keeps FMA_CHAINS multiply-add chains in flight: k in steps of ``nh``, each step's k
    into its own set of accumulators, the rest of k into the first, the sets summed before the store."""
    assert micro.chains(rows, 2, 8) == nh and micro.chains(6, 2, 8) == 1 and micro.chains(12, 2, 16) == 1
    for variant in _VARIANTS:
        text = variant(rows)
        sets = {int(h) for h in re.findall(r"kk_vf c0_0_(\d+) =", text)}
        assert sets == set(range(1, nh))
        assert (f"p + {nh} <= kc; p += {nh}" in text) == (nh > 1)
        if nh > 1:
            assert "c0_0 += " + " + ".join(f"c0_0_{h}" for h in range(1, nh)) + ";" in text


@pytest.mark.parametrize("k", [2, 3, 7, 301])
def test_chained_tails_at_every_remainder_of_k(k):
    """M of 49 and 50 (tails of 1 and 2 rows: 4 and 2 sets) with K not a multiple of the steps."""
    rng = np.random.default_rng(k)
    for m in (49, 50):
        x = Tensor.input("x", (m, k))
        w = Tensor(rng.standard_normal((k, 40)).astype(np.float32), name="w", role="param")
        _, plan, tails = _check((x @ w).graph("y"))
        if plan.algo == "packed":
            assert tails == {m % plan.register_block[0]} - {0}
