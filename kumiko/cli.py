"""The ``kumiko`` command line: run, dump and check graph files.

Every failure a user can cause prints a diagnostic (code, kind, at, why, suggestion) and exits with
status 2; ``--json`` prints it as JSON instead. Nothing here prints a Python traceback for bad input.
"""
from __future__ import annotations

import argparse
import json
import re
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
  kumiko run examples/attention_causal.json --target cuda-emu --dtype fp16 --emu asan --check
  kumiko run my_graph.json --check --bisect
  kumiko dump examples/conv3x3_s2_p1.json --stage frontend,tiny --out dumps/
  kumiko check my_graph.json --json
  kumiko bench examples/gemm_bias_relu.json --shapes M=512,N=512,K=512 --reps 10
  kumiko compile examples/gemm_bias_relu.json --target cuda --gpu-arch sm_90a --dump c --out build/

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


def _load(path: str, dtype: str | None = None):
    """The graph in ``path``; with ``dtype`` (``--dtype``), every float tensor retyped to it."""
    from kumiko.compiler import load
    from kumiko.frontend.graph import Graph
    program = load(path)
    if dtype is None:
        return program
    if not isinstance(program, Graph):
        raise KumikoError("E1010", at="--dtype", why=f"{path} is a Tiny IR dump; --dtype retypes frontend graphs",
                          suggestion="give the frontend JSON or .kumiko file the dump came from")
    return program.with_float_dtype(dtype)


def _run_options(args: argparse.Namespace) -> dict:
    """``--emu`` for the cuda-emu target (an emulator configuration), refused elsewhere; ``--gpu-arch``
    (``_gpu_arch_options``)."""
    opts = _gpu_arch_options(args)
    if args.emu is None:
        return opts
    if args.target != "cuda-emu":
        raise KumikoError("E1010", at="--emu", why=f"--emu picks the CUDA emulator's configuration; the target is "
                          f"{args.target}", suggestion="add --target cuda-emu")
    return {**opts, "emu": args.emu}


def _gpu_arch_options(args: argparse.Namespace) -> dict:
    """``--gpu-arch``: for ``cuda`` the cubin's arch (and the plans that go with it), for ``cuda-emu`` the plans an
    arch gets (``sm_90a``: the SM90 skeleton; any other: SM80's), refused for the other targets."""
    arch = getattr(args, "gpu_arch", None)
    if not arch:
        return {}
    if args.target not in ("cuda", "cuda-emu") or not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
        raise KumikoError("E1010", at="--gpu-arch", why=f"--gpu-arch {arch!r} with --target {args.target}: it names "
                          "an NVIDIA arch (sm_80, sm_90a, ...) for --target cuda (the cubin) or cuda-emu (the plans)",
                          suggestion="e.g. --target cuda-emu --gpu-arch sm_90a")
    if args.target == "cuda":
        return {"gpu_arch": arch}
    from kumiko.runtime.cuda_driver import plan_arch_for
    return {"arch": plan_arch_for(arch)}


def _gpu_arch_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-arch", help="--target cuda: build for this arch (sm_80, sm_90a, ...) with nvcc, without a "
                   "GPU (default: the device's); --target cuda-emu: plan for it (sm_90a: the SM90 skeleton, TMA + "
                   "wgmma; default sm_80's mma.sync)")


def _program(args: argparse.Namespace) -> tuple[object, dict]:
    """The program of FILE and the stages given instead of computed: ``--resume STAGE.json`` (a dumped tiny
    or region stage), or FILE itself a region dump (run against the Tiny IR dump beside it)."""
    from kumiko.pipeline import read_stage, tiny_beside
    path, resume = args.file, getattr(args, "resume", None)
    if resume is None and _is_region_dump(path):
        resume, path = path, tiny_beside(path)
        if not path.exists():
            raise KumikoError("E1009", at=args.file, why=f"a region dump runs against its program's Tiny IR, and "
                              f"{path} is missing", suggestion="dump both: kumiko compile FILE --dump tiny,region "
                              "--out DIR (or --dump all), or give FILE --resume REGION.json")
    program = _load(str(path), args.dtype)
    if resume is None:
        return program, {}
    stage, artifact = read_stage(resume)
    if stage == "tiny":
        return artifact, {}
    return program, {stage: artifact}


