"""Winograd F(m x m, 3x3) for the CPU's 3x3 convolutions (m = 2 or 4): when the region's contraction is one, and
when it pays.

A 3x3 convolution of stride 1 computes each m x m block of output pixels (a tile) from an n x n patch of input
pixels, n = m + 2. Winograd's minimal filtering algorithm F(m x m, 3x3) does that with n^2 products per (input
channel, output channel) instead of 9 m^2: the patch ``d`` is transformed to ``V = B^T d B`` and the 3x3
filter ``g`` to ``U = G g G^T`` (both n x n), their element-wise product summed over the input channels,
``M = sum_c U * V``, and transformed back, ``Y = A^T M A`` (m x m; ``TRANSFORMS``). Summed over the channels,
the element-wise product is n^2 independent GEMMs (one per element xi of the transform: tiles x C times
C x N), so 2.25x (F(2x2): 16 for 36) or 4x (F(4x4): 36 for 144) fewer multiply-adds go through the same
register-blocked micro-kernel as the direct path's, plus the transforms (additions for F(2x2), small
integer multiples for F(4x4)). The filter transform is done once, when the weights are packed
(``kumiko.kernel.winograd``).

Which regions qualify is read off the region, not an op name (``winograd_geometry``): the contraction's
A side (its rows, the M axes, ending in the output's row and column axes) reads a padded source through
a stage (``kumiko.region.operands.stage_bounds``) whose last dimension is stepped by a K axis alone (the
input channels, channels-last) and whose two other moving dimensions are each ``row axis + K axis`` with
unit coefficients (stride 1, dilation 1), the K axis of size 3; the B side (the N axes: output channels)
is a constant (pre-packed); the rest of the region is pointwise (bias, activation, residual). The output
rows and columns are even (whole 2x2 tiles) and the channels whole vectors.

Whether it pays, and which m (``winograd_tile``): on a 2-core Zen 3 (AVX2), a standalone F(2x2, 3x3) with
bias + ReLU took 0.79 ms for 64 -> 64 at 56x56, 0.84 for 128 -> 128 at 28x28 and 1.04 for 256 -> 256 at
14x14, where the direct kernels take about 1.65 each (231 MFLOP at ~140 GFLOP/s), and 1.79 ms for 512 -> 512
at 7x7 (16 tiles: no gain, and 16 MiB of transformed weights). So: at least ``MIN_TILES`` 2x2 tiles per
image and transformed weights of at most ``MAX_U_FLOATS``. F(4x4) where the rows and columns are multiples
of 4 (graphs of four 3x3 convs, three of them Winograd, ran 0.82 of F(2x2)'s time at 56x56 x 64 channels and
0.88 at 28x28 x 128; ResNet-50 0.978); its error is about twice F(2x2)'s (rel L2 7e-7 to 9e-7 against
PyTorch where F(2x2) gave 4e-7 to 6e-7).

How the kernel blocks the work (``winograd_blocks``): a block is a run of whole tile rows (m output rows
each: the pixels of a block are consecutive rows of the contraction's C) times a range of output channels;
the threads take blocks as they come. The chooser picks the tile rows and columns per block that minimise a
makespan model of the threads dealing the blocks (GEMM, transforms, the weights each block streams).
"""
from __future__ import annotations

from dataclasses import dataclass

from kumiko.region.operands import Orientation, phase_count, row_dim, stage_bounds
from kumiko.symbolic import Expr, least

#: the fewest 2x2 tiles per image for which the transforms pay (14x14 outputs: 49 tiles)
MIN_TILES = 49
#: the most floats of transformed weights (16 x C x N, 4 MiB): past it each block streams them from DRAM
MAX_U_FLOATS = 1 << 20
#: the fewest input channels and output channels: below, the transforms cost more than the GEMMs save
MIN_CHANNELS = 16
#: the most floats of a block's transformed tiles (16 x tiles x C) and products (16 x tiles x columns)
MAX_BLOCK_FLOATS = 1 << 18

