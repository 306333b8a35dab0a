"""Tensor maps at launch: ``TensorMapArg`` (a ``CUtensorMap`` kernel argument) and the emulator's encoding.

The arguments of ``cuTensorMapEncodeTiled`` come from the kernel's description record
(``gpu_ir_sm90.TensorMapDesc.encoding(sizes)``, a ``kernel.tensormap.TiledEncoding``); the array's address is
the launch's. On a GPU the driver's ``cuTensorMapEncodeTiled`` builds the map, in the emulator
``kumiko_emu_tensor_map_encode_tiled`` (same arguments, same checks).

    arg = TensorMapArg(desc.encoding({"kk_M": 200, "kk_K": 136}), a)      # a launch argument (emulator)
    mod.launch("gemm", grid, block, smem, args=[arg, ...])
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from kumiko.diagnostics import KumikoError
from kumiko.kernel.tensormap import TiledEncoding


@dataclass
class TensorMapArg:
    """A ``CUtensorMap`` launch argument: the encoding and the array it maps (the launch supplies the address)."""
    encoding: TiledEncoding
    array: np.ndarray


def emu_encode(lib: Any, enc: TiledEncoding, address: int) -> bytes:
    """The 128 bytes of the emulator's tensor map for ``enc`` at ``address`` (E1703 when the emulator refuses)."""
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    raw = ctypes.create_string_buffer(128 + 64)
    out = ctypes.addressof(raw) + (-ctypes.addressof(raw)) % 64
    r = enc.rank
    fn = lib.kumiko_emu_tensor_map_encode_tiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(u64),
                   ctypes.POINTER(u64), ctypes.POINTER(u32), ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int]
    rc = fn(out, enc.data_type, r, address, (u64 * r)(*enc.global_dim), (u64 * max(1, r - 1))(*enc.global_strides),
            (u32 * r)(*enc.box_dim), (u32 * r)(*enc.element_strides), enc.interleave, enc.swizzle, enc.l2_promotion,
            enc.oob_fill)
    if rc != 0:
        lib.kumiko_emu_tensor_map_error.restype = ctypes.c_char_p
        raise KumikoError("E1703", at="tensor map", why=lib.kumiko_emu_tensor_map_error().decode())
    return ctypes.string_at(out, 128)
