"""The per-call path of the cpu target (issue 23): an Executable remembers the sizes a call's arrays bound and
a CpuProgram keeps its kernels' argument arrays ready per call state and set of sizes (a ``Frame``), so a
call checks its inputs with a cheap comparison. None of that may let a bad input through, hide a kernel's
unwritten output, or mix two threads' calls: a good call first (the fast path taken), then the case."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import rel_l2
from kumiko.diagnostics import KumikoError
from kumiko.runtime.cpu import build_c
from kumiko.runtime.pool import OutputPool, address
from kumiko.runtime.program import CpuProgram

from .handmade import KERNELS, two_region_program

ENV = {"M": 5, "N": 7}


@pytest.fixture(scope="module")
def module():
    return build_c(KERNELS, name="handmade")


@pytest.fixture(scope="module")
def relu():
    """y = 2 * relu(x), x f32[4, 8]: exact in fp32, so a result is compared bit for bit."""
    x = Tensor.input("x", (4, 8))
    return kumiko.compile((x.relu() * 2.0).graph("y"), "cpu")


def _x(seed: int, shape=(4, 8)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _want(x) -> np.ndarray:
    return np.maximum(np.asarray(x, np.float32), 0) * 2


class _Sub(np.ndarray):
    pass


def _strided(x: np.ndarray) -> np.ndarray:
    big = np.zeros((x.shape[0], 2 * x.shape[1]), x.dtype)
    big[:, ::2] = x
    return big[:, ::2]


def _misaligned(x: np.ndarray) -> np.ndarray:
    raw = np.zeros(x.nbytes + 1, np.uint8)
    out = raw[1:].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


@pytest.mark.parametrize("bad, why", [
    (lambda: {"x": _x(1).astype(np.float64)}, "expected dtype fp32, got float64"),
    (lambda: {"x": _x(1).astype(np.float16)}, "expected dtype fp32, got float16"),
    (lambda: {"x": np.arange(32, dtype=np.int32).reshape(4, 8)}, "expected dtype fp32, got int32"),
    (lambda: {"x": _x(1, (4, 9))}, "expected shape [4, 8]"),
    (lambda: {"x": _x(1, (8, 4))}, "expected shape [4, 8]"),
    (lambda: {"x": _x(1, (32,))}, "expected rank 2"),
    (lambda: {"x": _x(1)[:, :4]}, "expected shape [4, 8]"),
    (lambda: {}, "missing ['x']"),
    (lambda: {"x": _x(1), "z": _x(2)}, "unexpected ['z']"),
])
def test_a_bad_input_after_good_calls_is_still_refused(relu, bad, why):
    x = _x(0)
    for _ in range(3):                                  # the sizes remembered, the frame made and reused
        np.testing.assert_array_equal(relu(x=x)["y"], _want(x))
    with pytest.raises(KumikoError) as e:
        relu(**bad())
    assert e.value.code == "E1015" and why in e.value.why
    np.testing.assert_array_equal(relu(x=x)["y"], _want(x))      # and good calls go on working


@pytest.mark.parametrize("make", [
    _strided,                                                   # strided: copied
    lambda x: np.asfortranarray(x),                             # not C-contiguous: copied
    _misaligned,                                                # C-contiguous, not element-aligned: copied
    lambda x: x.view(_Sub),                                     # an ndarray subclass: read as an ndarray
])
def test_inputs_the_cheap_check_does_not_take_give_right_answers(relu, make):
    for seed in range(3):
        x = _x(seed)
        relu(x=x)
        arg = make(_x(seed + 10))
        np.testing.assert_array_equal(relu(x=arg)["y"], _want(_x(seed + 10)))


def test_read_only_and_reused_input_arrays(relu):
    x = _x(3)
    x.setflags(write=False)
    for _ in range(3):
        np.testing.assert_array_equal(relu(x=x)["y"], _want(x))
    y = _x(4)
    for k in range(3):                                  # one array, new values each call: read each call
        y[...] = _x(20 + k)
        np.testing.assert_array_equal(relu(x=y)["y"], _want(_x(20 + k)))


def test_the_runtime_alone_refuses_bad_inputs_after_good_calls(module):
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"})
    x = _x(0, (5, 7))
    for _ in range(3):
        np.testing.assert_array_equal(run({"x": x}, ENV)["y"], x * 2 + 1)
    for bad, why in [(x.astype(np.float64), "expected dtype fp32"), (_x(0, (5, 8)), "expected shape [5, 7]"),
                     (x.reshape(7, 5), "expected shape [5, 7]"), (x.view(np.int32), "expected dtype fp32")]:
        with pytest.raises(KumikoError) as e:
            run({"x": bad}, ENV)
        assert e.value.code == "E1015" and why in e.value.why
    with pytest.raises(KumikoError) as e:
        run({}, ENV)
    assert e.value.code == "E1015" and "missing ['x']" in e.value.why
    np.testing.assert_array_equal(run({"x": _strided(x)}, ENV)["y"], x * 2 + 1)
    np.testing.assert_array_equal(run({"x": x}, ENV)["y"], x * 2 + 1)


def test_unwritten_output_is_nan_on_every_call(module):
    """k_y_half leaves half of y unwritten: NaN on each call of the fast path, with the output array reused
    and the caller's last values (finite) in it."""
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y_half"})
    addrs = set()
    for seed in range(6):
        y = run({"x": _x(seed, (5, 7))}, ENV)["y"]
        addrs.add(address(y))
        assert np.isfinite(y.ravel()[:17]).all() and np.isnan(y.ravel()[17:]).all()
        y[...] = 1.0
        del y
    assert len(addrs) == 1                              # the same array taken again each time


