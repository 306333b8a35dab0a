"""CpuProgram: hand-written ABI kernels for hand-built Programs, run through the runtime and compared with
region playback; poisoning, 16-bit storage, symbols, and the diagnostics of a bad run."""
import ml_dtypes
import numpy as np
import pytest

from kumiko import dtypes
from kumiko.diagnostics import KumikoError
from kumiko.region import play_program
from kumiko.runtime.cpu import build_c, forget_loaded
from kumiko.runtime.program import CpuProgram, aligned_empty, program_symbols

from .handmade import KERNELS, chain_program, single_region_program, two_region_program

ENV = {"M": 5, "N": 7}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KUMIKO_CACHE", str(tmp_path_factory.mktemp("cache")))
    forget_loaded()
    yield build_c(KERNELS, name="handmade")
    mp.undo()


def _x(seed=0, shape=(5, 7)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_two_regions_match_playback(module):
    prog = two_region_program()
    run = CpuProgram(prog, module, {"k_t": "k_t", "k_y": "k_y"})
    x = _x()
    out = run({"x": x}, ENV)
    want = play_program(prog, {"x": x}, ENV)
    assert list(out) == ["y"]
    np.testing.assert_array_equal(out["y"], want["y"])
    assert out["y"].ctypes.data % 64 == 0


def test_symbols_are_sorted_names():
    assert program_symbols(two_region_program()) == ("M", "N")


def test_forgotten_output_stays_nan(module):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y_half"})
    y = run({"x": _x()}, ENV)["y"].ravel()
    half = 35 // 2
    assert np.isfinite(y[:half]).all()
    assert np.isnan(y[half:]).all()


def test_poisoning_follows_kumiko_spec(module, monkeypatch):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y_half"})
    monkeypatch.setenv("KUMIKO_SPEC", "0")              # verifiers off: no poisoning (bare-kernel benchmarks)
    y = run({"x": np.ones((5, 7), np.float32)}, ENV)["y"].ravel()
    assert np.isfinite(y[:17]).all()
    forced = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y_half"}, poison=True)
    assert np.isnan(forced({"x": _x()}, ENV)["y"].ravel()[17:]).all()


def test_int_outputs_are_poisoned_with_0x7f(module):
    prog = single_region_program("k_int", dtypes.fp32, dtypes.i32, "add", 1.0)
    y = CpuProgram(prog, module, {"k_int": "k_int_nothing"})({"x": _x()}, ENV)["y"]
    assert y.dtype == np.int32 and (y == 0x7F7F7F7F).all()


def test_intermediates_are_poisoned_before_each_run(module):
    """k_y_half leaves y half unwritten; k_t fills t, so t itself must not be stale NaN - and a run of
    a program that never writes its intermediate reads the poison (NaN), not a previous run's values."""
    good = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"})
    good({"x": _x()}, ENV)
    lazy = CpuProgram(two_region_program(), module, {"k_t": "k_int_nothing", "k_y": "k_y"})
    assert np.isnan(lazy({"x": _x()}, ENV)["y"]).all()
    lazy({"x": _x()}, ENV)
    assert np.isnan(lazy({"x": _x()}, ENV)["y"]).all()


@pytest.mark.parametrize("how", ["spec2", "forced"])
def test_stale_bytes_in_the_arena_are_poisoned_before_the_next_call(module, monkeypatch, how):
    """Under KUMIKO_SPEC=2 (or ``poison=True``), bytes a previous call left where a lazy kernel's output lives
    (planted by hand here) are poison again before the next call, so its reader sees NaN on every call, not
    the last run's values."""
    if how == "spec2":
        monkeypatch.setenv("KUMIKO_SPEC", "2")
    lazy = CpuProgram(two_region_program(), module, {"k_t": "k_int_nothing", "k_y": "k_y"},
                      poison=True if how == "forced" else None)
    assert np.isnan(lazy({"x": _x()}, ENV)["y"]).all()
    (frame,) = lazy._primary.frames.values()
    frame.raw.view(np.float32)[:] = 1.0
    assert np.isnan(lazy({"x": _x()}, ENV)["y"]).all()


def test_by_default_the_arena_is_poisoned_before_its_first_call(module, monkeypatch):
    """At the default KUMIKO_SPEC=1 the arena is poisoned once, before the first call that uses it (a region
    that never writes its output gives NaN downstream), not refilled on each call (3% of MobileNetV2's time);
    the outputs are poisoned on every call."""
    monkeypatch.delenv("KUMIKO_SPEC", raising=False)
    lazy = CpuProgram(two_region_program(), module, {"k_t": "k_int_nothing", "k_y": "k_y"})
    assert np.isnan(lazy({"x": _x()}, ENV)["y"]).all()
    (frame,) = lazy._primary.frames.values()
    frame.raw.view(np.float32)[:] = 1.0          # what a previous call could have left
    np.testing.assert_array_equal(lazy({"x": _x()}, ENV)["y"], np.full((5, 7), 2.0, np.float32))
    half = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y_half"})
    for _ in range(2):
        assert np.isnan(half({"x": _x()}, ENV)["y"].ravel()[17:]).all()


def test_chain_reuses_the_arena(module):
    prog = chain_program(4)
    run = CpuProgram(prog, module, {r.name: "k_add1" for r in prog.regions})
    x = _x(3)
    np.testing.assert_array_equal(run({"x": x}, ENV)["y"], play_program(prog, {"x": x}, ENV)["y"])
    plan, _ = run.arena(ENV)
    assert plan.slot("b0").offset == plan.slot("b2").offset     # b0 dies before b2 is born
    assert plan.size < plan.naive_size


def test_sizes_change_between_calls(module):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"})
    for m, n in [(1, 1), (3, 17), (64, 33), (5, 7)]:
        x = _x(m, (m, n))
        np.testing.assert_array_equal(run({"x": x}, {"M": m, "N": n})["y"], x * 2 + 1)


def test_sixteen_bit_storage(module):
    prog = single_region_program("k_half", dtypes.bf16, dtypes.fp16)
    run = CpuProgram(prog, module, {"k_half": "k_half"})
    x = _x(4).astype(ml_dtypes.bfloat16)
    y = run({"x": x}, ENV)["y"]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, play_program(prog, {"x": x}, ENV)["y"])
    y2 = run({"x": x.view(np.uint16)}, ENV)["y"]           # raw bf16 storage is accepted as-is
    np.testing.assert_array_equal(y2, y)


