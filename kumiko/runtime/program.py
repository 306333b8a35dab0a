"""Run a compiled Program on the CPU: buffers, the arena, symbols, and one ABI call per region.

``CpuProgram(program, module, fn_names)(inputs, env)`` is what the ``cpu`` target's executable calls.
It owns everything between numpy and the kernels, so the code generator only emits kernels:

- inputs are checked against the Program's MemRefs (dtype, shape under ``env``) and copied only when
  they are not C-contiguous or not aligned as ``input_align`` asks (the element size for the generated C,
  which reads inputs with unaligned loads; the MemRef's ``alignment`` for the CUDA emulator); the copy is
  the runtime's own memory, reused call after call;
- outputs are 64-byte-aligned arrays **poisoned** before the run (NaN for floats, 0x7f bytes for
  integers), so an element a kernel forgets to write shows up in tests instead of passing by luck. They
  are reused (``OutputPool``, PyTorch-caching-allocator style) once nothing outside the runtime can see
  their memory any more, which saves a large output's first-touch page faults on every call;
  ``reuse_outputs=False`` gives a fresh array every call;
- intermediates (``Program.buffers``) live in one arena planned by liveness (``arena.plan_arena``),
  allocated once per shape and poisoned with 0xff bytes (NaN in every float dtype) before each run.
  Poisoning is a verifier: on unless ``KUMIKO_SPEC=0`` (or ``poison=False``), read at each call;
- each region's function gets ``bufs`` = its inputs then its outputs (``region.inputs`` order, then
  ``region.outputs`` order) and ``syms`` = the values of ``program_symbols(program)`` (sorted names).
  A code generator that runs several regions in one function (``kumiko.kernel.stream``: a deferred
  buffer handed from one region to the next inside the kernel) says so with ``Step``s; a buffer no step
  passes is never allocated.

Calls are safe from any number of threads at once. Everything a call writes besides the caller's inputs -
the arena, the output pools, the aligned input copies - lives in a ``CallState``; a call checks one out of
a small free list for its duration and gives it back, so two concurrent calls never share bytes, while a
program called from one thread reuses one state (one arena) call after call, as before.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Mapping

import ml_dtypes
import numpy as np

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.kernel.abi import Step, program_symbols, region_steps  # noqa: F401  (re-exported)
from kumiko.kernel.loops import STATUS_BAD_INDEX
from kumiko.region.ssa import MemRef, Program
from kumiko.runtime.arena import ALIGN, ArenaPlan, plan_arena
from kumiko.runtime.cpu import CModule
from kumiko.symbolic import dim_eval
from kumiko.tiny.inputs import check_array
from kumiko.util.log import enabled, log


def _nbytes(shape, dt: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dt.itemsize


def _aligned_raw(nbytes: int, align: int) -> tuple[np.ndarray, int]:
    """A fresh uint8 array that owns its memory, and the offset of its first ``align``-aligned byte."""
    raw = np.empty(nbytes + align, np.uint8)
    return raw, (-raw.ctypes.data) % align


def _view(raw: np.ndarray, start: int, shape, dt: np.dtype) -> np.ndarray:
    # numpy collapses the chain: the result's .base is ``raw`` itself, not the slice or the .view
    return raw[start:start + _nbytes(shape, dt)].view(dt).reshape(shape)


def aligned_empty(shape, dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data pointer is a multiple of ``align``.

    Its ``.base`` is the raw uint8 array that owns the memory (``OutputPool`` relies on that)."""
    dt = np.dtype(dtype)
    raw, start = _aligned_raw(_nbytes(shape, dt), align)
    return _view(raw, start, shape, dt)


def _owner_refs(entry: tuple) -> int:
    """``sys.getrefcount`` of a pool entry's memory owner (``entry[0]``), always measured the same way."""
    return sys.getrefcount(entry[0])


#: The count ``_owner_refs`` gives for an owner nothing else references: 2 on CPython (the entry tuple's
#: reference, plus the temporary that ``entry[0]`` makes for getrefcount's argument). Measured here, in the
#: same way the pool measures, rather than written down, so an interpreter that counts temporaries
#: differently still gets the right baseline.
_FREE_REFS = _owner_refs((np.empty(1, np.uint8), 0))


