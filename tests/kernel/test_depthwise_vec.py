"""Depthwise convolutions on the CPU loop path (kumiko/kernel/lower_vec.py's split loops): the row over the
output's contiguous axis runs in whole vectors from its start, ``ceil(OW / VW)`` of them: masked ones over
the head where the padding guards fail for some lane, plain ones inside, and a last one whose lanes the
guards all let through when the interior reaches the row's end (only the lanes past it masked, no lane
guard computed: a stride-2 row of 28 is one masked vector and one tail, not three iterations).

Every case runs the cpu target against the reference evaluator on random inputs at odd sizes (1, 2 and 7
channels, 13x17, stride 2 over odd widths, padding 0, 1 and 2, dilation 2, batch 1 and 3), the weights
bound as constants as an imported network binds them, with the outputs poisoned (NaN) before each run so
a lane the kernel never writes shows. The split's bounds are evaluated from the generated C at each width
around the vector width."""
import re

import numpy as np
import pytest

import kumiko
from kumiko import Tensor


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def dw(n, c, h, w, k=3, stride=1, pad=1, dil=1, seed=0):
    """Depthwise conv + bias + ReLU6 with constant weights; the graph and its input."""
    rng = np.random.default_rng(seed + 7 * h + w)
    x = Tensor.input("x", (n, c, h, w))
    wt = Tensor((rng.standard_normal((c, 1, k, k), np.float32) + np.float32(0.1)), name="w", role="param")
    b = Tensor(rng.standard_normal(c, np.float32), name="b", role="param")
    y = x.conv2d(wt, b, stride=stride, padding=pad, dilation=dil, groups=c).clip(0.0, 6.0)
    return y.graph("y", name="dw"), {"x": rng.standard_normal((n, c, h, w), np.float32) + np.float32(0.1)}


def check(g, ins, monkeypatch) -> str:
    monkeypatch.setenv("KUMIKO_SPEC", "1")              # outputs poisoned with NaN before each run
    exe, ref = kumiko.compile(g, "cpu"), kumiko.compile(g, "eval")
    assert exe._run.runner.poison is not False
    for _ in range(2):                                  # the second run reuses (and re-poisons) the outputs
        out, want = exe(**ins)["y"], ref(**ins)["y"]
        assert out.shape == want.shape and not np.isnan(out).any()
        assert rel(out, want) < 1e-5, rel(out, want)
    return exe._run.source


@pytest.mark.parametrize("n,c", [(1, 1), (3, 2), (1, 7)])
@pytest.mark.parametrize("stride,pad,dil", [(1, 1, 1), (2, 1, 1), (1, 0, 1), (2, 0, 1), (1, 2, 1), (2, 2, 1),
                                            (1, 2, 2), (2, 2, 2)])
def test_depthwise_at_odd_sizes(n, c, stride, pad, dil, monkeypatch):
    for h, w in [(13, 17), (9, 33), (5, 31)]:
        check(*dw(n, c, h, w, stride=stride, pad=pad, dil=dil), monkeypatch)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_rows_around_the_vector_width(stride, monkeypatch):
    """Output rows of 1 to 57 points: a head alone, a head and a tail, plain vectors between them."""
    for ow in (1, 2, 7, 14, 15, 16, 17, 28, 31, 32, 33, 48, 57):
        w = (ow - 1) * stride + 1 if ow % 2 else (ow - 1) * stride + 2       # even rows over odd widths too
        check(*dw(1, 3, 5, w, stride=stride, pad=1), monkeypatch)


def test_depthwise_5x5_stride_2_and_dilated_3x3(monkeypatch):
    check(*dw(3, 7, 13, 17, k=5, stride=2, pad=2), monkeypatch)
    check(*dw(1, 2, 11, 29, k=3, stride=1, pad=2, dil=2), monkeypatch)


