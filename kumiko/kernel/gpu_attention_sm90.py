"""Fused streaming attention on SM90 (FlashAttention-3 structure), from the same attention Region pair as the SM80
kernel (``attention_pair.find_attention_pair``, ``gpu_attention.pair_code``), as SM90 GPU IR (``gpu_ir_sm90``).

One CTA owns ``BM = 64 * consumers`` query rows of one batch point (grid: query blocks x batch points):

* warpgroup 0 is the producer (``setmaxnreg.dec``): one thread loads the CTA's Q block once (``kk_qfull``), then
  for each key block ``kt`` waits on ``kk_kempty[s]``, announces and issues K's TMA loads on ``kk_kfull[s]``, and
  the same for V (``kk_vempty`` / ``kk_vfull``), ``s = kt % stages``. Q, K and V are read through tensor maps
  built from the region's Read maps: the head dim innermost (boxes of 64 halves, 128-byte swizzle), the rows
  (queries or keys: TMA fills rows past M or N with zeros), then each batch axis the operand moves with, with
  its stride - so a head of a projection's ``[tokens, heads x d]`` output is a 3-D or 4-D map, not a copy;
* warpgroups 1.. are the consumers (``setmaxnreg.inc``), 64 query rows each. Per key block: ``S = Q K^T`` by
  ``wgmma`` (Q and K from shared memory, K-major descriptors), committed; then ``O += P V`` of the *previous*
  block by ``wgmma`` with P from registers (``wgmma_rs``) and V MN-major, committed; ``wait_group 1`` retires S
  while P·V runs on the tensor cores, K's stage goes back, the softmax runs on S (the region's score code on each
  element, the row max over the block and the lane quad, the rescale factor, P = exp2(k2 (z - m)) in place,
  the row sum), ``wait_group 0`` retires P·V and gives V's stage back, and only then is O rescaled and P packed
  to 16-bit A fragments - the D fragment's elements 8j..8j+7 are k16 step j's A registers (PTX ISA, wgmma A
  from registers). After the loop the last block's P·V; the epilogue divides by the row sums (added over the
  lane quad) and runs the consumer's epilogue code, rows past M not stored. Block 0 runs before the loop so that
  every wgmma wait inside it is unconditional (ptxas serializes every wgmma of a kernel with a wait on a
  divergent path). Two consumers take turns issuing their wgmmas (``kk_turn``, ping-pong): one's softmax runs
  while the other's GEMMs do.

Key blocks past the last column the CTA's rows can see through the score's guards (a causal mask) are never
loaded (``kk_KT`` from ``pair_code``'s bound), the longest query blocks run first, and a block the guards wholly
admit runs the score code without them (``PairCode.inside``); the diagonal block is masked by the score code.
The schedule is checked by ``gpu_verify_sm90`` (mbarrier phases, transaction bytes, wgmma groups, stage release)
for 0 to 5 key blocks, and runs in the emulator (``cuda_emu_sm90``) like the SM90 GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko.diagnostics import KumikoError
from kumiko.kernel.attention_pair import HEAD_DIMS_SM90, MAX_BATCH_DIMS, AttentionPair, operand_maps, operand_reads
from kumiko.kernel.gpu_attention import pair_code, pair_note
from kumiko.kernel.gpu_ir_sm90 import (
    BarDecl,
    BarRef,
    Elect,
    FenceMbarInit,
    For,
    FragEpilogue,
    IExpr,
    If,
    Let,
    MatDesc,
    MbarArrive,
    MbarArriveTx,
    MbarInit,
    MbarWait,
    RescalePack,
    Ring,
    Role,
    Roles,
    SetMaxNReg,
    Sm90Kernel,
    SmemBuf,
    SmemRef,
    SoftmaxInit,
    SoftmaxStep,
    SyncThreads,
    TensorMapDesc,
    TmaLoad,
    WgmmaCommit,
    WgmmaFence,
    WgmmaMma,
    WgmmaWait,
    layout_smem,
)
from kumiko.kernel.loops import Decl
from kumiko.plan.gpu_sm90 import CONSUMER_REGS, PRODUCER_REGS
from kumiko.plan.plan import Plan
from kumiko.symbolic import Expr


@dataclass(frozen=True)
class Sm90Attention:
    """The kernel, the buffer each tensor map reads (kernel order) and the sizes the maps need (name, size)."""
    kernel: Sm90Kernel
    map_bufs: tuple
    map_sizes: tuple


class _Sizes:
    """Kernel-side names for the map sizes that are not constants (the launch evaluates them)."""

    def __init__(self):
        self.named: dict = {}

    def __call__(self, e) -> IExpr:
        e = Expr.lift(e)
        if e.as_int() is not None:
            return IExpr.const(e.as_int())
        key = repr(e)
        if key not in self.named:
            self.named[key] = (f"kk_t{len(self.named)}", e)
        return IExpr.var(self.named[key][0])


def lower_attention_sm90(pair: AttentionPair, plan: Plan, syms: tuple, name: str, names: list) -> Sm90Attention:
    """The SM90 fused kernel of ``pair`` under ``plan`` (tile [BM, BN, 64], BM = 64 x consumers); ``names``: the
    buffers in parameter order (``b<i>``). E1801 when the pair is not the kernel's."""
    pc = pair_code(pair, syms, name, names)
    at = f"region {pair.f0.region.name}"
    d, dv = pair.head
    maps_of = operand_maps(pair)
    if d not in HEAD_DIMS_SM90 or dv not in HEAD_DIMS_SM90 or maps_of is None:
        raise KumikoError("E1801", at=at, why=f"the SM90 attention kernel takes head dims {list(HEAD_DIMS_SM90)} and "
                          f"Q, K, V read as tensor-map views (at most {MAX_BATCH_DIMS} batch axes); got D {d}, DV {dv}",
                          suggestion="use the SM80 streaming plan (arch sm80)")
    bm, bn, _ = plan.tile
    S, consumers = plan.stages, bm // 64
    # ping-pong (two consumers): a warpgroup issues its wgmmas only on its turn (``kk_turn[i]``, the other
    # warpgroup's arrival after issuing its own), so one's softmax runs while the other's GEMMs do; the n-th
    # turn of either warpgroup is phase n of its barrier (consumer 1 arrives once first: consumer 0 goes first)
    turns = bool(plan.get("async_", "pingpong", True)) and consumers == 2
    dt = pair.f0.dtype_of(pair.c0.x).name
    v, ci = IExpr.var, IExpr.const
    size = _Sizes()
    maps, bufs = [], []
    for mname, op, (e, _, _, _), box_rows in zip(("tmQ", "tmK", "tmV"), maps_of, operand_reads(pair),
                                                     (bm, bn, bn)):
        dims = (ci(op.cols), size(op.rows)) + tuple(size(pc.lo0.sizes[a]) for a, _ in op.batch)
        strides = (ci(op.step * 2),) + tuple(size(s * 2) for _, s in op.batch)
        maps.append(TensorMapDesc(mname, e.tensor, dt, dims, strides, (64, box_rows) + (1,) * len(op.batch), "128B",
                                  offset=size(op.origin)))
        bufs.append(e.tensor)
    q_bytes, k_bytes, v_bytes = bm * d * 2, bn * d * 2, bn * dv * 2
    smem = layout_smem((SmemBuf("sQ", "uint16_t", q_bytes), SmemBuf("sK", "uint16_t", k_bytes, S),
                        SmemBuf("sV", "uint16_t", v_bytes, S)))
    kt, ks = v("kt"), v("ks")
    st, ph = kt % S, (kt // S) & 1
    pst, pph = (kt - 1) % S, ((kt - 1) // S) & 1
    KT = v("kk_KT")
    bar = BarRef

    def boxes(mname: str, buf: str, stage, row, cols: int, rows: int, full) -> list:
        """TMA loads of one block: a box of 64 head-dim columns each, ``rows x 128`` bytes apart in the stage."""
        coords = tuple(v(a) for a, _ in maps_of[("tmQ", "tmK", "tmV").index(mname)].batch)
        return [TmaLoad(mname, SmemRef(buf, stage, j * rows * 128), full, (ci(64 * j), row) + coords)
                for j in range(cols // 64)]

    producer_body = (
        MbarArriveTx(bar("kk_qfull"), q_bytes),
        *boxes("tmQ", "sQ", ci(0), v("kk_qb") * bm, d, bm, bar("kk_qfull")),
        For("kt", ci(0), KT, (
            MbarWait(bar("kk_kempty", st), ph ^ 1), MbarArriveTx(bar("kk_kfull", st), k_bytes),
            *boxes("tmK", "sK", st, kt * bn, d, bn, bar("kk_kfull", st)),
            MbarWait(bar("kk_vempty", st), ph ^ 1), MbarArriveTx(bar("kk_vfull", st), v_bytes),
            *boxes("tmV", "sV", st, kt * bn, dv, bn, bar("kk_vfull", st)))))
    producer = (SetMaxNReg(False, PRODUCER_REGS), Elect(producer_body))

    def consumer(i: int) -> tuple:
        row0 = v("kk_qb") * bm + 64 * i
        # Q's and K's k16 step ks: box ks / 4 (64 head-dim columns), 32 bytes a step inside the swizzled rows
        dq = MatDesc(SmemRef("sQ", ci(0), i * 64 * 128), "128B", 16, 1024, "K", (ks // 4) * (bm * 128) + (ks % 4) * 32)
        dk = MatDesc(SmemRef("sK", st), "128B", 16, 1024, "K", (ks // 4) * (bn * 128) + (ks % 4) * 32)

        def dvd(stage) -> MatDesc:
            """V [keys, DV] as MN-major B: boxes of 64 DV columns, bn rows each; k16 step ks is 16 rows in."""
            return MatDesc(SmemRef("sV", stage), "128B", 64 * bn * 2, 1024, "MN", ks * (16 * 128))

        def issue(n, *mmas) -> tuple:
            if not turns:
                return mmas
            return (MbarWait(bar("kk_turn", ci(i)), n & 1), *mmas, MbarArrive(bar("kk_turn", ci(1 - i))))

        def pv(stage) -> tuple:
            """O += P V of the block in ``stage``, P from registers."""
            return (WgmmaFence(),       # P's registers were written since the last fence (else ptxas adds one)
                    For("ks", ci(0), ci(bn // 16), (WgmmaMma("kk_o", "kk_p", dvd(stage), dv, dt, a_row=ks),),
                        unroll=True),
                    WgmmaCommit())

        def scores() -> tuple:
            """S = Q K^T of key block kt, committed."""
            return (WgmmaFence(),
                    For("ks", ci(0), ci(d // 16), (WgmmaMma("kk_s", dq, dk, bn, dt, ks.gt(0)),), unroll=True),
                    WgmmaCommit())

        def softmax() -> tuple:
            return (MbarArrive(bar("kk_kempty", st)),
                    SoftmaxStep("kk_s", row0, kt * bn, pc.decl_score, pc.score, pair.k2, inside=pc.inside,
                                free_decls=pc.decl_free, free_code=pc.score_free))

        # block 0 before the loop and the last block's P V after it, so that every wait in the loop is
        # unconditional (a wgmma wait on a divergent path makes ptxas serialize every wgmma of the kernel)
        first = (MbarWait(bar("kk_kfull", st), ph), *issue(ci(0), *scores()), WgmmaWait(0), *softmax(),
                 RescalePack("kk_o", "kk_s", "kk_p", dt))
        step = (MbarWait(bar("kk_kfull", st), ph), MbarWait(bar("kk_vfull", pst), pph),
                # the previous block's P V runs on while S retires and the softmax runs
                *issue(kt, *scores(), *pv(pst)),
                WgmmaWait(1, ("kk_s",)),
                *softmax(),
                WgmmaWait(0),
                MbarArrive(bar("kk_vempty", pst)),
                RescalePack("kk_o", "kk_s", "kk_p", dt))
        last = KT - 1
        tail = (MbarWait(bar("kk_vfull", last % S), (last // S) & 1), *issue(KT, *pv(last % S)), WgmmaWait(0),
                MbarArrive(bar("kk_vempty", last % S)))
        return (SetMaxNReg(True, CONSUMER_REGS[consumers]),
                SoftmaxInit("kk_o"),
                *((MbarArrive(bar("kk_turn", ci(0))),) if turns and i == 1 else ()),
                MbarWait(bar("kk_qfull"), ci(0)),
                If(KT.gt(0), (Let("kt", ci(0)), *first, For("kt", ci(1), KT, step), *tail)),
                FragEpilogue("kk_o", row0, ci(0), pc.decl_out, pc.out, cols=str(dv), setup=pc.batch1,
                             row_div="kk_sum"))

    inits = [MbarInit(bar("kk_qfull"), 1)]
    if turns:
        inits.append(For("s", ci(0), ci(2), (MbarInit(bar("kk_turn", v("s")), 128),)))
    for r in ("k", "v"):
        inits.append(For("s", ci(0), ci(S), (MbarInit(bar(f"kk_{r}full", v("s")), 1),
                                             MbarInit(bar(f"kk_{r}empty", v("s")), 128 * consumers))))
    body = (Elect((*inits, FenceMbarInit())),
            SyncThreads(),
            Roles((Role("producer", 0, 1, producer),
                   *(Role(f"consumer{i}", 1 + i, 1, consumer(i)) for i in range(consumers)))))
    setup = list(pc.setup)
    if pc.bound:            # key blocks past the last column any of the CTA's rows sees through the guards
        # the query blocks with the most key blocks first (the grid runs blockIdx.x in order): no long tail
        setup += [Decl("const int", "kk_qb", "(int)(gridDim.x - 1 - blockIdx.x)"),
                  Decl("const long long", "kk_m0", f"(long long)kk_qb * {bm}"),
                  Decl("const long long", "kk_mhi", f"(kk_m0 + {bm} < kk_M ? kk_m0 + {bm} : kk_M) - 1"),
                  Decl("const long long", "kk_nb", pc.bound),
                  Decl("const long long", "kk_nend", "kk_nb > kk_N ? kk_N : kk_nb < 0 ? 0 : kk_nb")]
    else:
        setup += [Decl("const int", "kk_qb", "(int)blockIdx.x"), Decl("const long long", "kk_nend", "kk_N")]
    setup.append(Decl("const int", "kk_KT", f"(int)((kk_nend + {bn - 1}) / {bn})"))
    notes = (pair_note(pair, pc.bound),
             f"SM90 attention: BM {bm} ({consumers} consumer warpgroup(s) of 64 rows), BN {bn}, {S} stages of K and V "
             "by TMA, S = Q K^T and O += P V by wgmma (P from registers), the previous block's P V overlapping the "
             "softmax" + ("; the consumers take turns issuing (ping-pong)" if turns else ""))
    kern = Sm90Kernel(name, 128 * (1 + consumers), tuple(maps), (), smem,
                      (BarDecl("kk_qfull"), BarDecl("kk_kfull", S), BarDecl("kk_kempty", S), BarDecl("kk_vfull", S),
                       BarDecl("kk_vempty", S)) + ((BarDecl("kk_turn", 2),) if turns else ()),
                      (("kk_s", bn), ("kk_o", dv)), body,
                      rings=(Ring(("sK",), "kk_kfull", "kk_kempty", S), Ring(("sV",), "kk_vfull", "kk_vempty", S)),
                      regs=(("kk_p", (bn // 16, 4)),),
                      verify_sizes=(("kk_KT", (0, 1, 2, S, S + 1, 2 * S + 1)),),
                      notes=notes, params=pc.params, setup=tuple(setup))
    return Sm90Attention(kern, tuple(bufs), tuple(size.named.values()))
