#!/usr/bin/env python3
"""kumiko against onnxruntime, PyTorch eager and torch.compile on whole networks: ResNet-50, MobileNetV2,
BERT-base and GPT-2 small (``bench/netdefs.py``), at each batch size asked for.

Each model is built in torch with seeded random weights and exported once to ONNX (opset 17, the
TorchScript exporter) into a cache directory; then, in this one process and one runner after another:
onnxruntime (an InferenceSession on the CPU provider), PyTorch eager (``torch.no_grad``), torch.compile
(inductor) and kumiko (``kumiko.from_onnx`` then ``kumiko.compile(g, target="cpu")``, cold in an empty
cache directory, then warm from the cache it filled). Every runner gets the same inputs; every output is
checked against onnxruntime's by the relative L2 error (flagged over 1e-3); times are the median and min of
--reps runs after --warmup runs.

    python bench/models.py                                  # all four models, batch 1 and 8
    python bench/models.py --small --no-append --reps 3     # smoke run: 64x64 images, 2 layers, sequence 32
    python bench/models.py --models resnet50 --batch 1 --reps 5 --profile

Results are appended to bench/RESULTS.md (--no-append: not) with the date, the machine and the versions;
--json FILE writes them as JSON too. See bench/README.md ("Whole networks").
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import hashlib
import importlib.util
import io
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):          # run from a checkout without installing; netdefs beside us
    if _p not in sys.path:
        sys.path.insert(0, _p)

import netdefs  # noqa: E402

PEERS = ("onnxruntime", "torch", "torch.compile")
REL_L2_LIMIT = 1e-3
KUMIKO = "kumiko[cpu]"
#: an opt-in peer (``--peers onnxruntime,kumiko[eval]``): kumiko's evaluator, checked like the others
EVAL = "kumiko[eval]"
T0 = time.perf_counter()


def _load_bench():
    """bench/bench.py's helpers (machine line, timing loop, number format). It imports kumiko at the top, so
    a kumiko that does not import leaves us with None and the small fallbacks below: the kumiko row then says
    why, and the peers still run."""
    try:
        spec = importlib.util.spec_from_file_location("kumiko_bench_script", HERE / "bench.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod            # dataclasses look their module up while the script loads
        spec.loader.exec_module(mod)
        return mod, None
    except Exception as e:  # noqa: BLE001 - reported in the kumiko row
        sys.modules.pop("kumiko_bench_script", None)
        return None, e


BENCH, BENCH_ERROR = _load_bench()


def _fmt(v, spec="{:.3f}", none="-"):
    return BENCH._fmt(v, spec, none) if BENCH else (none if v is None else spec.format(v))


def rel_l2(got, want) -> float:
    try:
        from kumiko.accuracy import rel_l2 as k_rel_l2
    except Exception:  # noqa: BLE001 - kumiko is broken: the same measure, in numpy
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape or not np.isfinite(got).all():
            return float("inf")
        return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))
    return k_rel_l2(got, want)


def progress(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# memory: the growth of the resident set while a runner is set up and timed


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _trim() -> None:
    """Give freed heap back to the OS (glibc), so a runner's RSS baseline is not inflated by the last one's."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS: ``5`` into /proc/self/clear_refs (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


MEM_METHOD = ("VmHWM after a reset through /proc/self/clear_refs, minus VmRSS at the runner's start"
              if _status_kb("VmHWM") is not None and _reset_peak() else
              "growth of resource.getrusage's ru_maxrss (a process-wide high-water mark: a runner that stays "
              "under an earlier runner's peak shows 0)")


class PeakRSS:
    """Peak resident memory above the start, in MB, of what runs inside the ``with``."""

    def __enter__(self):
        _trim()
        self.hwm = MEM_METHOD.startswith("VmHWM") and _reset_peak()
        self.base_kb = _status_kb("VmRSS") if self.hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.mb = None
        return self

    def __exit__(self, *exc):
        now = _status_kb("VmHWM") if self.hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if now is not None and self.base_kb is not None:
            self.mb = max(0, now - self.base_kb) / 1024
        return False


# ------------------------------------------------------------------------------------------------
# rows and runners