def test_unaligned_and_strided_inputs_are_copied(module):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"})
    raw = aligned_empty((36,), np.float32)
    x = raw[1:36].reshape(5, 7)                                # 4 bytes past a 64-byte boundary
    x[...] = _x(5)
    np.testing.assert_array_equal(run({"x": x}, ENV)["y"], x * 2 + 1)
    xt = _x(6, (7, 5)).T                                       # not C-contiguous
    np.testing.assert_array_equal(run({"x": xt}, ENV)["y"], xt * 2 + 1)


def test_a_run_is_one_c_call(module):
    """The kernels of a run go to C in one call (``kumiko_run_steps`` of ``kumiko_cpu.h``: each with its own
    argument array, in order), not one ctypes call each; the results are the same, and a kernel's non-zero
    status still names its own step (below)."""
    calls = []
    prog = chain_program(4)
    run = CpuProgram(prog, module, {r.name: "k_add1" for r in prog.regions})
    real = run.run_steps
    assert real is not None

    def counting(n, *args):
        calls.append(n.value)
        return real(n, *args)
    run.run_steps = counting
    x = _x(3)
    for _ in range(2):
        np.testing.assert_array_equal(run({"x": x}, ENV)["y"], play_program(prog, {"x": x}, ENV)["y"])
    assert calls == [4, 4]


def test_nonzero_return_is_a_diagnostic(module):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_fail"})
    with pytest.raises(KumikoError) as e:
        run({"x": _x()}, ENV)
    assert e.value.code == "E1704" and "k_y" in e.value.at and "7" in e.value.why


@pytest.mark.parametrize("bad, code", [
    ({"x": np.zeros((5, 7), np.float64)}, "E1015"),
    ({"x": np.zeros((5, 8), np.float32)}, "E1015"),
    ({}, "E1015"),
])
def test_bad_inputs(module, bad, code):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"})
    with pytest.raises(KumikoError) as e:
        run(bad, ENV)
    assert e.value.code == code


def test_unbound_symbol_and_unknown_function(module):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"})
    with pytest.raises(KumikoError) as e:
        run({"x": _x()}, {"M": 5})
    assert e.value.code == "E1014" and "N" in e.value.why
    with pytest.raises(KumikoError) as e:
        CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "no_such_kernel"})
    assert e.value.code == "E1703"
    with pytest.raises(KumikoError) as e:
        CpuProgram(two_region_program(), module, {"k_t": "k_t"})
    assert e.value.code == "E1703"


def test_sizes_are_checked_once_per_set_of_sizes(monkeypatch):
    """``check_sizes`` depends on the bound sizes only: a second call with the same sizes skips it, new
    sizes run it, and sizes that fail it fail on every call (a failure is never remembered as passed)."""
    import kumiko
    from kumiko import Tensor, compiler

    calls = []
    real = compiler.check_sizes
    monkeypatch.setattr(compiler, "check_sizes", lambda g, env: (calls.append(dict(env)), real(g, env)))
    x = Tensor.input("x", ("N",))
    exe = kumiko.compile((x.shrink(((0, 4),)) * 2.0).graph("y"), "cpu")
    a = np.arange(6, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(exe(x=a)["y"], a[:4] * 2)
    assert len(calls) == 1
    exe(x=np.arange(5, dtype=np.float32))
    assert len(calls) == 2
    for _ in range(2):
        with pytest.raises(KumikoError) as e:
            exe(x=np.arange(3, dtype=np.float32))        # the slice [0, 4) leaves a source of 3
        assert e.value.code == "E1015"
    assert len(calls) == 4
