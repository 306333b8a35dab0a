"""The C expression helpers: a value just widened from the stored 16-bit type is stored as those bits."""
from __future__ import annotations

from kumiko import dtypes
from kumiko.kernel import cexpr as C
from kumiko.kernel.cexpr import cast, load, store_value

F16, BF16, F32 = dtypes.lookup("fp16"), dtypes.lookup("bf16"), dtypes.lookup("fp32")


def test_store_of_a_widened_value_keeps_its_bits():
    assert store_value(cast("a", F32, F16), F16) == "kk_f2h((float)(a))"      # a cast, not rounded twice
    assert store_value(load("b0", "i", F16), F16) == "b0[i]"                 # a copy
    assert store_value(cast("a", F32, BF16), BF16) == "kk_f2b((float)(a))"
    # anything else is converted: two calls, a call inside, the other 16-bit type, fp32
    assert store_value("kk_h2f(a) + kk_h2f(b)", F16) == "kk_f2h(kk_h2f(a) + kk_h2f(b))"
    assert store_value("f(kk_h2f(a))", F16) == "kk_f2h(f(kk_h2f(a)))"
    assert store_value("kk_b2f(a)", F16) == "kk_f2h(kk_b2f(a))"
    assert store_value("kk_h2f(a)", F32) == "kk_h2f(a)"



def test_nested_relu_and_integer_max_write_each_operand_once():
    """``relu`` was ``((x) < 0 ? 0 : (x))``: 30 nested relus under a reduction made source that doubled per
    level and kept gcc busy for minutes. Each is a function call now: the source grows linearly."""
    x = "b0[i]"
    for _ in range(40):
        x = C.unary("relu", C.unary("neg", x, "float"), "float")
        x = C.binary("max", x, "1", "int32_t")
    assert len(x) < 40 * 60 and x.count("b0[i]") == 1


def test_a_deep_relu_chain_under_a_sum_compiles_and_matches():
    import numpy as np

    import kumiko
    from kumiko import Tensor
    t = Tensor.input("x", (3, 70))
    y = t
    for _ in range(40):
        y = (-y).relu() - 0.25
    g = y.sum(axis=1).graph("y")
    xv = np.random.default_rng(0).standard_normal((3, 70), dtype=np.float32)
    np.testing.assert_allclose(kumiko.compile(g)(x=xv)["y"], kumiko.compile(g, "eval")(x=xv)["y"], rtol=1e-5)


def test_small_integer_powers_are_multiplies_and_match_the_evaluator():
    """x**3 (GPT-2's tanh-GELU) was a powf call per element in a GEMM's epilogue, exp2 an exp2f call: neither
    vectorises. Small integer powers are a chain of multiplies written out (a helper looping over n's bits kept
    gcc from vectorising the whole epilogue: +0.7 ms on GPT-2's 128x3072 GEMM), in scalar and vector code; the
    epilogue's exp2 is kumiko_cpu.h's."""
    import numpy as np

    import kumiko
    from kumiko import Tensor
    from kumiko.accuracy import rel_l2
    from kumiko.kernel import cexpr as C
    assert C.binary("pow", "x", "3.0f", "float") == "(x * (x * x))"
    assert C.binary("pow", "x", "-2.0f", "float") == "(1.0f / (x * x))"
    assert C.binary("pow", "x", "4.0f", "float") == "((x * x) * (x * x))"
    assert C.binary("pow", "x", "1.0f", "float") == "x"
    assert C.binary("pow", "x", "0.5f", "float") == "powf(x, 0.5f)"
    assert C.vbinary("pow", "v", "kv_broadcast(3.0f)", "f") == "(v * (v * v))"
    assert C.vbinary("pow", "v", "kv_broadcast(-1.0f)", "f") == "(kv_broadcast(1.0f) / v)"
    assert C.vbinary("pow", "v", "kv_broadcast(2.5f)", "f") == "kv_map2(powf, v, kv_broadcast(2.5f))"
    x, w = Tensor.input("x", (9, 20)), Tensor.input("w", (20, 37))
    g = (x @ w).gelu(approximate="tanh").graph("y")
    exe = kumiko.compile(g, "cpu")
    src = exe._run.source
    assert "powf(" not in src and "exp2f(" not in src and "kk_pownf" not in src
    ins = exe.random_inputs(4)
    want = kumiko.compile(g, "eval")(**ins)["y"]
    assert rel_l2(exe(**ins)["y"], want) < 1e-5
    y = Tensor.input("y", (5, 33))
    g2 = (y ** 3 + y ** -2 + y ** 2).graph("z")
    ins2 = {"y": np.random.default_rng(1).uniform(0.5, 2.0, (5, 33)).astype(np.float32)}
    assert rel_l2(kumiko.compile(g2, "cpu")(**ins2)["z"], kumiko.compile(g2, "eval")(**ins2)["z"]) < 1e-5


