"""A hand-assembled SM90 GPU IR program for the emulator, verifier and nvcc tests: C = A @ Bt.T on one warpgroup.

A (M x K) and Bt (N x K, B stored K-major) come in by TMA with the 128-byte swizzle into a two-stage ring
(full barriers: the producer's arrive.expect_tx plus the TMA bytes; empty barriers: all 128 consumer threads
arrive after wgmma.wait_group retired their reads), four wgmma m64nNk16 per 64-wide K tile read them through
K-major 128B-swizzle descriptors (start + 32 bytes per k16 step, stride byte offset 1024 = 8 rows of 128 bytes),
the fp32 accumulator goes to shared memory by ordinary stores, then, after fence.proxy.async and a barrier, out
by a TMA store. Tile 64 x N (one CTA per tile), K tiles of 64; sizes need not be multiples of the tile (TMA
fills out-of-bounds elements with zeros and does not store them).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kumiko.kernel.gpu_ir_sm90 import (
    AccToSmem,
    BarDecl,
    BarRef,
    BulkCommit,
    BulkWait,
    Elect,
    FenceMbarInit,
    FenceProxyAsync,
    For,
    IExpr,
    If,
    MatDesc,
    MbarArrive,
    MbarArriveTx,
    MbarInit,
    MbarWait,
    Ring,
    Role,
    Roles,
    SetMaxNReg,
    Sm90Kernel,
    SmemBuf,
    SmemRef,
    SyncThreads,
    TensorMapDesc,
    TmaLoad,
    TmaStore,
    WgmmaCommit,
    WgmmaFence,
    WgmmaMma,
    WgmmaWait,
    layout_smem,
    rewrite,
)
from kumiko.runtime.tensormap import TensorMapArg

BM = BK = 64


def gemm_kernel(n: int = 64, dtype: str = "fp16", stages: int = 2, swizzle: str = "128B",
                desc_swizzle: str | None = None, b_major: str = "K") -> Sm90Kernel:
    """The program for tile 64 x ``n``; ``desc_swizzle`` (default: ``swizzle``) is what the wgmma descriptors say.
    ``b_major="MN"``: B comes as K x N (N contiguous), n/64 boxes of 64 x 64 a stage 8192 bytes apart, read by
    MN-major descriptors (imm-trans-b; leading byte offset 8192 between the boxes, stride byte offset 1024 between
    groups of 8 K rows, 16 rows of 128 bytes per k16 step)."""
    v = IExpr.var
    kt, ks, s_ = v("kt"), v("ks"), v("s")
    KT, bx, by = v("kk_KT"), v("blockIdx.x"), v("blockIdx.y")
    S = stages
    span = {"none": 16, "32B": 32, "64B": 64, "128B": 128}[swizzle]
    box_k = span // 2 if swizzle != "none" else BK
    assert box_k == BK, "this program loads K tiles of 64 halves: 128-byte rows"
    a_bytes, b_bytes = BM * BK * 2, n * BK * 2
    maps = (TensorMapDesc("tmA", "A", dtype, (v("kk_K"), v("kk_M")), (v("kk_K") * 2,), (BK, BM), swizzle),
            TensorMapDesc("tmB", "Bt", dtype, (v("kk_K"), v("kk_N")), (v("kk_K") * 2,), (BK, n), swizzle)
            if b_major == "K" else
            TensorMapDesc("tmB", "B", dtype, (v("kk_N"), v("kk_K")), (v("kk_N") * 2,), (64, BK), swizzle),
            TensorMapDesc("tmC", "C", "fp32", (v("kk_N"), v("kk_M")), (v("kk_N") * 4,), (n, BM)))
    smem = layout_smem((SmemBuf("sA", "uint16_t", a_bytes, S), SmemBuf("sB", "uint16_t", b_bytes, S),
                        SmemBuf("sC", "float", BM * n * 4)))
    full, empty = (lambda i: BarRef("kk_full", i)), (lambda i: BarRef("kk_empty", i))
    st = kt % S
    dsw = desc_swizzle or swizzle

    def load(tile, stage) -> tuple:
        b = ((TmaLoad("tmB", SmemRef("sB", stage), full(stage), (tile * BK, bx * n)),) if b_major == "K" else
             tuple(TmaLoad("tmB", SmemRef("sB", stage, j * 64 * BK * 2), full(stage), (bx * n + 64 * j, tile * BK))
                   for j in range(n // 64)))
        return (MbarArriveTx(full(stage), a_bytes + b_bytes),
                TmaLoad("tmA", SmemRef("sA", stage), full(stage), (tile * BK, by * BM))) + b

    def desc(buf) -> MatDesc:
        if buf == "sB" and b_major == "MN":
            return MatDesc(SmemRef(buf, st), dsw, 64 * BK * 2, 8 * 128, "MN", ks * 16 * 128)
        return MatDesc(SmemRef(buf, st), dsw, 16, 8 * 128, "K", ks * 32)

    body = (
        Elect((For("s", IExpr.const(0), IExpr.const(S), (MbarInit(full(s_), 1), MbarInit(empty(s_), 128))),
               FenceMbarInit())),
        SyncThreads(),
        Elect((For("kt", IExpr.const(0), IExpr.const(S).min(KT), load(kt, kt)),)),
        For("kt", IExpr.const(0), KT, (
            MbarWait(full(st), (kt // S) & 1),
            WgmmaFence(),
            For("ks", IExpr.const(0), IExpr.const(BK // 16),
                (WgmmaMma("acc", desc("sA"), desc("sB"), n, dtype, kt.gt(0) | ks.gt(0)),), unroll=True),
            WgmmaCommit(),
            WgmmaWait(0),
            MbarArrive(empty(st)),
            Elect((If((kt + S).lt(KT), (MbarWait(empty(st), (kt // S) & 1), *load(kt + S, st))),)),
        )),
        AccToSmem("acc", SmemRef("sC"), n),
        FenceProxyAsync(),
        SyncThreads(),
        Elect((TmaStore("tmC", SmemRef("sC"), (bx * n, by * BM)), BulkCommit(), BulkWait(0))),
    )
    name = f"sm90_gemm_n{n}_{dtype}" + ("_bmn" if b_major == "MN" else "")
    return Sm90Kernel(name, 128, maps, ("kk_M", "kk_N", "kk_K", "kk_KT"), smem,
                      (BarDecl("kk_full", S), BarDecl("kk_empty", S)), (("acc", n),), body,
                      rings=(Ring(("sA", "sB"), "kk_full", "kk_empty", S),),
                      verify_sizes=(("kk_KT", (1, 2, S, S + 1, 2 * S + 1)),),
                      notes=(f"hand-assembled SM90 test GEMM: 64x{n} tile, {S} stages, {swizzle} swizzle",))


def ws_gemm_kernel(n: int = 64, dtype: str = "fp16", stages: int = 2) -> Sm90Kernel:
    """The same GEMM warp-specialised, 128 x ``n`` tiles: warpgroup 0 is the producer (setmaxnreg.dec 40; one
    thread waits on empty[s] - parity ((kt / S) & 1) ^ 1, so the first round passes on the fresh barrier -, announces
    and issues the TMA loads), warpgroups 1 and 2 the consumers (setmaxnreg.inc 232), each 64 rows of the tile: wait
    on full[s], wgmma, wait_group, release the stage (empty[s] counts both consumers' 256 threads); each stores its
    rows through its own shared buffer, synchronising its 128 threads on an mbarrier before its TMA store."""
    v = IExpr.var
    kt, ks = v("kt"), v("ks")
    KT, bx, by = v("kk_KT"), v("blockIdx.x"), v("blockIdx.y")
    S, bm = stages, 2 * BM
    a_bytes, b_bytes = bm * BK * 2, n * BK * 2
    maps = (TensorMapDesc("tmA", "A", dtype, (v("kk_K"), v("kk_M")), (v("kk_K") * 2,), (BK, bm), "128B"),
            TensorMapDesc("tmB", "Bt", dtype, (v("kk_K"), v("kk_N")), (v("kk_K") * 2,), (BK, n), "128B"),
            TensorMapDesc("tmC", "C", "fp32", (v("kk_N"), v("kk_M")), (v("kk_N") * 4,), (n, BM)))
    smem = layout_smem((SmemBuf("sA", "uint16_t", a_bytes, S), SmemBuf("sB", "uint16_t", b_bytes, S),
                        SmemBuf("sC0", "float", BM * n * 4), SmemBuf("sC1", "float", BM * n * 4)))
    full, empty = (lambda i: BarRef("kk_full", i)), (lambda i: BarRef("kk_empty", i))
    epi = (lambda i: BarRef("kk_epi", i))
    st = kt % S
    c = IExpr.const
    producer = (SetMaxNReg(False, 40), Elect((For("kt", c(0), KT, (
        MbarWait(empty(st), ((kt // S) & 1) ^ 1),
        MbarArriveTx(full(st), a_bytes + b_bytes),
        TmaLoad("tmA", SmemRef("sA", st), full(st), (kt * BK, by * bm)),
        TmaLoad("tmB", SmemRef("sB", st), full(st), (kt * BK, bx * n)))),)))

    def consumer(ci: int) -> tuple:
        da = MatDesc(SmemRef("sA", st, ci * BM * 128), "128B", 16, 1024, "K", ks * 32)
        db = MatDesc(SmemRef("sB", st), "128B", 16, 1024, "K", ks * 32)
        return (SetMaxNReg(True, 232),
                For("kt", c(0), KT, (
                    MbarWait(full(st), (kt // S) & 1),
                    WgmmaFence(),
                    For("ks", c(0), c(BK // 16), (WgmmaMma("acc", da, db, n, dtype, kt.gt(0) | ks.gt(0)),),
                        unroll=True),
                    WgmmaCommit(),
                    WgmmaWait(0),
                    MbarArrive(empty(st)))),
                AccToSmem("acc", SmemRef(f"sC{ci}"), n),
                FenceProxyAsync(),
                MbarArrive(epi(c(ci))),
                MbarWait(epi(c(ci)), c(0)),
                Elect((TmaStore("tmC", SmemRef(f"sC{ci}"), (bx * n, by * bm + BM * ci)), BulkCommit(), BulkWait(0))))

    body = (Elect((For("s", c(0), c(S), (MbarInit(full(v("s")), 1), MbarInit(empty(v("s")), 256))),
                   MbarInit(epi(c(0)), 128), MbarInit(epi(c(1)), 128), FenceMbarInit())),
            SyncThreads(),
            Roles((Role("producer", 0, 1, producer), Role("consumer0", 1, 1, consumer(0)),
                   Role("consumer1", 2, 1, consumer(1)))))
    return Sm90Kernel(f"sm90_ws_gemm_n{n}_{dtype}", 384, maps, ("kk_M", "kk_N", "kk_K", "kk_KT"), smem,
                      (BarDecl("kk_full", S), BarDecl("kk_empty", S), BarDecl("kk_epi", 2)), (("acc", n),), body,
                      rings=(Ring(("sA", "sB"), "kk_full", "kk_empty", S),),
                      verify_sizes=(("kk_KT", (1, 2, S, S + 1, 2 * S + 1)),),
                      notes=(f"hand-assembled warp-specialised SM90 test GEMM: 128x{n} tile, {S} stages",))


def inputs(m: int, n: int, k: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random A (m x k), Bt (n x k) as 16-bit patterns (fp16, or bf16 bits) and the float64 reference A @ Bt.T."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    if dtype == "fp16":
        a16, b16 = a.astype(np.float16), b.astype(np.float16)
        ref = a16.astype(np.float64) @ b16.astype(np.float64).T
        return a16.view(np.uint16), b16.view(np.uint16), ref
    import ml_dtypes
    a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    ref = a16.astype(np.float64) @ b16.astype(np.float64).T
    return a16.view(np.uint16), b16.view(np.uint16), ref


def launch(mod, k: Sm90Kernel, m: int, n_total: int, kk: int, a, bt, c) -> None:
    """Run ``k`` over C (m x n_total) with the tensor maps its description records give at these sizes."""
    sizes = {"kk_M": m, "kk_N": n_total, "kk_K": kk}
    arrays = {"A": a, "Bt": bt, "B": np.ascontiguousarray(bt.T), "C": c}
    n = dict(k.accs)["acc"]
    bm = k.maps[0].box[1]
    args = [TensorMapArg(d.encoding(sizes), arrays[d.buf]) for d in k.maps] + [m, n_total, kk, -(-kk // BK)]
    mod.launch(k.name, grid=(-(-n_total // n), -(-m // bm)), block=k.threads, smem=k.smem_bytes, args=args)


def inject(k: Sm90Kernel, bug: str) -> Sm90Kernel:
    """``k`` with one bug of issue 24's list, by rewriting its statements."""
    def fn(s):
        if bug in ("no_wgmma_wait", "no_epilogue_wait") and isinstance(s, WgmmaWait):
            return ()
        if bug == "no_epilogue_wait" and isinstance(s, MbarArrive) and s.bar.name == "kk_empty":  # (the epilogue first)
            return ()
        if bug == "no_wgmma_fence" and isinstance(s, WgmmaFence):
            return ()
        if bug == "expect_tx" and isinstance(s, MbarArriveTx):
            return (replace(s, bytes=s.bytes + BM * BK * 2),)
        if bug == "parity" and isinstance(s, MbarWait) and s.bar.name == "kk_full":
            return (replace(s, parity=s.parity ^ 1),)
        if bug == "no_proxy_fence" and isinstance(s, FenceProxyAsync):
            return ()
        if bug == "desc_swizzle" and isinstance(s, WgmmaMma):
            return (replace(s, a=replace(s.a, swizzle="64B"), b=replace(s.b, swizzle="64B")),)
        if bug == "no_empty_wait" and isinstance(s, MbarWait) and s.bar.name == "kk_empty":
            return ()
        if bug == "no_full_wait" and isinstance(s, MbarWait) and s.bar.name == "kk_full":
            return ()
        if bug == "empty_count" and isinstance(s, MbarInit) and s.bar.name == "kk_empty":
            return (replace(s, count=2 * s.count),)
        if bug == "no_barrier" and isinstance(s, SyncThreads):
            return ()
        if bug == "no_bulk_wait" and isinstance(s, BulkWait):
            return ()
        if bug == "wrong_n" and isinstance(s, WgmmaMma):
            return (replace(s, n=s.n + 8),)
        if bug == "early_release" and isinstance(s, MbarArrive) and s.bar.name == "kk_empty":
            return ()
        if bug == "early_release" and isinstance(s, WgmmaCommit):
            return (s, MbarArrive(BarRef("kk_empty", IExpr.var("kt") % k.rings[0].stages)))
        return None
    out = replace(k, body=rewrite(k.body, fn))
    assert out != k, f"bug {bug} changed nothing"
    return out


def roles_kernel(consumer_regs: int) -> Sm90Kernel:
    """Three warpgroups: a producer that gives registers back (setmaxnreg.dec 40) and two consumers that take
    ``consumer_regs`` each (setmaxnreg.inc): 232 fits the SM's 65536 registers, 240 does not."""
    return Sm90Kernel(f"sm90_roles_{consumer_regs}", 384, (), (), (), (), (),
                      (Roles((Role("producer", 0, 1, (SetMaxNReg(False, 40),)),
                              Role("consumer", 1, 2, (SetMaxNReg(True, consumer_regs),)))),))
