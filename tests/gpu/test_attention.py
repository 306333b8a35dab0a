"""The fused streaming attention kernel (``kumiko.kernel.gpu_attention``): chosen for the attention Region pair,
one launch with no scratch for the scores, matching the evaluator in every emulator configuration (causal and
not, head dims 64 and 128, fp16 and bf16, query and key lengths that are not multiples of the blocks and
differ), schedule bugs injected into its GPU IR caught by the verifier and the emulator, and nvcc builds for
sm_80 and sm_90a without spills."""
from __future__ import annotations

from dataclasses import replace

import pytest

import kumiko
from kumiko import Tensor
from kumiko.accuracy import bound
from kumiko.diagnostics import KumikoError
from kumiko.kernel.attention_pair import find_attention_pair
from kumiko.kernel.gpu_attention import AttentionKernel, LoadBlock, OnlineSoftmax
from kumiko.kernel.gpu_ir import Barrier, KLoop
from kumiko.kernel.gpu_ir_sm90 import (
    For,
    If,
    MbarArrive,
    MbarArriveTx,
    MbarWait,
    RescalePack,
    Roles,
    Sm90Kernel,
    SoftmaxStep,
    WgmmaWait,
    rewrite,
)
from kumiko.kernel.gpu_verify_attention import verify_attention
from kumiko.kernel.gpu_verify_sm90 import verify_sm90
from kumiko.pipeline import compile_cuda
from kumiko.plan.gpu import describe_gpu_plan
from kumiko.render.cuda import render_cuda
from kumiko.runtime.emu_program import CompiledCuda, GpuRunner
from kumiko.runtime.ptxas import nvcc_path

from .conftest import graph, mma_plans, needs_gxx, run_and_compare

#: (B, H, M queries, N keys): one key block and a partial one, M != N both ways, a single element
SIZES = ({"B": 1, "H": 3, "M": 37, "N": 37}, {"B": 2, "H": 1, "M": 100, "N": 129},
         {"B": 1, "H": 2, "M": 129, "N": 100}, {"B": 1, "H": 1, "M": 1, "N": 1})
CASES = [(d, causal, dt) for d in (64, 128) for causal in (True, False) for dt in ("fp16", "bf16")]


def attention(d: int, causal: bool, dtype: str, dv: int | None = None, mask: bool = False):
    q = Tensor.input("Q", ("B", "H", "M", d), dtype=dtype)
    k = Tensor.input("K", ("B", "H", "N", d), dtype=dtype)
    v = Tensor.input("V", ("B", "H", "N", dv or d), dtype=dtype)
    m = Tensor.input("A", ("M", "N"), dtype=dtype) if mask else None
    return q.scaled_dot_product_attention(k, v, attn_mask=m, is_causal=causal).graph("O", name=f"attn{d}")


@pytest.fixture(scope="module")
def progs(gpu_cache):
    cache: dict = {}

    def get(*case, **kw) -> tuple:
        key = case + tuple(sorted(kw.items()))
        if key not in cache:
            g = attention(*case, **kw)
            cache[key] = (g, compile_cuda(g.tiny))
        return cache[key]
    return get


def _check(c: CompiledCuda, g, emu: str, dtype: str, sizes=SIZES, seed: int = 1) -> None:
    for k, shapes in enumerate(sizes):
        errs = run_and_compare(c, g, emu, seed + k, shapes)
        assert all(e <= bound(dtype) for e in errs.values()), (emu, shapes, errs)


def test_the_pair_gets_one_fused_launch_and_no_scratch():
    c = compile_cuda(graph("attention_causal", "fp16").tiny)
    (k,), (ln,) = c.kernels, c.launches
    assert isinstance(k, AttentionKernel) and not ln.scratch and ln.regions == tuple(r.name for r in c.program.regions)
    p = c.program.regions[0].outputs[0].name                # the deferred P: no argument, never allocated
    assert all(name != p for _, name in ln.args)
    run = GpuRunner(c.program, None, c.launches)
    assert p not in {b for b, _ in run._planned.buffers} and c.source.count("__global__") == 1
    assert [pl.algo for pl in c.plans.values()] == ["streaming_softmax", "fused"]
    assert k.bound and "key blocks past the guards skipped" in k.notes[0]          # the causal mask's bound
    assert not compile_cuda(attention(64, False, "fp16").tiny).kernels[0].bound
    for arch in ("sm80", "sm90"):
        assert compile_cuda(graph("attention_causal", "fp16").tiny, arch=arch).plans[ln.region].arch == arch