class Skip(Exception):
    pass


@dataclass
class Row:
    model: str
    batch: int
    runner: str
    median_ms: float | None = None
    min_ms: float | None = None
    reps: int = 0
    gflops: float | None = None
    ratio: float | None = None          # kumiko's median over this runner's
    paired: tuple | None = None         # (median, lower quartile, upper quartile) of kumiko/runner, calls alternating
    rel_l2: float | None = None         # against onnxruntime (or the `ref` runner)
    ok: bool | None = None
    compile_s: float | None = None      # kumiko: cold build; torch.compile: first call; onnxruntime: session
    warm_compile_s: float | None = None
    peak_mb: float | None = None
    note: str = ""
    ref: str | None = None
    samples_ms: list = field(default_factory=list)
    profile: list = field(default_factory=list)   # kumiko --profile: [kernel, mean ms, share, what it does]


def describe(e: BaseException) -> str:
    """A failure as one line: a kumiko diagnostic by its code, kind, place and reason; anything else by type."""
    if hasattr(e, "code") and hasattr(e, "why") and hasattr(e, "kind"):
        at = f" at {e.at}" if getattr(e, "at", "") else ""
        why = " ".join(str(e.why).split())
        return f"{e.code} {e.kind}{at}: {why[:300]}"
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:300]}"


def _time(run: Callable, reps: int, warmup: int, budget_s: float) -> tuple[dict, str]:
    if BENCH:
        return BENCH._time(run, reps, warmup, budget_s)
    samples = []
    for _ in range(warmup):
        run()
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "reps": reps, "samples_s": samples}, ""


def paired_ratio(run_a: Callable, run_b: Callable, rounds: int, block: int = 3, settle_s: float = 0.3) -> tuple:
    """(median, lower quartile, upper quartile) over ``rounds`` rounds of ``run_a``'s time over ``run_b``'s: in a
    round each runs once untimed and ``block`` times timed (the median taken), after ``settle_s`` of sleep (the
    other runner's thread pool spinning down: onnxruntime's spins for tens of milliseconds after a run, and
    kumiko's call right after one took 2-3x as long), which goes first alternating. A host whose speed drifts
    from one second to the next moves both halves of a round together, where medians taken one runner after
    the other can differ by a third."""
    from kumiko.plan.tune import median_time  # kumiko ran (its run is ``run_a``), so it imports
    ratios = []
    for i in range(rounds):
        took = {}
        for k, run in ((0, run_a), (1, run_b)) if i % 2 == 0 else ((1, run_b), (0, run_a)):
            time.sleep(settle_s)
            took[k] = median_time(run, block)          # one untimed call, then the block's median
        ratios.append(took[0] / took[1])
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), q[0], q[2]


class Runner:
    """One runner's set-up: ``prepare()`` returns ``(run, to_numpy, compile_info)``; ``step`` names what it is
    doing, so a failure says where (export, import, compile, run)."""

    def __init__(self, name: str):
        self.name, self.step = name, "setup"


def ort_runner(r: Runner, path: Path, feeds: dict, args):
    try:
        import onnxruntime as ort
    except ImportError:
        raise Skip("onnxruntime is not installed (pip install onnxruntime)") from None
    r.step = "session"
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    first = time.perf_counter() - t0
    out = sess.get_outputs()[0].name
    r.step = "run"
    return (lambda: sess.run([out], feeds)[0]), np.asarray, first


def torch_runner(r: Runner, name: str, feeds: dict, args, compiled: bool):
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed (pip install torch==2.13.0)") from None
    torch.set_num_threads(args.threads)
    r.step = "build"
    model = netdefs.build(name, args.seed, args.small, args.layers)
    tin = [torch.from_numpy(v) for v in feeds.values()]
    first = None
    if compiled:
        r.step = "compile"
        model = torch.compile(model)          # inductor
        with torch.no_grad():
            t0 = time.perf_counter()
            model(*tin)
            first = time.perf_counter() - t0
    r.step = "run"

    def run():
        with torch.no_grad():
            return model(*tin)
    return run, lambda t: t.numpy(), first


