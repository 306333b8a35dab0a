"""The packed CPU contraction's two structural rules, chosen by the Plan (``k_blocks``, ``bind.split``).

The packed kernel (``kumiko.kernel.contract``) runs K in blocks and splits the work between threads by
rules that depend on the sizes and on which operands are constants (an operand that reads only bound
params is packed once, at load time: "pre-packed"). The chooser decides each rule here when the sizes it
needs are known at compile time and names the run-time form otherwise, so ``--dump plan`` says what the
kernel does:

- ``k_blocks``: ``"kc"`` equal K blocks of at most ``cache_block.kc``; ``"one"`` one block of all of K
  (the chooser's plan then records ``kc`` = K); ``"one_if_fits"`` one block when B's packed panels for all
  of K (NCp x K floats, NCp = the N block rounded up to NR) fit in a 2 MiB L2 (``ONE_K_BLOCK_FLOATS``),
  else ``"kc"``, tested at run time. The chooser takes one block under a pre-packed A (the weights then
  stream front to back, once: ResNet-50's last 3x3 convs stream 9.4 MB of weights a call).
- ``bind.split`` (the axis the threads split when they do not take whole batch points each): ``"m"``
  ranges of M rows (sharing each packed B block; N ranges only where the rows split unevenly),
  ``"n"`` ranges of N wherever that is about as even as M (within 10%), else as ``"m"``;
  ``"n_if_a_resident"`` and ``"n_if_small_a"`` test at run time whether A (Mp x K floats) is at most
  ``A_RESIDENT_FLOATS`` (a thread packs it once per batch point and keeps it in L2) or
  ``SMALL_A_FLOATS`` (2 MiB) and are ``"n"`` then, else ``"m"``. The chooser's threshold is the first
  one, or the second under a pre-packed B: each thread then streams its own part of the weights (from
  DRAM in a network: BERT-base's 9.4 MB FFN weights) and packs all of A, instead of every thread
  streaming every panel; BERT-base b1 ran 0.90x, GPT-2 0.955x (2-core EPYC, A/B alternating). Under a
  pre-packed B with fewer columns than A has rows (known when compiling: a channels-last conv, its pixels
  against its weights) the chooser writes ``"m"``: there every thread would read all of A for a share of a
  B it reads whole cheaply.

Which side is pre-packed is the lowering's fact too (``prepackable``: one function for both).
"""
from __future__ import annotations

from kumiko.region.analysis import Contraction
from kumiko.region.srnf import children, free_axes
from kumiko.region.ssa import Read, Ref, RExpr

#: floats of A a thread packs once per batch point for every K (half of a 512 KiB L2)
A_RESIDENT_FLOATS = 65536
#: floats of packed B (a 2 MiB L2) for all of K: the most for one K block under a pre-packed A
ONE_K_BLOCK_FLOATS = 1 << 19
#: the most bytes of a B panel read in place (NR lanes of each K row: its own cache lines) that stay in L1
#: beside the A panel and the C tile (half of a 32 KiB L1): a longer K is read in blocks that fit
IN_PLACE_PANEL_BYTES = 16 << 10
#: the most floats of A (2 MiB) for which the threads split N under a pre-packed B
SMALL_A_FLOATS = 1 << 19

K_BLOCKS = ("kc", "one", "one_if_fits")
SPLITS = ("m", "n", "n_if_a_resident", "n_if_small_a")
#: the A size each run-time split rule tests against
SPLIT_LIMITS = {"n_if_a_resident": A_RESIDENT_FLOATS, "n_if_small_a": SMALL_A_FLOATS}


def read_tensors(e: RExpr) -> frozenset | None:
    """The tensors ``e`` reads; None when it reads a let of the region (not memory alone)."""
    reads, stack = set(), [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Read):
            reads.add(x.tensor)
        elif isinstance(x, Ref):
            return None
        stack.extend(children(x))
    return frozenset(reads)


def prepackable(key: str, expr: RExpr, c: Contraction, nc: int, nr: int, constants: frozenset) -> bool:
    """Is side ``key`` (``"a"``/``"b"``, operand ``expr``) a function of constant inputs only, the same at
    every batch point? Then its panels, for all rows and all of K, are packed once and the kernel reads them
    in place. Not the B side under a fused window (N blocks then hold whole window groups, not whole panels)
    or with an NC that is not whole panels."""
    if key == "b" and (c.outer is not None or nc % nr):
        return False
    reads = read_tensors(expr)
    return bool(reads) and reads <= constants and not (free_axes(expr) & set(c.batch))


def n_block_padded(n: int, nc: int, nr: int, group: int | None) -> int:
    """The kernel's ``kk_ncp``: the columns of one N block (at most NC; whole window groups of ``group``
    columns under a fused window) rounded up to whole NR panels."""
    if group is None:
        cols = min(n, nc)
    else:
        g = group if group > 0 else 1
        cols = min(g * max(1, nc // g), n)
    return (cols + nr - 1) // nr * nr


def k_blocks_rule(pre_a: bool, ncp: int | None, k: int | None) -> str:
    """``k_blocks``: one block under a pre-packed A when B's panels for all of K fit (decided when NCp and
    K are known, else at run time); otherwise KC blocks."""
    if not pre_a:
        return "kc"
    if ncp is None or k is None:
        return "one_if_fits"
    return "one" if ncp * k <= ONE_K_BLOCK_FLOATS else "kc"


def split_rule(pre_b: bool, mp: int | None, k: int | None, n: int | None = None,
               mp_least: int | float | None = None) -> str:
    """``bind.split``: N when A (Mp x K floats) is at most the limit (2 MiB under a pre-packed B, else what a
    thread keeps resident), decided when Mp and K are known, else at run time; M under a pre-packed B of ``n``
    columns (when known) fewer than Mp, or than ``mp_least``, the least Mp of symbolic sizes (a batch of
    images: at least one image's pixels) (module docstring)."""
    rule = "n_if_small_a" if pre_b else "n_if_a_resident"
    if pre_b and n is not None and n < (mp if mp is not None else mp_least if mp_least is not None else 0):
        return "m"
    if mp is None or k is None:
        return rule
    return "n" if mp * k <= SPLIT_LIMITS[rule] else "m"