def test_only_a_streaming_softmax_pair_is_fused():
    """A row program that is not exp(k (z - max)) / sum (here a plain row normalisation) keeps the MMA path; so does
    the pair when the caller gives its regions' plans."""
    q, k, v = (Tensor.input(n, ("B", "M", 32), dtype="fp16") for n in "QKV")
    s = q @ k.transpose()
    g = (s / s.sum(-1, keepdim=True) @ v).graph("O", name="norm")
    prog = compile_cuda(g.tiny)
    assert not any(isinstance(x, AttentionKernel) for x in prog.kernels)
    assert all(find_attention_pair(prog.program, i) is None for i in range(len(prog.program.regions)))
    given = compile_cuda(graph("attention_causal", "fp16").tiny, plans=mma_plans("attention_causal"))
    assert [type(x).__name__ for x in given.kernels] == ["MmaKernel", "SimtKernel", "MmaKernel"]


@needs_gxx
@pytest.mark.parametrize("case", CASES, ids=[f"d{d}-{'causal' if c else 'full'}-{t}" for d, c, t in CASES])
def test_fused_attention_matches_the_evaluator(progs, case):
    g, c = progs(*case)
    _check(c, g, "deferred", case[2])


def _projected_heads(causal: bool, heads: int = 3, d: int = 64, s: int = 40):
    """What an exported transformer holds at batch 1: Q, K, V are heads of one [1, S, 3 * H * d] projection,
    reshaped and permuted to [1, H, S, d] (each a strided tile: rows 3 * H * d apart), constant sizes with a leading
    batch axis of one."""
    x = Tensor.input("X", (1, s, 3 * heads * d), dtype="fp16")
    q, k, v = (x[:, :, i * heads * d:(i + 1) * heads * d].reshape(1, s, heads, d).permute(0, 2, 1, 3)
               for i in range(3))
    return q.scaled_dot_product_attention(k, v, is_causal=causal, scale=0.125).graph("O", name="heads")


@needs_gxx
@pytest.mark.parametrize("causal", [False, True])
def test_batch_of_one_and_projected_heads_are_fused(gpu_cache, causal):
    """A size-1 batch axis (none of batch, M or N) and Q/K/V read as heads of a projection with a row step (not whole
    row-major tiles) still make an attention pair: one fused kernel, matching the evaluator in every schedule."""
    g = _projected_heads(causal)
    c = compile_cuda(g.tiny)
    assert [type(x).__name__ for x in c.kernels] == ["AttentionKernel"], [type(x).__name__ for x in c.kernels]
    for emu in ("deferred", "reversed", "random"):
        errs = run_and_compare(c, g, emu, 3)
        assert all(e <= bound("fp16") for e in errs.values()), (emu, errs)
    q = Tensor.input("Q", (1, 2, 40, 64), dtype="fp16")
    k, v = (Tensor.input(n, (1, 2, 40, 64), dtype="fp16") for n in "KV")
    one = compile_cuda(q.scaled_dot_product_attention(k, v, is_causal=causal).graph("O").tiny)
    assert [type(x).__name__ for x in one.kernels] == ["AttentionKernel"]


def test_a_head_whose_rows_are_not_16_byte_aligned_is_not_fused():
    """A row step that is not a multiple of 8 halves cannot be copied by cp.async: the MMA path runs it."""
    x = Tensor.input("X", (1, 40, 3 * 2 * 64 + 4), dtype="fp16")
    q, k, v = (x[:, :, i * 128:(i + 1) * 128].reshape(1, 40, 2, 64).permute(0, 2, 1, 3) for i in range(3))
    c = compile_cuda(q.scaled_dot_product_attention(k, v).graph("O").tiny)
    assert not any(isinstance(x, AttentionKernel) for x in c.kernels)