def kumiko_runner(r: Runner, path: Path, feeds: dict, args, info: dict):
    r.step = "import kumiko"
    if BENCH_ERROR is not None:
        raise BENCH_ERROR
    import kumiko
    from kumiko.runtime import cpu as kcpu
    from kumiko.runtime.flops import count_flops
    r.step = "from_onnx"
    t0 = time.perf_counter()
    g = kumiko.from_onnx(str(path))
    info["import_s"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="kumiko-bench-cache-") as tmp, BENCH._env("KUMIKO_CACHE", tmp):
        r.step = "compile (cold)"
        progress(f"{info['label']}: kumiko compile, cold cache")
        kcpu.forget_loaded()
        t0 = time.perf_counter()
        exe = kumiko.compile(g, target="cpu")
        cold = time.perf_counter() - t0
        del exe
        r.step = "compile (warm)"
        progress(f"{info['label']}: kumiko compile, warm cache (cold took {cold:.1f}s)")
        kcpu.forget_loaded()
        t0 = time.perf_counter()
        exe = kumiko.compile(g, target="cpu")
        warm = time.perf_counter() - t0
    info["flops"] = count_flops(exe.tiny)         # the exported shapes are static
    out = exe.output_names[0]
    info["exe"] = exe
    r.step = "run"
    return (lambda: exe(**feeds)[out]), np.asarray, (cold, warm)


def eval_runner(r: Runner, path: Path, feeds: dict):
    """kumiko's reference evaluator (numpy, node by node): not a speed peer, a correctness one, so the
    table shows the evaluator matching onnxruntime on the whole network."""
    r.step = "import kumiko"
    if BENCH_ERROR is not None:
        raise BENCH_ERROR
    import kumiko
    r.step = "from_onnx"
    exe = kumiko.compile(kumiko.from_onnx(str(path)), target="eval")
    out = exe.output_names[0]
    r.step = "run"
    return (lambda: exe(**feeds)[out]), np.asarray, None


_KERNEL_LINE = re.compile(r"^kumiko: cpu (\S+): ([0-9.]+) ms$")


def kumiko_profile(exe, feeds: dict, runs: int) -> list[list]:
    """Per-kernel times from the runtime's own timing (KUMIKO_DEBUG=2 logs each kernel's time on stderr as
    ``kumiko: cpu NAME: T ms``): the mean over ``runs`` calls, slowest first, with each kernel's share."""
    buf = io.StringIO()
    with BENCH._env("KUMIKO_DEBUG", "2"), contextlib.redirect_stderr(buf):
        for _ in range(runs):
            exe(**feeds)
    per: dict[str, float] = {}
    for line in buf.getvalue().splitlines():
        m = _KERNEL_LINE.match(line.strip())
        if m:
            per[m.group(1)] = per.get(m.group(1), 0.0) + float(m.group(2))
    total = sum(per.values()) or 1.0
    labels = _kernel_labels(exe)
    return [[k, v / runs, v / total, labels.get(k, "")] for k, v in sorted(per.items(), key=lambda kv: -kv[1])]


def _kernel_labels(exe) -> dict[str, str]:
    """What each kernel of the cpu target does, from its compiled program (best effort: internal objects):
    the plan's algorithm, the Tiny IR ops its region fuses and its first output's shape."""
    out: dict[str, str] = {}
    with contextlib.suppress(Exception):
        compiled = exe._run
        regions = {r.name: r for r in compiled.program.regions}
        for st in compiled.runner.steps:
            parts = []
            for name in st.regions:
                r, plan = regions.get(name), compiled.plans.get(name)
                algo = " ".join(f"{v} {k}" if k == "contraction" else str(v) for k, v in plan.algo_choice) \
                    if plan is not None else ""
                ops: list[str] = []
                for note in getattr(r, "notes", ()):
                    if note.startswith("fuses:"):
                        ops += [w for w in re.findall(r"\b[A-Z][A-Z0-9_]+\b", note) if w not in ops]
                shape = ""
                with contextlib.suppress(Exception):
                    shape = "x".join(str(d) for d in r.outputs[0].memref.shape)
                parts.append(" ".join(x for x in (algo, "/".join(ops), f"-> {shape}" if shape else "") if x))
            out[st.fn] = "; ".join(parts)
    return out