class OutputPool:
    """Output arrays kept for reuse, keyed by (output name, shape, dtype, alignment).

    An array goes back to its caller and stays in the pool; a later call takes it again only once the
    memory owner (the raw uint8 array ``aligned_empty`` slices, which owns the bytes) is referenced by the
    pool's entry alone - ``_owner_refs(entry) == _FREE_REFS``. That is the test because every way to see
    the bytes holds a reference to the owner: every numpy view of it (the array handed out, the user's
    ``y[0]``, ``y.T``, ``y.reshape(...)``, ``np.asarray(y)``) has ``.base is owner``, as numpy collapses
    view chains onto the array that owns the data; a memoryview, ``np.frombuffer``, ctypes' ``from_buffer``,
    ``np.ctypeslib.as_ctypes`` and ``y.ctypes.data_as`` keep such a view alive, and so do
    ``torch.from_numpy`` and ``torch.from_dlpack``. A reference cycle not yet collected only delays reuse.
    Not seen (and not to be relied on by callers): a bare integer address (``y.ctypes.data``) kept after
    the array is dropped, or a weak reference to the owner.

    Each key keeps at most ``per_key`` arrays (2: the usual ``y = exe(...)`` loop still holds the last
    result while the next call runs, so two arrays alternate); past that, held arrays make fresh ones that
    the pool does not keep. Each output keeps pools for its ``shapes`` most recently used shapes (symbolic
    sizes that change), so the memory kept stays bounded. Not thread-safe: each ``CallState`` has its own,
    used by one call at a time.
    """

    def __init__(self, per_key: int = 2, shapes: int = 4):
        self.per_key, self.shapes = per_key, shapes
        #: output name -> OrderedDict((shape, dtype, align) -> [(owner, offset), ...]), oldest key first
        self._pools: dict[str, OrderedDict[tuple, list[tuple[np.ndarray, int]]]] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype, align: int) -> np.ndarray:
        """An aligned array for output ``name``: a pooled one nothing else can see, else a fresh one.
        Its contents are whatever was there (a previous result): the caller poisons it if it wants to."""
        dt = np.dtype(dtype)
        key = (tuple(shape), dt, align)
        by_key = self._pools.setdefault(name, OrderedDict())
        pool = by_key.get(key)
        if pool is None:
            pool = by_key[key] = []
            if len(by_key) > self.shapes:
                by_key.popitem(last=False)      # forget the least recently used shape; held arrays stay valid
        else:
            by_key.move_to_end(key)
        for entry in pool:
            # no local name is bound to the owner while it is counted: the count is the pool's alone
            if _owner_refs(entry) == _FREE_REFS:
                return _view(entry[0], entry[1], shape, dt)
        raw, start = _aligned_raw(_nbytes(shape, dt), align)
        if len(pool) < self.per_key:
            pool.append((raw, start))
        return _view(raw, start, shape, dt)

    def clear(self) -> None:
        """Forget every pooled array (arrays still held elsewhere stay valid)."""
        self._pools.clear()


def poison(arr: np.ndarray) -> np.ndarray:
    """Fill with NaN (float dtypes) or 0x7f bytes (integers, bools): values no correct kernel leaves."""
    if arr.dtype.kind == "f" or arr.dtype == np.dtype(ml_dtypes.bfloat16):
        arr.fill(np.nan)
    else:
        arr.reshape(-1).view(np.uint8).fill(0x7F)     # reshape first: a 0-d array has no byte view
    return arr


class CallState:
    """The memory one call of a CpuProgram writes besides its results' owners: the arena bytes (one array per
    distinct symbol values), the output pool and the pool of aligned input copies.

    Why a separate object: these are reused call after call (no allocation and no page faults in a loop),
    so two calls running at once must not get the same one - a second thread's kernels would overwrite the
    first's intermediates mid-run. ``CpuProgram`` hands each running call its own."""

    def __init__(self) -> None:
        self.outputs = OutputPool()
        self.copies = OutputPool(per_key=1)   # aligned copies of inputs that are unaligned or not contiguous
        self.arenas: dict[tuple, np.ndarray] = {}
        self.views: dict[tuple, dict[str, np.ndarray]] = {}   # symbol values -> the arena's buffer views