@needs_gxx
@pytest.mark.parametrize("emu", ["eager", "reversed", "random", "asan"])
@pytest.mark.parametrize("case", [(64, True, "fp16"), (128, False, "bf16")], ids=["d64-causal-fp16", "d128-full-bf16"])
def test_fused_attention_in_every_emulator_configuration(progs, case, emu):
    g, c = progs(*case)
    _check(c, g, emu, case[2], SIZES[:3])


@needs_gxx
def test_score_code_comes_from_the_region(progs):
    """An additive mask tensor is read by the score code (no guard: every key block computed), V's head dim
    differs from Q's; the three-launch path (the caller's plans) still matches too."""
    g, c = progs(64, True, "fp16", dv=32, mask=True)
    assert isinstance(c.kernels[0], AttentionKernel) and c.kernels[0].head == (64, 32)
    _check(c, g, "deferred", "fp16", SIZES[1:3])
    g2 = graph("attention_causal", "fp16")
    errs = run_and_compare(compile_cuda(g2.tiny, plans=mma_plans("attention_causal")), g2, "deferred", 3,
                           {"B": 1, "H": 2, "S": 70})
    assert max(errs.values()) <= bound("fp16"), errs


# -- injected bugs ------------------------------------------------------------------------------------------
def _body(k: AttentionKernel, f) -> AttentionKernel:
    return replace(k, loop=KLoop(k.loop.var, tuple(x for s in k.loop.body for x in f(s))))


def _no_pv_barrier(k):
    body = list(k.loop.body)
    i = max(j for j, s in enumerate(body) if isinstance(s, Barrier))
    return replace(k, loop=KLoop(k.loop.var, tuple(body[:i] + body[i + 1:])))


BUGS = {
    "missing_pv_barrier": _no_pv_barrier,
    "missing_rescale": lambda k: _body(k, lambda s: (replace(s, rescale=False),) if isinstance(s, OnlineSoftmax)
                                       else (s,)),
    "missing_tail_mask": lambda k: _body(k, lambda s: (replace(s, mask_tail=False),) if isinstance(s, OnlineSoftmax)
                                         else (s,)),
    "missing_v_row_predicate": lambda k: _body(k, lambda s: (replace(s, pred_rows=False),)
                                               if isinstance(s, LoadBlock) and s.ring == "sV" else (s,)),
}
#: bug -> (verifier hazard or None, emulator configuration, E1702 fault or None for a wrong result)
CAUGHT = {"missing_pv_barrier": ("no_barrier_after_wait", "deferred", "poisoned_read"),
          "missing_rescale": ("online_softmax", "deferred", None),
          "missing_tail_mask": (None, "deferred", None),
          "missing_v_row_predicate": (None, "asan", "asan:heap-buffer-overflow")}
#: several key blocks, N not a multiple of BN: the max grows across blocks, a tail is masked, V ends mid-block
BUG_SIZES = {"B": 1, "H": 2, "M": 64, "N": 200}


@needs_gxx
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_injected_bugs_are_caught(progs, bug):
    g, base = progs(64, False, "fp16")
    hazard, emu, fault = CAUGHT[bug]
    ks = [BUGS[bug](base.kernels[0])]
    if hazard is not None:
        with pytest.raises(KumikoError) as e:
            verify_attention(ks[0])
        assert e.value.details["hazard"] == hazard
    else:
        assert verify_attention(ks[0]) is ks[0]
    bad = CompiledCuda(base.program, base.plans, ks, render_cuda(ks), base.launches, base.arch)
    if fault is None:
        errs = run_and_compare(bad, g, emu, 7, BUG_SIZES)
        assert max(errs.values()) > 10 * bound("fp16"), errs
        assert max(run_and_compare(base, g, emu, 7, BUG_SIZES).values()) <= bound("fp16")
    else:
        with pytest.raises(KumikoError) as e:
            run_and_compare(bad, g, emu, 7, BUG_SIZES)
        assert e.value.code == "E1702" and e.value.details["fault"] == fault, e.value.details


