#!/usr/bin/env python3
"""kumiko against its peers, side by side, on the issue's workloads (W1-W4).

Each workload is built once as a kumiko Graph (the Tensor API) and once per peer in that peer's own
terms: numpy (where it can say it), PyTorch eager, torch.compile, ONNX Runtime (an ONNX graph built
with onnx.helper, so it needs no torch) and tinygrad's CPU backend. Every runner gets the same fresh
random inputs (never zeros); every output is checked against kumiko's (relative L2 <= 1e-3 for fp32);
times are the median (and min) of --reps runs after --warmup runs, one runner after another (not
interleaved: a thread pool that spins after its run, OpenMP's or OpenBLAS's, steals a 2-core machine from
whichever runner comes next, which made every peer 1.5-2.5x slower when tried); kumiko's time over each runner's is
the ratio (> 1: kumiko is slower). Compile time is reported cold (empty cache) and warm (from the cache)
for kumiko, and as the first call for peers that compile. Missing peers are skipped with a reason.

    python bench/bench.py                       # every workload, every peer that is installed
    python bench/bench.py --quick --no-peers    # a smoke run: small sizes, kumiko only
    python bench/bench.py --workloads W1,W4 --peers numpy,torch --reps 20
    python bench/bench.py --install-peers       # pip install torch==2.13.0 tinygrad==0.14.0 onnxruntime first

Results are appended to bench/RESULTS.md (full runs; --append / --no-append to choose) with the date and
the machine; --json FILE writes them as JSON too. See bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))       # run from a checkout without installing
sys.path.insert(1, str(HERE))              # convs.py beside us

from convs import conv_workloads  # noqa: E402

import kumiko  # noqa: E402
from kumiko import Tensor  # noqa: E402
from kumiko.accuracy import rel_l2  # noqa: E402
from kumiko.runtime import cpu as kcpu  # noqa: E402
from kumiko.runtime.flops import count_flops, evaluator_bytes, gflops, measure  # noqa: E402
from kumiko.symbolic import dim_eval  # noqa: E402

PEERS = ("numpy", "torch", "torch.compile", "onnxruntime", "tinygrad")
PEER_PACKAGES = ("torch==2.13.0", "tinygrad==0.14.0", "onnxruntime")   # never an unpinned torch (a CUDA build)
REL_L2_LIMIT = 1e-3


# ------------------------------------------------------------------------------------------------
# workloads: a kumiko graph and each peer's version of the same computation


@dataclass
class Workload:
    key: str
    title: str
    sizes: dict
    quick: dict
    graph: Callable[[dict], "kumiko.Graph"]
    numpy: Callable | None = None          # (inputs, sizes) -> array
    torch: Callable | None = None          # (torch, inputs, sizes) -> tensor
    onnx: Callable | None = None           # (sizes) -> (nodes, inputs, initializers) for onnx.helper
    tinygrad: Callable | None = None       # (Tensor class, inputs, sizes) -> tensor


def _gemm_graph(bias_relu: bool):
    def build(sz):
        a, b = Tensor.input("A", ("M", "K")), Tensor.input("B", ("K", "N"))
        y = a @ b
        if bias_relu:
            y = (y + Tensor.input("bias", ("N",))).relu()
        return y.graph("y", name="gemm_bias_relu" if bias_relu else "gemm", symbols=sz)
    return build


def _conv_graph(sz):
    x = Tensor.input("X", ("N", sz["C"], "H", "W"))
    w = Tensor.input("Wt", (sz["Co"], sz["C"], 3, 3))
    y = x.conv2d(w, stride=1, padding=1).relu().max_pool2d(2, 2)
    return y.graph("y", name="conv_relu_maxpool", symbols={k: sz[k] for k in ("N", "H", "W")})


def _attn_graph(causal: bool):
    def build(sz):
        q, k, v = (Tensor.input(n, ("B", "H", "S", sz["D"])) for n in ("Q", "K", "V"))
        y = q.scaled_dot_product_attention(k, v, is_causal=causal, scale=1.0 / math.sqrt(sz["D"]))
        return y.graph("y", name="attention_causal" if causal else "attention",
                       symbols={k: sz[k] for k in ("B", "H", "S")})
    return build


def _np_conv(i, sz):
    x = np.pad(i["X"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))        # N, C, H, W, 3, 3
    y = np.einsum("nchwij,ocij->nohw", win, i["Wt"], optimize=True)
    y = np.maximum(y, 0)
    n, c, h, w = y.shape
    return y[:, :, : h // 2 * 2, : w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _np_attn(causal):
    def f(i, sz):
        s = (i["Q"] @ np.swapaxes(i["K"], -1, -2)) * np.float32(1.0 / math.sqrt(sz["D"]))
        if causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, np.float32(-np.inf))
        s = np.exp(s - s.max(-1, keepdims=True))
        return (s / s.sum(-1, keepdims=True)) @ i["V"]
    return f


def _torch_attn(causal):
    def f(torch, i, sz):
        return torch.nn.functional.scaled_dot_product_attention(i["Q"], i["K"], i["V"], is_causal=causal,
                                                                scale=1.0 / math.sqrt(sz["D"]))
    return f


def _onnx_gemm(bias_relu):
    def f(h, sz):
        nodes = [h.make_node("MatMul", ["A", "B"], ["mm" if bias_relu else "y"])]
        if bias_relu:
            nodes += [h.make_node("Add", ["mm", "bias"], ["pre"]), h.make_node("Relu", ["pre"], ["y"])]
        return nodes, []
    return f


def _onnx_conv(h, sz):
    return [h.make_node("Conv", ["X", "Wt"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            h.make_node("Relu", ["c"], ["r"]), h.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2],
                                                           strides=[2, 2])], []


def _onnx_attn(causal):
    def f(h, sz):
        from onnx import numpy_helper
        nodes = [h.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["Q", "Kt"], ["s0"]),
                 h.make_node("Mul", ["s0", "scale"], ["s1" if causal else "s"])]
        inits = [numpy_helper.from_array(np.array(1.0 / math.sqrt(sz["D"]), np.float32), "scale")]
        if causal:
            mask = np.where(np.tril(np.ones((sz["S"], sz["S"]), bool)), 0, -np.inf).astype(np.float32)
            inits.append(numpy_helper.from_array(mask, "mask"))
            nodes.append(h.make_node("Add", ["s1", "mask"], ["s"]))
        nodes += [h.make_node("Softmax", ["s"], ["p"], axis=-1), h.make_node("MatMul", ["p", "V"], ["y"])]
        return nodes, inits
    return f


def _tg_conv(T, i, sz):
    return i["X"].conv2d(i["Wt"], padding=1).relu().max_pool2d(kernel_size=(2, 2), stride=2)


def _tg_attn(causal):
    def f(T, i, sz):
        return i["Q"].scaled_dot_product_attention(i["K"], i["V"], is_causal=causal)   # scale 1/sqrt(D) default
    return f


#: seconds between runners: a 2-core machine is shared with the last runner's spinning threads until they sleep
SETTLE_S = 0.3

GEMM_QUICK = {"M": 128, "N": 128, "K": 128}
WORKLOADS = {w.key: w for w in [
    Workload("W1-1024", "fp32 GEMM 1024^3", {"M": 1024, "N": 1024, "K": 1024}, GEMM_QUICK, _gemm_graph(False),
             numpy=lambda i, sz: i["A"] @ i["B"], torch=lambda t, i, sz: i["A"] @ i["B"], onnx=_onnx_gemm(False),
             tinygrad=lambda T, i, sz: i["A"] @ i["B"]),
    Workload("W1-2048", "fp32 GEMM 2048^3", {"M": 2048, "N": 2048, "K": 2048}, {"M": 192, "N": 160, "K": 96},
             _gemm_graph(False), numpy=lambda i, sz: i["A"] @ i["B"], torch=lambda t, i, sz: i["A"] @ i["B"],
             onnx=_onnx_gemm(False), tinygrad=lambda T, i, sz: i["A"] @ i["B"]),
    Workload("W2", "GEMM 1024^3 + bias + ReLU", {"M": 1024, "N": 1024, "K": 1024}, GEMM_QUICK, _gemm_graph(True),
             numpy=lambda i, sz: np.maximum(i["A"] @ i["B"] + i["bias"], 0),
             torch=lambda t, i, sz: t.relu(i["A"] @ i["B"] + i["bias"]), onnx=_onnx_gemm(True),
             tinygrad=lambda T, i, sz: (i["A"] @ i["B"] + i["bias"]).relu()),
    Workload("W3", "Conv 3x3 s1 p1 NCHW 8x64->64x56x56 + ReLU + MaxPool 2x2",
             {"N": 8, "C": 64, "Co": 64, "H": 56, "W": 56}, {"N": 1, "C": 8, "Co": 8, "H": 16, "W": 16},
             _conv_graph, numpy=_np_conv, onnx=_onnx_conv, tinygrad=_tg_conv,
             torch=lambda t, i, sz: t.nn.functional.max_pool2d(t.relu(t.nn.functional.conv2d(i["X"], i["Wt"],
                                                                                              padding=1)), 2)),
    Workload("W4", "attention B=2 H=8 S=1024 D=64", {"B": 2, "H": 8, "S": 1024, "D": 64},
             {"B": 1, "H": 2, "S": 64, "D": 32}, _attn_graph(False), numpy=_np_attn(False), torch=_torch_attn(False),
             onnx=_onnx_attn(False), tinygrad=_tg_attn(False)),
    Workload("W4-causal", "causal attention B=2 H=8 S=1024 D=64", {"B": 2, "H": 8, "S": 1024, "D": 64},
             {"B": 1, "H": 2, "S": 64, "D": 32}, _attn_graph(True), numpy=_np_attn(True), torch=_torch_attn(True),
             onnx=_onnx_attn(True), tinygrad=_tg_attn(True)),
]}
WORKLOADS.update({w.key: w for w in conv_workloads(Workload)})     # C-*: the conv classes (bench/convs.py)


# ------------------------------------------------------------------------------------------------
# runners: each returns (run, to_numpy, first_call_s); a peer that cannot run raises Skip


class Skip(Exception):
    pass


@dataclass
class Row:
    workload: str
    runner: str
    median_ms: float | None = None
    min_ms: float | None = None
    reps: int = 0
    gflops: float | None = None
    ratio: float | None = None         # kumiko's median over this runner's
    rel_l2: float | None = None
    ok: bool | None = None
    compile_s: float | None = None     # kumiko: cold build; peers: first call
    warm_compile_s: float | None = None
    note: str = ""
    ref: str | None = None             # the runner whose output this one was checked against
    samples_ms: list = field(default_factory=list)


def _cores() -> int:
    return os.cpu_count() or 1


def peer_runner(peer: str, wl: Workload, sz: dict, inputs: dict, out_shape: list):
    if peer == "numpy":
        if wl.numpy is None:
            raise Skip("numpy cannot express it")
        return (lambda: wl.numpy(inputs, sz)), np.asarray, None
    if peer in ("torch", "torch.compile"):
        try:
            import torch
        except ImportError:
            raise Skip("torch is not installed (pip install torch==2.13.0, or --install-peers)") from None
        torch.set_num_threads(_cores())
        tin = {k: torch.from_numpy(v) for k, v in inputs.items()}
        fn = wl.torch
        if peer == "torch.compile":
            names = list(tin)
            compiled = torch.compile(lambda *a: fn(torch, dict(zip(names, a)), sz))
            args = [tin[n] for n in names]
            with torch.inference_mode():
                t0 = time.perf_counter()
                compiled(*args)
                first = time.perf_counter() - t0

            def run():
                with torch.inference_mode():
                    return compiled(*args)
            return run, lambda t: t.numpy(), first

        def run_eager():
            with torch.inference_mode():
                return fn(torch, tin, sz)
        return run_eager, lambda t: t.numpy(), None
    if peer == "onnxruntime":
        try:
            import onnx
            import onnxruntime as ort
            from onnx import TensorProto, helper
        except ImportError:
            raise Skip("onnx/onnxruntime are not installed (pip install onnx onnxruntime)") from None
        nodes, inits = wl.onnx(helper, sz)
        vin = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in inputs.items()]
        vout = [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)]
        model = helper.make_model(helper.make_graph(nodes, wl.key, vin, vout, inits),
                                  opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ORT reads IR <= 13
        onnx.checker.check_model(model)
        so = ort.SessionOptions()
        so.intra_op_num_threads = _cores()
        t0 = time.perf_counter()
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        first = time.perf_counter() - t0
        return (lambda: sess.run(["y"], inputs)[0]), np.asarray, first
    if peer == "tinygrad":
        try:
            from tinygrad import Device, TinyJit
            from tinygrad import Tensor as TT
        except ImportError:
            raise Skip("tinygrad is not installed (pip install tinygrad==0.14.0, or --install-peers)") from None
        if shutil.which("clang") is None:
            raise Skip("tinygrad's CPU device needs clang (Debian: apt-get install clang)")
        names = list(inputs)
        tin = [TT(inputs[k], device="CPU").realize() for k in names]
        # TinyJit: after two calls tinygrad replays the captured kernels, as a deployed model would
        jit = TinyJit(lambda *a: wl.tinygrad(TT, dict(zip(names, a)), sz).realize())

        def run_tg():
            out = jit(*tin)
            Device["CPU"].synchronize()
            return out
        t0 = time.perf_counter()
        for _ in range(3):
            run_tg()
        return run_tg, lambda t: t.numpy(), time.perf_counter() - t0
    raise Skip(f"unknown peer {peer!r}")


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def kumiko_runner(wl: Workload, graph, target: str, inputs: dict, poison: bool = True):
    """Compile twice, cold (an empty cache) and warm (the cache the first build filled), then run."""
    with tempfile.TemporaryDirectory(prefix="kumiko-bench-cache-") as tmp, _env("KUMIKO_CACHE", tmp):
        kcpu.forget_loaded()
        t0 = time.perf_counter()
        kumiko.compile(graph, target=target)
        cold = time.perf_counter() - t0
        kcpu.forget_loaded()
        t0 = time.perf_counter()
        exe = kumiko.compile(graph, target=target)
        warm = time.perf_counter() - t0
    # the peers' arrays as they are: the cpu runtime reads C-contiguous inputs in place at any alignment
    # (numpy's is 16 bytes); a target that needs more copies them inside the timed call
    if poison:
        return (lambda: exe(**inputs)["y"]), np.asarray, (cold, warm)

    def run_bare():                               # KUMIKO_SPEC=0: the runtime skips NaN-poisoning the buffers
        with _env("KUMIKO_SPEC", "0"):
            return exe(**inputs)["y"]
    return run_bare, np.asarray, (cold, warm)


def _time(run: Callable, reps: int, warmup: int, budget_s: float) -> tuple[dict, str]:
    """measure(), with fewer reps (never under 3) when one run is so slow that --reps would pass the budget."""
    t0 = time.perf_counter()
    run()
    one = time.perf_counter() - t0
    note = ""
    if one * (reps + max(0, warmup - 1)) > budget_s:
        reps, warmup, note = max(3, int(budget_s / max(one, 1e-9))), 0, "reps cut to fit the time budget"
    return measure(run, reps=reps, warmup=max(0, warmup - 1)), note


def bench_workload(wl: Workload, args) -> list[Row]:
    sz = dict(wl.quick if args.quick else wl.sizes)
    graph = wl.graph(sz)
    flops = count_flops(graph.tiny, sz)
    probe = kumiko.compile(graph, target="eval")
    inputs = probe.random_inputs(args.seed, sz)
    out_shape = [dim_eval(d, sz) for d in graph.tiny.output_node("y").shape]
    rows, outs = [], {}
    print(f"\n== {wl.key}: {wl.title}  sizes {sz}  ({flops / 1e9:.3f} GFLOP)" if flops else f"\n== {wl.key}")

    def record(name, prep):
        row = Row(wl.key, name)
        try:
            run, to_np, compile_info = prep()
            if isinstance(compile_info, tuple):
                row.compile_s, row.warm_compile_s = compile_info
            else:
                row.compile_s = compile_info
            last = {}

            def keep():                  # the last timed run's output is the one checked: no extra run
                last["y"] = run()
            gc.collect()                 # the last runner's objects (an ONNX Runtime session's thread pool) go,
            time.sleep(SETTLE_S)         # and thread pools that spin after their last run fall asleep
            r, row.note = _time(keep, args.reps, args.warmup, args.budget_s)
            outs[name] = to_np(last["y"])
            row.median_ms, row.min_ms, row.reps = r["median_s"] * 1e3, r["min_s"] * 1e3, r["reps"]
            row.samples_ms = [s * 1e3 for s in r["samples_s"]]
            row.gflops = gflops(flops, r["median_s"])
        except Skip as e:
            row.note = f"skipped: {e}"
        except Exception as e:  # noqa: BLE001 - a peer's failure is a result, not a crash of the bench
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            row.note = f"failed: {type(e).__name__}: {msg[-200:]}"
            if args.verbose:
                traceback.print_exc()
        rows.append(row)
        _print_row(row)

    big = evaluator_bytes(graph.tiny, sz) or 0
    if args.target == "eval" and big > args.eval_limit_mb * 2 ** 20:
        rows.append(Row(wl.key, f"kumiko[{args.target}]", note=f"skipped: the eval target would hold "
                        f"{big / 2 ** 30:.1f} GiB at once (limit --eval-limit-mb {args.eval_limit_mb})"))
        _print_row(rows[-1])
    else:
        record(f"kumiko[{args.target}]", lambda: kumiko_runner(wl, graph, args.target, inputs, not args.no_poison))
    for peer in args.peers:
        record(peer, lambda p=peer: peer_runner(p, wl, sz, inputs, out_shape))

    ref_name = next((r.runner for r in rows if r.runner.startswith("kumiko") and r.runner in outs), None)
    ref_name = ref_name or next((n for n in ("numpy", "torch", "onnxruntime") if n in outs), None)
    k_row = rows[0] if rows[0].runner.startswith("kumiko") else None
    for row in rows:
        row.ref = ref_name
        if row.runner in outs and ref_name:
            row.rel_l2 = rel_l2(outs[row.runner], outs[ref_name])
            row.ok = row.rel_l2 <= REL_L2_LIMIT
            if ref_name != rows[0].runner and row.runner != ref_name:
                row.note = (row.note + "; " if row.note else "") + f"checked against {ref_name}"
        if k_row and k_row.median_ms and row.median_ms and row is not k_row:
            row.ratio = k_row.median_ms / row.median_ms
    checked = [f"{r.runner} {r.rel_l2:.1e}{'' if r.ok else ' FAIL'}" for r in rows
               if r.rel_l2 is not None and r.runner != ref_name]
    if checked:
        print(f"  rel L2 against {ref_name}: {', '.join(checked)}")
    bad = [r.runner for r in rows if r.ok is False]
    if bad:
        print(f"  !! outputs differ from {ref_name} (rel L2 > {REL_L2_LIMIT}): {', '.join(bad)}")
    return rows


def _fmt(v, spec="{:.3f}", none="-"):
    return none if v is None else spec.format(v)


def _print_row(r: Row) -> None:
    if r.median_ms is None:
        print(f"  {r.runner:<16} {r.note}")
        return
    comp = f"  compile {r.compile_s:.2f}s" if r.compile_s is not None else ""
    comp += f" (warm {r.warm_compile_s:.3f}s)" if r.warm_compile_s is not None else ""
    print(f"  {r.runner:<16} median {r.median_ms:10.3f} ms  min {r.min_ms:10.3f} ms  "
          f"{_fmt(r.gflops, '{:8.2f}')} GFLOP/s  x{r.reps}{comp}{('  [' + r.note + ']') if r.note else ''}")


# ------------------------------------------------------------------------------------------------
# the report


def machine() -> dict:
    f = kcpu.cpu_features()
    isa = [k for k in ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx2", "avx", "fma", "f16c", "neon")
           if f.get(k)]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": f["model"], "cores": f["cores"], "isa": isa, "vector_width_f32": f["vector_width_f32"],
            "load_avg_1min": load, "kumiko_commit": _commit(),
            "python": platform.python_version(), "numpy": np.__version__, "peers": _peer_versions()}


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def _peer_versions() -> dict:
    out = {}
    for mod in ("torch", "onnxruntime", "tinygrad"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return out


def results_markdown(rows: list[Row], args, m: dict) -> str:
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"## {when}: target `{args.target}`{' (quick sizes)' if args.quick else ''}", "",
             f"- machine: {m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])} (f32 vector width "
             f"{m['vector_width_f32']}), load average {_fmt(m['load_avg_1min'], '{:.2f}')} at the start; python "
             f"{m['python']}, numpy {m['numpy']}" + "".join(f", {k} {v}" for k, v in m["peers"].items())
             + f"; kumiko {m['kumiko_commit']}",
             f"- command: `python bench/bench.py {' '.join(args.argv)}`; kumiko's runs "
             f"{'without' if args.no_poison else 'with'} buffer poisoning",
             f"- median and min of {args.reps} runs after {args.warmup} warm-up; ratio = kumiko's median / the "
             f"runner's (> 1: kumiko slower); rel L2 against the `ref` row, kumiko's output when it ran (limit "
             f"{REL_L2_LIMIT}); GFLOP/s from the Tiny IR count (causal attention counts the full square)", "",
             "| workload | runner | median ms | min ms | GFLOP/s | kumiko/runner | rel L2 | compile s (cold / warm) "
             "| note |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    refs = {r.workload: r.ref for r in rows}
    for r in rows:
        comp = _fmt(r.compile_s, "{:.2f}") + (f" / {r.warm_compile_s:.3f}" if r.warm_compile_s is not None else "")
        l2 = "-" if r.rel_l2 is None else f"{r.rel_l2:.1e}{'' if r.ok else ' FAIL'}"
        l2 = "ref" if r.runner == refs.get(r.workload) else l2
        lines.append(f"| {r.workload} | {r.runner} | {_fmt(r.median_ms)} | {_fmt(r.min_ms)} | "
                     f"{_fmt(r.gflops, '{:.2f}')} | {_fmt(r.ratio, '{:.2f}')} | {l2} | {comp} | {r.note} |")
    return "\n".join(lines) + "\n"


def install_peers() -> None:
    print(f"installing peers: {' '.join(PEER_PACKAGES)}")
    cmd = [sys.executable, "-m", "pip", "install"]
    if subprocess.run(cmd + list(PEER_PACKAGES), check=False).returncode != 0:
        for pkg in PEER_PACKAGES:          # one failure must not keep the others out
            if subprocess.run(cmd + [pkg], check=False).returncode != 0:
                print(f"  could not install {pkg}; its runner will be skipped")
    if shutil.which("clang") is None:
        print("  note: tinygrad's CPU device compiles with clang, which is missing (Debian: apt-get install clang)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", default="all", help=f"comma-separated keys or prefixes ({', '.join(WORKLOADS)}; "
                   "W1 = both GEMMs, C = every conv class); default all")
    p.add_argument("--target", default=None, help="kumiko target (default cpu when available, else eval)")
    p.add_argument("--reps", type=int, default=10, help="timed runs per runner (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the whole path")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated peers (default {','.join(PEERS)})")
    p.add_argument("--no-peers", action="store_true", help="run kumiko only")
    p.add_argument("--install-peers", action="store_true", help=f"pip install {' '.join(PEER_PACKAGES)} first")
    p.add_argument("--budget-s", type=float, default=20.0, help="seconds one runner may spend timing (cuts reps)")
    p.add_argument("--eval-limit-mb", type=float, default=1024, help="skip kumiko's eval target above this "
                   "largest intermediate (the evaluator materialises GEMM's M*N*K product)")
    p.add_argument("--append", dest="append", action="store_true", default=None,
                   help="append to the results file (default for full runs)")
    p.add_argument("--no-append", dest="append", action="store_false", help="do not append (default for --quick)")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="results file (default bench/RESULTS.md)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--no-poison", action="store_true", help="time kumiko without NaN-poisoning its output and "
                   "arena buffers before each run (KUMIKO_SPEC=0 during its runs); default: as users run it")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing runners")
    args = p.parse_args(argv)
    args.argv = argv
    args.peers = [] if args.no_peers else [x.strip() for x in args.peers.split(",") if x.strip()]
    if args.append is None:
        args.append = not args.quick
    if args.target is None:
        from kumiko.compiler import TARGETS
        args.target = "cpu" if "cpu" in TARGETS else "eval"
        if args.target == "eval":
            print("NOTE: the cpu target is not available in this build; kumiko runs on the eval target (the numpy "
                  "reference evaluator), which is slow by design and not a measure of kumiko's kernels.")
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    return args


def select(spec: str, workloads: dict | None = None) -> list:
    """Workloads by comma-separated keys or key prefixes before a '-' (``W1`` = ``W1-1024,W1-2048``)."""
    workloads = WORKLOADS if workloads is None else workloads
    if spec == "all":
        return list(workloads.values())
    out = []
    for part in (s.strip() for s in spec.split(",") if s.strip()):
        hits = [w for k, w in workloads.items() if k == part] or \
               [w for k, w in workloads.items() if k.split("-")[0] == part]
        if not hits:
            raise SystemExit(f"unknown workload {part!r}; choose from {', '.join(workloads)}")
        out += [w for w in hits if w not in out]
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.install_peers:
        install_peers()
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, {' '.join(m['isa'])}; kumiko target {args.target}; "
          f"peers {', '.join(args.peers) or 'none'}")
    rows: list[Row] = []
    for wl in select(args.workloads):
        rows += bench_workload(wl, args)
    report = {"machine": m, "target": args.target, "quick": args.quick, "rows": [r.__dict__ for r in rows]}
    if args.append:
        path = Path(args.results)
        head = "" if path.exists() else ("# kumiko benchmark results\n\nAppended by `bench/bench.py` (see "
                                          "bench/README.md); newest last.\n")
        with path.open("a") as f:
            f.write(head + "\n" + results_markdown(rows, args, m))
        print(f"\nappended to {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    failed = [r for r in rows if r.ok is False]
    report["failed_checks"] = [f"{r.workload}/{r.runner}" for r in failed]
    return report


if __name__ == "__main__":
    rep = main()
    sys.exit(1 if rep["failed_checks"] else 0)