class CpuProgram:
    """A Program whose regions are functions of a loaded C module; call it like the evaluator.

    Thread-safe: every call runs with a ``CallState`` of its own (see the module docstring)."""

    #: call states kept for reuse once their call is done (more concurrent calls make temporary ones)
    KEEP_STATES = 8

    def __init__(self, program: Program, module: CModule, fn_names: Mapping[str, str], *,
                 poison: bool | None = None, steps: tuple[Step, ...] | None = None, reuse_outputs: bool = True,
                 constants: Mapping[str, np.ndarray] | None = None):
        missing = [r.name for r in program.regions if r.name not in fn_names]
        if missing:
            raise KumikoError("E1703", at=f"program {program.name}", why=f"no kernel function for regions {missing}",
                              suggestion="Give fn_names an entry for every region.")
        self.module = module
        self.setup(program, steps if steps is not None else region_steps(program, fn_names), poison,
                   reuse_outputs=reuse_outputs)
        self.kernels = [(st, module.fn(st.fn)) for st in self.steps]
        self.constants = dict(constants or {})
        self._pack_fns = {pk.fn: module.fn(pk.fn) for st in self.steps for pk in st.packs}

    def setup(self, program: Program, steps: tuple[Step, ...], poison: bool | None, *,
              reuse_outputs: bool = True) -> None:
        """The buffer-handling state (also used by runners that launch kernels some other way)."""
        self.program, self.steps = program, steps
        self.poison = poison          # None: follow KUMIKO_SPEC (poison unless it is 0)
        self.reuse_outputs = reuse_outputs    # read at each call; False: a fresh array per output per call
        self.symbols = program_symbols(program)
        used = {b for st in steps for b in st.buffers}
        # buffers handed between regions inside one kernel are never allocated
        self._planned = dataclasses.replace(program, buffers=tuple(b for b in program.buffers if b[0] in used))
        self._plans: dict[tuple, ArenaPlan] = {}          # symbol values -> arena plan (immutable, shared)
        #: symbol values -> (input shapes, [(output, shape, numpy dtype, alignment)]): sizes evaluated once
        self._shapes: dict[tuple, tuple] = {}
        self._state_lock = threading.Lock()
        #: the Executable's bound inputs (the weights): a step's pre-packed panels of them are packed once
        self.constants: dict[str, np.ndarray] = {}
        self._pack_fns: dict = {}
        self._packed: dict[tuple, dict[str, np.ndarray]] = {}    # (step regions, symbol values) -> panels
        self._pack_lock = threading.Lock()
        #: pack function calls so far (a test checks that constants are packed once, not per call)
        self.pack_calls = 0
        #: the first call state: the one a single-threaded caller always gets back (tests inspect its pools)
        self._primary = CallState()
        self._free_states: list[CallState] = [self._primary]

    @property
    def _outputs(self) -> OutputPool:
        """The primary state's output pool: the one a single-threaded caller's calls use (tests inspect it)."""
        return self._primary.outputs

    @property
    def _copies(self) -> OutputPool:
        """The primary state's pool of aligned input copies (as ``_outputs``)."""
        return self._primary.copies

    @contextmanager
    def call_state(self) -> Iterator[CallState]:
        """A CallState no other running call has, for the duration of one call; kept for the next call
        after (up to ``KEEP_STATES`` of them), so sequential calls reuse one arena."""
        with self._state_lock:
            state = self._free_states.pop() if self._free_states else CallState()
        try:
            yield state
        finally:
            with self._state_lock:
                if len(self._free_states) < self.KEEP_STATES:
                    self._free_states.append(state)

    # -- buffers ----------------------------------------------------------------------------------
    def arena_plan(self, env: Mapping[str, int]) -> ArenaPlan:
        """The arena plan for these symbol values (computed once; a race computes the same plan twice)."""
        key = tuple(env.get(s) for s in self.symbols)
        plan = self._plans.get(key)
        if plan is None:
            step_of = {r: k for k, st in enumerate(self.steps) for r in st.regions}
            plan = plan_arena(self._planned, env, step_of=step_of)
            limit = knobs.max_bytes()
            if plan.size > limit:     # the inputs and outputs were checked at bind; the intermediates here
                raise KumikoError("E1017", at=f"program {self.program.name}", why=f"the intermediate buffers "
                                  f"need {plan.size:,} bytes at sizes {dict(env)}, over the limit of {limit:,} "
                                  "bytes (KUMIKO_MAX_BYTES)", bytes=plan.size, limit=limit)
            self._plans[key] = plan
        return plan

    def arena(self, env: Mapping[str, int], state: CallState | None = None) -> tuple[ArenaPlan, np.ndarray]:
        """The arena plan and ``state``'s arena bytes for these symbol values (allocated on first use).
        Without ``state``: the primary state's, for inspection (a call passes its own)."""
        plan = self.arena_plan(env)
        state = state if state is not None else self._primary
        key = tuple(env.get(s) for s in self.symbols)
        raw = state.arenas.get(key)
        if raw is None:
            raw = state.arenas[key] = aligned_empty((max(plan.size, ALIGN),), np.uint8, plan.align)
        return plan, raw

    def input_align(self, m: MemRef, dt: np.dtype) -> int:
        """The alignment an input is passed at without a copy. The generated C reads inputs with unaligned
        loads (``kumiko_cpu.h``, the stage micro-kernel; only the runtime's own scratch and packed panels
        are read with aligned ones), so a C-contiguous array at its element alignment is used in place: a
        numpy array is only 16-byte aligned, and copying a large one costs a pass over it per call."""
        return dt.itemsize

    def _input(self, name: str, m: MemRef, arr, want: tuple, state: CallState) -> np.ndarray:
        arr = check_array(name, m.dtype, arr, want, m.shape, raw16=True)   # raw 16-bit storage accepted as-is
        align = self.input_align(m, arr.dtype)
        if arr.flags.c_contiguous and arr.ctypes.data % align == 0:
            return arr
        # the aligned copy is the runtime's own (never handed out): its memory is reused call after call
        out = state.copies.take(name, tuple(arr.shape), arr.dtype, max(align, ALIGN))
        out[...] = arr
        return out

    def buffers(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int],
                state: CallState) -> dict[str, np.ndarray]:
        """Every named buffer of one run: checked inputs, (poisoned) outputs, arena views, all in ``state``
        (the running call's own, from ``call_state``).

        Outputs come from the output pool (an array no caller can still see) unless ``reuse_outputs`` is
        off; poisoning, when on, covers reused arrays too."""
        names = [n for n, _ in self.program.inputs]
        missing = [n for n in names if n not in inputs]
        if missing:
            raise KumikoError("E1015", at="inputs", why=f"missing {missing}", expected=names)
        do_poison = self.poison if self.poison is not None else knobs.spec() >= 1
        key = tuple(env.get(s) for s in self.symbols)
        try:
            shapes = self._shapes.get(key)
            if shapes is None:     # the sizes depend on the symbol values only: evaluated once per set
                shapes = self._shapes[key] = (
                    {n: tuple(dim_eval(d, env) for d in m.shape) for n, m in self.program.inputs},
                    [(n, tuple(dim_eval(d, env) for d in m.shape), m.dtype.np, max(ALIGN, m.alignment))
                     for n, m in self.program.outputs])
            consts = self.constants
            # a bound constant passed as itself was checked by the Executable and is C-contiguous (only the cpu
            # target passes constants: it reads inputs at their element alignment)
            bufs = {n: inputs[n] if n in consts and inputs[n] is consts[n]
                    else self._input(n, m, inputs[n], shapes[0][n], state) for n, m in self.program.inputs}
            for n, shape, dt, align in shapes[1]:
                arr = (state.outputs.take(n, shape, dt, align) if self.reuse_outputs
                       else aligned_empty(shape, dt, align))
                bufs[n] = poison(arr) if do_poison else arr
            plan, raw = self.arena(env, state)
        except KeyError as e:
            raise KumikoError("E1014", at=f"program {self.program.name}", why=f"size symbol {e.args[0]} has no "
                              "value", suggestion="Bind it through an input's shape (or give it in env).") from None
        if do_poison and plan.slots:
            raw.fill(0xFF)
        views = state.views.get(key)
        if views is None:          # views of this state's arena for these sizes: made once
            memrefs = dict(self._planned.buffers)
            views = state.views[key] = {
                s.name: raw[s.offset:s.offset + s.nbytes].view(memrefs[s.name].dtype.np).reshape(
                    tuple(dim_eval(d, env) for d in memrefs[s.name].shape)) for s in plan.slots}
        bufs.update(views)
        return bufs

    # -- running ----------------------------------------------------------------------------------
    def syms(self, env: Mapping[str, int]) -> list[int]:
        try:
            return [int(env[s]) for s in self.symbols]
        except KeyError as e:
            raise KumikoError("E1014", at=f"program {self.program.name}", why=f"size symbol {e.args[0]} has no "
                              "value", suggestion="Bind it through an input's shape (or give it in env).") from None

    # -- pre-packed constant operands ---------------------------------------------------------------
    def _bind_packs(self, inputs: Mapping[str, np.ndarray], bufs: dict, syms: list[int],
                    env: Mapping[str, int], state: CallState) -> None:
        """Put every step's pre-packed panels in ``bufs``: packed once per set of sizes and kept while the
        call passes the bound arrays themselves (``constants``: read-only, so they cannot change under the
        panels); packed for this call alone into ``state``'s memory when it passes other arrays."""
        key = tuple(env.get(s) for s in self.symbols)
        for step, _ in self.kernels:
            if not step.packs:
                continue
            own = all(self.constants.get(src) is not None and inputs.get(src) is self.constants[src]
                      for pk in step.packs for src in pk.sources)
            if not own:
                bufs.update(self._pack(step, bufs, syms, env, state))
                continue
            # keyed by the step's regions: steps of layers alike call one function with other weights
            panels = self._packed.get((step.regions, key))
            if panels is None:
                with self._pack_lock:
                    panels = self._packed.get((step.regions, key))
                    if panels is None:
                        panels = self._packed[(step.regions, key)] = self._pack(step, bufs, syms, env, None)
            bufs.update(panels)

    def _pack(self, step: Step, bufs: dict, syms: list[int], env: Mapping[str, int],
              state: CallState | None) -> dict[str, np.ndarray]:
        panels = {}
        for pk in step.packs:
            n = max(1, int(dim_eval(pk.floats, env)))
            panels[pk.buffer] = (state.copies.take(pk.buffer, (n,), np.float32, ALIGN) if state is not None
                                 else aligned_empty((n,), np.float32))
        view = {**bufs, **panels}
        for pk in step.packs:
            self._run_step(Step(pk.fn, step.regions, step.buffers), self._pack_fns[pk.fn], view, syms, env)
            self.pack_calls += 1
        for a in panels.values():
            a.setflags(write=False)
        return panels

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        syms = self.syms(env)
        with self.call_state() as state:
            bufs = self.buffers(inputs, env, state)
            if self._pack_fns:
                self._bind_packs(inputs, bufs, syms, env, state)
            timed = enabled(2)
            for step, fn in self.kernels:
                t0 = time.perf_counter()
                self._run_step(step, fn, bufs, syms, env)
                if timed:
                    log(2, f"cpu {step.fn}: {(time.perf_counter() - t0) * 1e3:.3f} ms")
        return {n: bufs[n] for n, _ in self.program.outputs}

    def _run_step(self, step: Step, fn, bufs: Mapping[str, np.ndarray], syms: list[int],
                  env: Mapping[str, int]) -> None:
        """One ABI call; its status as a diagnostic."""
        where = f"region {' + '.join(step.regions)}"
        try:
            arrays = [bufs[n] for n in step.buffers]
        except KeyError as e:
            raise KumikoError("E1703", at=where, why=f"buffer {e.args[0]!r} is neither a "
                              "program input, output nor intermediate") from None
        rc = fn(arrays, syms)
        if rc == STATUS_BAD_INDEX:     # the generated code's data-dependent index check (gather)
            raise KumikoError("E1015", at=where, why="a gather index is out of range for "
                              "the tensor it reads", suggestion="Pass indices within the gathered axis.",
                              sizes=dict(env))
        if rc != 0:
            raise KumikoError("E1704", at=where, why=f"kernel {fn.name} returned {rc}",
                              sizes=dict(env))