@pytest.mark.parametrize("change", [
    lambda y: setattr(y, "shape", (y.size,)),
    lambda y: y.setflags(write=False),
])
def test_a_pooled_array_changed_in_place_is_handed_out_as_it_should_be(change):
    """The pool hands the same array object out again; one its last holder reshaped in place or made
    read-only before dropping it comes back as a fresh view of the same memory: right shape, writeable."""
    pool = OutputPool()
    dt = np.dtype(np.float32)
    a, addr = pool.lease("y", (3, 4), dt, 64)
    assert address(a) == addr and addr % 64 == 0
    change(a)
    del a
    b, addr_b = pool.lease("y", (3, 4), dt, 64)
    assert addr_b == addr and address(b) == addr
    assert b.shape == (3, 4) and b.flags.writeable and b.flags.c_contiguous
    held = b
    c, addr_c = pool.lease("y", (3, 4), dt, 64)             # b is held: another array
    assert addr_c != addr and address(c) == addr_c and held is b


def _dense_graph():
    """relu(x @ w + b), x f32[M, 30] with M symbolic; w and b bound (w pre-packed)."""
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((30, 50)).astype(np.float32), name="w", role="param")
    b = Tensor(rng.standard_normal(50).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", ("M", 30))
    return ((x @ w) + b).relu().graph("y")


def test_threads_with_other_sizes_and_other_weights():
    """Four threads, each call its own input; calls at two sizes (two frames per call state) and one in
    three with another weight array than the bound one (that call's own packing, then the shared panels
    again): every result right."""
    exe = kumiko.compile(_dense_graph(), "cpu")
    w, b = exe.params["w"].astype(np.float64), exe.params["b"].astype(np.float64)
    errors: list[str] = []
    start = threading.Barrier(4)

    def work(t: int) -> None:
        start.wait()
        for i in range(60):
            seed = 100 * t + i
            rng = np.random.default_rng(seed)
            x = rng.standard_normal((3 if seed % 2 else 8, 30)).astype(np.float32)
            kw = {}
            wt = w
            if seed % 3 == 0:
                kw["w"] = rng.standard_normal((30, 50)).astype(np.float32)
                wt = kw["w"].astype(np.float64)
            try:
                got = exe(x=x, **kw)["y"]
            except Exception as e:  # noqa: BLE001 - reported, so the test names it
                errors.append(f"seed {seed}: {type(e).__name__}: {e}")
                continue
            want = np.maximum(x.astype(np.float64) @ wt + b, 0)
            if got.shape != want.shape or rel_l2(got, want) > 1e-5:
                errors.append(f"seed {seed}: wrong y")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, f"{len(errors)} failures, e.g. {errors[:3]}"


def test_address_is_the_first_element_whatever_the_array():
    """``pool.address`` takes a writable contiguous array's address through the buffer protocol and anything
    else's from ``__array_interface__``: the same first element either way (offset views, read-only,
    strided, Fortran-ordered, empty, bool arrays)."""
    base = np.arange(64, dtype=np.float32)
    ro = base.copy()
    ro.setflags(write=False)
    arrays = [base, base[3:], base[::2], base.reshape(8, 8)[:, 1], np.asfortranarray(base.reshape(8, 8)), ro,
              np.zeros(0, np.float32), np.zeros(5, bool), np.broadcast_to(base[:4], (3, 4))]
    for a in arrays:
        assert address(a) == a.__array_interface__["data"][0], (a.shape, a.strides, a.flags.writeable)
