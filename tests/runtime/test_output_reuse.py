"""CpuProgram reuses an output array once nothing outside the runtime can see its memory (OutputPool):
never while the caller holds the array, a view of it or any buffer export of it; the same memory once
dropped; poisoned again on reuse; right shapes when symbolic sizes change; ``reuse_outputs=False``."""
import ctypes
import gc
import weakref

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.runtime.cpu import build_c
from kumiko.runtime.program import CpuProgram, OutputPool

from .handmade import KERNELS, two_region_program

ENV = {"M": 5, "N": 7}


@pytest.fixture(scope="module")
def module():
    return build_c(KERNELS, name="handmade")


def _x(seed, shape=(5, 7)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(module, **kw):
    return CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y"}, poison=True, **kw)


def _addr(a) -> int:
    return a.__array_interface__["data"][0]


def _torch_from_numpy(y):
    torch = pytest.importorskip("torch")
    return torch.from_numpy(y)


def _torch_from_dlpack(y):
    torch = pytest.importorskip("torch")
    return torch.from_dlpack(y)


# (what the caller keeps of an output y, once y itself is dropped; how to read the values back from it)
HOLDERS = {
    "array": (lambda y: y, lambda h: h),
    "row": (lambda y: y[2], lambda h: h),
    "slice": (lambda y: y[1:, 3:], lambda h: h),
    "transpose": (lambda y: y.T, lambda h: h.T),
    "reshape": (lambda y: y.reshape(-1), lambda h: h.reshape(5, 7)),
    "asarray": (lambda y: np.asarray(y), lambda h: h),
    "view_of_view_of_view": (lambda y: y[1:][::2][:, 2:], lambda h: h),
    "memoryview": (lambda y: memoryview(y), lambda h: np.asarray(h)),
    "frombuffer": (lambda y: np.frombuffer(y, np.float32), lambda h: h.reshape(5, 7)),
    "frombuffer_of_memoryview": (lambda y: np.frombuffer(memoryview(y), np.float32), lambda h: h.reshape(5, 7)),
    "ctypes_from_buffer": (lambda y: (ctypes.c_float * 35).from_buffer(y),
                           lambda h: np.frombuffer(h, np.float32).reshape(5, 7)),
    "ctypeslib_as_ctypes": (lambda y: np.ctypeslib.as_ctypes(y), lambda h: np.ctypeslib.as_array(h)),
    "ctypes_data_as": (lambda y: y.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                       lambda h: np.ctypeslib.as_array(h, shape=(5, 7))),
    "torch_from_numpy": (_torch_from_numpy, lambda h: h.numpy()),
    "torch_from_dlpack": (_torch_from_dlpack, lambda h: h.numpy()),
}


@pytest.mark.parametrize("how", list(HOLDERS))
def test_held_output_is_never_overwritten(module, how):
    """The caller keeps only a view / export of y: later calls (each one poisoning its output with NaN and
    writing other values) must neither hand out y's memory nor change what the caller sees."""
    keep, read = HOLDERS[how]
    run = _run(module)
    y = run({"x": _x(0)}, ENV)["y"]
    saved, addr = y.copy(), _addr(y)
    held = keep(y)
    want = read(held).copy()
    del y
    gc.collect()
    for seed in range(1, 5):                     # more calls than the pool keeps arrays
        out = run({"x": _x(seed)}, ENV)["y"]
        assert _addr(out) != addr
        np.testing.assert_array_equal(out, _x(seed) * 2 + 1)
        del out
    np.testing.assert_array_equal(read(held), want)
    np.testing.assert_array_equal(saved, _x(0) * 2 + 1)
    del held
    gc.collect()
    again = run({"x": _x(9)}, ENV)["y"]           # now nothing sees it: back in use
    assert _addr(again) == addr
    np.testing.assert_array_equal(again, _x(9) * 2 + 1)


def test_dropped_output_is_reused(module):
    run = _run(module)
    y = run({"x": _x(0)}, ENV)["y"]
    addr = _addr(y)
    del y
    y = run({"x": _x(1)}, ENV)["y"]
    assert _addr(y) == addr
    np.testing.assert_array_equal(y, _x(1) * 2 + 1)
    assert y.flags.c_contiguous and y.flags.writeable and addr % 64 == 0


def test_unaligned_contiguous_input_is_used_in_place(module):
    """A C-contiguous input at its element alignment (not 64-byte aligned) is passed as it is: the
    generated C reads inputs with unaligned loads, and a copy would cost a pass over the input."""
    run = _run(module)
    for seed in range(3):
        big = np.empty(5 * 7 + 1, np.float32)
        x = big[1:].reshape(5, 7) if _addr(big) % 64 == 0 else big[:-1].reshape(5, 7)
        x[...] = _x(seed)
        assert _addr(x) % 64 != 0
        np.testing.assert_array_equal(run({"x": x}, ENV)["y"], _x(seed) * 2 + 1)
    assert "x" not in run._copies._pools


def test_strided_input_copies_reuse_one_buffer(module):
    """A strided or byte-misaligned input is copied into memory the runtime keeps: one buffer, taken
    again call after call, and refilled each time (the values are always this call's)."""
    run = _run(module)
    for seed in range(3):
        x = np.empty((5, 14), np.float32)[:, ::2]
        x[...] = _x(seed)
        np.testing.assert_array_equal(run({"x": x}, ENV)["y"], _x(seed) * 2 + 1)
        raw = np.zeros(5 * 7 * 4 + 1, np.uint8)
        odd = raw[1:].view(np.float32).reshape(5, 7)
        odd[...] = _x(seed + 10)
        assert _addr(odd) % 4 != 0
        np.testing.assert_array_equal(run({"x": odd}, ENV)["y"], _x(seed + 10) * 2 + 1)
    (pool,) = run._copies._pools["x"].values()
    assert len(pool) == 1


def test_loop_alternates_between_two_arrays(module):
    """``y = run(...)`` holds the previous result while the next call runs: two arrays take turns."""
    run = _run(module)
    addrs, y = [], None
    for seed in range(8):
        prev = None if y is None else (y.copy(), _addr(y))
        y = run({"x": _x(seed)}, ENV)["y"]
        np.testing.assert_array_equal(y, _x(seed) * 2 + 1)
        if prev is not None:
            assert _addr(y) != prev[1]
        addrs.append(_addr(y))
    assert len(set(addrs)) == 2
    assert addrs[0::2] == [addrs[0]] * 4 and addrs[1::2] == [addrs[1]] * 4


def test_pool_keeps_at_most_two_per_key(module):
    run = _run(module)
    ys = [run({"x": _x(s)}, ENV)["y"] for s in range(4)]          # all held: four distinct arrays
    assert len({_addr(y) for y in ys}) == 4
    for s, y in enumerate(ys):
        np.testing.assert_array_equal(y, _x(s) * 2 + 1)
    owners = [weakref.ref(y.base) for y in ys]
    del ys, y
    gc.collect()
    assert [w() is not None for w in owners] == [True, True, False, False]


def test_poisoning_happens_on_reuse(module):
    """k_y_half writes only the first half of y: a reused array must show NaN in the second half again,
    not the values left there by the caller (or by a previous run)."""
    run = CpuProgram(two_region_program(), module, {"k_t": "k_t", "k_y": "k_y_half"}, poison=True)
    y = run({"x": _x(0)}, ENV)["y"]
    assert np.isnan(y.ravel()[17:]).all()
    y[...] = 5.0                                   # the caller scribbles on its result, then drops it
    addr = _addr(y)
    del y
    y = run({"x": _x(1)}, ENV)["y"]
    assert _addr(y) == addr
    np.testing.assert_array_equal(y.ravel()[:17], (_x(1) * 2 + 1).ravel()[:17])
    assert np.isnan(y.ravel()[17:]).all()


def test_int_outputs_are_poisoned_on_reuse(module):
    from kumiko import dtypes

    from .handmade import single_region_program
    prog = single_region_program("k_int", dtypes.fp32, dtypes.i32, "add", 1.0)
    run = CpuProgram(prog, module, {"k_int": "k_int_nothing"}, poison=True)
    y = run({"x": _x(0)}, ENV)["y"]
    y[...] = 3
    addr = _addr(y)
    del y
    y = run({"x": _x(0)}, ENV)["y"]
    assert _addr(y) == addr and (y == 0x7F7F7F7F).all()


def test_reuse_outputs_false_gives_fresh_arrays(module):
    run = _run(module, reuse_outputs=False)
    y = run({"x": _x(0)}, ENV)["y"]
    owner = weakref.ref(y.base)
    del y
    assert owner() is None                        # nothing kept it: every call allocates
    np.testing.assert_array_equal(run({"x": _x(1)}, ENV)["y"], _x(1) * 2 + 1)
    on = _run(module)
    y = on({"x": _x(0)}, ENV)["y"]
    owner = weakref.ref(y.base)
    del y
    assert owner() is not None                    # the pool keeps it for the next call


def test_shapes_change_between_calls(module):
    run = _run(module)
    first = {}
    for m, n in [(5, 7), (3, 17), (1, 1), (5, 7), (3, 17), (64, 33), (5, 7)]:
        x = _x(m * 100 + n, (m, n))
        y = run({"x": x}, {"M": m, "N": n})["y"]
        assert y.shape == (m, n) and y.dtype == np.float32
        np.testing.assert_array_equal(y, x * 2 + 1)
        assert _addr(y) == first.setdefault((m, n), _addr(y))      # each shape gets its own memory back
        del y


def test_old_shapes_are_forgotten():
    pool = OutputPool(per_key=2, shapes=2)
    a = pool.take("y", (4,), np.float32, 64)
    owner_a = weakref.ref(a.base)
    del a
    for n in (5, 6):                                 # two newer shapes push (4,) out
        pool.take("y", (n,), np.float32, 64)
    gc.collect()
    assert owner_a() is None
    b = pool.take("y", (6,), np.float32, 64)
    assert b.shape == (6,) and _addr(b) % 64 == 0
    c = pool.take("y", (6,), np.float32, 64)         # b is held: another array
    assert _addr(c) != _addr(b)
    addr_b = _addr(b)
    del b
    assert _addr(pool.take("z", (6,), np.float32, 64)) != addr_b     # pools are per output name
    assert _addr(pool.take("y", (6,), np.float32, 64)) == addr_b


def test_pool_alignment_dtype_and_0d():
    pool = OutputPool()
    for shape, dt, align in [((3, 5), np.float16, 64), ((7,), np.int32, 128), ((), np.float32, 64),
                             ((0, 4), np.float32, 64)]:
        a = pool.take("o", shape, dt, align)
        assert a.shape == shape and a.dtype == dt and a.flags.c_contiguous
        assert a.size == 0 or _addr(a) % align == 0      # numpy moves an empty slice's pointer (never read)
        addr = _addr(a)
        del a
        assert _addr(pool.take("o", shape, dt, align)) == addr


def test_compiled_gemm_reuses_and_matches_numpy():
    """Through kumiko.compile: a GEMM with a symbolic row count, called in a loop at two sizes."""
    a = Tensor.input("a", ("M", 32))
    b = Tensor.input("b", (32, 24))
    exe = kumiko.compile((a @ b).relu().graph("y"))
    rng = np.random.default_rng(0)
    B = rng.standard_normal((32, 24)).astype(np.float32)
    addrs: dict[int, set] = {}
    held = []
    for k, m in enumerate([16, 16, 16, 40, 40, 16, 40, 16]):
        A = rng.standard_normal((m, 32)).astype(np.float32)
        y = exe(a=A, b=B)["y"]
        assert y.shape == (m, 24)
        np.testing.assert_allclose(y, np.maximum(A @ B, 0), rtol=1e-5, atol=1e-5)
        addrs.setdefault(m, set()).add(_addr(y))
        if k == 1:
            held.append((y, y.copy()))               # kept for the whole loop: never overwritten
        del y
    np.testing.assert_array_equal(held[0][0], held[0][1])
    assert len(addrs[40]) == 1                      # nothing held at that size: one array, reused
    assert len(addrs[16]) == 2                      # the held one plus one reused


def test_cuda_emulator_asks_inputs_for_the_memref_alignment():
    """The CPU runtime passes inputs at their element alignment; the CUDA emulator's runner keeps asking
    for the MemRef's (its kernels take 16-byte vector loads from inputs), so it copies a numpy array."""
    from kumiko import dtypes
    from kumiko.region.ssa import MemRef
    from kumiko.runtime.emu_program import GpuRunner
    from kumiko.runtime.program import CpuProgram

    m = MemRef((5, 7), dtypes.fp32)
    assert CpuProgram.input_align(None, m, np.dtype(np.float32)) == 4
    assert GpuRunner.input_align(None, m, np.dtype(np.float32)) == max(64, m.alignment)
