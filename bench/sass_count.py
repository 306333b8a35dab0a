#!/usr/bin/env python3
"""Static instruction counts of kumiko's generated fp16 GEMM, from its SASS: no GPU needed.

Builds bench_gpu.py's fp16 GEMM ``y = A @ B`` (symbolic M, N, K: the kernel it times; ``--workload`` picks
another of its workloads, e.g. ``conv3x3``, the implicit GEMM) under each MMA tile given, with nvcc for each
arch, disassembles the cubin with ``nvdisasm`` and prints, per tile and arch:

- ptxas's registers per thread;
- the K loop (the backward branch whose body holds the HMMAs): on the shortest path from its head back to it
  that issues the most LDGSTS (the iteration that copies the next tile), the count of HMMA, LDSM, LDGSTS,
  other instructions and NOPs, per warp and K tile;
- the epilogue: instructions along the shortest path from the drain's ``cp.async.wait_group 0`` to EXIT that
  stores the most column pairs (``STG.E``, one 32-bit store of two halves), per thread for one output tile.

Branches are followed wherever they lead, so a branch laid out after the loop counts. These are issue counts,
not times: what they are good for is comparing two versions of the generator (bench/RESULTS.md).

    python bench/sass_count.py                                  # the large plan's tile, sm_80 and sm_90a
    python bench/sass_count.py --tiles 128x128x32/64x64/4/g8/merged,64x64x32/32x32/3/registers --arch sm_90a
    python bench/sass_count.py --nvdisasm /path/to/nvdisasm --keep out/   # keeps k.cu, k.cubin, k.sass

``nvdisasm`` is in the CUDA toolkit, or in the ``nvidia-cuda-nvdisasm`` wheel (``nvidia/cu13/bin``).
"""
from __future__ import annotations

import argparse
import heapq
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]     # kumiko from this checkout; bench_gpu beside this script

