"""Backends: what each target adds to the pipeline after the Tiny IR, as objects the driver calls.

The driver (``kumiko.pipeline``) runs the stages in order and keeps every artifact on its ``Compilation``
record; a backend says which of the later stages it has (``stages``) and implements them, each reading the
artifacts before it from the record it is given (``comp``; a backend never imports the driver):

- ``choose_plans(comp)``: region name -> Plan (the chooser's, a cached tuned winner, the caller's ``plans``
  validated - E1801 for a bad one - or tuned);
- ``lower(comp)``: the kernel IR of the regions under their plans;
- ``render(comp)``: its source text;
- ``build(comp)``: the runnable artifact (a loaded library, an emulator program, a cubin);
- ``runner(comp)``: ``(inputs, env) -> outputs``;
- ``replan(comp, error)``: new plans after a build refused the chosen ones (ptxas spills), or None.

A target's options are a typed record (``Options``, a dataclass per backend): an option the record does not
have is E1010, never ignored. ``BACKENDS`` names each target's backend by module and class, imported on
first use (a backend's heavy imports are paid only by its users).
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kumiko.diagnostics import KumikoError
from kumiko.plan.plan import Plan
from kumiko.region.ssa import Program, Region

#: target name -> "module:class" of its backend
BACKENDS: dict[str, str] = {
    "eval": "kumiko.backend.eval:EvalBackend",
    "cpu": "kumiko.backend.cpu:CpuBackend",
    "cuda-emu": "kumiko.backend.cuda:CudaEmuBackend",
    "cuda": "kumiko.backend.cuda:CudaBackend",
}
#: the stages a backend may add after the Tiny IR, in pipeline order
BACKEND_STAGES: tuple[str, ...] = ("region", "plan", "kernel", "source", "binary")


@dataclass(frozen=True)
class Options:
    """The options every compiling target takes: ``plans`` (region name -> Plan, validated against the
    region; E1801 when one does not fit), ``tune`` (time candidate plans) and ``shapes`` (the sizes to tune
    for)."""
    plans: Mapping[str, Plan] | None = None
    tune: bool = False
    shapes: Mapping[str, int] | None = None


class Backend:
    """A target's stages after the Tiny IR (module docstring). Subclasses set ``name``, ``Options`` and
    ``stages`` and implement the stage methods they list."""

    name: str = ""
    Options: type = Options
    stages: tuple[str, ...] = BACKEND_STAGES

    def options(self, given: Mapping[str, Any]) -> Any:
        """The typed options record of ``given`` (E1010 naming an option the target does not take)."""
        fields = [f.name for f in dataclasses.fields(self.Options)]
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise KumikoError("E1010", at=f"compile (target {self.name})", why=f"target {self.name!r} has no "
                              f"option{'s' * (len(unknown) > 1)} {', '.join(unknown)}",
                              suggestion=f"its options: {', '.join(fields) or 'none'}")
        return self.Options(**given)

    def channels_last(self, options: Any) -> bool:
        """Whether the driver gives this target a Graph with channels-last activations between its
        convolutions (``kumiko.frontend.layout``) under ``options``. No by default."""
        return False

    def prepare(self, comp) -> None:
        """Called once before the stages of a compile that will build a binary (not for one the program cache
        answers): start what the build will need and can begin now (the ``cpu`` target's precompiled
        header). Nothing by default."""

    def formation(self) -> dict[str, Any]:
        """The region formation's options for this target (``kumiko.region.form.form_regions``' keyword
        arguments): none by default."""
        return {}

    def choose_plans(self, comp) -> dict[str, Plan]:
        raise NotImplementedError(f"the {self.name} target has no plan stage")

    def lower(self, comp) -> Any:
        raise NotImplementedError(f"the {self.name} target has no kernel stage")

    def render(self, comp) -> Any:
        raise NotImplementedError(f"the {self.name} target has no source stage")

    def build(self, comp) -> Any:
        raise NotImplementedError(f"the {self.name} target has no binary stage")

    def runner(self, comp) -> Callable:
        return comp.binary

    def replan(self, comp, error: KumikoError) -> dict[str, Plan] | None:
        """Plans to retry with after ``build`` raised ``error`` (None: the error stands)."""
        return None

    def source_files(self, comp) -> dict[tuple, str | bytes]:
        """The generated source (and binary, where one is a file) as dump name parts -> content."""
        return {}


def backend(name: str) -> Backend:
    """The backend of target ``name`` (E1501 for an unknown target)."""
    if name not in BACKENDS:
        raise KumikoError("E1501", at="compile", why=f"unknown target {name!r}",
                          suggestion=f"available targets: {', '.join(sorted(BACKENDS))}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def override_plans(program: Program, chosen: dict[str, Plan], given: Mapping[str, Plan] | None,
                   validate: Callable[[Plan, Region], Plan]) -> dict[str, Plan]:
    """``chosen`` with the caller's plans put in, each ``validate``d against its region; E1801 for a plan of a
    region the program does not have, or one that is not a Plan (a plan file's entry)."""
    regions = {r.name: r for r in program.regions}
    for name, p in (given or {}).items():
        if name not in regions:
            raise KumikoError("E1801", at=f"plan of {name}", why=f"the program has no region {name!r}",
                              suggestion=f"regions: {list(regions)}")
        if not isinstance(p, Plan):
            raise KumikoError("E1801", at=f"plan of {name}", why=f"not a plan: {type(p).__name__}")
        chosen[name] = validate(p, regions[name])
    return chosen


def refuse_tune(target: str, tune: bool) -> None:
    """``tune=True`` on a target that chooses its plans from the ptxas report: refused, not ignored."""
    if tune:
        raise KumikoError("E1010", at="--tune", why=f"autotuning times plans on the CPU; the {target} target "
                          "chooses its plans from the ptxas register report", suggestion="drop --tune, or use "
                          "--target cpu")