def _onnx_path(name: str, batch: int, args) -> Path:
    """The cached export: named by model, batch, sizes, seed and a digest of netdefs.py and the torch version,
    so an edited model definition or another exporter exports again."""
    sz = netdefs.sizes(name, args.small, args.layers)
    try:
        import torch
        tv = torch.__version__
    except ImportError:
        tv = "none"
    digest = hashlib.sha256((HERE / "netdefs.py").read_bytes() + tv.encode()).hexdigest()[:10]
    tag = "-".join(f"{k}{v}" for k, v in sz.items()) + ("-dynbatch" if args.dynamic_batch else "")
    return Path(args.cache).expanduser() / f"{name}-b{batch}-{tag}-s{args.seed}-{digest}.onnx"


def bench_model(name: str, batch: int, args) -> list[Row]:
    label = f"{name} b{batch}{' (dynamic batch)' if args.dynamic_batch else ''}"
    path = _onnx_path(name, batch, args)
    feeds = netdefs.inputs(name, batch, args.seed, args.small)
    rows: list[Row] = []
    print(f"\n== {label}: {netdefs.sizes(name, args.small, args.layers)}  ({path.name})")
    if not path.exists():
        progress(f"{label}: exporting to ONNX")
        try:
            netdefs.export_onnx(name, batch, path, args.seed, small=args.small, layers=args.layers,
                                dynamic_batch=args.dynamic_batch)
        except Exception as e:  # noqa: BLE001
            if args.verbose:
                traceback.print_exc()
            row = Row(name, batch, "export", note=f"failed: torch.onnx.export: {describe(e)}")
            print(f"  {row.note}")
            return [row]
    else:
        progress(f"{label}: ONNX from the cache")
    outs: dict[str, np.ndarray] = {}
    runs: dict[str, Callable] = {}           # the runners that timed, for the paired phase
    info: dict = {"label": label}

    def record(runner: str, prep: Callable):
        row, r = Row(name, batch, runner), Runner(runner)
        progress(f"{label}: {runner}: setting up")
        try:
            with PeakRSS() as mem:
                run, to_np, comp = prep(r)
                if isinstance(comp, tuple):
                    row.compile_s, row.warm_compile_s = comp
                else:
                    row.compile_s = comp
                last = {}

                def keep():          # the last timed run's output is the one checked: no extra run
                    last["y"] = run()
                time.sleep(BENCH.SETTLE_S if BENCH else 0.3)  # spinning thread pools of the last runner sleep
                progress(f"{label}: {runner}: timing")
                res, row.note = _time(keep, args.reps, args.warmup, args.budget_s)
            row.peak_mb = mem.mb
            outs[runner] = np.asarray(to_np(last["y"]))
            runs[runner] = run
            row.median_ms, row.min_ms, row.reps = res["median_s"] * 1e3, res["min_s"] * 1e3, res["reps"]
            row.samples_ms = [s * 1e3 for s in res["samples_s"]]
        except Skip as e:
            row.note = f"skipped: {e}"
        except Exception as e:  # noqa: BLE001 - a runner's failure is a result, not the end of the run
            row.note = f"failed at {r.step}: {describe(e)}"
            if args.verbose:
                traceback.print_exc()
        rows.append(row)
        _print_row(row)
        return row

    for peer in args.peers:
        if peer == "onnxruntime":
            record(peer, lambda r: ort_runner(r, path, feeds, args))
        elif peer in ("torch", "torch.compile"):
            record(peer, lambda r, p=peer: torch_runner(r, name, feeds, args, p == "torch.compile"))
        elif peer == EVAL:
            record(peer, lambda r: eval_runner(r, path, feeds))
        else:
            rows.append(Row(name, batch, peer, note=f"skipped: unknown peer {peer!r}"))
        gc.collect()
    k_row = record(KUMIKO, lambda r: kumiko_runner(r, path, feeds, args, info))
    if "import_s" in info:
        k_row.note = "; ".join(x for x in (f"from_onnx {info['import_s']:.2f}s", k_row.note) if x)
    exe = info.pop("exe", None)
    if args.profile and exe is not None and k_row.median_ms is not None:
        progress(f"{label}: kumiko per-kernel profile")
        try:
            k_row.profile = kumiko_profile(exe, feeds, max(1, min(args.reps, 3)))
            _print_profile(k_row)
        except Exception as e:  # noqa: BLE001
            print(f"  profile failed: {describe(e)}")
    if args.pairs and KUMIKO in runs:
        for row in rows:
            if row.runner in runs and row.runner not in (KUMIKO, EVAL):
                progress(f"{label}: kumiko and {row.runner}, calls alternating")
                try:
                    row.paired = paired_ratio(runs[KUMIKO], runs[row.runner], args.pairs,
                                              settle_s=BENCH.SETTLE_S if BENCH else 0.3)
                    print(f"  kumiko/{row.runner} paired {_paired(row)}")
                except Exception as e:  # noqa: BLE001
                    row.note = (row.note + "; " if row.note else "") + f"paired timing failed: {describe(e)}"
    del exe
    runs.clear()
    rows.sort(key=lambda x: x.runner != KUMIKO)          # kumiko first, then the peers in their order

    ref = "onnxruntime" if "onnxruntime" in outs else next((p for p in ("torch", KUMIKO) if p in outs), None)
    flops = info.get("flops")
    for row in rows:
        row.ref = ref
        if row.runner in outs and ref:
            row.rel_l2 = rel_l2(outs[row.runner], outs[ref])
            row.ok = row.rel_l2 <= REL_L2_LIMIT
            if ref != "onnxruntime" and row.runner != ref:
                row.note = (row.note + "; " if row.note else "") + f"checked against {ref}"
        if k_row.median_ms and row.median_ms and row is not k_row:
            row.ratio = k_row.median_ms / row.median_ms
        if flops and row.median_ms:
            row.gflops = flops / (row.median_ms * 1e-3) / 1e9
    checked = [f"{r.runner} {r.rel_l2:.1e}{'' if r.ok else ' FAIL'}" for r in rows
               if r.rel_l2 is not None and r.runner != ref]
    if checked:
        print(f"  rel L2 against {ref}: {', '.join(checked)}")
    bad = [r.runner for r in rows if r.ok is False]
    if bad:
        print(f"  !! outputs differ from {ref} (rel L2 > {REL_L2_LIMIT}): {', '.join(bad)}")
    return rows