DEFAULT_TILES = "128x128x32/64x64/4/g8/merged"
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+([@A-Z].*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:!?U?P\w+,\s*)?`?\(?(\.L_x_\d+)")


@dataclass(frozen=True)
class Sass:
    """A kernel's instructions in layout order, with the index each label names."""
    instrs: tuple[str, ...]
    labels: dict

    @classmethod
    def parse(cls, text: str) -> Sass:
        instrs, labels, pending = [], {}, []
        for line in text.splitlines():
            m = _LABEL.match(line)
            if m:
                pending.append(m.group(1))
                continue
            m = _INSTR.match(line)
            if m:
                for lab in pending:
                    labels[lab] = len(instrs)
                pending = []
                instrs.append(m.group(1))
        return cls(tuple(instrs), labels)

    def successors(self, i: int) -> list:
        """Where control goes after instruction ``i``: indices, or "exit"."""
        t = self.instrs[i]
        if t.startswith("EXIT"):
            return ["exit"]
        m = _BRANCH.search(t)
        out = []
        if m:
            out.append(self.labels[m.group(1)])
            if not t.startswith("@"):
                return out
        if i + 1 < len(self.instrs):
            out.append(i + 1)
        return out

    def shortest(self, start: int, ends, weight) -> dict[int, list[int]]:
        """For each total ``weight`` reachable, the shortest path (instruction indices) from ``start``
        (excluded) to an end: ``ends(j)`` is true for the end's successor value. Dijkstra over
        (instruction, weight so far)."""
        best: dict[int, list[int]] = {}
        seen = set()
        heap = [(0, 0, start, ())]
        while heap:
            cost, w, i, path = heapq.heappop(heap)
            if (i, w) in seen:
                continue
            seen.add((i, w))
            for j in self.successors(i):
                if ends(j):
                    best.setdefault(w, list(path))
                    continue
                if j == "exit":
                    continue
                w2 = w + weight(self.instrs[j])
                if (j, w2) not in seen:
                    heapq.heappush(heap, (cost + 1, w2, j, path + (j,)))
        return best


def kind(t: str) -> str:
    for k in ("HMMA", "LDSM", "LDGSTS"):
        if k in t:
            return k
    return "NOP" if t.startswith("NOP") or t.startswith("@!PT LDS") else "other"


def k_loop(s: Sass) -> Counter | None:
    """Counts on the K loop's shortest copying iteration (the loop with the most HMMAs; of several such -
    one per loop version - the one that copies the most, then the shortest)."""
    loops = []
    for i, t in enumerate(s.instrs):
        m = _BRANCH.search(t)
        if m and s.labels[m.group(1)] <= i:
            head = s.labels[m.group(1)]
            loops.append((sum("HMMA" in x for x in s.instrs[head:i + 1]), head))
    if not loops:
        return None
    most = max(n for n, _ in loops)
    found = []
    for n, head in loops:
        if n != most:
            continue
        paths = s.shortest(head, lambda j, h=head: j == h, lambda t: kind(t) == "LDGSTS")
        if paths:
            w = max(paths)
            found.append((w, -len(paths[w]), Counter(kind(s.instrs[i]) for i in [head] + paths[w])))
    return max(found, key=lambda f: (f[0], f[1]))[2] if found else None


def epilogue(s: Sass) -> tuple[int, int] | None:
    """(pair stores, instructions) on the epilogue's shortest path storing the most pairs (from the
    drain's wait to EXIT); of several drains (one per loop version), the shortest."""
    out = []
    for i, t in enumerate(s.instrs):
        if t.startswith("DEPBAR.LE SB0, 0x0"):
            paths = s.shortest(i, lambda j: j == "exit", lambda t: "STG.E " in t)
            if paths:
                w = max(paths)
                out.append((w, len(paths[w]) + 1))
    return min(out, key=lambda p: (-p[0], p[1])) if out else None


def build(tiny, spec: str, arch: str, keep: Path | None):
    """The program ``tiny`` with its MMA regions under tile ``spec`` (bench_gpu's syntax), built for ``arch``:
    the chosen plans come from the emulator target's compile (no nvcc), the tile replaces theirs."""
    from bench_gpu import apply_tile

    from kumiko.pipeline import compile_cuda, compile_program

    plans = {n: apply_tile(p, spec) for n, p in compile_cuda(tiny).plans.items() if p.algo == "mma"}
    got = compile_program(tiny, "cuda", {"plans": plans, "gpu_arch": arch}).binary
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "k.cu").write_text(got.compiled.source)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--tiles", default=DEFAULT_TILES, help="comma-separated MMA tiles, bench_gpu's --tiles syntax")
    p.add_argument("--arch", default="sm_80,sm_90a", help="comma-separated GPU archs (default sm_80,sm_90a)")
    p.add_argument("--nvdisasm", default=None, help="nvdisasm to use (default: on PATH)")
    p.add_argument("--keep", type=Path, default=None, help="write each build's k.cu, k.cubin, k.sass here")
    p.add_argument("--workload", default="gemm-4096", help="bench_gpu.py's workload whose MMA kernel to count "
                   "(default gemm-4096; conv3x3: the implicit GEMM)")
    args = p.parse_args(argv)
    from bench_gpu import WORKLOADS
    if args.workload not in WORKLOADS:
        print(f"sass_count: no workload {args.workload!r} (bench_gpu.py has {', '.join(WORKLOADS)})", file=sys.stderr)
        return 2
    nvdisasm = args.nvdisasm or shutil.which("nvdisasm")
    if nvdisasm is None:
        print("sass_count: no nvdisasm (give --nvdisasm, or pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    wl = WORKLOADS[args.workload]
    tiny = wl.graph(wl.sizes).tiny          # symbolic sizes: the sizes are the run's, not the kernel's
    print("| tile | arch | registers | K loop: HMMA | LDSM | LDGSTS | other | NOP | epilogue: pairs | instructions |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for spec in [t for t in args.tiles.split(",") if t]:
        for arch in [a for a in args.arch.split(",") if a]:
            keep = args.keep / f"{spec.replace('/', '_')}_{arch}" if args.keep else None
            got = build(tiny, spec, arch, keep)
            with tempfile.TemporaryDirectory() as tmp:
                cubin = Path(tmp) / "k.cubin"
                cubin.write_bytes(got.cubin.data)
                text = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True,
                                      check=True).stdout
            if keep is not None:
                (keep / "k.cubin").write_bytes(got.cubin.data)
                (keep / "k.sass").write_text(text)
            s = Sass.parse(text)
            regs = max(r.registers for r in got.cubin.resources.values())
            c = k_loop(s) or Counter()
            e = epilogue(s) or ("-", "-")
            print(f"| {spec} | {arch} | {regs} | {c['HMMA']} | {c['LDSM']} | {c['LDGSTS']} | {c['other']} | "
                  f"{c['NOP']} | {e[0]} | {e[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