def _is_region_dump(path: str) -> bool:
    if not path.endswith(".json"):
        return False
    try:
        return json.loads(Path(path).read_text()).get("kumiko") == "region"
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return False            # load reports what is wrong with the file


def _compile_options(args: argparse.Namespace) -> dict:
    """``--plan PLAN.json``: the plans of the named regions (validated against them: E1801)."""
    from kumiko.pipeline import read_plans
    return {"plans": read_plans(args.plan)} if getattr(args, "plan", None) else {}


def cmd_run(args: argparse.Namespace) -> int:
    from kumiko.compiler import compile as kcompile
    program, start = _program(args)
    t0 = time.perf_counter()
    exe = kcompile(program, target=args.target, start=start, **_run_options(args), **_compile_options(args))
    t_compile = time.perf_counter() - t0
    if args.inputs:
        inputs = _read_inputs(args.inputs)
    else:
        inputs = exe.random_inputs(args.seed, _shapes(args.shapes))
    t0 = time.perf_counter()
    outputs = exe(**inputs)
    t_run = time.perf_counter() - t0
    checks = _check(exe, inputs, outputs) if args.check else None
    failed = checks is not None and not all(c.ok for c in checks)
    bisected = None
    if args.bisect:                     # kumiko.debug: every intermediate checked, the first wrong one named
        from kumiko.debug import bisect
        bisected = bisect(program, inputs, args.target, **_run_options(args))
        failed = failed or not bisected.ok
    if args.out:
        import io

        from kumiko.util.files import write_file
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        write_file(Path(args.out), buf.getvalue(), "the outputs")
    summary = {name: _describe(arr) for name, arr in outputs.items()}
    target = exe.target + (f" (emulator: {args.emu})" if args.emu else "")
    if args.json and not failed:        # a mismatch prints one JSON document: the diagnostic, with the table
        res = {"target": exe.target, "compile_s": round(t_compile, 6), "run_s": round(t_run, 6), "outputs": summary}
        if args.emu:
            res["emu"] = args.emu
        if checks is not None:
            res["check"] = {c.name: c.to_json() for c in checks}
        if bisected is not None:
            res["bisect"] = bisected.to_json()
        print(json.dumps(res, indent=2))
    elif not args.json:
        print(f"{Path(args.file).name}: target {target}, compiled in {t_compile * 1e3:.1f} ms, "
              f"ran in {t_run * 1e3:.1f} ms")
        for name, s in summary.items():
            print(f"  {name}: {s['dtype']}{s['shape']}  min {s['min']:.6g}  max {s['max']:.6g}  "
                  f"mean {s['mean']:.6g}  first {s['first']}")
        for c in checks or ():
            print(f"  check {c.name}: relative L2 error {c.rel_l2:.3g} against the evaluator "
                  f"(bound {c.bound:g} for {c.dtype}): {'ok' if c.ok else 'MISMATCH'}")
        if args.out:
            print(f"  wrote {args.out}")
        if bisected is not None:
            print(bisected.render())
    if bisected is not None and not bisected.ok:
        raise bisected.error(table=args.json)
    if failed:
        from kumiko.accuracy import raise_on_mismatch
        raise_on_mismatch(checks, target, exe.bind({**exe.params, **inputs}))
    return 0