# -- nvcc ---------------------------------------------------------------------------------------------------
@pytest.mark.nvcc
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("d", [64, 128])
def test_fused_attention_builds_for_sm80_and_sm90a_without_spills(d):
    from kumiko.runtime.emu_program import nvcc_check
    for dt, causal in (("fp16", True), ("bf16", False)):
        c = compile_cuda(attention(d, causal, dt).tiny)
        for arch in ("sm_80", "sm_90a"):
            res = nvcc_check(c, arch)
            assert "warning" not in res.log, res.log
            r = res.resources[c.launches[0].kernel]
            assert r.spill_stores == r.spill_loads == 0 and r.stack_frame == 0 and r.registers <= 255, r
            for instr in ("cp.async.cg.shared.global", "ldmatrix.sync.aligned.m8n8.x4.trans", "ex2.approx.ftz.f32",
                          f"mma.sync.aligned.m16n8k16.row.col.f32.{dt.replace('fp', 'f')}"):
                assert instr in res.ptx, instr


def test_a_streaming_plan_without_its_pair_is_refused():
    g = graph("attention_causal", "fp16")
    plans = compile_cuda(g.tiny).plans
    r0, r1 = list(plans)
    with pytest.raises(KumikoError) as e:                   # the consumer left on the MMA path
        compile_cuda(g.tiny, plans={r0: plans[r0], r1: mma_plans("attention_causal")[r1]})
    assert e.value.code == "E1801" and "attention region pair" in e.value.why
    with pytest.raises(KumikoError) as e:
        compile_cuda(g.tiny, plans={r0: plans[r0].with_(tile=(64, 64, 32))})
    assert e.value.code == "E1801"
    assert kumiko.compile(g, "cuda-emu").target == "cuda-emu"


# -- the SM90 kernel (kernel.gpu_attention_sm90: TMA, mbarrier rings, wgmma with P from registers) ----------------
SM90_CASES = [(64, False, "fp16"), (128, True, "bf16")]


@pytest.fixture(scope="module")
def progs90(gpu_cache):
    cache: dict = {}

    def get(*case) -> tuple:
        if case not in cache:
            g = attention(*case)
            cache[case] = (g, compile_cuda(g.tiny, arch="sm90"))
        return cache[case]
    return get


def test_sm90_plans_take_the_tma_wgmma_kernel():
    """On sm90 the pair is one launch of the SM90 kernel: three tensor maps (Q, K, V, 128-byte swizzle), K and V
    rings, two consumer warpgroups (one when constant sizes give fewer query blocks than two an SM); a head dim the
    kernel does not take keeps the SM80 kernel."""
    c = compile_cuda(attention(64, True, "fp16").tiny, arch="sm90")
    (k,), (ln,) = c.kernels, c.launches
    assert isinstance(k, Sm90Kernel) and [m.name for m in k.maps] == ["tmQ", "tmK", "tmV"]
    assert {m.swizzle for m in k.maps} == {"128B"} and [r.buffers for r in k.rings] == [("sK",), ("sV",)]
    assert k.threads == 384 and ln.block == 384 and not ln.scratch and len(ln.maps) == 3
    assert "TMA + wgmma, 2 consumer warpgroups" in describe_gpu_plan(c.plans[ln.region])
    # causal: the query blocks with the most key blocks run first; the full-attention grid runs in order
    full = compile_cuda(attention(64, False, "fp16").tiny, arch="sm90")
    assert "gridDim.x - 1 - blockIdx.x" in c.source and "gridDim.x - 1 - blockIdx.x" not in full.source
    assert "kk_inside" in full.source and "kk_turn" in full.source
    q = Tensor.input("Q", (1, 12, 128, 64), dtype="fp16")
    kk, v = (Tensor.input(n, (1, 12, 128, 64), dtype="fp16") for n in "KV")
    small = compile_cuda(q.scaled_dot_product_attention(kk, v).graph("O").tiny, arch="sm90")
    assert small.kernels[0].threads == 256 and small.plans[small.launches[0].region].tile[0] == 64
    odd = compile_cuda(attention(32, False, "fp16").tiny, arch="sm90")
    assert isinstance(odd.kernels[0], AttentionKernel)


