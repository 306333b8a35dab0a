"""The SM90 (Hopper) GPU dialect IR: TMA, mbarrier, wgmma, warpgroup roles (seed 001 §9, issue 24).

An ``Sm90Kernel`` is a structured program of the statements below, written as data like the SM80
``MmaKernel`` (``gpu_ir``) so the verifier (``gpu_verify_sm90``) checks the schedule as written, the
renderer (``render/cuda_sm90``) prints it as CUDA C over ``kumiko_cuda.cuh``'s SM90 functions, and tests
mutate the records to inject bugs.

Asynchrony is explicit, with the PTX objects as tokens: a ``TmaLoad`` delivers its bytes to an mbarrier
(``complete_tx``) that a ``MbarArriveTx`` announced; ``MbarWait`` with the phase parity makes them
visible to the waiting threads; ``WgmmaMma`` reads shared memory through matrix descriptors and its
accumulator is in flight until a ``WgmmaWait`` retires its ``WgmmaCommit`` group; threads' ordinary
stores to shared memory (``AccToSmem``) reach the async proxy (TMA stores, wgmma) only after a
``FenceProxyAsync``; a ``TmaStore`` is complete at the ``BulkWait`` of its ``BulkCommit`` group.

Integer expressions (stage indices, phase parities, coordinates, loop bounds) are ``IExpr`` trees over
loop variables and kernel scalars: the renderer prints them as C, the verifier evaluates them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

from kumiko.kernel.tensormap import DTYPE_BYTES, TiledEncoding

# ------------------------------------------------------------------------------------------------- IExpr


@dataclass(frozen=True)
class IExpr:
    """An integer expression: ``op`` "var" / "const" or a binary C operator over ``args``."""
    op: str
    args: tuple = ()
    value: Union[int, str] = 0

    @staticmethod
    def var(name: str) -> IExpr:
        return IExpr("var", value=name)

    @staticmethod
    def const(v: int) -> IExpr:
        return IExpr("const", value=int(v))

    def _bin(self, op: str, other, swap: bool = False) -> IExpr:
        o = other if isinstance(other, IExpr) else IExpr.const(other)
        return IExpr(op, (o, self) if swap else (self, o))

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __floordiv__(self, o): return self._bin("/", o)
    def __mod__(self, o): return self._bin("%", o)
    def __and__(self, o): return self._bin("&", o)
    def __xor__(self, o): return self._bin("^", o)
    def __or__(self, o): return self._bin("|", o)
    def lt(self, o): return self._bin("<", o)
    def gt(self, o): return self._bin(">", o)
    def min(self, o): return self._bin("min", o)

    def c(self) -> str:
        if self.op == "var":
            return str(self.value)
        if self.op == "const":
            return str(self.value)
        a, b = (x.c() for x in self.args)
        if self.op == "min":
            return f"min({a}, {b})"
        return f"({a} {self.op} {b})"

    def eval(self, env: dict) -> int:
        if self.op == "var":
            return int(env[self.value])
        if self.op == "const":
            return int(self.value)
        a, b = (x.eval(env) for x in self.args)
        if self.op in ("/", "%") and (a < 0 or b <= 0):
            raise ValueError(f"{self.c()}: C division of {a} by {b} (operands must be >= 0 and > 0)")
        return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0, "%": a % b if b else 0, "&": a & b,
                "^": a ^ b, "|": a | b, "<": int(a < b), ">": int(a > b), "min": min(a, b)}[self.op]


def ix(v: Union[int, str, IExpr]) -> IExpr:
    """An int, a variable name or an IExpr as an IExpr."""
    if isinstance(v, IExpr):
        return v
    return IExpr.var(v) if isinstance(v, str) else IExpr.const(v)


# ------------------------------------------------------------------------------------------------- declarations

SWIZZLE_SPAN = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
#: the matrix descriptor's swizzle code (bits 62-63, PTX ISA "Matrix Descriptor Format")
DESC_SWIZZLE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}


@dataclass(frozen=True)
class TensorMapDesc:
    """A tiled tensor map over the global array ``buf`` (runtime side: cuTensorMapEncodeTiled). ``dims`` and
    ``box`` innermost first; ``strides`` the byte strides of dims 1.. (dim 0 is contiguous). The kernel takes it as
    ``const __grid_constant__ CUtensorMap name``."""
    name: str
    buf: str
    dtype: str                      # "fp16" | "bf16" | "fp32"
    dims: tuple                     # IExpr per dimension (kernel scalars, for the host to evaluate)
    strides: tuple                  # IExpr per dimension 1.. (bytes)
    box: tuple                      # ints
    swizzle: str = "none"           # "none" | "32B" | "64B" | "128B"
    oob: str = "zero"               # "zero" | "nan"
    offset: IExpr = IExpr.const(0)  # elements from the array's start to the map's origin (a multiple of 16 bytes)

    @property
    def rank(self) -> int:
        return len(self.box)

    @property
    def box_bytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for b in self.box:
            n *= b
        return n

    def origin_bytes(self, sizes: dict) -> int:
        """Bytes from the array's start to the map's origin (the address the launch encodes is the array's plus
        this)."""
        return ix(self.offset).eval(sizes) * DTYPE_BYTES[self.dtype]

    def encoding(self, sizes: dict) -> TiledEncoding:
        """cuTensorMapEncodeTiled's arguments at these sizes (the address is the launch's)."""
        return TiledEncoding.make(self.dtype, tuple(ix(d).eval(sizes) for d in self.dims),
                                  tuple(ix(s).eval(sizes) for s in self.strides), self.box, self.swizzle, self.oob)


@dataclass(frozen=True)
class SmemBuf:
    """A shared-memory buffer of ``stages`` stages of ``stage_bytes`` each, at ``offset`` in dynamic shared memory."""
    name: str
    ctype: str                      # element type the kernel sees ("uint16_t", "float")
    stage_bytes: int
    stages: int = 1
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.stage_bytes * self.stages


@dataclass(frozen=True)
class BarDecl:
    """An array of ``n`` mbarriers (static shared memory)."""
    name: str
    n: int = 1


@dataclass(frozen=True)
class Ring:
    """A multi-stage ring: ``buffers`` (SmemBuf names, same stages) filled by TMA under ``full[s]`` and released by
    their consumers through ``empty[s]`` (the verifier checks a stage is refilled only after its release)."""
    buffers: tuple
    full: str
    empty: str
    stages: int


@dataclass(frozen=True)
class SmemRef:
    """Stage ``stage`` of buffer ``buf``, ``offset`` bytes in (a stage may hold several TMA boxes)."""
    buf: str
    stage: IExpr = IExpr.const(0)
    offset: int = 0


@dataclass(frozen=True)
class BarRef:
    name: str
    index: IExpr = IExpr.const(0)


@dataclass(frozen=True)
class MatDesc:
    """A wgmma operand in shared memory: descriptor over ``ref`` + ``k_bytes`` (the k16 step's offset), K-major
    (``major="K"``) or MN-major (``"MN"``, B only: imm-trans-b), with swizzle, leading and stride byte offsets."""
    ref: SmemRef
    swizzle: str
    lbo: int
    sbo: int
    major: str = "K"
    k_bytes: IExpr = IExpr.const(0)


# ------------------------------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class MbarInit:
    bar: BarRef
    count: int


@dataclass(frozen=True)
class MbarArrive:
    bar: BarRef


@dataclass(frozen=True)
class MbarArriveTx:
    """``mbarrier.arrive.expect_tx``: announce ``bytes`` of TMA transactions for the current phase, and arrive."""
    bar: BarRef
    bytes: int


@dataclass(frozen=True)
class MbarWait:
    """``mbarrier.try_wait.parity`` until the phase of parity ``parity`` completed."""
    bar: BarRef
    parity: IExpr


@dataclass(frozen=True)
class TmaLoad:
    map: str
    dst: SmemRef
    bar: BarRef
    coords: tuple                   # IExpr, innermost first


@dataclass(frozen=True)
class TmaStore:
    map: str
    src: SmemRef
    coords: tuple


@dataclass(frozen=True)
class BulkCommit:
    pass


@dataclass(frozen=True)
class BulkWait:
    pending: int
    read: bool = False              # .read: only the shared source may be reused


@dataclass(frozen=True)
class FenceProxyAsync:
    pass


@dataclass(frozen=True)
class FenceMbarInit:
    pass


@dataclass(frozen=True)
class SyncThreads:
    pass


@dataclass(frozen=True)
class WgmmaFence:
    pass


@dataclass(frozen=True)
class WgmmaMma:
    """``wgmma.mma_async.m64nNk16`` into accumulator ``acc`` (fp32): A from shared memory (``a`` a MatDesc, K-major)
    or registers (``a`` the name of a ``uint32_t[4]`` fragment, or of an array of them indexed by ``a_row``), B from
    shared memory."""
    acc: str
    a: Union[MatDesc, str]
    b: MatDesc
    n: int
    dtype: str                      # "fp16" | "bf16"
    scale_d: IExpr = IExpr.const(1)  # 0: D = A*B (the accumulator's old value is ignored)
    a_row: Union[IExpr, None] = None


@dataclass(frozen=True)
class WgmmaCommit:
    pass


@dataclass(frozen=True)
class WgmmaWait:
    """``wgmma.wait_group pending``; ``retired``: the accumulators whose groups this retires (fenced for the compiler
    after it; None: every accumulator - name them when another accumulator's group stays in flight, so the
    compiler does not see a use of registers a wgmma is still writing)."""
    pending: int
    retired: Union[tuple, None] = None


@dataclass(frozen=True)
class AccToSmem:
    """Ordinary stores of accumulator ``acc`` (m64nN, the D fragment layout) to ``dst`` as fp32, row-major, ``ld``
    floats a row."""
    acc: str
    dst: SmemRef
    ld: int


@dataclass(frozen=True)
class FragEpilogue:
    """The region's epilogue on accumulator ``acc`` (m64nN, the D fragment layout) of the tile at (``row0``,
    ``col0``): each thread's elements at global row ``kk_gm`` and column ``kk_gn``, predicated on ``kk_gm < kk_M``
    and ``kk_gn < cols``, declare the M and N axes (``decls``, loop statements) and run ``code`` (loop statements over
    ``const float kk_acc``: bias, activation, residual, cast, the store). ``setup``: loop statements first (in the
    epilogue's scope); ``row_div``: the name of a ``float[2]`` of per-lane row sums (rows g, g + 8) that are added
    over the lane quad and divide each element (an online softmax's running sum)."""
    acc: str
    row0: IExpr
    col0: IExpr
    decls: tuple
    code: tuple
    cols: str = "kk_N"
    setup: tuple = ()
    row_div: str = ""


@dataclass(frozen=True)
class SplitKSum:
    """Split-K (``Plan.split_k``) on accumulator ``acc`` (m64nN D fragment) of consumer warpgroup ``part`` of
    ``parts``: every thread writes its elements (zeros where ``live`` is 0: a split with no K tiles) to its split's
    slab of ``workspace``, fences, and counts itself in its own word of ``counters`` (one per output tile, consumer
    and thread: no barrier among the threads is needed, each one's elements are its own). The thread that arrives
    last of the tile's ``splits`` CTAs adds every split's slab into ``acc`` in split order (its own read back too, so
    the sum never depends on which CTA is last), sets its word back to 0 for the next launch and runs ``body`` (the
    epilogue); the others skip it. ``tile``: the output tile's index (batch included), ``split``: the CTA's split."""
    acc: str
    splits: int
    workspace: str
    counters: str
    tile: IExpr
    split: IExpr
    part: int
    parts: int
    live: IExpr
    body: tuple


@dataclass(frozen=True)
class SoftmaxInit:
    """Accumulator ``acc`` zeroed, and the online softmax's per-lane row state (rows g and g + 8 of the thread's warp)
    declared: the running max ``kk_mx`` (-inf), sum ``kk_sum`` (0) and rescale factor ``kk_al``."""
    acc: str


@dataclass(frozen=True)
class SoftmaxStep:
    """One key block of an online softmax on score accumulator ``acc`` (m64nN D fragment) at global row ``row0`` and
    column ``col0``: the region's score code (``decls``, ``code``: loop statements that set ``kk_z`` from
    ``const float kk_acc``; columns at or past ``kk_N`` and rows at or past ``kk_M`` get -inf), the new row max over
    the block and the lane quad, ``kk_al`` = exp2(k2 (m_old - m_new)) (``rescale`` False: 1, a bug for tests), the
    sum rescaled, and P = exp2(k2 (z - m_new)) in place of S, added to the sum. A block inside M and N for which
    ``inside`` holds runs ``free_code`` (the score code with its guards' selects taken as true) instead."""
    acc: str
    row0: IExpr
    col0: IExpr
    decls: tuple
    code: tuple
    k2: float
    rescale: bool = True
    inside: str = ""                # C over the block's rows kk_r0..kk_r1 and columns kk_c0..kk_c1: no guard masks it
    free_decls: tuple = ()          # ... and then the score code without the guards
    free_code: tuple = ()


@dataclass(frozen=True)
class RescalePack:
    """``out`` *= the rows' ``kk_al``, and P (accumulator ``acc``, m64nN) packed to 16-bit in register array ``regs``
    ([N / 16][4]): the D fragment's elements 8j..8j+7 are the A fragment of k16 step j (PTX ISA: wgmma A from
    registers has the mma.m16n8k16 A layout per warp)."""
    out: str
    acc: str
    regs: str
    dtype: str


@dataclass(frozen=True)
class SetMaxNReg:
    inc: bool
    regs: int


@dataclass(frozen=True)
class For:
    var: str
    start: IExpr
    stop: IExpr
    body: tuple
    unroll: bool = False


@dataclass(frozen=True)
class If:
    cond: IExpr
    body: tuple


@dataclass(frozen=True)
class Let:
    """``const int var = value;``: a name for the statements after it in the same body (a persistent kernel's tile
    coordinates)."""
    var: str
    value: IExpr


@dataclass(frozen=True)
class Elect:
    """The body runs on one thread (thread 0 of the enclosing role)."""
    body: tuple


@dataclass(frozen=True)
class Role:
    """Warp specialisation: warpgroups [first, first + count) run ``body``; the others skip it."""
    name: str
    first: int
    count: int
    body: tuple


@dataclass(frozen=True)
class Roles:
    """Roles running concurrently (the verifier schedules them like threads)."""
    roles: tuple


Sm90Stmt = Union[MbarInit, MbarArrive, MbarArriveTx, MbarWait, TmaLoad, TmaStore, BulkCommit, BulkWait,
                 FenceProxyAsync, FenceMbarInit, SyncThreads, WgmmaFence, WgmmaMma, WgmmaCommit, WgmmaWait,
                 AccToSmem, FragEpilogue, SplitKSum, SoftmaxInit, SoftmaxStep, RescalePack, SetMaxNReg, For, If,
                 Elect, Roles]


@dataclass(frozen=True)
class Sm90Kernel:
    name: str
    threads: int
    maps: tuple                     # TensorMapDesc
    scalars: tuple                  # kernel int parameters (names)
    smem: tuple                     # SmemBuf
    bars: tuple                     # BarDecl
    accs: tuple                     # (name, n): fp32 accumulators of m64nN wgmma, n/2 floats a thread
    body: tuple
    rings: tuple = ()               # Ring
    regs: tuple = ()                # (name, count or dims): uint32_t register arrays (A fragments)
    verify_sizes: tuple = ()        # ((scalar, (values...)), ...): the verifier runs each combination
    notes: tuple = ()
    params: tuple = ()              # gpu_ir.Param: the region's buffers and sizes, after the maps and scalars
    setup: tuple = ()               # loop statements at the kernel's top (the batch axes from blockIdx.z)

    @property
    def smem_bytes(self) -> int:
        return max((b.offset + b.nbytes for b in self.smem), default=0)

    def buf(self, name: str) -> SmemBuf:
        for b in self.smem:
            if b.name == name:
                return b
        raise KeyError(name)

    def map(self, name: str) -> TensorMapDesc:
        for m in self.maps:
            if m.name == name:
                return m
        raise KeyError(name)


def layout_smem(bufs, align: int = 1024) -> tuple:
    """Place the buffers one after another in dynamic shared memory, each aligned to ``align`` (the 128-byte
    swizzle pattern repeats every 1024 bytes, and TMA boxes and descriptors follow the shared address)."""
    out, off = [], 0
    for b in bufs:
        off = -(-off // align) * align
        out.append(SmemBuf(b.name, b.ctype, b.stage_bytes, b.stages, off))
        off += b.nbytes
    return tuple(out)


def rewrite(body: tuple, fn) -> tuple:
    """``body`` with every statement ``s`` (nested ones first) replaced by ``fn(s)``: a tuple of statements, or None
    to keep it. The bug-injection tests mutate kernels with it (``dataclasses.replace(k, body=rewrite(...))``)."""
    out = []
    for s in body:
        if isinstance(s, (For, If, Elect, SplitKSum)):
            s = replace(s, body=rewrite(s.body, fn))
        elif isinstance(s, Roles):
            s = Roles(tuple(replace(r, body=rewrite(r.body, fn)) for r in s.roles))
        new = fn(s)
        out.extend((s,) if new is None else new)
    return tuple(out)
