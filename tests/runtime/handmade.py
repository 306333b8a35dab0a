"""Small Programs built by hand from Region SSA dataclasses, with C kernels written by hand to the ABI.

They stand in for the code generator: the runtime is tested on what it must run, without waiting for
(or depending on) the generated code.
"""
from __future__ import annotations

from kumiko import dtypes
from kumiko.region.ssa import Axis, Binary, Cast, Const, Let, MemRef, Output, Program, Read, Ref, Region, Yield
from kumiko.symbolic import Expr

M, N = Expr.lift("M"), Expr.lift("N")
I0, I1 = Expr.lift("i0"), Expr.lift("i1")


def elementwise_region(name: str, src: str, dst: str, fn: str, value, dt=dtypes.fp32, out_dt=None) -> Region:
    """dst[i0, i1] = src[i0, i1] <fn> value over an M x N grid (with a cast when out_dt differs)."""
    out_dt = out_dt or dt
    x = Read(src, (I0, I1))
    lets = [Let("v", Binary(fn, x if dt is dtypes.fp32 else Cast(x, dtypes.fp32), Const(value)))]
    if out_dt is not dtypes.fp32:
        lets.append(Let("c", Cast(Ref("v"), out_dt)))
    return Region(name, (Axis("i0", M), Axis("i1", N)), ((src, MemRef((M, N), dt)),),
                  (Output(dst, MemRef((M, N), out_dt)),), tuple(lets), (Yield(lets[-1].name, dst),))


def two_region_program() -> Program:
    """x -> k_t: t = x * 2 -> k_y: y = t + 1 (t is an intermediate in the arena)."""
    regions = (elementwise_region("k_t", "x", "t", "mul", 2.0), elementwise_region("k_y", "t", "y", "add", 1.0))
    return Program("two", regions, (("x", MemRef((M, N), dtypes.fp32)),), (("y", MemRef((M, N), dtypes.fp32)),),
                   (("t", MemRef((M, N), dtypes.fp32)),))


def chain_program(k: int = 4) -> Program:
    """x -> b0 -> b1 -> ... -> y, each region adding 1: buffer b_j is live over regions [j, j+1]."""
    names = ["x"] + [f"b{j}" for j in range(k - 1)] + ["y"]
    regions = tuple(elementwise_region(f"k{j}", names[j], names[j + 1], "add", 1.0) for j in range(k))
    return Program("chain", regions, (("x", MemRef((M, N), dtypes.fp32)),), (("y", MemRef((M, N), dtypes.fp32)),),
                   tuple((n, MemRef((M, N), dtypes.fp32)) for n in names[1:-1]))


KERNELS = r"""
#include "kumiko_cpu.h"

/* syms = [M, N] (sorted symbol names); bufs = region inputs then outputs */
KUMIKO_KERNEL k_t(void** bufs, const long long* syms) {
    const float* KUMIKO_RESTRICT x = bufs[0];
    float* KUMIKO_RESTRICT t = bufs[1];
    long long n = syms[0] * syms[1], i = 0;
    for (; i + KUMIKO_VW <= n; i += KUMIKO_VW) kv_store(t + i, kv_load(x + i) * 2.0f);
    for (; i < n; i++) t[i] = x[i] * 2.0f;
    return 0;
}

KUMIKO_KERNEL k_y(void** bufs, const long long* syms) {
    const float* t = bufs[0];
    float* y = bufs[1];
    #pragma omp parallel for
    for (long long i = 0; i < syms[0] * syms[1]; i++) y[i] = t[i] + 1.0f;
    return 0;
}

/* forgets the second half of y: poisoning must show it */
KUMIKO_KERNEL k_y_half(void** bufs, const long long* syms) {
    const float* t = bufs[0];
    float* y = bufs[1];
    for (long long i = 0; i < syms[0] * syms[1] / 2; i++) y[i] = t[i] + 1.0f;
    return 0;
}

KUMIKO_KERNEL k_fail(void** bufs, const long long* syms) { (void)bufs; (void)syms; return 7; }

/* the chain: every region adds 1 */
KUMIKO_KERNEL k_add1(void** bufs, const long long* syms) {
    const float* a = bufs[0];
    float* b = bufs[1];
    for (long long i = 0; i < syms[0] * syms[1]; i++) b[i] = a[i] + 1.0f;
    return 0;
}

/* bf16 in, fp16 out: y = x * 2 through fp32 */
KUMIKO_KERNEL k_half(void** bufs, const long long* syms) {
    const uint16_t* x = bufs[0];
    uint16_t* y = bufs[1];
    for (long long i = 0; i < syms[0] * syms[1]; i++) y[i] = kumiko_f32_to_f16(kumiko_bf16_to_f32(x[i]) * 2.0f);
    return 0;
}

/* i32 out, writes nothing: the 0x7f7f7f7f poison must show */
KUMIKO_KERNEL k_int_nothing(void** bufs, const long long* syms) { (void)bufs; (void)syms; return 0; }
"""


def single_region_program(name: str, in_dt, out_dt, fn: str = "mul", value=2.0) -> Program:
    r = elementwise_region(name, "x", "y", fn, value, in_dt, out_dt)
    return Program(name, (r,), (("x", MemRef((M, N), in_dt)),), (("y", MemRef((M, N), out_dt)),))