def test_max_min_with_a_literal_are_one_instruction_forms():
    """``maximum(x, L)``/``minimum(x, L)`` with a float literal: ``L > x ? L : x`` (maxps/minps), not the
    general NaN-aware compare-and-blend, which gcc vectorised into ~35 instructions a vector in a GEMM's
    ReLU6 epilogue. ``L = +0`` on the right is ``x <= L ? L : x`` (numpy's tie gives the second operand; one
    select, which gcc if-converts on AVX2 where it would not ``(0 > x ? 0 : x) + 0``), and the vector form adds
    ``+0``; ``-0`` and non-literals keep the general form."""
    assert C.binary("max", "x", "6.0f", "float") == "(6.0f > (x) ? 6.0f : (x))"
    assert C.binary("min", "1e-05f", "x", "float") == "(1e-05f < (x) ? 1e-05f : (x))"
    assert C.binary("max", "x", "0.0f", "float") == "((x) <= 0.0f ? 0.0f : (x))"
    assert C.binary("min", "x", "0.0f", "float") == "((x) >= 0.0f ? 0.0f : (x))"
    # the CPU's spelling of L = +0 (``zero_masks``): a compare and an and-not of the bits, the same values
    assert C.binary("max", "x", "0.0f", "float", zero_masks=True) == "kumiko_max0f(x)"
    assert C.binary("min", "x", "0.0f", "float", zero_masks=True) == "kumiko_min0f(x)"
    assert C.binary("max", "x", "6.0f", "float", zero_masks=True) == "(6.0f > (x) ? 6.0f : (x))"
    assert C.binary("max", "x", "-0.0f", "float") == "kk_maxf(x, -0.0f)"
    assert C.binary("max", "x", "y", "float") == "kk_maxf(x, y)"
    assert C.vbinary("min", "v", "kv_broadcast(6.0f)", "f") == "kv_min(kv_broadcast(6.0f), v)"
    assert C.vbinary("max", "v", "kv_broadcast(0.0f)", "f") == "(kv_max(kv_broadcast(0.0f), v) + kv_broadcast(0.0f))"
    assert C.vbinary("max", "v", "w", "f") == "kv_maxnan(v, w)"


def test_max_min_with_a_literal_keep_numpy_bits():
    """NaN, signed zeros and infinities through max/min against literals on either side, in a vector loop,
    a scalar loop (a strided read) and a GEMM's epilogue: the bits numpy gives (a NaN where numpy has one)."""
    import numpy as np

    import kumiko
    from kumiko import Tensor
    special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 6.0, -6.0, 1e-5, -1e-30, 3.5], np.float32)

    def ops_of(t):
        return {"a": t.maximum(0.0).minimum(6.0), "b": t.minimum(0.0), "c": t.clip(-0.0, 0.0),
                "d": t.maximum(float("inf")) + t.minimum(float("-inf")), "e": t.maximum(-6.0).minimum(1e-5)}
    x = Tensor.input("x", (7, 40))
    xt = x.transpose(0, 1)       # a strided read: the scalar path
    w = Tensor.input("w", (40, 40))
    outs = {**ops_of(x), **{k + "t": v for k, v in ops_of(xt).items()},
            **{k + "g": v for k, v in ops_of(x @ w).items()}}
    first = next(iter(outs))
    g = outs[first].graph(first, outputs={k: v for k, v in outs.items() if k != first})
    rng = np.random.default_rng(3)
    xv = rng.choice(special, (7, 40)).astype(np.float32)
    wv = np.zeros((40, 40), np.float32)
    wv[np.arange(40), np.arange(40)] = 1.0          # x @ I: the specials reach the epilogue as they are
    wv[0, 1] = 1e-3
    got, want = kumiko.compile(g, "cpu")(x=xv, w=wv), kumiko.compile(g, "eval")(x=xv, w=wv)
    for k in want:
        o, e = got[k], want[k]
        assert np.array_equal(np.isnan(o), np.isnan(e)), k
        fin = ~np.isnan(e)
        assert np.array_equal(o[fin].view(np.int32), e[fin].view(np.int32)), k


def test_cpu_relu6_epilogue_masks_its_zero_side():
    """A GEMM's ReLU6 epilogue on the CPU clips at +0 with ``kumiko_max0f`` (a compare and an and-not of the
    bits: gcc had merged the two selects of ``x <= 0 ? 0 : x`` and ``6 < y ? 6 : y`` into nine vector
    instructions; MobileNetV2 ran 0.976 of the time with the masks, its output the same bits); the values are
    numpy's (``test_max_min_with_a_literal_keep_numpy_bits`` checks NaN and signed zeros through it)."""
    import numpy as np

    import kumiko
    from kumiko import Tensor
    w = Tensor(np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32), name="w", role="param")
    g = (Tensor.input("x", (64, 32)) @ w).clip(0.0, 6.0).graph("y")
    exe = kumiko.compile(g, "cpu")
    assert "kumiko_max0f(" in exe._run.source
    ins = {"x": np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)}
    np.testing.assert_allclose(exe(**ins)["y"], kumiko.compile(g, "eval")(**ins)["y"], rtol=1e-5, atol=1e-5)
