"""The ``kumiko`` command line: run, dump and check graph files.

Every failure a user can cause prints a diagnostic (code, kind, at, why, suggestion) and exits with
status 2; ``--json`` prints it as JSON instead. Nothing here prints a Python traceback for bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from kumiko.diagnostics import KumikoError

EXIT_DIAGNOSTIC = 2

EPILOG = """\
examples:
  kumiko run examples/gemm_bias_relu.json
  kumiko run examples/gemm_bias_relu.json --shapes M=128,N=64,K=32 --seed 1 --out y.npz
  kumiko dump examples/conv3x3_s2_p1.json --stage frontend,tiny --out dumps/
  kumiko check my_graph.json --json

Graph files are frontend JSON (see docs/frontend.md), a dumped Tiny IR (a file with "uops"),
or the graph DSL (.kumiko). Errors print as diagnostics and exit with status 2.
"""


def _shapes(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in filter(None, (text or "").split(",")):
        name, _, value = part.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise KumikoError("E1010", at="--shapes", why=f"{part!r} is not NAME=INT",
                              suggestion="write --shapes M=128,N=64") from None
        if out[name.strip()] < 0:
            raise KumikoError("E1010", at="--shapes", why=f"{part!r}: sizes must be >= 0")
    return out


def _load(path: str):
    from kumiko.compiler import load
    return load(path)


def cmd_run(args: argparse.Namespace) -> int:
    from kumiko.compiler import compile as kcompile
    program = _load(args.file)
    t0 = time.perf_counter()
    exe = kcompile(program, target=args.target)
    t_compile = time.perf_counter() - t0
    if args.inputs:
        try:
            with np.load(args.inputs) as z:
                inputs = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise KumikoError("E1502", at=args.inputs, why=f"cannot read the inputs: {e}",
                              suggestion="give an .npz written by numpy.savez with arrays keyed by input name") from None
    else:
        inputs = exe.random_inputs(args.seed, _shapes(args.shapes))
    t0 = time.perf_counter()
    outputs = exe(**inputs)
    t_run = time.perf_counter() - t0
    if args.out:
        from kumiko.util import atomic_write
        import io
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        atomic_write(Path(args.out), buf.getvalue())
    summary = {name: _describe(arr) for name, arr in outputs.items()}
    if args.json:
        print(json.dumps({"target": exe.target, "compile_s": round(t_compile, 6), "run_s": round(t_run, 6),
                          "outputs": summary}, indent=2))
    else:
        print(f"{Path(args.file).name}: target {exe.target}, compiled in {t_compile * 1e3:.1f} ms, "
              f"ran in {t_run * 1e3:.1f} ms")
        for name, s in summary.items():
            print(f"  {name}: {s['dtype']}{s['shape']}  min {s['min']:.6g}  max {s['max']:.6g}  "
                  f"mean {s['mean']:.6g}  first {s['first']}")
        if args.out:
            print(f"  wrote {args.out}")
    return 0


def _describe(arr: np.ndarray) -> dict:
    f = arr.astype(np.float64) if arr.size else np.zeros(1)
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "min": float(np.nanmin(f)) if f.size else 0.0,
            "max": float(np.nanmax(f)) if f.size else 0.0, "mean": float(np.nanmean(f)) if f.size else 0.0,
            "first": [round(float(v), 6) for v in arr.reshape(-1)[:4].astype(np.float64)]}


def cmd_dump(args: argparse.Namespace) -> int:
    from kumiko.pipeline import dump
    program = _load(args.file)
    stages = [s.strip() for s in args.stage.split(",") if s.strip()]
    out_dir = Path(args.out) if args.out else None
    texts = dump(program, stages, out_dir)
    if out_dir is None:
        if len(texts) == 1:
            sys.stdout.write(next(iter(texts.values())))
        else:
            sys.stdout.write(json.dumps({s: json.loads(t) for s, t in texts.items()}, indent=2) + "\n")
    else:
        for s in texts:
            print(f"wrote {out_dir / f'{program.name}.{s}.json'}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from kumiko.compiler import to_tiny
    program = _load(args.file)
    tiny = to_tiny(program)
    if args.json:
        print(json.dumps({"ok": True, "diagnostics": [], "tiny_nodes": len(tiny.nodes)}))
    else:
        print(f"{args.file}: ok ({len(tiny.nodes)} Tiny IR nodes; inputs {[t for t, _ in tiny.inputs]}, "
              f"outputs {[t for t, _ in tiny.outputs]})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from kumiko.compiler import DEFAULT_TARGET, PLANNED, TARGETS
    from kumiko.pipeline import STAGES
    p = argparse.ArgumentParser(prog="kumiko", description="kumiko: a deep-learning compiler (tensor graphs -> "
                                "Tiny IR -> polyhedral analysis -> kernels).", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print results and diagnostics as JSON")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    targets = ", ".join(sorted(TARGETS)) + "".join(f"; {t}: planned" for t in PLANNED if t not in TARGETS)

    r = sub.add_parser("run", help="compile a graph and run it on inputs (random ones when none are given)",
                       description="Compile FILE for a target and run it. Without --inputs, fresh random inputs "
                       "are made from the signature (sizes from --shapes, else the file's 'symbols').")
    r.add_argument("file", help="graph file (.json frontend graph, Tiny IR dump, or .kumiko DSL)")
    r.add_argument("--target", default=DEFAULT_TARGET, help=f"where to run (default {DEFAULT_TARGET}; {targets})")
    r.add_argument("--inputs", help=".npz with one array per signature input name")
    r.add_argument("--shapes", help="sizes for symbolic dims, e.g. M=128,N=64 (overrides the file's defaults)")
    r.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    r.add_argument("--out", help="write the outputs to this .npz (keyed by signature output name)")
    r.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    r.set_defaults(fn=cmd_run)

    d = sub.add_parser("dump", help="write the JSON of pipeline stages", description="Print or write each "
                       "stage's JSON dump, in the seeds' shape; dumps are byte-identical across runs.")
    d.add_argument("file", help="graph file")
    d.add_argument("--stage", default="frontend,tiny", help=f"comma-separated stages: {', '.join(STAGES)} "
                   "(default frontend,tiny)")
    d.add_argument("--out", help="directory to write <name>.<stage>.json into (default: print to stdout)")
    d.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    d.set_defaults(fn=cmd_dump)

    c = sub.add_parser("check", help="verify a graph file (shapes, dtypes, names) without running it",
                       description="Load and verify FILE: the frontend checks and the Tiny IR verifier. "
                       "Exit 0 when it is valid, 2 with a diagnostic when not.")
    c.add_argument("file", help="graph file")
    c.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    c.set_defaults(fn=cmd_check)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False) or "--json" in argv
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    try:
        return args.fn(args)
    except KumikoError as e:
        if args.json:
            print(e.to_json())
        else:
            print(e.render(), file=sys.stderr)
        return EXIT_DIAGNOSTIC


if __name__ == "__main__":
    sys.exit(main())
