"""What the CUDA renderers (``cuda``: the SM80 MMA skeleton and SIMT kernels, ``cuda_attention``, ``cuda_sm90``)
print alike: a kernel's parameter list, the loop-IR element code it carries, the SM80 cp.async pipeline's
statements (commit, wait, barrier, the K loop) and the kernel's opening and closing lines."""
from __future__ import annotations

from typing import Callable

from kumiko.kernel.gpu_ir import Barrier, CommitGroup, KLoop, WaitGroup
from kumiko.render.c import render_stmts


def cuda_params(params) -> str:
    """Kernel parameters (``gpu_ir.Param``) as a C parameter list."""
    out = []
    for p in params:
        if p.pointer:
            out.append(f"{'const ' if p.const else ''}{p.ctype}* __restrict__ {p.name}")
        else:
            out.append(f"{p.ctype} {p.name}")
    return ", ".join(out)


def code(stmts, ind: int) -> list[str]:
    """Loop-IR statements printed by the C renderer at indent level ``ind`` (two spaces a level)."""
    out: list[str] = []
    render_stmts(stmts, ind, out)
    return out


def open_cta_kernel(k) -> list[str]:
    """The signature of a one-CTA-per-SM kernel over ``k.params`` and its dynamic shared memory."""
    return [f"extern \"C\" __global__ void __launch_bounds__({k.threads}, 1) {k.name}({cuda_params(k.params)}) {{",
            "  extern __shared__ __align__(128) unsigned char kk_smem[];"]


def close_kernel(k) -> list[str]:
    return ["}", f"KUMIKO_ENTRY({k.name})"]


def pipeline_stmts(body, pad: str, stmt: Callable[[object, str], list[str]]) -> list[str]:
    """A cp.async pipeline's statements: the group commits and waits, the barriers and the K loop printed here,
    every other statement by ``stmt(s, pad)``."""
    out: list[str] = []
    for s in body:
        if isinstance(s, CommitGroup):
            out.append(f"{pad}cp_async_commit();")
        elif isinstance(s, WaitGroup):
            out.append(f"{pad}cp_async_wait<{s.pending}>();")
        elif isinstance(s, Barrier):
            out.append(f"{pad}__syncthreads();  // {s.why}")
        elif isinstance(s, KLoop):
            out.append(f"{pad}for (int {s.var} = 0; {s.var} < KT; ++{s.var}) {{")
            out += pipeline_stmts(s.body, pad + "  ", stmt)
            out.append(f"{pad}}}")
        else:
            out += stmt(s, pad)
    return out