def _print_row(r: Row) -> None:
    if r.median_ms is None:
        print(f"  {r.runner:<14} {r.note}")
        return
    comp = f"  compile {r.compile_s:.2f}s" if r.compile_s is not None else ""
    comp += f" (warm {r.warm_compile_s:.3f}s)" if r.warm_compile_s is not None else ""
    mem = f"  peak +{r.peak_mb:.0f} MB" if r.peak_mb is not None else ""
    print(f"  {r.runner:<14} median {r.median_ms:10.3f} ms  min {r.min_ms:10.3f} ms  x{r.reps}{comp}{mem}"
          f"{('  [' + r.note + ']') if r.note else ''}")


def _print_profile(r: Row, top: int = 15) -> None:
    if not r.profile:
        print("  (no per-kernel times: the runtime logged none)")
        return
    total = sum(x[1] for x in r.profile)
    print(f"  kumiko per-kernel time (KUMIKO_DEBUG=2, mean of the profiled runs): {len(r.profile)} kernels, "
          f"{total:.3f} ms in kernels of {r.median_ms:.3f} ms per call")
    for k, ms, share, what in r.profile[:top]:
        print(f"    {ms:9.3f} ms  {share * 100:5.1f}%  {k:<24} {what}")
    if len(r.profile) > top:
        rest = r.profile[top:]
        print(f"    {sum(x[1] for x in rest):9.3f} ms  {sum(x[2] for x in rest) * 100:5.1f}%  "
              f"({len(rest)} more kernels)")


# ------------------------------------------------------------------------------------------------
# the report


