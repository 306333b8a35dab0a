"""The C expression helpers: a value just widened from the stored 16-bit type is stored as those bits."""
from __future__ import annotations

from kumiko import dtypes
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

