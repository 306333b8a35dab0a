"""The runtime's own host memory: aligned arrays, the pool that reuses output arrays, and poisoning.

``CpuProgram`` (``kumiko.runtime.program``) takes its outputs and its aligned input copies from
``OutputPool``s; an array comes with its data address, which the pool computed once when it allocated the
memory, so a call hands the kernels' argument arrays an address without asking numpy for one (``address``
costs about a microsecond: a call that takes two arrays from a pool saves two of them).
"""
from __future__ import annotations

import ctypes
import sys
from collections import OrderedDict

import ml_dtypes
import numpy as np

from kumiko.runtime.arena import ALIGN


def _nbytes(shape, dt: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dt.itemsize


def address(arr: np.ndarray) -> int:
    """The address of ``arr``'s first element: through the buffer protocol for a writable contiguous array
    (0.46 us; ``__array_interface__`` builds a dict, 1.8-2.4 us, and ``arr.ctypes.data`` an object), else
    from ``__array_interface__`` (read-only, non-contiguous or empty arrays)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError, BufferError):
        return arr.__array_interface__["data"][0]


def _aligned_raw(nbytes: int, align: int) -> tuple[np.ndarray, int]:
    """A fresh uint8 array that owns its memory, and the offset of its first ``align``-aligned byte."""
    raw = np.empty(nbytes + align, np.uint8)
    return raw, (-address(raw)) % align


def _view(raw: np.ndarray, start: int, shape, dt: np.dtype) -> np.ndarray:
    # numpy collapses the chain: the result's .base is ``raw`` itself, not the slice or the .view
    return raw[start:start + _nbytes(shape, dt)].view(dt).reshape(shape)


def aligned_empty(shape, dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data pointer is a multiple of ``align``.

    Its ``.base`` is the raw uint8 array that owns the memory (``OutputPool`` relies on that)."""
    dt = np.dtype(dtype)
    raw, start = _aligned_raw(_nbytes(shape, dt), align)
    return _view(raw, start, shape, dt)


class _Entry:
    """One pooled array: the memory owner ``raw``, the address of the array's first byte, and the view of it
    that was handed out last (kept, so that taking the array again makes no new numpy view)."""
    __slots__ = ("raw", "addr", "start", "view")

    def __init__(self, raw: np.ndarray, start: int, shape: tuple, dt: np.dtype):
        self.raw, self.start = raw, start
        self.addr = address(raw) + start
        self.view = _view(raw, start, shape, dt)


def _refs(obj) -> int:
    return sys.getrefcount(obj)


#: ``_refs(entry.raw)`` and ``_refs(entry.view)`` of an entry nothing outside the pool references, measured
#: in the way the pool measures (the entry's slot, getrefcount's argument, and for the owner the view's
#: ``.base``), rather than written down, so an interpreter that counts temporaries differently still gets
#: the right baseline
_PROBE = _Entry(*_aligned_raw(4, 4), (1,), np.dtype(np.float32))
_FREE_RAW, _FREE_VIEW = _refs(_PROBE.raw), _refs(_PROBE.view)
del _PROBE


class OutputPool:
    """Output arrays kept for reuse, keyed by (output name, shape, dtype, alignment).

    An array goes back to its caller and stays in the pool; a later call takes it again only once nothing
    outside the pool references either the memory owner (the raw uint8 array ``aligned_empty`` slices,
    which owns the bytes) or the array handed out. That is the test because every way to see the bytes
    holds a reference to one of them: every numpy view of the array (the user's ``y[0]``, ``y.T``,
    ``y.reshape(...)``) has ``.base is owner``, as numpy collapses view chains onto the array that owns the
    data; ``np.asarray(y)`` is ``y``; a memoryview, ``np.frombuffer``, ctypes' ``from_buffer``,
    ``np.ctypeslib.as_ctypes`` and ``y.ctypes.data_as`` keep such an array alive, and so do
    ``torch.from_numpy`` and ``torch.from_dlpack``. A reference cycle not yet collected only delays reuse.
    Not seen (and not to be relied on by callers): a bare integer address (``y.ctypes.data``) kept after the
    array is dropped, or a weak reference.

    The array handed out is kept with its entry and handed out again, unless its holder changed it in place
    before dropping it (its shape, strides, dtype or writeable flag): then a fresh view of the same memory.

    Each key keeps at most ``per_key`` arrays (2: the usual ``y = exe(...)`` loop still holds the last
    result while the next call runs, so two arrays alternate); past that, held arrays make fresh ones that
    the pool does not keep. Each output keeps pools for its ``shapes`` most recently used shapes (symbolic
    sizes that change), so the memory kept stays bounded. Not thread-safe: each ``CallState`` has its own,
    used by one call at a time.
    """

    def __init__(self, per_key: int = 2, shapes: int = 4):
        self.per_key, self.shapes = per_key, shapes
        #: output name -> OrderedDict((shape, dtype, align) -> [entry, ...]), oldest key first
        self._pools: dict[str, OrderedDict[tuple, list[_Entry]]] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype, align: int) -> np.ndarray:
        """An aligned array for output ``name``: a pooled one nothing else can see, else a fresh one.
        Its contents are whatever was there (a previous result): the caller poisons it if it wants to."""
        return self.lease(name, tuple(shape), np.dtype(dtype), align)[0]

    def lease(self, name: str, shape: tuple[int, ...], dt: np.dtype, align: int) -> tuple[np.ndarray, int]:
        """``take``'s array and its address; ``shape`` a tuple and ``dt`` a numpy dtype already."""
        key = (shape, dt, align)
        by_key = self._pools.get(name)
        if by_key is None:
            by_key = self._pools[name] = OrderedDict()
        pool = by_key.get(key)
        if pool is None:
            pool = by_key[key] = []
            if len(by_key) > self.shapes:
                by_key.popitem(last=False)      # forget the least recently used shape; held arrays stay valid
        elif len(by_key) > 1:
            by_key.move_to_end(key)
        for e in pool:
            # no local name is bound to the owner or the view while they are counted: the counts are the pool's
            if _refs(e.raw) == _FREE_RAW and _refs(e.view) == _FREE_VIEW:
                v = e.view
                if not (v.shape == shape and v.dtype == dt and v.flags.writeable and v.flags.c_contiguous):
                    v = e.view = _view(e.raw, e.start, shape, dt)       # changed in place by its last holder
                return v, e.addr
        e = _Entry(*_aligned_raw(_nbytes(shape, dt), align), shape, dt)
        if len(pool) < self.per_key:
            pool.append(e)
        return e.view, e.addr

    def clear(self) -> None:
        """Forget every pooled array (arrays still held elsewhere stay valid)."""
        self._pools.clear()


_BF16 = np.dtype(ml_dtypes.bfloat16)


def poison(arr: np.ndarray) -> np.ndarray:
    """Fill with NaN (float dtypes) or 0x7f bytes (integers, bools): values no correct kernel leaves."""
    if arr.dtype.kind == "f" or arr.dtype == _BF16:
        arr.fill(np.nan)
    else:
        arr.reshape(-1).view(np.uint8).fill(0x7F)     # reshape first: a 0-d array has no byte view
    return arr
