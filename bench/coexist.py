#!/usr/bin/env python3
"""kumiko beside other thread pools: the same kumiko calls timed alone and in a process where
onnxruntime and PyTorch have run (their thread pools alive), and interleaved call by call with them.

A user of a PyTorch backend or of an ONNX pipeline runs kumiko's kernels in a process that already has
an OpenMP pool (PyTorch's) and onnxruntime's own pool; pools that spin after their work, or that
oversubscribe the cores, slow whichever runs next. Each scenario runs in a fresh process (a scenario's
pools must not leak into the next):

- ``alone``: only kumiko in the process;
- ``after-peers``: onnxruntime sessions and PyTorch ops ran first (their pools idle but alive), then kumiko;
- ``interleaved``: each timed kumiko call directly follows one onnxruntime call and one PyTorch call (the
  peers' calls are not timed).

Workloads (fp32, batch 1): ReLU of 16 floats (per-call overhead), Conv 3x3 groups 8 64->64 at 56x56,
a 512^3 GEMM, Linear 768->3072 of one row, and two Conv 3x3 64->64 + bias + ReLU at 56x56 (``conv2``: a
network's channels-last convolutions, whose threads take their M blocks as they come). The ratio is a
scenario's median over ``alone``'s.

    python bench/coexist.py                  # append a table to bench/RESULTS.md
    python bench/coexist.py --no-append --reps 50
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SCENARIOS = ("alone", "after-peers", "interleaved")
WORKLOADS = ("relu16", "gconv", "gemm512", "linear1", "conv2")


def onnx_model(key: str):
    """(model bytes, feeds) of one workload, built with onnx.helper (opset 17)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = []
    if key == "relu16":
        x = rng.standard_normal((16,), dtype=np.float32)
        nodes = [helper.make_node("Relu", ["x"], ["y"])]
    elif key == "gconv":
        x = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
        w = rng.standard_normal((64, 8, 3, 3), dtype=np.float32) * 0.1
        inits.append(numpy_helper.from_array(w, "w"))
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1, 1, 1])]
    elif key == "gemm512":
        x = rng.standard_normal((512, 512), dtype=np.float32)
        inits.append(numpy_helper.from_array(rng.standard_normal((512, 512), dtype=np.float32), "w"))
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    elif key == "linear1":
        x = rng.standard_normal((1, 768), dtype=np.float32)
        inits.append(numpy_helper.from_array(rng.standard_normal((768, 3072), dtype=np.float32), "w"))
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    elif key == "conv2":
        x = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
        nodes = []
        for i in range(2):
            inits += [numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3), dtype=np.float32) * 0.05, f"w{i}"),
                      numpy_helper.from_array(rng.standard_normal((64,), dtype=np.float32), f"b{i}")]
            src = "x" if i == 0 else "r0"
            nodes += [helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", [f"c{i}"], ["y" if i == 1 else f"r{i}"])]
    else:
        raise SystemExit(f"unknown workload {key!r}")
    g = helper.make_graph(nodes, key, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString(), {"x": x}


def _peers():
    """An onnxruntime session and a PyTorch op, each run until its pool is up; returns one call of each."""
    import onnxruntime as ort
    import torch
    model, feeds = onnx_model("gconv")
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    xt = torch.from_numpy(feeds["x"])
    wt = torch.randn(64, 8, 3, 3)

    def peer_call():
        sess.run(None, feeds)
        with torch.no_grad():
            torch.nn.functional.conv2d(xt, wt, padding=1, groups=8)
    for _ in range(10):
        peer_call()
    return peer_call


def child(scenario: str, workloads: list[str], reps: int, warmup: int) -> dict:
    """One scenario in this (fresh) process: median/min seconds of each workload's kumiko call."""
    sys.path.insert(0, str(HERE.parent))
    import kumiko
    peer_call = _peers() if scenario != "alone" else None
    out = {}
    for key in workloads:
        model, feeds = onnx_model(key)
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kumiko-coexist-{key}-{os.getpid()}.onnx"
        path.write_bytes(model)
        try:
            exe = kumiko.compile(kumiko.from_onnx(str(path)), target="cpu")
        finally:
            path.unlink(missing_ok=True)
        samples = []
        for i in range(warmup + reps):
            if scenario == "interleaved":
                peer_call()
            t0 = time.perf_counter()
            exe(**feeds)
            dt = time.perf_counter() - t0
            if i >= warmup:
                samples.append(dt)
        out[key] = {"median_s": statistics.median(samples), "min_s": min(samples)}
    return out


def machine_line() -> str:
    """The machine as kumiko's own host query sees it (``kumiko.runtime.host.cpu_features``)."""
    sys.path.insert(0, str(HERE.parent))
    from kumiko.runtime.host import cpu_features
    f = cpu_features()
    isa = " ".join(k for k in ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx2", "amx_tile") if f.get(k))
    return f"{f['model']}, {f['cores']} cores, {isa or 'no avx2'}, load average {os.getloadavg()[0]:.2f} at the start"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated ({','.join(WORKLOADS)})")
    p.add_argument("--reps", type=int, default=30, help="timed calls per workload and scenario (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--no-append", action="store_true", help="print only; do not append to bench/RESULTS.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    workloads = [w for w in a.workloads.split(",") if w]
    if a.child:
        print(json.dumps(child(a.child, workloads, a.reps, a.warmup)))
        return 0
    line = machine_line()
    res = {}
    for sc in SCENARIOS:
        print(f"scenario {sc} ...", file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, __file__, "--child", sc, "--workloads", ",".join(workloads),
                            "--reps", str(a.reps), "--warmup", str(a.warmup)], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            raise SystemExit(f"scenario {sc} failed")
        res[sc] = json.loads(r.stdout.strip().splitlines()[-1])
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"## {when}: kumiko beside onnxruntime and PyTorch thread pools (`bench/coexist.py`)", "",
             f"- machine: {line}; each scenario in a fresh process; median (min) of {a.reps} calls after "
             f"{a.warmup}; ratio = the scenario's median / `alone`'s", "",
             "| workload | " + " | ".join(f"{s} ms" for s in SCENARIOS) + " | "
             + " | ".join(f"{s}/alone" for s in SCENARIOS[1:]) + " |",
             "|---|" + "---:|" * (2 * len(SCENARIOS) - 1)]
    for w in workloads:
        base = res["alone"][w]["median_s"]
        cells = [f"{res[s][w]['median_s'] * 1e3:.4f} ({res[s][w]['min_s'] * 1e3:.4f})" for s in SCENARIOS]
        ratios = [f"{res[s][w]['median_s'] / base:.2f}" for s in SCENARIOS[1:]]
        lines.append(f"| {w} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.no_append:
        with open(HERE / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