@needs_gxx
@pytest.mark.parametrize("emu", ["deferred", "reversed", "random"])
@pytest.mark.parametrize("case", SM90_CASES, ids=[f"d{d}-{'causal' if c else 'full'}-{t}" for d, c, t in SM90_CASES])
def test_sm90_attention_matches_the_evaluator(progs90, case, emu):
    """Also at 300 x 260: query blocks wholly below the causal diagonal run the score code without the mask."""
    g, c = progs90(*case)
    assert ("the score code without them" in c.source) == case[1]
    _check(c, g, emu, case[2], SIZES[:3] + ({"B": 1, "H": 1, "M": 300, "N": 260},))


@needs_gxx
def test_sm90_attention_over_projected_heads():
    """Q, K, V as heads of one [1, S, 3 * H * d] projection: 3-D maps (d, S, H) whose origins are Q's, K's and V's
    column offsets; one consumer warpgroup (few query blocks)."""
    g = _projected_heads(True, heads=2, s=150)
    c = compile_cuda(g.tiny, arch="sm90")
    (k,) = c.kernels
    assert isinstance(k, Sm90Kernel) and [len(m.dims) for m in k.maps] == [3, 3, 3]
    assert [m.offset.eval({}) for m in k.maps] == [0, 128, 256]
    errs = run_and_compare(c, g, "deferred", 5)
    assert all(e <= bound("fp16") for e in errs.values()), errs


def _drop(cls, **match):
    """A rewrite that removes the statements of ``cls`` whose fields equal ``match``."""
    def fn(s):
        if isinstance(s, cls) and all(getattr(s, f) == v for f, v in match.items()):
            return ()
        return None
    return fn


def _pack_before_pv_retires(s):
    if isinstance(s, For) and isinstance(s.body[-1], RescalePack):  # moved before the wait that retires P V
        body = list(s.body)
        i = next(j for j, x in enumerate(body) if isinstance(x, WgmmaWait) and x.pending == 0)
        pack = body.pop(-1)
        return (replace(s, body=tuple(body[:i] + [pack] + body[i:])),)
    return None


def _no_tail_wait(s):
    """The last block's P V (the consumer's ``If(KT > 0)``) without its wait and stage release: the epilogue reads
    O while that wgmma is in flight."""
    if isinstance(s, If) and isinstance(s.body[-1], MbarArrive) and isinstance(s.body[-2], WgmmaWait):
        return (replace(s, body=s.body[:-2]),)
    return None


def _drop_first_turn(s):
    """Consumer 1 without its first arrival on consumer 0's turn barrier: the ping-pong never starts."""
    if isinstance(s, Roles):
        return (Roles(tuple(replace(r, body=tuple(x for x in r.body if not (isinstance(x, MbarArrive) and
                                                                        x.bar.name == "kk_turn")))
                            if r.name == "consumer1" else r for r in s.roles)),)
    return None


def _mutate_sm90(k, fn):
    return replace(k, body=rewrite(k.body, fn))


def _skip_diagonal(k):
    """The causal bound one key block short for every query block but the first (those blocks are not masked)."""
    setup = tuple(replace(d, init=f"{d.init} - (kk_qb > 0 ? 1 : 0)") if getattr(d, "name", "") == "kk_KT" else d
                  for d in k.setup)
    return replace(k, setup=setup)


