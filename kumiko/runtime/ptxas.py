"""nvcc builds and the ptxas resource report: registers, shared memory, spills per kernel.

The plan stage needs the real resource use of a kernel (seed 001 §11: stop when registers drop
occupancy, when shared memory passes ~80% of the limit), and CI needs a compile check for
``sm_80`` / ``sm_90a`` on machines without a GPU. ``nvcc --ptxas-options=-v`` prints, per kernel::

    ptxas info    : Compiling entry function 'gemm' for 'sm_80'
    ptxas info    : Function properties for gemm
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 126 registers, used 1 barriers, 1024 bytes smem, 392 bytes cmem[0]

``parse_ptxas_report`` turns that into ``{kernel: KernelResources}``; ``nvcc_compile`` runs nvcc on
a source (cubin + PTX in one call) and returns both.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from kumiko.diagnostics import KumikoError
from kumiko.plan.gpu import KernelResources  # noqa: F401  (the report record; re-exported)
from kumiko.runtime.toolchain import build_dir, run_tool
from kumiko.util.files import safe_stem

INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"


_COMPILING = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_FUNC_COMPILE = re.compile(r"Function properties for ([^\s]+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")


def parse_ptxas_report(text: str) -> dict[str, KernelResources]:
    """Parse ``--ptxas-options=-v`` output (one or several kernels, any arch) into a dict by name.

    Lines arrive in the order "Compiling entry function" (entry kernels only), "Function
    properties" + the frame line, then "Used N registers...". A kernel compiled for two archs
    keeps the last report; pass each arch's log separately to keep both.
    """
    out: dict[str, dict[str, Any]] = {}
    current: str | None = None
    entries: dict[str, str] = {}
    for line in text.splitlines():
        m = _COMPILING.search(line)
        if m:
            current = m.group(1)
            entries[current] = m.group(2)
            out.setdefault(current, {"name": current, "arch": m.group(2), "entry": True})
            continue
        m = _FUNC_COMPILE.search(line)
        if m:
            current = m.group(1)
            out.setdefault(current, {"name": current, "arch": entries.get(current, ""), "entry": current in entries})
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            out[current].update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = _USED.search(line)
        if m:
            rec = out[current]
            rec["registers"] = int(m.group(1))
            if b := _BARRIERS.search(line):
                rec["barriers"] = int(b.group(1))
            if s := _SMEM.search(line):
                rec["smem"] = int(s.group(1))
            rec["cmem"] = {int(bank): int(n) for n, bank in _CMEM.findall(line)}
    return {k: KernelResources(**v) for k, v in out.items()}


@dataclass(frozen=True)
class NvccResult:
    """One nvcc build: the PTX text, the ptxas report parsed per kernel, and the raw log."""

    arch: str
    ptx: str
    resources: dict[str, KernelResources]
    log: str


def nvcc_path() -> str | None:
    """nvcc on PATH, or None (callers skip GPU compile checks with a reason)."""
    return shutil.which("nvcc")


def nvcc_compile(source: str, arch: str = "sm_80", *, name: str = "kernel", defines: Mapping[str, Any] | None = None,
                 extra_flags: Sequence[str] = (), host: bool = False) -> NvccResult:
    """Compile ``source`` for ``arch`` (``sm_80``, ``sm_90a``...) to a cubin, keeping the PTX.

    ``host=True`` builds an object file instead, so the host side (the KUMIKO_ENTRY launch
    wrappers) is compiled too; slower, as nvcc then runs the host compiler. Raises E1701 when nvcc
    is missing or the build fails (with the log).
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise KumikoError("E1701", at=name, why="nvcc is not on PATH", suggestion="Install the CUDA toolkit.")
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch must look like sm_80 or sm_90a, got {arch!r}")
    defs = [f"-D{k}" if v is None or v is True else f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    with build_dir("nvcc") as d:
        stem = safe_stem(name, "kernel")
        src = Path(d) / f"{stem}.cu"
        src.write_text(source)
        out = Path(d) / (f"{stem}.o" if host else f"{stem}.cubin")
        cmd = [nvcc, "-std=c++17", f"-arch={arch}", "-c" if host else "-cubin", "--ptxas-options=-v", "-keep",
               "-keep-dir", d, "-I", str(INCLUDE_DIR), *defs, *extra_flags, "-o", str(out), str(src)]
        proc = run_tool(cmd, at=name, cwd=d)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            first = next((x.strip() for x in log.splitlines() if "error" in x), log.strip()[:200])
            raise KumikoError("E1701", at=name, why=f"nvcc -arch={arch} failed: {first}", command=" ".join(cmd),
                              log=log[-8000:])
        ptx_files = sorted(Path(d).glob("*.ptx"))
        ptx = "\n".join(p.read_text() for p in ptx_files)
    return NvccResult(arch=arch, ptx=ptx, resources=parse_ptxas_report(log), log=log)
