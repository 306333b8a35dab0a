#!/usr/bin/env python3
"""kumiko's ``cuda`` target against PyTorch (cuBLAS, SDPA) on the same GPU.

Workloads in fp16 (fp32 accumulation): GEMM 4096^3 and 8192^3 (torch.matmul = cuBLAS), GEMM + bias + ReLU
4096^3 (torch.addmm + relu), attention and causal attention B=8 H=16 S=2048 D=64
(torch.nn.functional.scaled_dot_product_attention), and the memory-bound row ops softmax and layernorm over
the last axis of 8192 x 8192 (torch.softmax, torch.nn.functional.layer_norm). Every runner gets the same
random inputs (never zeros), already on the device; kumiko's output, from a full poisoned run, is checked
against torch's (relative L2 < 1e-2). Times are GPU times by CUDA events on the default stream (kumiko: its launches
only; inputs stay on the device, no poisoning), median and min of --reps runs (>= 10) after --warmup runs.
The ratio is kumiko's median over torch's (> 1: kumiko slower); "% of torch" is its inverse. The issue's
goal for the SM80-path GEMM on an H100 is >= 60% of cuBLAS.

    python bench/bench_gpu.py                          # everything; appends a section to bench/RESULTS.md
    python bench/bench_gpu.py --quick                  # small sizes, nothing appended (a smoke run)
    python bench/bench_gpu.py --workloads gemm-4096,attn --reps 20 --json out.json
    python bench/bench_gpu.py --workloads gemm --tiles 128x256x32/64x64/3,64x64x32/32x32/3   # a tile sweep
    python bench/bench_gpu.py --workloads attn --cuda-graph   # kumiko's launches replayed as one CUDA Graph

Without a GPU (no cuda-bindings, driver or device) it says so and exits 0; without torch it times kumiko only.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))       # run from a checkout without installing

import kumiko  # noqa: E402
from kumiko import Tensor  # noqa: E402
from kumiko.accuracy import bound, rel_l2  # noqa: E402
from kumiko.diagnostics import KumikoError  # noqa: E402
from kumiko.plan.gpu import (  # noqa: E402
    FUSED,  # noqa: E402
    RELEASES,
    STREAMING,
    describe_gpu_plan,
    mma_threads,
)
from kumiko.runtime.cuda_driver import CudaDevice, device_available  # noqa: E402

_spec = importlib.util.spec_from_file_location("kumiko_bench_cpu", HERE / "bench.py")
cpu_bench = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_bench)        # the CPU bench's helpers: _commit, _fmt
_fmt = cpu_bench._fmt
REL_L2_LIMIT = bound("fp16")


@dataclass
class Workload:
    key: str
    title: str
    sizes: dict
    quick: dict
    graph: Callable[[dict], "kumiko.Graph"]
    torch: Callable                          # (torch, inputs on the device, sizes) -> tensor
    flops: Callable[[dict], float]


def _gemm(bias_relu: bool):
    def build(sz):
        a, b = Tensor.input("A", ("M", "K"), dtype="fp16"), Tensor.input("B", ("K", "N"), dtype="fp16")
        y = a @ b
        if bias_relu:
            y = (y + Tensor.input("bias", ("N",), dtype="fp16")).relu()
        return y.graph("y", name="gemm_bias_relu" if bias_relu else "gemm")
    return build


def _attn(causal: bool):
    def build(sz):
        q, k, v = (Tensor.input(n, ("B", "H", "S", sz["D"]), dtype="fp16") for n in ("Q", "K", "V"))
        y = q.scaled_dot_product_attention(k, v, is_causal=causal, scale=1.0 / math.sqrt(sz["D"]))
        return y.graph("y", name="attention_causal" if causal else "attention")
    return build


def _torch_attn(causal):
    return lambda t, i, sz: t.nn.functional.scaled_dot_product_attention(i["Q"], i["K"], i["V"], is_causal=causal,
                                                                         scale=1.0 / math.sqrt(sz["D"]))


def _conv(fixed: bool = False):
    """An fp16 3x3 convolution, stride 1, padding 1, NCHW (a ResNet stage's body): an implicit GEMM whose im2col
    operand is gathered through the region's index map. ``fixed``: at constant sizes, with bias + ReLU (what an
    imported network holds, so the plan chooser sees them: a batch-1 ResNet stage's few output tiles over a long K
    get split-K)."""
    def build(sz):
        x = Tensor.input("X", (sz["N"], sz["C"], sz["H"], sz["W"]) if fixed else ("N", sz["C"], "H", "W"),
                         dtype="fp16")
        w = Tensor.input("Wt", (sz["Co"], sz["C"], 3, 3), dtype="fp16")
        if not fixed:
            return x.conv2d(w, padding=1).graph("y", name="conv3x3")
        b = Tensor.input("b", (sz["Co"],), dtype="fp16")
        return x.conv2d(w, b, padding=1).relu().graph("y", name="conv3x3_bias_relu")
    return build


def _linear(sz):
    """``x @ W + b`` at constant sizes (a transformer projection at a few tokens)."""
    x = Tensor.input("x", (sz["M"], sz["K"]), dtype="fp16")
    w = Tensor.input("W", (sz["K"], sz["N"]), dtype="fp16")
    return (x @ w + Tensor.input("b", (sz["N"],), dtype="fp16")).graph("y", name="linear")


def _conv_flops(sz):
    return 2.0 * sz["N"] * sz["Co"] * sz["H"] * sz["W"] * sz["C"] * 9


def _gemm_flops(sz):
    return 2.0 * sz["M"] * sz["N"] * sz["K"]


def _attn_flops(sz):                        # QK^T and PV; causal counts the full square, as bench.py does
    return 4.0 * sz["B"] * sz["H"] * sz["S"] * sz["S"] * sz["D"]


def _rows(op: str):
    """A row-wise op over the last axis of an fp16 [M, N] tensor (the SIMT skeleton, a warp per row)."""
    def build(sz):
        x = Tensor.input("x", ("M", "N"), dtype="fp16")
        return (x.softmax(-1) if op == "softmax" else x.layernorm(-1)).graph("y", name=op)
    return build


def _torch_rows(op: str):
    if op == "softmax":
        return lambda t, i, sz: t.softmax(i["x"], -1)
    return lambda t, i, sz: t.nn.functional.layer_norm(i["x"], (sz["N"],), eps=1e-5)


def _rows_flops(sz):                        # memory-bound: ~5 operations an element; compare the times
    return 5.0 * sz["M"] * sz["N"]


ATTN = {"B": 8, "H": 16, "S": 2048, "D": 64}
ATTN_QUICK = {"B": 1, "H": 2, "S": 128, "D": 64}
ATTN_128 = {"B": 4, "H": 16, "S": 4096, "D": 128}         # issue 24's attention workload
ATTN_QUICK_128 = {"B": 1, "H": 2, "S": 128, "D": 128}
WORKLOADS = {w.key: w for w in [
    Workload("gemm-4096", "fp16 GEMM 4096^3", {"M": 4096, "N": 4096, "K": 4096}, {"M": 256, "N": 256, "K": 256},
             _gemm(False), lambda t, i, sz: t.matmul(i["A"], i["B"]), _gemm_flops),
    Workload("gemm-8192", "fp16 GEMM 8192^3", {"M": 8192, "N": 8192, "K": 8192}, {"M": 512, "N": 384, "K": 256},
             _gemm(False), lambda t, i, sz: t.matmul(i["A"], i["B"]), _gemm_flops),
    Workload("gemm_bias_relu-4096", "fp16 GEMM + bias + ReLU 4096^3", {"M": 4096, "N": 4096, "K": 4096},
             {"M": 200, "N": 136, "K": 200}, _gemm(True),
             lambda t, i, sz: t.relu(t.addmm(i["bias"], i["A"], i["B"])), _gemm_flops),
    Workload("attn", "fp16 attention B=8 H=16 S=2048 D=64", ATTN, ATTN_QUICK, _attn(False), _torch_attn(False),
             _attn_flops),
    Workload("attn-causal", "fp16 causal attention B=8 H=16 S=2048 D=64", ATTN, ATTN_QUICK, _attn(True),
             _torch_attn(True), _attn_flops),
    Workload("conv3x3", "fp16 conv 3x3 s1 p1 N=32 C=128 H=W=56 Co=128 (implicit GEMM)",
             {"N": 32, "C": 128, "H": 56, "W": 56, "Co": 128}, {"N": 2, "C": 8, "H": 9, "W": 7, "Co": 24}, _conv(),
             lambda t, i, sz: t.nn.functional.conv2d(i["X"], i["Wt"], padding=1), _conv_flops),
    Workload("attn-d128", "fp16 attention B=4 H=16 S=4096 D=128", ATTN_128, ATTN_QUICK_128, _attn(False),
             _torch_attn(False), _attn_flops),
    Workload("attn-d128-causal", "fp16 causal attention B=4 H=16 S=4096 D=128", ATTN_128, ATTN_QUICK_128, _attn(True),
             _torch_attn(True), _attn_flops),
    Workload("conv3x3-s4b1", "fp16 conv 3x3 + bias + ReLU N=1 C=512 H=W=7 Co=512 (ResNet-50 stage 4, batch 1)",
             {"N": 1, "C": 512, "H": 7, "W": 7, "Co": 512}, {"N": 1, "C": 64, "H": 7, "W": 7, "Co": 64},
             _conv(fixed=True),
             lambda t, i, sz: t.relu(t.nn.functional.conv2d(i["X"], i["Wt"], i["b"], padding=1)), _conv_flops),
    *(Workload(key, f"fp16 Linear 128 x {k} -> {n} + bias ({what} at 128 tokens)", {"M": 128, "K": k, "N": n},
               {"M": 16, "K": 256, "N": 64}, _linear, lambda t, i, sz: t.addmm(i["b"], i["x"], i["W"]), _gemm_flops)
      for key, k, n, what in (("linear-128", 3072, 768, "BERT-base FFN out"),
                              ("linear-128-768", 768, 768, "BERT-base attention output"),
                              ("linear-128-qkv", 768, 2304, "GPT-2 small QKV projection"))),
    Workload("softmax-8192", "fp16 softmax over the last axis, 8192 x 8192 (memory-bound)", {"M": 8192, "N": 8192},
             {"M": 64, "N": 1000}, _rows("softmax"), _torch_rows("softmax"), _rows_flops),
    Workload("layernorm-8192", "fp16 layernorm over the last axis, 8192 x 8192 (memory-bound)",
             {"M": 8192, "N": 8192}, {"M": 64, "N": 1000}, _rows("layernorm"), _torch_rows("layernorm"),
             _rows_flops),
]}


@dataclass
class Row:
    workload: str
    runner: str
    median_ms: float | None = None
    min_ms: float | None = None
    tflops: float | None = None
    ratio: float | None = None               # kumiko median / torch median
    rel_l2: float | None = None
    note: str = ""


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _timer(dev: CudaDevice, torch):
    """CUDA-event timing on the default stream for both runners (torch's current stream must be it)."""
    if torch is not None and torch.cuda.current_stream().cuda_stream != 0:
        raise SystemExit("torch's current stream is not the default stream; run without CUDA_API_PER_THREAD_DEFAULT_"
                         "STREAM so both runners are timed on the same stream")
    return lambda fn, reps, warmup: dev.time_ms(fn, reps=reps, warmup=warmup)


TILE_SPEC = ("BMxBNxBK/WMxWN/STAGES[/gGROUP_M][/sSPLIT_K][/registers|/merged|/trailing] "
             "(e.g. 128x128x32/64x64/4/g8/registers; a tile without /s keeps the plan's split_k)")


def parse_tile(spec: str) -> dict:
    """``BMxBNxBK/WMxWN/S`` with optional ``/gN`` (CTA runs of N M tiles: layout_hints.group_m), ``/sN`` (split-K
    over N CTAs a tile: split_k) and
    ``/registers``, ``/merged`` or ``/trailing`` (async.release) -> the MMA plan fields it sets (the plan's other
    layout hints and async fields are kept by the caller)."""
    try:
        tile, warp, stages, *rest = spec.split("/")
        bm, bn, bk = (int(x) for x in tile.split("x"))
        wm, wn = (int(x) for x in warp.split("x"))
        out = {"tile": (bm, bn, bk), "warp_tile": f"{wm}x{wn}", "stages": int(stages),
               "threads": mma_threads((bm, bn), f"{wm}x{wn}")}
        for r in rest:
            if r in RELEASES:
                out["release"] = r
            elif r.startswith("g"):
                out["group_m"] = int(r[1:])
            elif r.startswith("s"):
                out["split_k"] = int(r[1:])
            else:
                raise ValueError(r)
        return out
    except ValueError:
        raise SystemExit(f"--tiles: {spec!r} is not {TILE_SPEC}") from None


WG_SPEC = ("wg:BMxBN/STAGES[/f0|/f1][/p][/sN] (e.g. wg:128x256/3/f1/p: an sm90 plan, f = wgmma groups in flight, "
           "p = persistent, s = split-K over N CTAs a tile)")


def parse_wgmma_tile(spec: str) -> dict:
    """``wg:BMxBN/STAGES[/fN][/p][/sN]`` -> the sm90 plan fields it sets (``in_flight`` None: the plan's own)."""
    try:
        tile, stages, *rest = spec[3:].split("/")
        bm, bn = (int(x) for x in tile.split("x"))
        out = {"bm": bm, "bn": bn, "stages": int(stages), "in_flight": None, "persistent": False, "split": 1}
        for r in rest:
            if r == "p":
                out["persistent"] = True
            elif r.startswith("s"):
                out["split"] = int(r[1:])
            elif r.startswith("f"):
                out["in_flight"] = int(r[1:])
            else:
                raise ValueError(r)
        return out
    except ValueError:
        raise SystemExit(f"--tiles: {spec!r} is not {WG_SPEC}") from None


def apply_wgmma_tile(plan, spec: str):
    """An sm90 (wgmma) plan with ``wg:BMxBN/STAGES[/fN][/p][/sN]``'s tile, ring depth, wgmma groups in flight,
    persistence and split-K."""
    f = parse_wgmma_tile(spec)
    asy = {**dict(plan.async_), "prefetch_depth": f["stages"], "epilogue_overlap": f["persistent"]}
    if f["in_flight"] is not None:
        asy["wgmma_in_flight"] = f["in_flight"]
    cache = tuple({**dict(c), "stages": f["stages"]} for c in plan.cache)
    return plan.with_(tile=(f["bm"], f["bn"], plan.tile[2]), stages=f["stages"], warp_tile=f"64x{f['bn']}",
                      threads=128 * (1 + f["bm"] // 64), async_=asy, cache=cache, split_k=f["split"])


AT_SPEC = ("at:BMxBN[/nopp] (e.g. at:128x64: the streaming attention kernel's query rows and keys a block; /nopp: "
           "the SM90 kernel's two consumer warpgroups without ping-pong)")


def parse_attention_tile(spec: str) -> tuple[int, int, bool]:
    body, _, flag = spec[3:].partition("/")
    try:
        bm, bn = (int(x) for x in body.split("x"))
    except ValueError:
        raise SystemExit(f"--tiles: {spec!r} is not {AT_SPEC}") from None
    if flag not in ("", "nopp"):
        raise SystemExit(f"--tiles: {spec!r} is not {AT_SPEC}")
    return bm, bn, flag != "nopp"


def apply_tile(plan, spec: str):
    """The plan with the tile spec's fields replaced (an sm90 plan's with a ``wg:`` spec, the streaming attention
    plan's with ``at:``)."""
    if spec.startswith("wg:"):
        return apply_wgmma_tile(plan, spec)
    if spec.startswith("at:"):
        bm, bn, pingpong = parse_attention_tile(spec)
        if plan.barrier_model == "mbarrier":        # the SM90 kernel: a consumer warpgroup per 64 rows
            return plan.with_(tile=(bm, bn, plan.tile[2]), threads=128 * (1 + bm // 64),
                              async_={**dict(plan.async_), "pingpong": pingpong})
        return plan.with_(tile=(bm, bn, plan.tile[2]), threads=bm // 16 * 32, warp_tile=f"16x{bn}")
    f = parse_tile(spec)
    hints, asy = dict(plan.layout_hints), dict(plan.async_)
    if "group_m" in f:
        hints["group_m"] = f.pop("group_m")
    if "release" in f:
        asy["release"] = f.pop("release")
    asy["prefetch_depth"] = f["stages"] - 1
    return plan.with_(layout_hints=hints, async_=asy, **f)


def time_kumiko(wl: Workload, exe, inputs: dict, sz: dict, args, timer, runner: str) -> tuple[Row, np.ndarray]:
    """One full poisoned run (its output is checked by the caller), then the launches alone, timed."""
    out = exe(**inputs)["y"]
    prog = exe._run.runner()
    b = prog.bind(exe.bind(inputs))
    prog.upload(b, inputs)
    ms = timer(lambda: prog.enqueue(b), args.reps, args.warmup)
    plans = "; ".join(f"{p.algo} {describe_gpu_plan(p)}" for p in exe._run.plans.values())
    graph = ", one CUDA Graph" if prog.graph else ""
    k = Row(wl.key, runner, statistics.median(ms), min(ms),
            note=f"{len(b.launches)} kernels ({plans}), {exe._run.plan_arch} plans, {exe._run.gpu_arch}{graph}")
    k.tflops = wl.flops(sz) / (k.median_ms * 1e-3) / 1e12
    prog.release()
    return k, out


def tile_variants(wl: Workload, sz: dict, args, inputs: dict, timer, chosen) -> list[tuple[Row, np.ndarray]]:
    """--tiles: the workload again under each given MMA tile (every MMA region of the ``chosen`` plans gets
    it); a tile the plan validator, the GPU IR verifier or ptxas rejects is reported as such and skipped."""
    got = []
    graph = wl.graph(sz)
    for spec in args.tiles:
        algo = "wgmma" if spec.startswith("wg:") else STREAMING if spec.startswith("at:") else "mma"
        plans = {name: apply_tile(p, spec) for name, p in chosen.items() if p.algo == algo}
        if plans and algo == STREAMING:     # the pair's consumer plan goes with it
            plans = {**{name: p for name, p in chosen.items() if p.algo == FUSED}, **plans}
        if not plans:
            print(f"  tile {spec}: no {algo} region in the chosen plans")
            continue
        try:
            exe = kumiko.compile(graph, "cuda", plans=plans, cuda_graph=args.cuda_graph)
            got.append(time_kumiko(wl, exe, inputs, sz, args, timer, f"kumiko[cuda] {spec}"))
        except KumikoError as e:
            print(f"  tile {spec}: rejected: {e.code} {e.why}")
    return got


def bench_workload(wl: Workload, args, dev: CudaDevice, torch) -> list[Row]:
    sz = wl.quick if args.quick else wl.sizes
    print(f"\n{wl.key}: {wl.title}{' (quick sizes ' + str(sz) + ')' if args.quick else ''}")
    first, *others = args.archs or [None]
    exe = kumiko.compile(wl.graph(sz), "cuda", cuda_graph=args.cuda_graph, arch=first)
    inputs = exe.random_inputs(args.seed, sz)
    timer = _timer(dev, torch)
    k, out = time_kumiko(wl, exe, inputs, sz, args, timer, "kumiko[cuda]")
    variants = tile_variants(wl, sz, args, inputs, timer, exe._run.plans) if args.tiles else []
    for arch in others:           # --archs: the same workload under other plan archs (sm80's mma.sync on Hopper)
        other = kumiko.compile(wl.graph(sz), "cuda", cuda_graph=args.cuda_graph, arch=arch)
        variants.append(time_kumiko(wl, other, inputs, sz, args, timer, f"kumiko[cuda {arch}]"))
    rows = [k] + [r for r, _ in variants]
    if torch is not None:
        dt = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32}
        tin = {n: torch.from_numpy(v.astype(np.float32)).to("cuda", dt[v.dtype]) for n, v in inputs.items()}
        ref = wl.torch(torch, tin, sz)
        torch.cuda.synchronize()
        tms = timer(lambda: wl.torch(torch, tin, sz), args.reps, args.warmup)
        t = Row(wl.key, "torch", statistics.median(tms), min(tms), note=f"torch {torch.__version__}")
        t.tflops = wl.flops(sz) / (t.median_ms * 1e-3) / 1e12
        want = ref.float().cpu().numpy()
        for r, o in [(k, out)] + variants:
            r.rel_l2 = rel_l2(o.astype(np.float32), want)
            r.ratio = r.median_ms / t.median_ms
        t.ratio, t.rel_l2 = 1.0, 0.0
        rows.append(t)
        del tin, ref
        torch.cuda.empty_cache()
    for r in rows:
        mine = r.runner.startswith("kumiko")
        print(f"  {r.runner:36s} median {r.median_ms:9.3f} ms  min {r.min_ms:9.3f} ms  {r.tflops:8.2f} TFLOP/s"
              + (f"  kumiko/torch {r.ratio:.2f} ({100 / r.ratio:.0f}% of torch)" if mine and r.ratio else "")
              + (f"  rel L2 {r.rel_l2:.1e}" if mine and r.rel_l2 is not None else ""))
    return rows


def machine(dev: CudaDevice, torch) -> dict:
    from kumiko.runtime.cubin import find_nvcc, nvcc_version
    d = dev.describe()
    return {"gpu": d["name"], "cc": d["cc"], "sm_count": d["sm_count"], "memory_gib": round(d["total_mem"] / 2**30, 1),
            "driver_cuda": d["driver"], "nvcc": nvcc_version(find_nvcc()).split("|")[0].strip(),
            "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__ if torch is not None else None,
            "cpu": platform.processor() or platform.machine(),
            "kumiko_commit": cpu_bench._commit()}


def results_markdown(rows: list[Row], args, m: dict) -> str:
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"## {when}: target `cuda` (bench/bench_gpu.py){' (quick sizes)' if args.quick else ''}", "",
             f"- machine: {m['gpu']} (compute capability {m['cc']}, {m['sm_count']} SMs, {m['memory_gib']} GiB), "
             f"driver CUDA {m['driver_cuda']}, {m['nvcc']}; python {m['python']}, numpy {m['numpy']}, torch "
             f"{m['torch']}; kumiko {m['kumiko_commit']}",
             f"- command: `python bench/bench_gpu.py {' '.join(args.argv)}`",
             f"- GPU time by CUDA events on the default stream, median and min of {args.reps} runs after "
             f"{args.warmup} warm-up; kumiko times its launches only (inputs on the device, no poisoning); ratio = "
             f"kumiko's median / torch's (> 1: kumiko slower); rel L2 of kumiko's output (a full, poisoned run) "
             f"against torch's (limit {REL_L2_LIMIT}); causal attention counts the full square", "",
             "| workload | runner | median ms | min ms | TFLOP/s | kumiko/torch | % of torch | rel L2 | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        pct = "-" if not r.ratio or not r.runner.startswith("kumiko") else f"{100 / r.ratio:.0f}%"
        l2 = "-" if r.rel_l2 is None else "ref" if r.runner == "torch" else \
            f"{r.rel_l2:.1e}{'' if r.rel_l2 < REL_L2_LIMIT else ' FAIL'}"
        lines.append(f"| {r.workload} | {r.runner} | {_fmt(r.median_ms)} | {_fmt(r.min_ms)} | "
                     f"{_fmt(r.tflops, '{:.1f}')} | {_fmt(r.ratio if r.runner != 'torch' else None, '{:.2f}')} | "
                     f"{pct} | {l2} | {r.note} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", default="all", help=f"comma-separated keys or prefixes ({', '.join(WORKLOADS)})")
    p.add_argument("--reps", type=int, default=20, help="timed runs per runner (default 20, at least 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the whole path")
    p.add_argument("--no-torch", action="store_true", help="time kumiko only")
    p.add_argument("--cuda-graph", action="store_true", help="kumiko replays its launches as one CUDA Graph")
    p.add_argument("--archs", type=lambda v: [a for a in v.split(",") if a], default=[],
                   help="plan archs to time, comma-separated, the first in the main row (default: the device's; "
                   "e.g. sm90,sm80 on Hopper times the wgmma skeleton and the mma.sync one side by side)")
    p.add_argument("--tiles", default="", help="also time each workload under these MMA tiles, comma-separated\n"
                   f"{TILE_SPEC}, or {WG_SPEC}, or {AT_SPEC}: a tile sweep")
    p.add_argument("--append", dest="append", action="store_true", default=None,
                   help="append to the results file (default for full runs)")
    p.add_argument("--no-append", dest="append", action="store_false", help="do not append (default for --quick)")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    args.argv = argv
    if args.reps < 10 and not args.quick:
        p.error("--reps must be >= 10 (medians of fewer runs are noise)")
    args.tiles = [t for t in args.tiles.split(",") if t]
    for t in args.tiles:
        parse_wgmma_tile(t) if t.startswith("wg:") else parse_attention_tile(t) if t.startswith("at:") else \
            parse_tile(t)
    if args.append is None:
        args.append = not args.quick
    return args


def select(spec: str) -> list[Workload]:
    return cpu_bench.select(spec, WORKLOADS)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    ok, why = device_available()
    if not ok:
        print(f"bench_gpu: no GPU for the cuda target ({why}); nothing measured.")
        return 0
    dev = CudaDevice.get(0)
    torch = None if args.no_torch else _torch()
    if torch is None and not args.no_torch:
        print("bench_gpu: torch with CUDA is not available; timing kumiko only")
    m = machine(dev, torch)
    print(f"machine: {m}")
    rows: list[Row] = []
    failed = []
    for wl in select(args.workloads):
        try:
            rows += bench_workload(wl, args, dev, torch)
        except KumikoError as e:            # the other workloads are still measured (and recorded)
            print(e.render(), file=sys.stderr)
            failed.append(wl.key)
            if e.details.get("sticky"):     # a fault: this process's CUDA context is gone
                break
    if failed:
        print(f"bench_gpu: failed: {', '.join(failed)}", file=sys.stderr)
    if args.append and rows:
        with Path(args.results).open("a") as f:
            f.write("\n" + results_markdown(rows, args, m))
        print(f"\nappended to {args.results}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": m, "rows": [r.__dict__ for r in rows]}, indent=2))
    bad = [r for r in rows if r.rel_l2 is not None and r.rel_l2 >= REL_L2_LIMIT]
    return 2 if failed else 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