def cpu_flags() -> list[str]:
    """The ISA flags that matter here, from /proc/cpuinfo: avx2, avx512f, and AMX (tile, bf16, int8)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                  if line.split(":", 1)[0].strip() in ("flags", "Features")), set())
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8") if f in flags]


def machine() -> dict:
    if BENCH:
        m = BENCH.machine()
    else:
        import platform
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.machine())
        m = {"cpu": model, "cores": os.cpu_count() or 1, "isa": [], "vector_width_f32": None,
             "load_avg_1min": os.getloadavg()[0], "kumiko_commit": "unknown (bench.py did not load)",
             "python": platform.python_version(), "numpy": np.__version__, "peers": {}}
    m["cpuinfo_flags"] = cpu_flags()
    with contextlib.suppress(Exception):
        import onnx
        m["peers"]["onnx"] = onnx.__version__
    return m


def results_markdown(rows: list[Row], args, m: dict) -> str:
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    flags = " ".join(m["cpuinfo_flags"]) or "none of avx2/avx512f/amx"
    amx = "" if any(f.startswith("amx") for f in m["cpuinfo_flags"]) else ", no AMX"
    sizes = "; ".join(f"{n} {netdefs.sizes(n, args.small, args.layers)}" for n in args.models)
    lines = [f"## {when}: whole networks, target `cpu`{' (small sizes)' if args.small else ''}", "",
             f"- machine: {m['cpu']}, {m['cores']} cores, ISA {' '.join(m['isa'])} (f32 vector width "
             f"{m['vector_width_f32']}; /proc/cpuinfo: {flags}{amx}), load average "
             f"{_fmt(m['load_avg_1min'], '{:.2f}')} at the start; python {m['python']}, numpy {m['numpy']}"
             + "".join(f", {k} {v}" for k, v in m["peers"].items()) + f"; kumiko {m['kumiko_commit']}",
             f"- command: `python bench/models.py {' '.join(args.argv)}`; threads {args.threads} (onnxruntime "
             f"intra-op, torch{', kumiko through OMP_NUM_THREADS' if args.threads_set else ''}); models from "
             "`bench/netdefs.py`, random weights, exported with torch.onnx (opset 17)"
             + (" with a dynamic batch (the inputs' and outputs' first dimension a dim_param: kumiko compiles one "
                "program for every batch size)" if args.dynamic_batch else ""),
             f"- sizes: {sizes}",
             f"- median and min of {args.reps} runs after {args.warmup} warm-up; ratio = kumiko's median / the "
             f"runner's (> 1: kumiko slower); paired = the median (and quartiles) over {args.pairs} rounds of "
             "kumiko's time over the runner's, each round one untimed and three timed calls of each after a pause "
             "(`paired_ratio`), the figure to compare on a noisy host; rel L2 against onnxruntime's output (limit "
             f"{REL_L2_LIMIT}, FAIL above); GFLOP/s from kumiko's Tiny IR count; compile: kumiko cold (empty "
             "cache) / warm (from the cache), torch.compile's first call, onnxruntime's session; peak MB: resident "
             f"memory growth during the runner's set-up and runs ({MEM_METHOD})", "",
             "| model | batch | runner | median ms | min ms | GFLOP/s | kumiko/runner | paired (IQR) | rel L2 | "
             "compile s (cold / warm) | peak MB | note |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        comp = _fmt(r.compile_s, "{:.2f}") + (f" / {r.warm_compile_s:.3f}" if r.warm_compile_s is not None else "")
        l2 = "-" if r.rel_l2 is None else f"{r.rel_l2:.1e}{'' if r.ok else ' FAIL'}"
        l2 = "ref" if r.runner == r.ref and r.median_ms is not None else l2
        note = r.note.replace("|", "\\|")
        lines.append(f"| {r.model} | {r.batch} | {r.runner} | {_fmt(r.median_ms)} | {_fmt(r.min_ms)} | "
                     f"{_fmt(r.gflops, '{:.2f}')} | {_fmt(r.ratio, '{:.2f}')} | {_paired(r)} | {l2} | {comp} | "
                     f"{_fmt(r.peak_mb, '{:.0f}')} | {note} |")
    return "\n".join(lines) + "\n"


def _paired(r: Row) -> str:
    return "-" if r.paired is None else f"{r.paired[0]:.3f} ({r.paired[1]:.3f}-{r.paired[2]:.3f})"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(netdefs.MODELS), help=f"comma-separated ({','.join(netdefs.MODELS)})")
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--reps", type=int, default=10, help="timed runs per runner (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--pairs", type=int, default=20, help="then kumiko and each peer in turn, this many rounds of "
                   "a few calls each: the paired ratio (default 20; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated peers (default {','.join(PEERS)}); "
                   f"onnxruntime is the reference of the checks; {EVAL} adds kumiko's reference evaluator")
    p.add_argument("--small", action="store_true", help=f"smoke-run sizes: {netdefs.IMAGE_SMALL}x"
                   f"{netdefs.IMAGE_SMALL} images, {netdefs.LAYERS_SMALL} layers, sequence {netdefs.SEQ_SMALL}")
    p.add_argument("--layers", type=int, default=None, help="BERT/GPT-2 layers (default 12; 2 with --small)")
    p.add_argument("--threads", type=int, default=None, help="threads for every runner (default: all cores; sets "
                   "OMP_NUM_THREADS for kumiko's OpenMP kernels)")
    p.add_argument("--budget-s", type=float, default=60.0, help="seconds one runner may spend timing; a slower "
                   "one gets fewer reps, never under 3 (default 60)")
    p.add_argument("--cache", default="~/.cache/kumiko-bench", help="where exported ONNX files are kept "
                   "(default ~/.cache/kumiko-bench)")
    p.add_argument("--profile", action="store_true", help="print kumiko's per-kernel times (KUMIKO_DEBUG=2)")
    p.add_argument("--dynamic-batch", action="store_true", help="export each model with a symbolic batch "
                   "dimension (dim_param \"batch\", as exports for serving usually are) and run it at --batch: "
                   "kumiko compiles it once for every batch size")
    p.add_argument("--append", dest="append", action="store_true", default=True,
                   help="append the table to the results file (default)")
    p.add_argument("--no-append", dest="append", action="store_false", help="do not append")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="results file (default bench/RESULTS.md)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing runners")
    args = p.parse_args(argv)
    args.argv = argv
    args.models = [x.strip() for x in args.models.split(",") if x.strip()]
    unknown = [x for x in args.models if x not in netdefs.MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(netdefs.MODELS)}")
    try:
        args.batch = [int(x) for x in args.batch.split(",") if x.strip()]
    except ValueError:
        p.error("--batch takes comma-separated integers, e.g. 1,8")
    args.peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    if args.reps < 1 or args.warmup < 0 or args.pairs < 0 or not args.batch or min(args.batch) < 1:
        p.error("--reps and batch sizes must be >= 1, --warmup and --pairs >= 0")
    args.threads_set = args.threads is not None
    if args.threads is not None:
        if args.threads < 1:
            p.error("--threads must be >= 1")
        os.environ["OMP_NUM_THREADS"] = str(args.threads)     # before kumiko loads its first kernel
    else:
        args.threads = os.cpu_count() or 1
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, {' '.join(m['cpuinfo_flags'])}; threads {args.threads}; "
          f"peers {', '.join(args.peers) or 'none'}; ONNX cache {Path(args.cache).expanduser()}")
    if BENCH_ERROR is not None:
        print(f"NOTE: bench/bench.py (and kumiko) did not import: {describe(BENCH_ERROR)}")
    rows: list[Row] = []
    for name in args.models:
        for batch in args.batch:
            rows += bench_model(name, batch, args)
    report = {"machine": m, "small": args.small, "memory": MEM_METHOD, "rows": [r.__dict__ for r in rows]}
    table = results_markdown(rows, args, m)
    print("\n" + table)
    if args.append:
        path = Path(args.results)
        head = "" if path.exists() else "# kumiko benchmark results\n\nAppended by `bench/bench.py` and " \
                                        "`bench/models.py` (see bench/README.md); newest last.\n"
        with path.open("a") as f:
            f.write(head + "\n" + table)
        print(f"appended to {path}")
    report["failed_checks"] = [f"{r.model}/b{r.batch}/{r.runner}" for r in rows if r.ok is False]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    rep = main()
    sys.exit(1 if rep["failed_checks"] else 0)
