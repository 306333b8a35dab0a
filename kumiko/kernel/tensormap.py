"""Tensor-map encodings: the arguments of ``cuTensorMapEncodeTiled`` a kernel's ``TensorMapDesc`` gives at given sizes.

A kernel that uses TMA takes ``const __grid_constant__ CUtensorMap`` parameters whose contents depend on the
array's address, so the runtime builds each at launch (``runtime/tensormap``) from a ``TiledEncoding``.
``TiledEncoding.check`` applies the driver's documented requirements (cuda.h) first, so a bad map is a
``KumikoError`` (E1703) naming the field rather than ``CUDA_ERROR_INVALID_VALUE``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kumiko.diagnostics import KumikoError

#: CUtensorMapDataType (cuda.h) of the element types kumiko's kernels move
DTYPE_CODE = {"u8": 0, "u16": 1, "u32": 2, "i32": 3, "u64": 4, "i64": 5, "fp16": 6, "fp32": 7, "fp64": 8, "bf16": 9}
DTYPE_BYTES = {"u8": 1, "u16": 2, "u32": 4, "i32": 4, "u64": 8, "i64": 8, "fp16": 2, "fp32": 4, "fp64": 8, "bf16": 2}
#: CUtensorMapSwizzle
SWIZZLE_CODE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
#: CUtensorMapFloatOOBfill: zero, or NaN ("NAN_REQUEST_ZERO_FMA")
OOB_CODE = {"zero": 0, "nan": 1}
L2_PROMOTION_128B = 2


@dataclass(frozen=True)
class TiledEncoding:
    """``cuTensorMapEncodeTiled(map, dataType, rank, address, globalDim, globalStrides, boxDim, elementStrides,
    interleave, swizzle, l2Promotion, oobFill)`` without the map and the address. Dimensions innermost first;
    ``global_strides`` in bytes for dimensions 1.. (rank - 1 entries)."""
    data_type: int
    rank: int
    global_dim: tuple
    global_strides: tuple
    box_dim: tuple
    element_strides: tuple
    interleave: int = 0
    swizzle: int = 0
    l2_promotion: int = L2_PROMOTION_128B
    oob_fill: int = 0

    @staticmethod
    def make(dtype: str, dims: tuple, strides: tuple, box: tuple, swizzle: str = "none",
             oob: str = "zero") -> TiledEncoding:
        enc = TiledEncoding(DTYPE_CODE[dtype], len(dims), tuple(int(d) for d in dims), tuple(int(s) for s in strides),
                            tuple(int(b) for b in box), (1,) * len(dims), 0, SWIZZLE_CODE[swizzle], L2_PROMOTION_128B,
                            OOB_CODE[oob])
        enc.check()
        return enc

    @staticmethod
    def for_array(arr_shape: tuple, dtype: str, box: tuple, swizzle: str = "none", oob: str = "zero") -> TiledEncoding:
        """The map of a C-contiguous array of ``arr_shape`` (outermost first, numpy order); ``box`` innermost first."""
        dims = tuple(reversed(arr_shape))
        esize = DTYPE_BYTES[dtype]
        strides, s = [], esize
        for d in dims[:-1]:
            s *= d
            strides.append(s)
        return TiledEncoding.make(dtype, dims, tuple(strides), box, swizzle, oob)

    @property
    def esize(self) -> int:
        return {v: DTYPE_BYTES[k] for k, v in DTYPE_CODE.items()}[self.data_type]

    @property
    def box_bytes(self) -> int:
        return int(np.prod(self.box_dim)) * self.esize

    def check(self) -> None:
        """cuTensorMapEncodeTiled's requirements (cuda.h) that kumiko's maps can break."""
        def bad(why: str) -> KumikoError:
            return KumikoError("E1703", at="tensor map", why=why, suggestion="fix the TensorMapDesc")
        r = self.rank
        if not 1 <= r <= 5 or not (len(self.global_dim) == len(self.box_dim) == len(self.element_strides) == r):
            raise bad(f"rank {r}: 1 to 5 dimensions, with a size, a box and an element stride each")
        if len(self.global_strides) != r - 1:
            raise bad(f"{len(self.global_strides)} global strides for rank {r} (rank - 1 needed)")
        for i, d in enumerate(self.global_dim):
            if not 1 <= d <= 2**32:
                raise bad(f"globalDim[{i}] = {d} is not in [1, 2^32]")
        for i, s in enumerate(self.global_strides):
            if s % 16 or not 0 < s < 2**40:
                raise bad(f"globalStrides[{i}] = {s} bytes: a multiple of 16 below 2^40 is required (rows of the "
                          "array must be 16-byte aligned)")
        for i, b in enumerate(self.box_dim):
            if not 1 <= b <= 256:
                raise bad(f"boxDim[{i}] = {b} is not in [1, 256]")
        inner = self.box_dim[0] * self.esize
        if inner % 16:
            raise bad(f"the box's inner dimension is {inner} bytes, not a multiple of 16")
        span = {0: 0, 1: 32, 2: 64, 3: 128}[self.swizzle]
        if span and inner > span:
            raise bad(f"the box's inner dimension ({inner} bytes) exceeds the {span}-byte swizzle span")
