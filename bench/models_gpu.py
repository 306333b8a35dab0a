#!/usr/bin/env python3
"""Whole networks on the ``cuda`` target against PyTorch (cuDNN, cuBLAS) on the same GPU: ResNet-50, MobileNetV2,
BERT-base and GPT-2 small (``bench/netdefs.py``), in fp16 (tensor cores) or fp32.

Each model is built in torch with seeded random weights and exported to ONNX (``models.py``'s cache), imported
with ``kumiko.from_onnx``, retyped to the chosen float dtype (``Graph.with_float_dtype``: weights included) and
compiled for ``cuda`` (timed: the compile is cold in a fresh cache directory unless ``--cache-dir`` is given).
kumiko's launches are timed alone with CUDA events after one full poisoned run, the weights bound on the device
once (a whole ``exe(...)`` call, which copies them in each time, is timed too); PyTorch eager runs the same model
(``.half()`` for fp16) on the same inputs under ``torch.no_grad``. Both outputs are checked against PyTorch in
fp32 on the GPU (relative L2; fp16 through 50 layers is good to about 1e-2).

    python bench/models_gpu.py                                   # the four models, batch 1, fp16
    python bench/models_gpu.py --models resnet50 --batch 1,8 --archs sm90,sm80
    python bench/models_gpu.py --small --no-append --reps 5      # smoke run: 64x64 images, 2 layers

Without a GPU it says so and exits 0. Results are appended to bench/RESULTS.md (--no-append: not).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import netdefs  # noqa: E402

import kumiko  # noqa: E402
from kumiko.accuracy import rel_l2  # noqa: E402
from kumiko.plan.gpu import describe_gpu_plan  # noqa: E402
from kumiko.runtime.cuda_driver import CudaDevice, device_available  # noqa: E402


@dataclass
class Row:
    model: str
    batch: int
    runner: str
    median_ms: float | None = None
    min_ms: float | None = None
    ratio: float | None = None               # / torch eager (same dtype)
    rel_l2: float | None = None              # against torch fp32
    compile_s: float | None = None
    call_ms: float | None = None             # kumiko: one whole exe(...) call, host copies included
    note: str = ""


def _onnx(name: str, batch: int, args) -> Path:
    """The exported model (``models.py``'s cache naming, so both benches share the files)."""
    import models
    path = models._onnx_path(name, batch, args)
    if not path.exists():
        print(f"  exporting {name} b{batch} to ONNX", flush=True)
        netdefs.export_onnx(name, batch, path, args.seed, small=args.small, layers=args.layers)
    return path


def _feeds(name: str, batch: int, args, dtype: str) -> dict[str, np.ndarray]:
    feeds = netdefs.inputs(name, batch, args.seed, args.small)
    np_dt = {"fp16": np.float16, "fp32": np.float32}[dtype]
    return {k: v.astype(np_dt) if v.dtype.kind == "f" else v for k, v in feeds.items()}


def kernel_profile(exe, prog, b, dev: CudaDevice, top: int) -> list[tuple]:
    """Each launch of one run timed alone by CUDA events (median of 5): the ``top`` slowest as (ms, kernel, grid,
    plan), and the sum of all."""
    plans = exe._run.plans
    region_of = {ln.kernel: ln.region for ln in exe._run.launches}
    rows = []
    for ln in b.launches:
        ms = statistics.median(dev.time_ms(lambda ln=ln: dev.launch(ln.fn, ln.kernel, ln.grid, ln.block, ln.smem,
                                                                     ln.argv), reps=5, warmup=1))
        p = plans.get(region_of.get(ln.kernel))
        rows.append((ms, ln.kernel, ln.grid, f"{p.algo} {describe_gpu_plan(p)}" if p is not None else ""))
    total = sum(r[0] for r in rows)
    print(f"    per kernel (alone, CUDA events): {len(rows)} launches, {total:.3f} ms in all; the slowest:")
    for ms, k, grid, plan in sorted(rows, reverse=True)[:top]:
        print(f"      {ms:7.3f} ms  {k:28s} grid {list(grid)}  {plan}")
    return rows


def kumiko_rows(name: str, batch: int, args, dev: CudaDevice, timer, feeds: dict, want: np.ndarray) -> list[Row]:
    g = kumiko.from_onnx(str(_onnx(name, batch, args)))
    if args.dtype != "fp32":
        g = g.with_float_dtype(args.dtype)
    rows = []
    for i, arch in enumerate(args.archs or [None]):
        runner = "kumiko[cuda]" + (f" {arch}" if arch else "")
        row = Row(name, batch, runner)
        rows.append(row)
        try:
            t0 = time.perf_counter()
            exe = kumiko.compile(g, "cuda", arch=arch)
            row.compile_s = time.perf_counter() - t0
            out = exe(**feeds)[exe.output_names[0]]
            calls = []
            for _ in range(3):                  # a whole call: the inputs copied in, the output out
                t0 = time.perf_counter()
                exe(**feeds)
                calls.append((time.perf_counter() - t0) * 1e3)
            row.call_ms = statistics.median(calls)
            prog = exe._run.runner()
            full = {**exe.params, **{k: exe._narrow(k, v) for k, v in feeds.items()}}   # token ids as i32
            b = prog.bind(exe.bind(full))
            prog.upload(b, full)
            ms = timer(lambda p=prog, bound=b: p.enqueue(bound), args.reps, args.warmup)
            row.median_ms, row.min_ms = statistics.median(ms), min(ms)
            row.rel_l2 = rel_l2(np.asarray(out, np.float32), want)
            algos = Counter(p.algo for p in exe._run.plans.values())
            row.note = (f"{len(b.launches)} launches, plans {dict(algos)}, {exe._run.plan_arch} plans, "
                        f"{exe._run.gpu_arch}")
            if args.profile and i == 0:
                kernel_profile(exe, prog, b, dev, args.profile)
            if args.cuda_graph and i == 0:      # the same launches captured once as a CUDA Graph and replayed
                grow = Row(name, batch, runner + " graph", note=row.note + ", one CUDA Graph a run")
                rows.append(grow)
                prog.graph = True
                ms = timer(lambda p=prog, bound=b: p.enqueue(bound), args.reps, args.warmup)
                grow.median_ms, grow.min_ms = statistics.median(ms), min(ms)
                prog.fill_poison(b)
                prog.enqueue(b)
                prog.wait(b)
                grow.rel_l2 = rel_l2(np.asarray(prog.download(b)[exe.output_names[0]], np.float32), want)
            prog.release()
        except Exception as e:  # noqa: BLE001 - a failing model is reported, the others still run
            if args.verbose:
                traceback.print_exc()
            row.note = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return rows


def torch_rows(name: str, batch: int, args, timer, torch, feeds: dict) -> tuple[list[Row], np.ndarray]:
    """PyTorch eager in ``args.dtype``, and its fp32 output (the reference)."""
    model = netdefs.build(name, args.seed, args.small, args.layers).cuda().eval()
    raw = netdefs.inputs(name, batch, args.seed, args.small)
    t32 = [torch.from_numpy(v).cuda() for v in raw.values()]
    with torch.no_grad():
        want = model(*t32).float().cpu().numpy()
    rows = []
    if args.dtype == "fp16":
        model = model.half()
    tin = [torch.from_numpy(v).cuda() for v in feeds.values()]
    with torch.no_grad():
        out = model(*tin)
        torch.cuda.synchronize()

        def run():
            return model(*tin)
        ms = timer(run, args.reps, args.warmup)
    r = Row(name, batch, "torch", statistics.median(ms), min(ms), 1.0, rel_l2(out.float().cpu().numpy(), want),
            note=f"torch {torch.__version__} eager, {args.dtype}")
    rows.append(r)
    if args.cuda_graph:                 # PyTorch's forward captured once as a CUDA Graph and replayed
        try:
            with torch.no_grad():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):          # warm-up off the default stream, as capture wants
                    for _ in range(2):
                        model(*tin)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    gout = model(*tin)
                g.replay()
                torch.cuda.synchronize()
                ms = timer(g.replay, args.reps, args.warmup)
            rows.append(Row(name, batch, "torch graph", statistics.median(ms), min(ms), None,
                            rel_l2(gout.float().cpu().numpy(), want),
                            note=f"torch {torch.__version__}, one CUDA Graph"))
        except Exception as e:  # noqa: BLE001 - a model PyTorch cannot capture is reported, not fatal
            rows.append(Row(name, batch, "torch graph", note=f"failed: {type(e).__name__}: {str(e)[:200]}"))
    return rows, want