SM90_BUGS = {
    "no_wait_before_softmax": lambda k: _mutate_sm90(k, _drop(WgmmaWait, pending=1)),
    "pack_before_pv_retires": lambda k: _mutate_sm90(k, _pack_before_pv_retires),
    "no_wait_before_epilogue": lambda k: _mutate_sm90(k, _no_tail_wait),
    "wrong_k_parity": lambda k: _mutate_sm90(k, lambda s: (replace(s, parity=s.parity ^ 1),)
                                            if isinstance(s, MbarWait) and s.bar.name == "kk_kfull" else None),
    "wrong_expect_tx": lambda k: _mutate_sm90(k, lambda s: (replace(s, bytes=s.bytes - 128),)
                                             if isinstance(s, MbarArriveTx) and s.bar.name == "kk_vfull" else None),
    "wrong_turn_parity": lambda k: _mutate_sm90(k, lambda s: (replace(s, parity=s.parity ^ 1),)
                                               if isinstance(s, MbarWait) and s.bar.name == "kk_turn" else None),
    "no_first_turn": lambda k: _mutate_sm90(k, _drop_first_turn),
    "missing_rescale": lambda k: _mutate_sm90(k, lambda s: (replace(s, rescale=False),)
                                             if isinstance(s, SoftmaxStep) else None),
    "skipped_unmasked_block": _skip_diagonal,
}
#: bug -> the verifier's hazard, or None: the verifier passes it and the emulator's result is wrong
SM90_CAUGHT = {"wrong_turn_parity": "mbar_parity", "no_first_turn": "mbar_deadlock",
               "no_wait_before_softmax": "release_in_flight", "pack_before_pv_retires": "acc_in_flight",
               "no_wait_before_epilogue": "acc_in_flight", "wrong_k_parity": "mbar_parity",
               "wrong_expect_tx": "expect_tx", "missing_rescale": None, "skipped_unmasked_block": None}


@needs_gxx
@pytest.mark.parametrize("bug", sorted(SM90_BUGS))
def test_sm90_injected_bugs_are_caught(progs90, bug):
    causal = bug == "skipped_unmasked_block"
    g, base = progs90(64, causal, "fp16") if causal else progs90(64, False, "fp16")
    k = SM90_BUGS[bug](base.kernels[0])
    assert k != base.kernels[0]
    hazard = SM90_CAUGHT[bug]
    if hazard is not None:
        with pytest.raises(KumikoError) as e:
            verify_sm90(k)
        assert e.value.details["hazard"] == hazard, e.value.details
        return
    assert verify_sm90(k) is k
    sizes = {"B": 1, "H": 2, "M": 300, "N": 300}        # several key blocks; three query blocks
    bad = CompiledCuda(base.program, base.plans, [k], render_cuda([k]), base.launches, base.arch)
    errs = run_and_compare(bad, g, "deferred", 7, sizes)
    assert max(errs.values()) > 10 * bound("fp16"), errs
    assert max(run_and_compare(base, g, "deferred", 7, sizes).values()) <= bound("fp16")


@pytest.mark.nvcc
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("d", [64, 128])
def test_sm90_attention_builds_without_spills_or_serialized_wgmma(d):
    """ptxas neither spills nor inserts waits of its own (C7517) that serialize every wgmma of the kernel (C7518):
    every wgmma wait in the loop is unconditional and the waits fence only the accumulators they retire."""
    from kumiko.runtime.emu_program import nvcc_check
    for dt, causal in (("fp16", True), ("bf16", False)):
        c = compile_cuda(attention(d, causal, dt).tiny, arch="sm90")
        res = nvcc_check(c, "sm_90a")
        r = res.resources[c.launches[0].kernel]
        assert r.spill_stores == r.spill_loads == 0 and r.stack_frame == 0, r
        assert "ptxas info" in res.log and "C7517" not in res.log and "C7518" not in res.log, res.log
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in res.ptx and "cp.async.bulk.tensor.4d" in res.ptx
        # the softmax's 2^x without exp2f's subnormal range test around MUFU.EX2
        assert "ex2.approx.ftz.f32" in res.ptx and "ex2.approx.f32" not in res.ptx
