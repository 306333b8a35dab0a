"""The GPU dialect IR and the plans: what the skeleton instantiates for each region shape, the verifier's
hazards and budgets, plan validation (E1801), plan injection (stages, tile, warp tile), determinism."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kumiko import Tensor
from kumiko.diagnostics import KumikoError
from kumiko.kernel.gpu_ir import Barrier, KLoop, LoadFrag, MmaFrag, MmaKernel, SimtKernel
from kumiko.kernel.gpu_verify import verify_mma
from kumiko.pipeline import compile_cuda
from kumiko.plan.gpu import choose_gpu_plan, fallback_gpu_plan, validate_gpu_plan
from kumiko.plan.plan import Plan
from kumiko.region import form_regions
from kumiko.runtime.program import program_symbols

from .conftest import EXAMPLES, graph, mma_plans, needs_gxx, run_and_compare


def _mma(stem: str, dtype: str = "fp16", **kw) -> MmaKernel:
    return next(k for k in compile_cuda(graph(stem, dtype).tiny, **kw).kernels if isinstance(k, MmaKernel))


def test_operand_staging_follows_the_access_maps():
    gemm = _mma("gemm_bias_relu")
    x, y = gemm.loads
    assert x.vec is not None and y.vec is not None                    # A[m,k], B[k,n]: plain tiles
    assert [r.layout for r in gemm.rings] == ["sk", "ks"]             # B is read with ldmatrix.trans
    conv = _mma("conv3x3_s2_p1")
    assert conv.loads[0].vec is None and conv.loads[1].vec is not None    # im2col gathered, weights cp.async
    qk = _mma("attention_causal", plans=mma_plans("attention_causal"))
    assert [r.layout for r in qk.rings] == ["sk", "sk"]               # K[n, d]: k contiguous, no trans
    pool = _mma("conv_relu_maxpool")
    assert pool.epilogue.mode == "smem_window" and pool.epilogue.window == 4


def test_region_shapes_pick_their_skeleton():
    c = compile_cuda(graph("attention_causal", "fp16").tiny, plans=mma_plans("attention_causal"))
    kinds = [type(k).__name__ for k in c.kernels]
    assert kinds == ["MmaKernel", "SimtKernel", "MmaKernel"]          # QK^T, row softmax on its scratch, PV
    assert c.launches[0].scratch and c.launches[1].scratch == c.launches[0].scratch
    fused = compile_cuda(graph("attention_causal", "fp16").tiny)       # the chooser's: one streaming kernel
    assert [type(k).__name__ for k in fused.kernels] == ["AttentionKernel"] and not fused.launches[0].scratch
    f32 = compile_cuda(graph("gemm_bias_relu", "fp32").tiny)
    assert all(isinstance(k, SimtKernel) for k in f32.kernels)


def test_verifier_hazards():
    k = _mma("gemm_bias_relu")
    assert verify_mma(k) is k
    no_landed = replace(k, loop=KLoop("kt", tuple(s for s in k.loop.body
                                                  if not (isinstance(s, Barrier) and s.why.startswith("landed")))))
    with pytest.raises(KumikoError) as e:
        verify_mma(no_landed)
    assert e.value.details["hazard"] == "no_barrier_after_wait"
    with pytest.raises(KumikoError) as e:
        verify_mma(replace(_mma("conv_relu_maxpool"), drain=()))
    assert e.value.details["hazard"] == "epilogue_smem"
    with pytest.raises(KumikoError) as e:
        verify_mma(replace(k, regs_budget=64))
    assert e.value.details["hazard"] == "register_budget"
    # a thread's cp.async chunks are rows apart only when the threads cover whole rows of chunks
    ragged = replace(k.rings[1], cols=24 * 8)                       # 24 chunks a row, 128 threads
    assert ragged.rows * ragged.cols // 8 % k.threads == 0
    with pytest.raises(KumikoError) as e:
        verify_mma(replace(k, rings=(k.rings[0], ragged)))
    assert e.value.details["hazard"] == "shape" and "whole rows" in e.value.why


def _region(stem, dtype="fp16"):
    p = form_regions(graph(stem, dtype).tiny)
    return p.regions[0], program_symbols(p)


def test_plan_validation():
    r, syms = _region("gemm_bias_relu")
    p = choose_gpu_plan(r, "sm80", syms)
    assert p.algo == "mma" and p.barrier_model == "cp_async_group" and p.epilogue == ("cast", "add", "relu")
    assert validate_gpu_plan(p, r, syms) is p
    for bad in (replace(p, tile=(256, 256, 128), warp_tile="64x64", stages=4),      # shared memory
                replace(p, warp_tile="24x32"), replace(p, stages=5), replace(p, arch="cpu-avx2"),
                p.with_(async_={**dict(p.async_), "release": "eager"})):                   # no such ring schedule
        with pytest.raises(KumikoError) as e:
            validate_gpu_plan(bad, r, syms)
        assert e.value.code == "E1801"
    r32, syms32 = _region("gemm_bias_relu", "fp32")
    simt = choose_gpu_plan(r32, "sm80", syms32)
    assert simt.algo == "simt" and simt.layout_hints == () and simt.threads == 256
    with pytest.raises(KumikoError):
        validate_gpu_plan(replace(p, arch="sm80"), r32, syms32)


def test_gpu_plan_json_has_the_seeds_fields_and_no_notes():
    """An MMA plan's JSON: the seed's CTA tile [BM, BN, BK], warp_tile and stages, layout_hints with typed hints
    only (group_m, the CTA swizzle); no CPU block fields. A CPU field, a note in layout_hints or a thread count
    the warp tiles do not give is E1801 naming the field."""
    r, syms = _region("gemm_bias_relu")
    p = choose_gpu_plan(r, "sm80", syms)
    d = p.to_json()
    assert (d["tile"], d["warp_tile"], d["stages"], d["layout_hints"]) == ([128, 128, 32], "64x64", 4, {"group_m": 8})
    assert not {"cache_block", "register_block", "micro"} & set(d) and d["ptxas_fallback"] == {}
    assert Plan.from_json(d) == p
    for bad, name in (({"cache_block": {"mc": 64, "nc": 64, "kc": 32}}, "cache_block"),
                      ({"layout_hints": {"group_m": 8, "why_simt": "no contraction"}}, "layout_hints.why_simt"),
                      ({"layout_hints": {"smem_pad": 8}}, "layout_hints.smem_pad"),
                      ({"ptxas_fallback": {"after_ptxas": "sm_90a: spills"}}, "after_ptxas")):
        with pytest.raises(KumikoError) as e:
            Plan.from_json({**d, **bad})
        assert e.value.code == "E1801" and name in e.value.why, name
    for bad, name in ((replace(p, threads=64), "threads=64"), (replace(p, register_block=(6, 16)), "register_block")):
        with pytest.raises(KumikoError) as e:
            validate_gpu_plan(bad, r, syms)
        assert e.value.code == "E1801" and name in e.value.why, name


def _gemm_region(m, n, k, batch=None):
    a_shape, b_shape = ((batch,) if batch else ()) + (m, k), ((batch,) if batch else ()) + (k, n)
    g = (Tensor.input("A", a_shape, dtype="fp16") @ Tensor.input("B", b_shape, dtype="fp16")).graph("y", name="g")
    p = form_regions(g.tiny)
    return p.regions[0], program_symbols(p)


@pytest.mark.parametrize("shape, want", [
    (("M", "N", "K"), ((128, 128, 32), "64x64", 4)),                # unknown sizes count as large
    ((4096, 4096, 4096), ((128, 128, 32), "64x64", 4)),
    ((2048, 2048, 64), ((128, 128, 32), "64x64", 4)),               # 256 CTAs of 128x128: nearly two an SM
    ((1024, 1024, 1024), ((128, 64, 32), "32x32", 3)),              # 64 CTAs of 128x128 would idle half a GPU
    ((256, 256, 256, 64), ((128, 128, 32), "64x64", 4)),            # a batch of 64 fills it
    (("S", 64, 64, 128), ((64, 64, 32), "32x32", 3)),               # N = 64 (attention's P.V): small N tile
    (("S", 32, 32), ((64, 32, 32), "32x32", 3)),
])
def test_plan_tile_follows_the_problem_size(shape, want):
    r, syms = _gemm_region(*shape)
    p = choose_gpu_plan(r, "sm80", syms)
    assert (p.tile, p.warp_tile, p.stages) == want
    assert p.threads == (p.tile[0] // int(p.warp_tile.split("x")[0])) * (p.tile[1] // int(p.warp_tile[-2:])) * 32
    assert validate_gpu_plan(p, r, syms) is p


def test_plan_json_round_trip():
    r, syms = _region("conv_relu_maxpool")
    p = choose_gpu_plan(r, "sm90", syms)
    assert Plan.from_json(p.to_json()) == p and p.to_json()["async"]["epilogue_overlap"] is False


@needs_gxx
def test_injected_plan_two_stages_and_overlap(gpu_cache):
    g = graph("gemm_bias_relu", "fp16")
    r, syms = _region("gemm_bias_relu")
    base = choose_gpu_plan(r, "sm80", syms)
    plan = replace(base, tile=(128, 64, 32), warp_tile="64x32", stages=2,
                   async_=(("enable", True), ("epilogue_overlap", True), ("prefetch_depth", 1)))
    c = compile_cuda(g.tiny, plans={r.name: plan})
    k = c.kernels[0]
    assert k.tile == (128, 64, 32) and k.warps == (2, 2) and k.stages == 2 and k.drain == ()
    assert "cp_async_wait<1>()" in c.source
    for emu in ("deferred", "eager"):
        errs = run_and_compare(c, g, emu, 7, {"M": 130, "N": 72, "K": 40})
        assert max(errs.values()) < 1e-2, errs


@needs_gxx
def test_registers_schedule_double_buffers_fragments(gpu_cache):
    """async.release="registers" (the small plan's schedule; the large plan's 64x64 warps keep one set of
    fragments): k16 step j + 1 is loaded into the other register buffer while step j's MMAs run, the one
    barrier sits between the tile's last ldmatrix and the next tile's first; BK=64 gives four steps over two
    buffers. The verifier follows the buffers; BK must be a multiple of 32."""
    g = graph("gemm_bias_relu", "fp16")
    r, syms = _region("gemm_bias_relu")
    base = choose_gpu_plan(r, "sm80", syms)
    assert base.warp_tile == "64x64" and base.get("async_", "release") == "merged"
    r_small, syms_small = _gemm_region(1024, 1024, 1024)
    small = choose_gpu_plan(r_small, "sm80", syms_small)
    assert small.warp_tile == "32x32" and small.get("async_", "release") == "registers"
    first = fallback_gpu_plan(small, "sm_80", "spill")                                # ptxas feedback's first step
    assert first.get("async_", "release") == "merged" and first.get("ptxas_fallback", "steps") == 1
    plan = replace(base, tile=(64, 64, 64), warp_tile="32x32", stages=3, threads=128).with_(
        async_={**dict(base.async_), "release": "registers"})
    c = compile_cuda(g.tiny, plans={r.name: plan})
    k = c.kernels[0]
    steps = [(type(s).__name__, getattr(s, "kstep", None), s.buf) for s in k.loop.body
             if isinstance(s, (LoadFrag, MmaFrag))]
    assert steps == [("LoadFrag", 1, 1), ("MmaFrag", None, 0), ("LoadFrag", 2, 0), ("MmaFrag", None, 1),
                     ("LoadFrag", 3, 1), ("MmaFrag", None, 0), ("LoadFrag", 0, 0), ("MmaFrag", None, 1)]
    last = [i for i, s in enumerate(k.loop.body) if isinstance(s, LoadFrag)]
    bar = next(i for i, s in enumerate(k.loop.body) if isinstance(s, Barrier))
    assert last[-2] < bar < last[-1] and k.loop.body[last[-1]].tile.offset == 1
    assert "uint32_t kk_fa[2][2][4], kk_fb[2][4][2];" in c.source
    merged = compile_cuda(g.tiny, plans={r.name: plan.with_(async_={**dict(plan.async_), "release": "merged"})})
    assert k.estimated_registers() == merged.kernels[0].estimated_registers() + 2 * 4 + 4 * 2   # a 2nd fragment set
    for emu in ("deferred", "eager"):
        for sizes in ({"M": 130, "N": 72, "K": 200}, {"M": 64, "N": 64, "K": 64}, {"M": 33, "N": 40, "K": 8}):
            errs = run_and_compare(c, g, emu, 3, sizes)
            assert max(errs.values()) < 1e-2, (emu, sizes, errs)
    # a step multiplied twice and one never: the verifier says which
    body = list(k.loop.body)
    i = next(i for i, s in enumerate(body) if isinstance(s, MmaFrag))
    body[i] = replace(body[i], buf=1)
    with pytest.raises(KumikoError) as e:
        verify_mma(replace(k, loop=KLoop("kt", tuple(body))))
    assert e.value.details["hazard"] == "fragment_order"
    with pytest.raises(KumikoError) as e:
        validate_gpu_plan(replace(plan, tile=(64, 64, 48)), r, syms)
    assert e.value.code == "E1801" and "multiple of 32" in e.value.why
    assert validate_gpu_plan(plan.with_(tile=(64, 64, 48), async_={**dict(plan.async_), "release": "merged"}),
                             r, syms)


_ROWS = {   # region -> the SIMT binding its access maps call for
    "softmax over the last axis": (lambda: Tensor.input("x", ("M", "N"), dtype="fp32").softmax(-1), "warp"),
    "layernorm (fp16)": (lambda: Tensor.input("x", ("M", "N"), dtype="fp16").layernorm(-1), "warp"),
    "row sum": (lambda: Tensor.input("x", ("M", "N"), dtype="fp32").sum(1, keepdim=True), "warp"),
    "row max": (lambda: Tensor.input("x", ("M", "N"), dtype="fp32").max(-1), "warp"),
    "softmax over axis 0": (lambda: Tensor.input("x", ("M", "N"), dtype="fp32").softmax(0), "thread"),
    "column sum": (lambda: Tensor.input("x", ("M", "N"), dtype="fp32").sum(0), "thread"),
    "rows of 8": (lambda: Tensor.input("x", ("M", 8), dtype="fp32").softmax(-1), "thread"),
    "fp32 GEMM": (lambda: Tensor.input("a", ("M", "N"), dtype="fp32") @ Tensor.input("b", ("N", "M"), dtype="fp32"),
                  "thread"),
}


@needs_gxx
@pytest.mark.parametrize("case", sorted(_ROWS))
def test_simt_rows_bind_to_warps_where_they_are_contiguous(gpu_cache, case):
    """A SIMT row whose elements are contiguous goes to a warp (lanes stride over it, reductions end in a
    shuffle butterfly); otherwise adjacent threads take adjacent points. Both bindings compute the same
    values (checked against the evaluator at rows shorter than, as long as and longer than a warp)."""
    build, want = _ROWS[case]
    g = build().graph("y", name="rows")
    c = compile_cuda(g.tiny)
    (name, plan), = c.plans.items()
    (k,), (ln,) = c.kernels, c.launches
    assert plan.get("bind", "point") == want and k.warp == (want == "warp")
    assert ln.grid[0][1] == (8 if want == "warp" else 256) and ln.block == 256
    assert ("shfl_xor_f32" in c.source) == (want == "warp")
    other = compile_cuda(g.tiny, plans={name: plan.with_(bind={"point": "thread" if want == "warp" else "warp"})})
    assert other.kernels[0].warp != k.warp
    # deferred + round-robin only: a SIMT kernel has no cp.async and no barrier for the other configurations
    # to reorder; its shuffles are checked by the emulator's warp collectives in any of them
    for sz in ({"M": 37, "N": 5}, {"M": 9, "N": 100}, {"M": 3, "N": 32}):
        sz = {s: v for s, v in sz.items() if s == "M" or case != "rows of 8"}
        for prog in (c, other):
            errs = run_and_compare(prog, g, "deferred", 2, sz)
            assert max(errs.values()) < 1e-5 * (300 if "fp16" in case else 1), (case, sz, errs)


def test_attention_softmax_rest_binds_to_warps():
    c = compile_cuda(graph("attention_row_softmax", "fp16").tiny)
    (plan,) = c.plans.values()
    assert plan.algo == "mma" and plan.get("bind", "rest.point") == "warp"
    rest = c.kernels[1]
    assert isinstance(rest, SimtKernel) and rest.warp and c.launches[1].grid[0][1] == 8
    r, syms = _region("gemm_bias_relu", "fp32")
    p = choose_gpu_plan(r, "sm80", syms)
    for bad in (p.with_(bind={"point": "block"}), replace(p.with_(bind={"point": "warp"}), threads=48)):
        with pytest.raises(KumikoError) as e:
            validate_gpu_plan(bad, r, syms)
        assert e.value.code == "E1801" and "bind.point" in e.value.why


def test_gpu_ir_dump_stage(tmp_path):
    """``kumiko dump --stage gpu_ir``: every kernel's GPU IR as records named by kind (the ring schedule,
    fragments, the SIMT binding, the element code), and the launches; byte-identical across runs."""
    import json

    from kumiko.cli import main
    from kumiko.pipeline import dumps, stage_json
    g = graph("attention_causal", "fp16")
    d = stage_json(g, "gpu_ir")
    assert [k["kind"] for k in d["kernels"]] == ["AttentionKernel"]
    (attn,) = d["kernels"]
    assert [s["kind"] for s in attn["loop"]["body"]] == [
        "WaitGroup", "Barrier", "LoadBlock", "CommitGroup", "ScoreMma", "OnlineSoftmax",
        "WaitGroup", "Barrier", "LoadBlock", "CommitGroup", "PvMma"]
    assert [ln["kernel"] for ln in d["launches"]] == [attn["name"]]
    assert d["launches"][0]["grid"][:2] == [["S", 64], ["B*H", 1]] and len(d["launches"][0]["regions"]) == 2
    rows = stage_json(graph("attention_row_softmax", "fp16"), "gpu_ir")       # no P @ V: the three-launch shape
    qk, rest = rows["kernels"]
    assert [s["kind"] for s in qk["loop"]["body"]] == ["WaitGroup", "Barrier", "LoadTile", "CommitGroup", "Compute"]
    assert rest["kind"] == "SimtKernel" and rest["warp"] is True
    assert [ln["kernel"] for ln in rows["launches"]] == [qk["name"], rest["name"]]
    assert rows["launches"][1]["grid"][0] == ["B*H*M", 8]
    text = dumps(d)
    assert json.loads(text) == d and dumps(stage_json(g, "gpu_ir")) == text
    assert main(["dump", str(EXAMPLES / "gemm_bias_relu.json"), "--stage", "gpu_ir", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "gemm_bias_relu.gpu_ir.json").read_text())["kernels"][0]["kind"] == "SimtKernel"


def test_generated_source_is_deterministic():
    g = graph("attention_causal", "fp16")
    assert compile_cuda(g.tiny).source == compile_cuda(g.tiny).source


@needs_gxx
def test_rasterised_grid_and_paired_stores(gpu_cache):
    """``layout_hints.group_m`` remaps the grid in runs of M tiles (here 2: runs of 2 and 1 for 3 M tiles),
    still writing every output tile once (outputs are poisoned); the fragment epilogue stores column pairs
    with one ``st_global_v2`` where the pair is contiguous and aligned, one store each elsewhere (odd N)."""
    g = graph("gemm_bias_relu", "fp16")
    r, syms = _region("gemm_bias_relu")
    base = choose_gpu_plan(r, "sm80", syms)
    assert base.get("layout_hints", "group_m") == 8 and base.tile == (128, 128, 32)
    plan = base.with_(tile=(64, 64, 32), warp_tile="32x32", stages=3, threads=128,
                      layout_hints={**dict(base.layout_hints), "group_m": 2})
    c = compile_cuda(g.tiny, plans={r.name: plan})
    k = c.kernels[0]
    assert k.group_m == 2 and k.store.width == 2
    assert "kk_rows = min(gridDim.y - kk_first, 2u)" in c.source and "st_global_v2(" in c.source
    for n in (136, 133):
        for emu in ("deferred", "asan"):
            errs = run_and_compare(c, g, emu, 8, {"M": 3 * 64 - 11, "N": n, "K": 40})
            assert max(errs.values()) < 1e-2, (n, emu, errs)
    with pytest.raises(KumikoError) as e:
        validate_gpu_plan(plan.with_(layout_hints={"group_m": 0}), r, syms)
    assert e.value.code == "E1801" and "group_m" in e.value.why


@needs_gxx
def test_k_loop_versions_by_operand_alignment(gpu_cache):
    """The K loop is rendered twice: where every vector operand's rows are 16-byte aligned, a version with
    only cp.async copies (no scalar gather, no alignment test inside); otherwise one that gathers every
    operand element by element. K's partial tile is tile 0 (the tiles start ``kk_kd`` before K = 0), so
    only the prologue's first load tests K and the loop's copies test the row bounds alone. Each version
    is run on the emulator against the evaluator, including the mixed cases (A aligned and B not, and the
    reverse) and M, N, K tails, with ASan (a chunk outside M or K has src-size 0 and an address outside
    the operand, which must not be read)."""
    g = graph("gemm_bias_relu", "fp16")
    c = compile_cuda(g.tiny)
    _, _, rest = c.source.partition("  if (kk_vec_x && kk_vec_y) {")
    aligned, _, general = rest.partition("  } else {  // an operand's rows are not 16-byte aligned")
    assert aligned and general, "both versions are rendered"
    assert "cp_async_16(" in aligned and "kk_v =" not in aligned and "if (kk_vec_" not in aligned
    prologue, _, loop = aligned.partition("for (int kt = 0; kt < KT; ++kt)")
    assert "kk_c0x >= kk_kd" in prologue and "kk_r >= kk_kd" in prologue     # tile 0 zero-fills K < 0
    assert "kk_kd ?" not in loop and ">= kk_kd" not in loop and "kk_K" not in loop
    general = general.split("// epilogue")[0]
    assert "cp_async_16(" not in general and "kk_v = " in general and "kk_gk >= 0" in general
    for sizes in ({"M": 133, "N": 136, "K": 72},       # both aligned, M tail
                  {"M": 64, "N": 133, "K": 72},        # A aligned, B's rows (N) not
                  {"M": 70, "N": 136, "K": 75},        # B aligned, A's rows (K) not
                  {"M": 129, "N": 130, "K": 37}):      # neither
        for emu in ("deferred", "asan"):
            errs = run_and_compare(c, g, emu, 11, sizes)
            assert max(errs.values()) < 1e-2, (sizes, emu, errs)


@needs_gxx
def test_gathered_operands_go_by_rows(gpu_cache):
    """A gathered operand whose ring rows are its M/N (``sk``) is filled by rows: each thread owns one row of
    the tile (its M indices decomposed once per loop version, before the prologue: for the implicit GEMM's
    im2col, the 64-bit divisions by run-time sizes leave the K loop) and a run of its columns, eight columns
    to one 16-byte shared store. Past tile 0 the K indices advance as a counter; tile 0 (K's partial tile)
    decomposes each column and skips those before K = 0. An operand read K-major (``ks``) keeps the
    element-per-thread gather. Run against the evaluator: K inside one tile, K with a partial tile, M tails,
    in the three emulator configurations."""
    g = graph("conv3x3_s2_p1", "fp16")
    c = compile_cuda(g.tiny)
    _, _, aligned = c.source.partition("  if (kk_vec_y && kk_fit_x) {")
    aligned, _, general = aligned.partition("  } else {  // an operand's rows are not 16-byte aligned, or a gather "
                                            "needs 64 bits")
    # the version with int32 arithmetic: x goes through its per-warp K tables (tests/gpu/test_gather_table.py)
    setup, _, loads = aligned.partition("if (0 < KT) {")
    assert "x gathered by rows" in setup and "x through per-warp K tables" in setup
    assert "const long long i0 = " in setup and "const long long i0 = " not in loads
    tile0, _, rest = loads.partition("cp_async_commit();")
    assert "kk_k0 + kk_gcx + kk_j + kk_e >= 0" in tile0 and "kk_k0 + kk_gcx + kk_j + kk_e >= 0" not in rest
    assert "st_shared_16(kk_row + kk_j" in aligned and "for (int kk_i = tid;" not in aligned
    # the 64-bit version: both operands gathered, x by rows
    setup, _, loads = general.split("// epilogue")[0].partition("if (0 < KT) {")
    assert "x gathered by rows" in setup and "const long long i0 = " in setup       # once, before the loads
    tile0, _, rest = loads.partition("cp_async_commit();")
    assert "kk_gk >= 0" in tile0 and "r2 = (kk_gk) % 3LL" in tile0 and "++r2" not in tile0
    assert "if (++r2 == 3LL) { r2 = 0; if (++r1 == 3LL) { r1 = 0; ++r0; } }" in rest and "kk_gk >= 0" not in rest
    # counters below a constant size (kh, kw) are ints; the one over C (a run-time size) stays 64-bit
    assert "int r2 = (kk_gk) % 3LL;" in rest and "int r1 = " in rest and "long long r0 = " in rest
    assert "st_shared_16(kk_row + kk_j" in general
    assert "const long long i0 = " not in rest                                      # not per element or tile
    gemm = compile_cuda(graph("gemm_bias_relu", "fp16").tiny).source
    general = gemm.partition("  } else {  // an operand's rows are not 16-byte aligned")[2].split("// epilogue")[0]
    assert "x gathered by rows" in general and "for (int kk_i = tid;" in general   # B[k, n] is ks: per element
    for sizes in ({"N": 1, "C": 3, "H": 9, "W": 7, "Co": 8},          # K = 27: one partial tile
                  {"N": 2, "C": 11, "H": 17, "W": 23, "Co": 40}):     # K = 99, M = 216
        for emu in ("deferred", "eager", "asan"):
            errs = run_and_compare(c, g, emu, 12, sizes)
            assert max(errs.values()) < 1e-2, (sizes, emu, errs)


@needs_gxx
def test_interior_tiles_store_without_bound_tests(gpu_cache):
    """A CTA whose tile lies inside M and N runs the fragment epilogue without bound tests; the others keep
    them. The plain fp16 GEMM (its cast to fp16 is stored as is, not rounded twice) at sizes with interior,
    edge and corner tiles, odd N (pairs misaligned on every other row) among them, against the evaluator."""
    a, b = Tensor.input("A", ("M", "K"), dtype="fp16"), Tensor.input("B", ("K", "N"), dtype="fp16")
    g = (a @ b).graph("y", name="gemm")
    c = compile_cuda(g.tiny)
    assert c.kernels[0].tile[:2] == (128, 128)
    epi = c.source.split("// epilogue")[1]
    interior, _, edge = epi.partition("  } else {")
    assert "if (m0 + 128 <= kk_M && n0 + 128 <= kk_N) {  // an interior tile" in interior
    assert "kk_ok[kk_h] = true;" in interior and "kk_gm < kk_M && kk_gn < kk_N" in edge
    assert "kk_sv0[kk_h] = kk_f2h((float)(kk_acc));" in interior       # no kk_f2h(kk_h2f(...)) round trip
    for sizes in ({"M": 300, "N": 264, "K": 40}, {"M": 260, "N": 259, "K": 24}):
        for emu in ("deferred", "asan"):
            errs = run_and_compare(c, g, emu, 13, sizes)
            assert max(errs.values()) < 1e-2, (sizes, emu, errs)