def bench(name: str, batch: int, args, dev: CudaDevice, torch) -> list[Row]:
    from bench_gpu import _timer
    print(f"\n== {name} b{batch} {netdefs.sizes(name, args.small, args.layers)} {args.dtype}", flush=True)
    timer = _timer(dev, torch)
    feeds = _feeds(name, batch, args, args.dtype)
    trows, want = torch_rows(name, batch, args, timer, torch, feeds)
    krows = kumiko_rows(name, batch, args, dev, timer, feeds, want)
    for r in krows + trows[1:]:
        if r.median_ms is not None:
            r.ratio = r.median_ms / trows[0].median_ms
    rows = krows + trows
    for r in rows:
        t = f"median {r.median_ms:8.3f} ms  min {r.min_ms:8.3f}" if r.median_ms is not None else "-"
        extra = (f"  /torch eager {r.ratio:.2f}" if r.ratio is not None and r.runner != "torch" else "") + \
                (f"  rel L2 {r.rel_l2:.1e}" if r.rel_l2 is not None else "") + \
                (f"  compile {r.compile_s:.1f} s" if r.compile_s is not None else "") + \
                (f"  whole call {r.call_ms:.1f} ms" if r.call_ms is not None else "")
        print(f"  {r.runner:22s} {t}{extra}  {r.note}", flush=True)
    return rows