#: F(m x m, 3x3)'s matrices by output tile m (Lavin and Gray's, interpolation points 0, -1, 1 and 0, +-1, +-2
#: with infinity): B^T (n x n, n = m + 2: the input patch), G (n x 3: the filter) and A^T (m x n: the output).
#: Y = A^T [(G g G^T) * (B^T d B)] A is the m x m correlation of the n x n patch d with the 3x3 filter g.
TRANSFORMS = {
    2: (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        ((1, 0, 0), (1 / 2, 1 / 2, 1 / 2), (1 / 2, -1 / 2, 1 / 2), (0, 0, 1)),
        ((1, 1, 1, 0), (0, 1, -1, -1))),
    4: (((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
         (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
        ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
         (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))),
}
#: cycles per (tile, channel) of the input transform and per (tile, column) of the output transform and
#: epilogue, by m (F(2x2): 16 loads, 32 additions, 16 stores per 8 channels; F(4x4): 36 loads, about 250
#: multiply-adds and additions, 36 stores)
_IN_COST = {2: 2.7, 4: 15.0}
_OUT_COST = {2: 3.0, 4: 12.0}


@dataclass(frozen=True)
class Geometry:
    """A 3x3, stride-1 convolution as the region's contraction sees it (channels-last, on the A side)."""
    oh: str            # the M axis of the output rows (the rows' second innermost)
    ow: str            # ... and of its columns (the innermost)
    kh: str            # the K axis that moves the stage's row dimension with ``oh``
    kw: str            # ... its column dimension with ``ow``
    ci: str            # ... its last dimension (the input channels)
    dh: int            # the stage dimensions ``kh`` and ``kw`` move
    dw: int
    rows: int          # output rows, all images (the M axes but the innermost, flat); of one image where the
    #                    batch is symbolic (the least it can be: the kernel counts the rows at run time)
    cols: int          # output columns
    c: int             # input channels
    n: int             # output channels (the N side, flat)
    image_rows: int    # one image's output rows (the size of ``oh``)


def _known(e) -> int | None:
    return Expr.lift(e).as_int()


def _only(e: Expr, axis: str) -> bool:
    """``e`` is ``axis`` (coefficient 1) plus a constant."""
    return len(e.terms) == 1 and e.coeff(axis) == 1


def winograd_geometry(c, o: Orientation, sizes: dict, vw: int, pre_b: bool) -> Geometry | None:
    """The region's contraction as a 3x3 stride-1 convolution Winograd's F(m x m, 3x3) computes (module
    docstring), else None. ``o``: the operands' orientation; ``pre_b``: the B side is pre-packed."""
    if c.outer is not None or not c.pointwise or c.batch or not pre_b or len(c.k_axes) != 3:
        return None
    dims = stage_bounds(o.a_table)
    rows = o.a_rows
    if dims is None or len(rows) < 2 or len(dims) < 3:
        return None
    if any(phase_count(rest, rp, rows) != 1 for (rest, rp, _), _ in dims):
        return None
    last = len(dims) - 1
    moved = row_dim(rows, dims)
    if moved is None or moved != (moved[0], 1) or moved[0] == last:
        return None
    ow, oh = rows[-1], rows[-2]
    ks = {a.name for a in c.k_axes}
    (rest_c, rp_c, kp_c), _ = dims[last]
    ci = next((k for k in ks if _only(kp_c, k) and kp_c.const == 0), None)
    if ci is None or rp_c.terms or rest_c.terms:
        return None
    dh = dw = None
    kh = kw = None
    for i, ((rest, rp, kp), _) in enumerate(dims[:last]):
        if rest.terms:
            return None
        k = next((k for k in ks - {ci} if _only(kp, k)), None)
        if k is None:
            if kp.terms or any(a in (oh, ow) for a in rp.symbols()):
                return None            # another dimension that K moves, or that the output pixels move
            continue
        if _only(rp, ow) and dw is None:
            dw, kw = i, k
        elif _only(rp, oh) and dh is None:
            dh, kh = i, k
        else:
            return None
    if dh is None or dw is None or kh == kw or dw != moved[0]:
        return None
    kdims = {a.name: _known(a.size) for a in c.k_axes}
    if kdims[kh] != 3 or kdims[kw] != 3 or kdims[ci] is None:
        return None
    cols = _known(sizes[ow])
    flat = 1
    for a in rows[:-2]:         # the image axes (a symbolic batch: its least, 1)
        v = least(sizes[a])
        if v < 1:
            return None
        flat *= int(v)
    n = 1
    for a in o.b_rows:
        v = _known(sizes[a])
        if v is None:
            return None
        n *= v
    oh_n = _known(sizes[oh])
    if cols is None or oh_n is None or cols % 2 or oh_n % 2 or kdims[ci] % vw:
        return None
    flat *= oh_n
    return Geometry(oh, ow, kh, kw, ci, dh, dw, flat, cols, kdims[ci], n, oh_n)


def winograd_tile(g: Geometry, nr: int) -> int | None:
    """The output tile m of F(m x m, 3x3) for ``g``, or None where the direct kernel is as fast (module
    docstring): 4 where the output rows and columns are multiples of 4 and the transformed weights (36 x C x
    N) stay within ``MAX_U_FLOATS``, else 2 where its conditions hold."""
    n_pad = (g.n + nr - 1) // nr * nr
    tiles = (g.image_rows // 2) * (g.cols // 2)
    if tiles < MIN_TILES or g.c < MIN_CHANNELS or g.n < MIN_CHANNELS or 16 * g.c * n_pad > MAX_U_FLOATS:
        return None
    if g.image_rows % 4 == 0 and g.cols % 4 == 0 and 36 * g.c * n_pad <= MAX_U_FLOATS:
        return 4
    return 2


#: floats of a 512 KiB L2 (Zen 3's; the model's threshold for the weights and a block's V and X staying in it)
L2_FLOATS = 1 << 17


def _block_cost(tiles: int, cols: int, c: int, mr: int, u_total: int, m: int = 2) -> float:
    """A block's time in cycles of one core (AVX2: 16 multiply-adds a cycle) under F(m x m): its (m + 2)^2
    GEMMs (whole MR-row panels), the input transform and the output transform with the epilogue
    (``_IN_COST``, ``_OUT_COST``), the transformed weights it streams (from L3 once all of them, ``u_total`` floats,
    outgrow L2) and its transformed tiles and products (V and X) when they outgrow L2."""
    nn = (m + 2) ** 2
    tp = (tiles + mr - 1) // mr * mr
    u = nn * c * cols
    vx = nn * tp * (c + cols)
    return (nn * tp * c * cols / 16 + _IN_COST[m] * tiles * c + _OUT_COST[m] * tiles * cols
            + (0.5 if u_total > L2_FLOATS else 0.02) * u + (0.2 * vx if vx > L2_FLOATS else 0.0))


def winograd_blocks(g: Geometry, mr: int, nr: int, cores: int, m: int = 2) -> tuple[int, int]:
    """(tile rows, output channels) per block: the pair whose blocks, dealt in order to the least loaded of
    ``cores`` threads, finish first under ``_block_cost`` (fewer blocks on a tie). Blocks whose V passes
    ``MAX_BLOCK_FLOATS`` are not considered (one tile row always is). Measured against the model's choices
    (2-core Zen 3, whole graphs of four 3x3 convs, in-process A/B). F(2x2): 64 -> 64 at 56x56, one to three
    tile rows a block ran 0.95-0.99 of seven's time; 256 -> 256 at 14x14, all seven tile rows and 128
    channels a block 0.90 of seven rows and 32 channels (one tile row a block 1.23-1.28: the 4 MiB of weights
    streamed seven times); at 28x28 every choice within the noise (0.96-1.07). F(4x4): the model's seven tile
    rows and 64 channels at 56x56 and 28x28 ran within 0.97-1.05 of the alternatives tried (1 to 14 rows)."""
    n_pad = (g.n + nr - 1) // nr * nr
    nn = (m + 2) ** 2
    u_total = nn * g.c * n_pad
    trows, tcols = g.rows // m, g.cols // m
    best: tuple | None = None
    for parts in range(1, n_pad // nr + 1):
        cols = (n_pad // nr + parts - 1) // parts * nr
        if parts > 1 and (n_pad + cols - 1) // cols < parts:
            continue
        for tr in range(1, trows + 1):
            tiles = tr * tcols
            if tr > 1 and nn * ((tiles + mr - 1) // mr * mr) * g.c > MAX_BLOCK_FLOATS:
                break
            load = [0.0] * max(1, cores)
            nblk = 0
            for r0 in range(0, trows, tr):
                t = min(tr, trows - r0) * tcols
                for j0 in range(0, n_pad, cols):
                    k = load.index(min(load))
                    load[k] += _block_cost(t, min(cols, n_pad - j0), g.c, mr, u_total, m)
                    nblk += 1
            key = (max(load), nblk)
            if best is None or key < best[0]:
                best = (key, tr, cols)
    assert best is not None
    return best[1], best[2]