# the split's bounds, read back from the generated C ----------------------------------------------------------
_C_FNS = {"kumiko_min_ll": min, "kumiko_max_ll": max, "kumiko_ceildiv": lambda a, q: -(-a // q),
          "kumiko_floordiv": lambda a, q: a // q}


def _split_bounds(src: str, vw: int) -> list[dict]:
    """Each split loop's (head end, plain end, interior end, row end) at ``vw`` lanes, evaluated from its
    declarations (constant sizes: the outer loop indices do not appear)."""
    out = []
    decl = re.compile(r"const long long (t\d+) = (.*);$")
    lines = src.splitlines()
    for k, line in enumerate(lines):
        m = re.search(r"for \(long long (\w+) = 0LL; \1 < (t\d+); \1 \+= KUMIKO_VW\)", line)
        if not m:
            continue
        env: dict = {}
        for prev in lines[max(0, k - 4):k]:
            d = decl.search(prev.strip())
            if d:
                expr = re.sub(r"(\d+)LL", r"\1", d.group(2)).replace("KUMIKO_VW", str(vw)).replace("/", "//")
                env[d.group(1)] = eval(expr, dict(_C_FNS), env)
        lo, hi, a, b = (env[t] for t in list(env)[-4:])
        end = re.search(r"if \(t\d+ >= (\d+)LL\)", "\n".join(lines[k:])).group(1)
        out.append({"lo": lo, "hi": hi, "head": a, "plain": b, "n": int(end)})
    return out


@pytest.mark.parametrize("h,w,stride,pad", [(56, 56, 2, 1), (56, 56, 1, 1), (28, 28, 1, 1), (112, 112, 2, 1),
                                            (14, 14, 1, 1), (14, 14, 2, 1), (17, 37, 1, 2), (9, 41, 2, 2)])
def test_row_runs_in_whole_vectors_from_its_start(h, w, stride, pad, monkeypatch):
    """At 16, 8 and 4 lanes: the head ends on a vector boundary (or the row's end) past the padding's
    lanes, the plain vectors stay inside the interior, and the row takes ceil(OW / VW) iterations."""
    src = check(*dw(1, 2, h, w, stride=stride, pad=pad), monkeypatch)
    ow = (w + 2 * pad - 3) // stride + 1
    for vw in (16, 8, 4):
        rows = _split_bounds(src, vw)       # the row in the guard-free interior copy and in the guarded body
        assert rows
        for row in rows:
            _check_row(row, ow, vw)


def _check_row(row: dict, ow: int, vw: int) -> None:
    assert row["n"] == ow and 0 <= row["lo"] <= row["head"] <= row["plain"] <= ow
    assert row["head"] % vw == 0 or row["head"] == ow
    assert row["head"] >= row["lo"] and (row["head"] - row["lo"] < vw or row["head"] == ow)
    assert (row["plain"] - row["head"]) % vw == 0 and row["plain"] <= max(row["hi"], row["head"])
    tail = ow - row["plain"]
    iters = row["head"] // vw + (row["head"] % vw > 0) + (row["plain"] - row["head"]) // vw + -(-tail // vw)
    assert iters == -(-ow // vw), (vw, row)


def test_tail_inside_the_padding_computes_no_lane_guard(monkeypatch):
    """Stride 2 over 56 (pad 1): every tap of the last output (2*27 + 1 < 56) is in range, so the row's last
    vector is the interior body under the tail mask - a masked strided load, no kv_affine_ge - and the
    guarded body is only the other branch of that ``if``."""
    src = check(*dw(1, 3, 56, 56, stride=2, pad=1), monkeypatch)
    row = _split_bounds(src, 16)[0]
    assert row["hi"] >= row["n"] == 28
    start = re.search(r"if \(t\d+ >= 28LL\) \{", src).end()
    then, other = src[start:].split("} else {", 1)
    assert "kv_load_stride_mask(" in then and "kv_affine_ge(" not in then
    assert "kv_affine_ge(" in other.split("return 0;")[0]