def markdown(rows: list[Row], args, machine: dict) -> str:
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"## {when}: whole networks, target `cuda`, {args.dtype}{' (small sizes)' if args.small else ''}", "",
             f"Machine: {machine}. `bench/models_gpu.py --reps {args.reps}`: CUDA events, median, the launches alone "
             "with the weights bound once on the device (PyTorch likewise keeps its weights there); 'whole call' is "
             "one `exe(...)` by wall clock, which copies every weight and input in and the output out; rel L2 "
             "against PyTorch fp32 on the GPU.", "",
             "| model | batch | runner | median ms | min ms | / torch eager | rel L2 | compile s | whole call ms "
             "| note |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        def f(v, spec="{:.3f}"):
            return "-" if v is None else spec.format(v)
        lines.append(f"| {r.model} | {r.batch} | {r.runner} | {f(r.median_ms)} | {f(r.min_ms)} | "
                     f"{f(r.ratio, '{:.2f}') if r.runner != 'torch' else '-'} | {f(r.rel_l2, '{:.1e}')} | "
                     f"{f(r.compile_s, '{:.1f}')} | {f(r.call_ms, '{:.1f}')} | {r.note} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(netdefs.MODELS), help=f"comma-separated ({','.join(netdefs.MODELS)})")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes (default 1)")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"), help="float dtype of both runners")
    p.add_argument("--archs", type=lambda v: [a for a in v.split(",") if a], default=[],
                   help="kumiko plan archs to time (default: the device's), e.g. sm90,sm80 on Hopper")
    p.add_argument("--cuda-graph", action="store_true", help="also time kumiko (cuda_graph=True) and PyTorch with "
                   "their launches captured as one CUDA Graph")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print kumiko's N slowest kernels, each "
                   "timed alone")
    p.add_argument("--reps", type=int, default=20, help="timed runs per runner (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="smoke-run sizes (64x64 images, 2 layers, sequence 32)")
    p.add_argument("--layers", type=int, default=None, help="BERT/GPT-2 layers (default 12; 2 with --small)")
    p.add_argument("--cache", default="~/.cache/kumiko-bench", help="where exported ONNX files are kept")
    p.add_argument("--cache-dir", default=None, help="kumiko's compile cache (default: a fresh one, so compiles "
                   "are cold)")
    p.add_argument("--append", dest="append", action="store_true", default=True, help="append to --results")
    p.add_argument("--no-append", dest="append", action="store_false", help="do not append")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing runners")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ok, why = device_available()
    if not ok:
        print(f"models_gpu: no GPU for the cuda target ({why}); nothing measured.")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("models_gpu: torch sees no GPU; nothing measured.")
        return 0
    dev = CudaDevice.get(0)
    machine = {**dev.describe(), "torch": torch.__version__}
    tmp = None
    if args.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="kumiko-gpu-models-")
        os.environ["KUMIKO_CACHE"] = tmp.name
    else:
        os.environ["KUMIKO_CACHE"] = args.cache_dir
    rows: list[Row] = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            rows += bench(name, batch, args, dev, torch)
    text = markdown(rows, args, machine)
    print("\n" + text)
    if args.append:
        with open(args.results, "a") as f:
            f.write("\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
