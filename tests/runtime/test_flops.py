"""FLOP counting on the Tiny IR (GEMM counts 2*M*N*K; elementwise 1 per output element; REDUCE 1 per input
element) and the timing loop."""
from kumiko import Tensor
from kumiko.runtime.flops import count_flops, count_io_bytes, evaluator_bytes, gflops, measure


def test_gemm_bias_relu():
    a, b, bias = Tensor.input("A", ("M", "K")), Tensor.input("B", ("K", "N")), Tensor.input("bias", ("N",))
    g = (a @ b + bias).relu().graph("y", symbols={"M": 4, "N": 5, "K": 6})
    assert count_flops(g.tiny) == 2 * 4 * 5 * 6 + 2 * 4 * 5           # MAC = 2, + bias add + relu
    assert count_flops(g.tiny, {"M": 100, "N": 10, "K": 10}) == 2 * 100 * 10 * 10 + 2 * 100 * 10
    assert count_io_bytes(g.tiny) == 4 * (4 * 6 + 6 * 5 + 5 + 4 * 5)
    # the evaluator never materialises the M x N x K product (4 GiB here): inputs, outputs, A@B and
    # the float64 copies of its operands
    big = {"M": 1024, "N": 1024, "K": 1024}
    assert 3 * 4 * 2 ** 20 < evaluator_bytes(g.tiny, big) < 64 * 2 ** 20


def test_conv_counts_two_per_mac():
    x, w = Tensor.input("x", (1, 3, 8, 8)), Tensor.input("w", (4, 3, 3, 3))
    g = x.conv2d(w, padding=1).graph("y")
    assert count_flops(g.tiny) == 2 * (1 * 4 * 8 * 8) * (3 * 9)


def test_unbound_symbol_gives_none():
    g = (Tensor.input("x", ("M", 4)) * 2).graph("y")
    assert count_flops(g.tiny) is None and count_flops(g.tiny, {"M": 3}) == 12


def test_measure_and_gflops():
    calls = []
    r = measure(lambda: calls.append(1), reps=5, warmup=2)
    assert len(calls) == 7 and r["reps"] == 5 and len(r["samples_s"]) == 5
    assert r["min_s"] <= r["median_s"]
    assert gflops(2_000_000_000, 2.0) == 1.0 and gflops(None, 1.0) is None
