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
  allocated once per shape and poisoned with 0xff bytes (NaN in every float dtype) before its first run,
  and before every run under ``KUMIKO_SPEC=2`` (or ``poison=True``): a region that leaves part of its
  output unwritten gives NaN downstream on the first call, while refilling 6 MiB before each call was 3% of
  MobileNetV2's time at batch 1 (1% of ResNet-50's). Poisoning is a verifier: on unless ``KUMIKO_SPEC=0``
  (or ``poison=False``), read at each call;
- each region's function gets ``bufs`` = its inputs then its outputs (``region.inputs`` order, then
  ``region.outputs`` order) and ``syms`` = the values of ``program_symbols(program)`` (sorted names); a run
  calls them all in one C call (``kumiko_run_steps`` of ``kumiko_cpu.h``, in the program's own module)
  unless ``KUMIKO_DEBUG=2`` times them one by one.
  A code generator that runs several regions in one function (``kumiko.kernel.stream``: a deferred
  buffer handed from one region to the next inside the kernel) says so with ``Step``s; a buffer no step
  passes is never allocated.

Calls are safe from any number of threads at once. Everything a call writes besides the caller's inputs -
the arena, the output pools, the aligned input copies - lives in a ``CallState``; a call checks one out of
a small free list for its duration and gives it back, so two concurrent calls never share bytes, while a
program called from one thread reuses one state (one arena) call after call, as before.

What a call costs besides its kernels (issue 23: a few microseconds): a call state keeps, per set of
symbol values, a ``Frame`` - each step's ABI argument array (``ctypes.c_void_p * n``) with the addresses of
the arena's buffers already in it, the ``syms`` array, each input's and output's expected shape, dtype and
strides, and the places its address goes. A call then checks each input against that (an array of the
expected dtype, shape and C strides at its element alignment; anything else takes the full check, with its
diagnostics, and the copy), writes the inputs' and outputs' addresses into the argument arrays (outputs come
from the pool with their address) and calls each kernel without ctypes' argument conversion. The bound
constants (a network's weights) are checked by identity alone once their addresses are in place: a call
that passes another array under a constant's name takes the full path, and the next one puts the constants
back (MobileNetV2 at batch 1, 106 inputs: 49 -> 35 microseconds a call, without the arena's fill).
"""
from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
from contextlib import contextmanager
from operator import is_, itemgetter
from typing import Iterator, Mapping, Sequence

import numpy as np

from kumiko import knobs
from kumiko.diagnostics import KumikoError
from kumiko.kernel.abi import Step, program_symbols, region_steps  # noqa: F401  (re-exported)
from kumiko.kernel.loops import STATUS_BAD_INDEX
from kumiko.region.ssa import MemRef, Program
from kumiko.runtime.arena import ALIGN, ArenaPlan, plan_arena
from kumiko.runtime.cpu import CModule
from kumiko.runtime.pool import OutputPool, address, aligned_empty, poison  # noqa: F401  (re-exported)
from kumiko.symbolic import dim_eval
from kumiko.tiny.inputs import check_array
from kumiko.util.log import enabled, log


class CallState:
    """The memory one call of a CpuProgram writes besides its results' owners: the arena bytes (one array per
    distinct symbol values), the output pool, the pool of aligned input copies, and the ``Frame`` of each set
    of symbol values (the kernels' argument arrays, which hold addresses of this state's memory).

    Why a separate object: these are reused call after call (no allocation and no page faults in a loop),
    so two calls running at once must not get the same one - a second thread's kernels would overwrite the
    first's intermediates mid-run. ``CpuProgram`` hands each running call its own."""

    def __init__(self) -> None:
        self.outputs = OutputPool()
        self.copies = OutputPool(per_key=1)   # aligned copies of inputs that are unaligned or not contiguous
        self.arenas: dict[tuple, np.ndarray] = {}
        self.frames: dict[tuple, Frame] = {}  # symbol values -> the prepared arguments of a call


class Frame:
    """A call state's prepared call at one set of symbol values (made by ``CpuProgram.frame``).

    ``inputs``: per program input (name, MemRef, shape, numpy dtype, C strides, alignment, places, the bound
    constant or None, the constant's address), where places are the (argument array, index) pairs its address
    goes to; ``outputs``: per output (name, shape, numpy dtype, alignment, places); ``calls``: per step (step,
    kernel or None, argument array), the arena's addresses already written; ``packs``: per step with pre-packed
    panels (step, ((panel buffer, places), ...)); ``views``: the arena's buffers as arrays."""
    __slots__ = ("inputs", "outputs", "calls", "batch", "syms", "sym_list", "raw", "poison_arena", "arena_fresh",
                 "views", "packs", "packs_static", "packed_own", "var_inputs", "const_names", "const_arrays",
                 "const_template", "const_placed")

    def __init__(self, inputs: tuple, outputs: tuple, calls: list, syms: list[int], raw: np.ndarray,
                 poison_arena: bool, views: dict, packs: tuple, packs_static: bool):
        self.inputs, self.outputs, self.calls = inputs, outputs, calls
        #: the calls as one C call (``kumiko_run_steps``): (n, function pointers, argument arrays, failed index);
        #: None unless every step's kernel is a C function
        self.batch = None
        if calls and all(isinstance(getattr(fn, "bare", None), ctypes._CFuncPtr) for _, fn, _ in calls):
            self.batch = (ctypes.c_longlong(len(calls)),
                          (ctypes.c_void_p * len(calls))(*[ctypes.cast(fn.bare, ctypes.c_void_p).value
                                                           for _, fn, _ in calls]),
                          (ctypes.c_void_p * len(calls))(*[ctypes.addressof(a) for _, _, a in calls]),
                          ctypes.c_longlong(-1))
        self.sym_list = syms
        self.syms = (ctypes.c_longlong * max(1, len(syms)))(*syms)
        self.raw, self.poison_arena, self.views = raw, poison_arena, views
        self.arena_fresh = True         # no run has used the arena yet (poisoned before the first one)
        self.packs, self.packs_static = packs, packs_static
        #: the panels' places hold the shared panels of the bound constants (not a call's own packing)
        self.packed_own = False
        # the bound constants usable at these sizes: their addresses stay in their places until a call passes
        # another array under one of their names (``const_placed``), so a call checks them by identity alone
        consts = [i for i, e in enumerate(inputs) if e[7] is not None]
        self.var_inputs = tuple((i, e) for i, e in enumerate(inputs) if e[7] is None)
        self.const_names = tuple(inputs[i][0] for i in consts)
        self.const_arrays = tuple(inputs[i][7] for i in consts)
        self.const_template = [e[7] for e in inputs]
        self.const_placed = False


def _same(inputs: Mapping[str, np.ndarray], names: tuple, arrays: tuple) -> bool:
    """Whether ``inputs`` holds exactly ``arrays`` (the same objects) under ``names``."""
    if not names:
        return True
    try:
        got = itemgetter(*names)(inputs)
    except KeyError:
        return False
    return all(map(is_, got if len(names) > 1 else (got,), arrays))


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


class CpuProgram:
    """A Program whose regions are functions of a loaded C module; call it like the evaluator.

    Thread-safe: every call runs with a ``CallState`` of its own (see the module docstring)."""

    #: call states kept for reuse once their call is done (more concurrent calls make temporary ones)
    KEEP_STATES = 8
    #: all of a run's kernels in one C call (``kumiko_run_steps``, kumiko_cpu.h); None for runners that call
    #: ``setup`` alone and launch their kernels some other way
    run_steps = None

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
        self.run_steps = module.steps_fn()
        self.constants = dict(constants or {})
        self._pack_fns = {pk.fn: module.fn(pk.fn) for st in self.steps for pk in st.packs}

    def setup(self, program: Program, steps: tuple[Step, ...], poison: bool | None, *,
              reuse_outputs: bool = True) -> None:
        """The buffer-handling state (also used by runners that launch kernels some other way)."""
        self.program, self.steps = program, steps
        self.poison = poison          # None: follow KUMIKO_SPEC (poison unless it is 0)
        self.reuse_outputs = reuse_outputs    # read at each call; False: a fresh array per output per call
        self.symbols = program_symbols(program)
        self.kernels: list = []       # (step, kernel function) where the steps are C functions
        used = {b for st in steps for b in st.buffers}
        # buffers handed between regions inside one kernel are never allocated
        self._planned = dataclasses.replace(program, buffers=tuple(b for b in program.buffers if b[0] in used))
        self._plans: dict[tuple, ArenaPlan] = {}          # symbol values -> arena plan (immutable, shared)
        #: symbol values -> (input shapes, [(output, shape, numpy dtype, alignment)]): sizes evaluated once
        self._shapes: dict[tuple, tuple] = {}
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

    def _checkout(self) -> CallState:
        """A CallState no other running call has; give it back with ``_checkin``. No lock: ``list.pop`` and
        ``list.append`` are atomic (a lock taken and released twice was a tenth of a small graph's call)."""
        try:
            return self._free_states.pop()
        except IndexError:
            return CallState()

    def _checkin(self, state: CallState) -> None:
        """Keep ``state`` for the next call (about ``KEEP_STATES`` of them: threads checking in at once may keep
        one or two more), so sequential calls reuse one arena."""
        if len(self._free_states) < self.KEEP_STATES:
            self._free_states.append(state)

    @contextmanager
    def call_state(self) -> Iterator[CallState]:
        """A CallState no other running call has, for the duration of one call; kept for the next call after."""
        state = self._checkout()
        try:
            yield state
        finally:
            self._checkin(state)

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

    def _input(self, name: str, m: MemRef, arr, want: tuple, state: CallState) -> tuple[np.ndarray, int]:
        """The full check of an input (its diagnostics) and the array the kernels read, with its address: the
        input itself, or a copy in ``state``'s memory when it is not C-contiguous or not aligned."""
        arr = check_array(name, m.dtype, arr, want, m.shape, raw16=True)   # raw 16-bit storage accepted as-is
        align = self.input_align(m, arr.dtype)
        if arr.flags.c_contiguous:
            ptr = address(arr)
            if ptr % align == 0:
                return arr, ptr
        # the aligned copy is the runtime's own (never handed out): its memory is reused call after call
        out, ptr = state.copies.lease(name, tuple(arr.shape), arr.dtype, max(align, ALIGN))
        out[...] = arr
        return out, ptr

    def _sizes(self, env: Mapping[str, int], key: tuple) -> tuple:
        """(input shapes, [(output, shape, numpy dtype, alignment)]) at these symbol values, evaluated once."""
        shapes = self._shapes.get(key)
        if shapes is None:
            try:
                shapes = self._shapes[key] = (
                    {n: tuple(dim_eval(d, env) for d in m.shape) for n, m in self.program.inputs},
                    [(n, tuple(dim_eval(d, env) for d in m.shape), np.dtype(m.dtype.np), max(ALIGN, m.alignment))
                     for n, m in self.program.outputs])
            except KeyError as e:
                raise self._unbound(e) from None
        return shapes

    def _unbound(self, e: KeyError) -> KumikoError:
        return KumikoError("E1014", at=f"program {self.program.name}", why=f"size symbol {e.args[0]} has no "
                           "value", suggestion="Bind it through an input's shape (or give it in env).")

    def frame(self, env: Mapping[str, int], state: CallState) -> Frame:
        """``state``'s prepared call at these symbol values (made on first use)."""
        key = tuple([env.get(s) for s in self.symbols]) if self.symbols else ()
        frame = state.frames.get(key)
        if frame is None:
            frame = state.frames[key] = self._frame(env, key, state)
        return frame

    def _frame(self, env: Mapping[str, int], key: tuple, state: CallState) -> Frame:
        in_shapes, outs = self._sizes(env, key)
        syms = self.syms(env)
        plan, raw = self.arena(env, state)
        memrefs = dict(self._planned.buffers)
        views = {s.name: raw[s.offset:s.offset + s.nbytes].view(memrefs[s.name].dtype.np).reshape(
            tuple(dim_eval(d, env) for d in memrefs[s.name].shape)) for s in plan.slots}
        base = address(raw)
        at_offset = {s.name: base + s.offset for s in plan.slots}
        places: dict[str, list] = {}
        calls = []
        for step, fn in self.kernels or [(st, None) for st in self.steps]:
            args = (ctypes.c_void_p * max(1, len(step.buffers)))()
            for j, n in enumerate(step.buffers):
                if n in at_offset:
                    args[j] = at_offset[n]
                else:
                    places.setdefault(n, []).append((args, j))
            calls.append((step, fn, args))
        panels = {pk.buffer for st in self.steps for pk in st.packs}
        known = {n for n, _ in self.program.inputs} | {n for n, _ in self.program.outputs} | panels
        for step in self.steps:
            bad = [n for n in step.buffers if n not in known and n not in at_offset]
            if bad:
                raise KumikoError("E1703", at=f"region {' + '.join(step.regions)}", why=f"buffer {bad[0]!r} is "
                                  "neither a program input, output nor intermediate")
        inputs = []
        for n, m in self.program.inputs:
            dt, want = np.dtype(m.dtype.np), in_shapes[n]
            const, const_ptr = self.constants.get(n), None
            if const is not None:       # a bound constant is passed as itself once it passed the full check here
                try:
                    const, const_ptr = self._input(n, m, const, want, state)
                except KumikoError:
                    const = None        # not usable at these sizes: a call that passes it gets the diagnostic
                if const is not None and const is not self.constants[n]:
                    const = None        # it needs a copy: each call copies it, as any input
            inputs.append((n, m, want, dt, _c_strides(want, dt.itemsize), self.input_align(m, dt),
                           tuple(places.get(n, ())), const, const_ptr))
        outputs = tuple((n, shape, dt, align, tuple(places.get(n, ()))) for n, shape, dt, align in outs)
        packs = tuple((st, tuple((pk.buffer, tuple(places.get(pk.buffer, ()))) for pk in st.packs))
                      for st in self.steps if st.packs)
        static = all(self.constants.get(src) is not None for st, _ in packs for pk in st.packs for src in pk.sources)
        return Frame(tuple(inputs), outputs, calls, syms, raw, bool(plan.slots), views, packs, static)

    def _poisoning(self) -> tuple[bool, bool]:
        """(poison the outputs, refill the arena before every call), from one read of ``KUMIKO_SPEC`` (1: the
        first, 2: both); ``poison`` overrides it (True: both, False: neither)."""
        if self.poison is not None:
            return self.poison, self.poison
        spec = knobs.spec()
        return spec >= 1, spec >= 2

    def place(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int], state: CallState,
              do_poison: bool, refill: bool = False) -> tuple[Frame, list[np.ndarray], dict[str, np.ndarray], bool]:
        """Make ready one run in ``state``: the inputs checked (copied where they must be), the outputs taken
        (and poisoned), the arena poisoned, every address written into the frame's argument arrays. Returns
        the frame, the arrays the kernels read for the inputs (in ``program.inputs`` order: keep them alive
        for the run), the outputs, and whether a bound constant was passed as another array."""
        frame = self.frame(env, state)
        if frame.const_placed and _same(inputs, frame.const_names, frame.const_arrays):
            arrays = list(frame.const_template)
            entries = frame.var_inputs          # the constants' addresses are in place already
        else:
            arrays = []
            entries = tuple(enumerate(frame.inputs))
        overridden = False
        for k, (name, m, want, dt, strides, align, places, const, const_ptr) in entries:
            try:
                arr = inputs[name]
            except KeyError:
                names = [n for n, _ in self.program.inputs]
                raise KumikoError("E1015", at="inputs", why=f"missing {[n for n in names if n not in inputs]}",
                                  expected=names) from None
            if arr is const:            # checked when the frame was made; an array's address never changes
                ptr = const_ptr
            else:
                overridden = overridden or name in self.constants
                # the cheap check: what the full one would accept in place, as it is; anything else takes it
                if not (type(arr) is np.ndarray and arr.dtype == dt and arr.shape == want and arr.strides == strides
                        and (ptr := address(arr)) % align == 0):
                    arr, ptr = self._input(name, m, arr, want, state)
            if len(arrays) > k:
                arrays[k] = arr
            else:
                arrays.append(arr)
            for a, j in places:
                a[j] = ptr
        if entries is not frame.var_inputs:
            frame.const_placed = not overridden
        outs = {}
        for name, shape, dt, align, places in frame.outputs:
            if self.reuse_outputs:
                arr, ptr = state.outputs.lease(name, shape, dt, align)
            else:
                arr = aligned_empty(shape, dt, align)
                ptr = address(arr)
            outs[name] = poison(arr) if do_poison else arr
            for a, j in places:
                a[j] = ptr
        if do_poison and frame.poison_arena and (frame.arena_fresh or refill):
            # (before every call only when asked: MobileNetV2 at batch 1 ran 1.028x the time with its 6 MiB
            # refilled each call, IQR 1.009-1.061, in-process A/B with pauses; ResNet-50 1.011)
            frame.raw.fill(0xFF)
        frame.arena_fresh = False
        return frame, arrays, outs, overridden

    def buffers(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int],
                state: CallState) -> dict[str, np.ndarray]:
        """Every named buffer of one run: checked inputs, (poisoned) outputs, arena views, all in ``state``
        (the running call's own, from ``call_state``).

        Outputs come from the output pool (an array no caller can still see) unless ``reuse_outputs`` is
        off; poisoning, when on, covers reused arrays too."""
        frame, arrays, outs, _ = self.place(inputs, env, state, *self._poisoning())
        bufs = {n: a for (n, *_), a in zip(frame.inputs, arrays)}
        bufs.update(outs)
        bufs.update(frame.views)
        return bufs

    # -- running ----------------------------------------------------------------------------------
    def syms(self, env: Mapping[str, int]) -> list[int]:
        try:
            return [int(env[s]) for s in self.symbols]
        except KeyError as e:
            raise self._unbound(e) from None

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

    def _place_packs(self, frame: Frame, inputs: Mapping[str, np.ndarray], arrays: list[np.ndarray],
                     outs: dict[str, np.ndarray], overridden: bool, env: Mapping[str, int],
                     state: CallState) -> None:
        """Write the panels' addresses into the frame: the shared panels of the bound constants (once, until
        a call passes other arrays), or this call's own packing."""
        frame.packed_own = False        # until every place is written below
        bufs = {n: a for (n, *_), a in zip(frame.inputs, arrays)}
        bufs.update(outs)
        bufs.update(frame.views)
        self._bind_packs(inputs, bufs, frame.sym_list, env, state)
        for _, panels in frame.packs:
            for buf, places in panels:
                ptr = address(bufs[buf])
                for a, j in places:
                    a[j] = ptr
        frame.packed_own = frame.packs_static and not overridden

    def _pack(self, step: Step, bufs: dict, syms: list[int], env: Mapping[str, int],
              state: CallState | None) -> dict[str, np.ndarray]:
        panels = {}
        for pk in step.packs:
            n = max(1, int(dim_eval(pk.floats, env)))
            panels[pk.buffer] = (state.copies.take(pk.buffer, (n,), np.float32, ALIGN) if state is not None
                                 else aligned_empty((n,), np.float32))
        view = {**bufs, **panels}
        for pk in step.packs:
            # its integer constants, when it reads them (``Pack.consts``): one more buffer after the step's
            extra = (np.asarray(pk.consts, dtype=np.int64),) if pk.consts else ()
            self._run_step(Step(pk.fn, step.regions, step.buffers), self._pack_fns[pk.fn], view, syms, env, extra)
            self.pack_calls += 1
        for a in panels.values():
            a.setflags(write=False)
        return panels

    def __call__(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> dict[str, np.ndarray]:
        do_poison, refill = self._poisoning()
        timed = enabled(2)
        state = self._checkout()
        try:
            frame, arrays, outs, overridden = self.place(inputs, env, state, do_poison, refill)
            if frame.packs and (overridden or not frame.packed_own):
                self._place_packs(frame, inputs, arrays, outs, overridden, env, state)
            syms = frame.syms
            if self.run_steps is not None and frame.batch is not None and not timed:   # every kernel in one C call
                n, fns, argv, failed = frame.batch
                rc = self.run_steps(n, fns, argv, syms, ctypes.byref(failed))
                if rc:
                    step, fn, _ = frame.calls[failed.value]
                    self._failed(step, fn, rc, env)
                return outs
            for step, fn, args in frame.calls:
                t0 = time.perf_counter() if timed else 0.0
                rc = fn.bare(args, syms)
                if rc:
                    self._failed(step, fn, rc, env)
                if timed:
                    log(2, f"cpu {step.fn}: {(time.perf_counter() - t0) * 1e3:.3f} ms")
        finally:
            self._checkin(state)
        return outs

    def _run_step(self, step: Step, fn, bufs: Mapping[str, np.ndarray], syms: list[int],
                  env: Mapping[str, int], extra: Sequence[np.ndarray] = ()) -> None:
        """One ABI call with named buffers and then ``extra`` ones (the pack functions); its status as a
        diagnostic."""
        try:
            arrays = [bufs[n] for n in step.buffers] + list(extra)
        except KeyError as e:
            raise KumikoError("E1703", at=f"region {' + '.join(step.regions)}", why=f"buffer {e.args[0]!r} is "
                              "neither a program input, output nor intermediate") from None
        rc = fn(arrays, syms)
        if rc:
            self._failed(step, fn, rc, env)

    def _failed(self, step: Step, fn, rc: int, env: Mapping[str, int]) -> None:
        """A kernel's nonzero status as its diagnostic."""
        where = f"region {' + '.join(step.regions)}"
        if rc == STATUS_BAD_INDEX:     # the generated code's data-dependent index check (gather)
            raise KumikoError("E1015", at=where, why="a gather index is out of range for "
                              "the tensor it reads", suggestion="Pass indices within the gathered axis.",
                              sizes=dict(env))
        raise KumikoError("E1704", at=where, why=f"kernel {fn.name} returned {rc}", sizes=dict(env))