def _read_inputs(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``--inputs`` .npz; E1502 for anything that is not a readable one."""
    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data as z:
                return {k: z[k] for k in z.files}
        why = "it holds a single array (.npy), not named arrays"
    # numpy's readers raise many kinds for a damaged archive (BadZipFile, zlib.error, EOFError, ValueError,
    # NotImplementedError, tokenize's TokenError...): the file is the user's, so each one is a FileError
    except Exception as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}" if not isinstance(e, OSError) else (e.strerror or str(e))
    raise KumikoError("E1502", at=path, why=f"cannot read the inputs: {why}",
                      suggestion="give an .npz written by numpy.savez, arrays keyed by input name")


def _check(exe, inputs: dict, outputs: dict) -> list:
    """``--check``: the same inputs through the reference evaluator, each output compared within its dtype's
    bound (kumiko.accuracy)."""
    from kumiko.accuracy import compare, judged_as
    from kumiko.compiler import Executable
    return compare(outputs, Executable(exe.tiny, "eval")(**{**exe.params, **inputs}), judged_as(exe.tiny))


def _describe(arr: np.ndarray) -> dict:
    f = arr.astype(np.float64) if arr.size else np.zeros(1)
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "min": float(np.nanmin(f)) if f.size else 0.0,
            "max": float(np.nanmax(f)) if f.size else 0.0, "mean": float(np.nanmean(f)) if f.size else 0.0,
            "first": [round(float(v), 6) for v in arr.reshape(-1)[:4].astype(np.float64)]}


def cmd_dump(args: argparse.Namespace) -> int:
    from kumiko.pipeline import dump, dump_path
    program = _load(args.file, args.dtype)
    stages = [s.strip() for s in args.stage.split(",") if s.strip()]
    out_dir = Path(args.out) if args.out else None
    if args.format != "json":
        return _dump_pictures(program, stages, args.format, out_dir, args.target)
    texts = dump(program, stages, out_dir, target=args.target)
    if out_dir is None:
        if len(texts) == 1:
            sys.stdout.write(next(iter(texts.values())))
        else:
            sys.stdout.write(json.dumps({s: json.loads(t) for s, t in texts.items()}, indent=2) + "\n")
    else:
        for s in texts:
            print(f"wrote {dump_path(out_dir, program.name, s, 'json')}")
    return 0


def _dump_pictures(program, stages: list[str], fmt: str, out_dir: Path | None, target: str | None = None) -> int:
    from kumiko.pipeline import draw_target_stages, write_dumps
    if fmt == "svg" and out_dir is None and len(stages) > 1:
        raise KumikoError("E1010", at="dump --format svg", why="several SVG pictures cannot share stdout",
                          suggestion="pick one stage (--stage frontend) or write files with --out DIR")
    texts = draw_target_stages(program, stages, fmt, target)     # written here, under a file name safe_stem made
    if out_dir is None:
        sys.stdout.write("".join(texts.values()))
    else:
        for path in write_dumps(texts, program.name, out_dir, fmt):
            print(f"wrote {path}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from kumiko.pipeline import to_tiny
    program = _load(args.file)
    tiny = to_tiny(program)
    if args.json:
        print(json.dumps({"ok": True, "diagnostics": [], "tiny_nodes": len(tiny.nodes)}))
    else:
        print(f"{args.file}: ok ({len(tiny.nodes)} Tiny IR nodes; inputs {[t for t, _ in tiny.inputs]}, "
              f"outputs {[t for t, _ in tiny.outputs]})")
    return 0


def _compile_stages(args: argparse.Namespace) -> list[str]:
    """``compile --dump``'s stages, checked before anything is compiled. Without ``--out`` it is E1010, not a
    print: compile's stdout is its report (or its ``--json`` document, which scripts parse), ``c`` can be a
    binary cubin, and ``kumiko dump`` is the command that prints a stage."""
    from kumiko.pipeline import dump_names
    stages = [s.strip() for s in (args.dump or "").split(",") if s.strip()]
    dump_names(None, stages)
    if stages and not args.out:
        printable = [s for s in stages if s not in ("plan", "c", "all")]
        raise KumikoError("E1010", at="compile --dump", why="--dump writes files and no --out directory is given",
                          suggestion="add --out DIR" + (f", or print the stage with: kumiko dump {args.file} "
                                                         f"--stage {','.join(printable)}" if printable else ""))
    return stages


def cmd_compile(args: argparse.Namespace) -> int:
    from kumiko.compiler import compile as kcompile
    from kumiko.pipeline import DUMPS, dump_names, stage_dumps, write_files
    from kumiko.plan.gpu import describe_plan
    stages = _compile_stages(args)
    program, start = _program(args)
    opts: dict = _compile_options(args)
    if args.tune:                        # options a target does not take are refused
        opts["tune"] = True
    if args.shapes:
        opts["shapes"] = _shapes(args.shapes)
    opts.update(_gpu_arch_options(args))
    t0 = time.perf_counter()
    exe = kcompile(program, target=args.target, start=start, want=tuple(DUMPS[s] for s in stages if s in DUMPS),
                   **opts)
    took = time.perf_counter() - t0
    comp = exe.compilation
    built = comp.binary
    out_dir = Path(args.out) if args.out else None
    cubin = getattr(built, "cubin", None)
    if stages:
        write_files(stage_dumps(comp, dump_names(comp, stages)), comp.name, out_dir)
    launches = [_launch_info(ln, cubin) for ln in getattr(built, "launches", ())]
    if args.json:
        plans = {n: p.to_json() for n, p in (comp.plan or {}).items()}
        res = {"target": exe.target, "compile_s": round(took, 4), "plans": plans}
        if launches:
            res["launches"] = launches
        if cubin is not None:
            res["gpu_arch"] = cubin.arch
        print(json.dumps(res, indent=2))
        return 0
    print(f"{Path(args.file).name}: compiled for {exe.target}"
          + (f" ({cubin.arch} cubin{', from the cache' if cubin.cached else ''})" if cubin is not None else "")
          + f" in {took * 1e3:.1f} ms")
    for name, p in (comp.plan or {}).items():
        print(f"  {name}: {describe_plan(p)}")
    for ln in launches:
        res = ln.get("ptxas")
        print(f"    launch {ln['kernel']}: grid {ln['grid']} block {ln['block']} dynamic smem {ln['smem']} B"
              + (f"; ptxas: {res['registers']} registers, {res['smem']} B static smem, {res['spill_stores']} B "
                 f"spill stores" if res else ""))
    runner = getattr(built, "runner", None)
    for step in getattr(runner, "steps", ()):
        if len(step.regions) > 1:
            print(f"  {' + '.join(step.regions)}: one kernel {step.fn} (row-block pipeline; "
                  "the deferred buffer between them is never written)")
    if out_dir is not None and stages:
        print(f"  dumps in {out_dir}")
    return 0


def _launch_info(ln, cubin) -> dict:
    """One GPU launch for ``compile``'s report (``Launch.to_json``), its grid as ceil(extent / tile) per axis,
    with ptxas's registers / static shared memory / spills when a cubin was built."""
    out = {**ln.to_json(), "grid": [str(e) if t == 1 else str(-(-e // t)) if isinstance(e, int)
                                    else f"ceil({e}/{t})" for e, t in ln.grid]}
    res = cubin.resources.get(ln.kernel) if cubin is not None else None
    if res is not None:
        out["ptxas"] = {"registers": res.registers, "smem": res.smem, "spill_stores": res.spill_stores,
                        "spill_loads": res.spill_loads}
    return out


def cmd_explain(args: argparse.Namespace) -> int:
    from kumiko.pipeline import compile_program
    from kumiko.region.srnf import epilogue
    program = _load(args.file)
    p = compile_program(program, until="region").region
    if args.json:
        print(json.dumps({"regions": [{"name": r.name, "outputs": [o.name for o in r.outputs],
                                       "materialize": [o.materialize for o in r.outputs],
                                       "epilogue": epilogue(r), "notes": list(r.notes)} for r in p.regions]},
                         indent=2))
        return 0
    print(f"{program.name}: {len(p.regions)} kernel(s), in execution order")
    for k, r in enumerate(p.regions):
        outs = ", ".join(f"{o.name} ({o.materialize})" for o in r.outputs)
        iters = ", ".join(f"{a.name}<{a.size}" for a in r.iters)
        print(f"\n[{k}] {r.name}: writes {outs}; iterates {iters}")
        for note in r.notes:
            print(f"    {note}")
        ep = epilogue(r)
        if ep:
            print(f"    epilogue on the accumulator: {' -> '.join(ep)}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Time a compiled graph on fresh random inputs: median and min of --reps runs after --warmup runs."""
    from kumiko.compiler import compile as kcompile
    from kumiko.runtime.flops import count_flops, gflops, measure
    if args.reps < 1 or args.warmup < 0:
        raise KumikoError("E1010", at="bench", why=f"--reps {args.reps} / --warmup {args.warmup}",
                          suggestion="give --reps >= 1 and --warmup >= 0")
    program = _load(args.file, args.dtype)
    t0 = time.perf_counter()
    exe = kcompile(program, target=args.target)
    t_compile = time.perf_counter() - t0
    shapes = _shapes(args.shapes)
    inputs = exe.random_inputs(args.seed, shapes)
    env = exe.bind(inputs, shapes)
    r = measure(lambda: exe(**inputs), reps=args.reps, warmup=args.warmup)
    flops = count_flops(exe.tiny, env)
    rate = gflops(flops, r["median_s"])
    res = {"file": args.file, "target": exe.target, "sizes": env, "compile_s": round(t_compile, 6),
           "median_ms": r["median_s"] * 1e3, "min_ms": r["min_s"] * 1e3, "mean_ms": r["mean_s"] * 1e3,
           "reps": r["reps"], "warmup": r["warmup"], "flops": flops, "gflops": rate}
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    sizes = ",".join(f"{k}={v}" for k, v in sorted(env.items()))
    print(f"{Path(args.file).name}: target {exe.target}, sizes {sizes or '-'}, compiled in {t_compile * 1e3:.1f} ms")
    print(f"  median {res['median_ms']:.3f} ms  min {res['min_ms']:.3f} ms  ({r['reps']} runs after "
          f"{r['warmup']} warm-up)" + (f"  {rate:.2f} GFLOP/s ({flops} FLOPs)" if rate is not None else ""))
    return 0


def _dtype_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32", "fp64"), help="store every floating-point tensor as "
                   "this dtype (e.g. an fp32 example as fp16: the tensor-core path of the CUDA targets)")


def _resume_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume", metavar="STAGE.json", help="start from a dumped stage instead of computing it: a "
                   "tiny or region dump (--dump tiny,region); FILE gives the program it computes (its inputs, "
                   "and the reference --check compares with). FILE may itself be a region dump, run against "
                   "the <name>.tiny.json beside it")
    p.add_argument("--plan", metavar="PLAN.json", help="use these plans (region name -> plan, as --dump plan "
                   "writes them; any subset of the regions), each validated against its region: a bad one is "
                   "E1801")


def _command(sub, name: str, fn, file_help: str = "graph file", **kw) -> argparse.ArgumentParser:
    """Subcommand ``name`` over FILE, run by ``fn``; it takes the top-level ``--json`` after FILE too (hidden)."""
    c = sub.add_parser(name, **kw)
    c.add_argument("file", help=file_help)
    c.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    c.set_defaults(fn=fn)
    return c


def build_parser() -> argparse.ArgumentParser:
    from kumiko.compiler import DEFAULT_TARGET, TARGETS
    from kumiko.pipeline import DRAWINGS, DUMPS, STAGES
    p = argparse.ArgumentParser(prog="kumiko", description="kumiko: a deep-learning compiler (tensor graphs -> "
                                "Tiny IR -> polyhedral analysis -> kernels).", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print results and diagnostics as JSON")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    targets = ", ".join(sorted(TARGETS))

    r = _command(sub, "run", cmd_run, "graph file (.json frontend graph, Tiny IR dump, .kumiko DSL or .onnx model)",
                 help="compile a graph and run it on inputs (random ones when none are given)",
                 description="Compile FILE for a target and run it. Without --inputs, fresh random inputs are made "
                 "from the signature (sizes from --shapes, else the file's 'symbols').")
    r.add_argument("--target", default=DEFAULT_TARGET, help=f"where to run (default {DEFAULT_TARGET}; {targets})")
    r.add_argument("--inputs", help=".npz with one array per signature input name")
    r.add_argument("--shapes", help="sizes for symbolic dims, e.g. M=128,N=64 (overrides the file's defaults)")
    r.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    r.add_argument("--out", help="write the outputs to this .npz (keyed by signature output name)")
    _dtype_option(r)
    _resume_options(r)
    r.add_argument("--check", action="store_true", help="also run the reference evaluator on the same inputs and "
                   "compare each output (relative L2 error within its dtype's bound: fp32 1e-4, fp16 1e-2, "
                   "bf16 2e-2, integers exact); a mismatch is diagnostic E1705 (exit 2)")
    r.add_argument("--bisect", action="store_true", help="also compile with every intermediate tensor exposed, "
                   "compare each one with the evaluator and print the table, naming the first wrong node and the "
                   "kernel it runs in; a mismatch is E1705 (docs/debugging.md)")
    _gpu_arch_option(r)
    r.add_argument("--emu", choices=("deferred", "eager", "reversed", "random", "asan"),
                   help="--target cuda-emu: the emulator's configuration (default deferred: cp.async lands at "
                   "wait_group, round-robin threads; eager: copies land at issue, warp 0 runs ahead between "
                   "barriers; reversed: copies land at issue, the last warp first and ahead; random: deferred "
                   "copies, a seeded random thread order; asan: AddressSanitizer); "
                   "docs/emulator.md says what each catches")

    d = _command(sub, "dump", cmd_dump, help="write the JSON of pipeline stages", description="Print or write "
                 "each stage's JSON dump, in the seeds' shape; dumps are byte-identical across runs.")
    d.add_argument("--stage", default="frontend,tiny", help="comma-separated stages: "
                   f"{', '.join(n for n in DUMPS if n != 'c')} (default frontend,tiny)")
    d.add_argument("--target", default=None, help="whose region, plan and gpu_ir stages to dump or draw (default "
                   f"cpu, and cuda-emu for gpu_ir; {targets}): --target cuda-emu --stage plan shows the GPU plans")
    d.add_argument("--out", help="directory to write <name>.<stage>.<format> into (default: print to stdout)")
    d.add_argument("--format", choices=("json", "dot", "svg"), default="json",
                   help=f"json (default): the stage's dump; dot or svg: a picture of the stage "
                   f"({', '.join(DRAWINGS)}); svg needs graphviz's dot")
    _dtype_option(d)

    k = _command(sub, "compile", cmd_compile,
                 help="compile a graph for a target; optionally autotune and write stage dumps",
                 description="Compile FILE (regions, plans, generated code, build). --tune times the "
                 "candidate plans of each kernel and caches the winners; --dump writes stage dumps "
                 f"({', '.join([*DUMPS, 'all'])}) into --out. The stages run in order: "
                 f"{' -> '.join(STAGES)}; --resume starts from a dumped tiny or region stage, --plan "
                 "replaces the plans. KUMIKO_DUMP=DIR writes every stage of every compile (--dump all); "
                 "KUMIKO_DEBUG=1..5 prints stage times, kernels, plans, source, IRs on stderr.")
    k.add_argument("--target", default=DEFAULT_TARGET, help=f"target (default {DEFAULT_TARGET}; {targets})")
    k.add_argument("--tune", action="store_true", help="autotune: build and time candidate plans, cache the best")
    k.add_argument("--shapes", help="sizes to tune for, e.g. M=1024,N=1024,K=1024 (default: the file's symbols)")
    k.add_argument("--dump", help="comma-separated stages to write, or all (needs --out; `kumiko dump` prints "
                   "a stage instead); c writes the generated source (.c, or .cu for the CUDA targets, with the "
                   "cubin for --target cuda), gpu_ir the CUDA targets' kernels")
    k.add_argument("--out", help="directory for dumps")
    _dtype_option(k)
    _resume_options(k)
    _gpu_arch_option(k)

    _command(sub, "explain", cmd_explain,
             help="show the kernels (regions) a graph becomes and why each boundary is there",
             description="Form the regions of FILE (one region = one kernel) and print, for each, what it fuses, "
             "what it reads, which rule made each boundary, and its epilogue.")
    _command(sub, "check", cmd_check, help="verify a graph file (shapes, dtypes, names) without running it",
             description="Load and verify FILE: the frontend checks and the Tiny IR verifier. Exit 0 when it is "
             "valid, 2 with a diagnostic when not.")

    b = _command(sub, "bench", cmd_bench, help="time a compiled graph on random inputs (median, min, GFLOP/s)",
                 description="Compile FILE for a target, make fresh random inputs (never zeros), run --warmup "
                 "untimed and --reps timed runs, and print the median and min time and GFLOP/s (FLOPs counted "
                 "on the Tiny IR: 2 per multiply-accumulate). bench/bench.py compares peers.")
    b.add_argument("--target", default=DEFAULT_TARGET, help=f"where to run (default {DEFAULT_TARGET}; {targets})")
    b.add_argument("--shapes", help="sizes for symbolic dims, e.g. M=1024,N=1024,K=1024")
    b.add_argument("--reps", type=int, default=10, help="timed runs (default 10)")
    b.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    b.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    _dtype_option(b)
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
