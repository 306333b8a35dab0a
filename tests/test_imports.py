"""Imports run one way through the pipeline (docs/ARCHITECTURE.md, "What each package may import").

Every ``import`` in ``kumiko/`` (at any depth: inside functions and ``TYPE_CHECKING`` blocks too) is read
with ``ast`` and mapped to the package it names. A package may import only packages of lower or equal
rank; no two packages import each other (directly or through others); and no stage after the frontend
imports the frontend or the driver (``pipeline``, ``compiler``, ``cli``); ``render`` never imports
``runtime``."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "kumiko"

#: modules directly under kumiko/ that every stage may use (rank 0)
LEAVES = {"diagnostics", "dtypes", "knobs", "symbolic", "ops", "util", "accuracy"}
#: the stage order; a package may import packages of lower or equal rank. Anything else under kumiko/
#: (compiler, cli, tensor, debug, the package root) is the face, the last of all.
RANK = {"leaf": 0, "tiny": 1, "frontend": 2, "indexbook": 3, "poly": 4, "region": 5, "plan": 6, "kernel": 7,
        "render": 8, "runtime": 8, "backend": 9, "pipeline": 10, "face": 11}
#: the stages after the frontend, which never import the frontend or the driver
STAGES = {"indexbook", "poly", "region", "plan", "kernel", "render", "runtime", "backend"}
DRIVER = {"frontend", "pipeline", "compiler", "cli"}
#: (importing module, imported package) pairs allowed to break the rules above, each with its reason.
#: Empty: nothing is left to allow. An entry here is a debt: say which work removes it.
ALLOWED: set = set()


def unit(module: str) -> str:
    """The package (rank unit) of a dotted ``kumiko`` module: a stage, ``leaf`` or ``face``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "face"
    head = parts[1]
    return "leaf" if head in LEAVES else head if head in RANK else "face"


def driver_name(module: str) -> str | None:
    """The driver package a module belongs to (frontend, pipeline, compiler, cli), else None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in DRIVER else None


def imports(root: Path) -> list[tuple[str, str]]:
    """(importing module, imported kumiko module) for every import under ``root`` (a ``kumiko`` tree)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        me = ".".join(rel.parts)
        is_pkg = path.name == "__init__.py"
        if is_pkg:
            me = me[: -len(".__init__")]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = me.split(".") if is_pkg else me.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                subs = [f"{mod}.{a.name}" for a in node.names]
                targets = subs if mod == "kumiko" else [mod] + subs
            else:
                continue
            out += [(me, t) for t in targets if t == "kumiko" or t.startswith("kumiko.")]
    return out


def problems(pairs: list[tuple[str, str]], allowed: set = frozenset()) -> list[str]:
    """What breaks the rules: package cycles, imports up the stage order, stages importing the driver."""
    edges: dict = {}
    bad, seen = [], set()
    for me, target in pairs:
        a, b = unit(me), unit(target)
        if a == b or (me, b) in allowed or (me, b, driver_name(target)) in seen:
            continue                # one report per importing module and imported package
        seen.add((me, b, driver_name(target)))
        edges.setdefault(a, set()).add(b)
        if RANK[b] > RANK[a]:
            bad.append(f"up: {me} ({a}, rank {RANK[a]}) imports {target} ({b}, rank {RANK[b]})")
        if a in STAGES and driver_name(target):
            bad.append(f"driver: {me} ({a}) imports {target}")
        if (a, b) == ("render", "runtime"):          # same rank, but rendering never needs a runtime
            bad.append(f"render: {me} imports {target}")

    def reach(start: str) -> set:
        seen, todo = set(), [start]
        while todo:
            for n in edges.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen
    cycles = {tuple(sorted((a, b))) for a in edges for b in edges[a] if a in reach(b)}
    bad += [f"cycle: {a} <-> {b}" for a, b in sorted(cycles)]
    return bad


def test_kumiko_imports_run_one_way():
    pairs = imports(ROOT)
    assert len(pairs) > 100                         # the walk found the code
    assert problems(pairs, ALLOWED) == []


def test_the_rules_catch_each_kind_of_break(tmp_path):
    pkg = tmp_path / "kumiko"
    for d, text in (("plan", "from kumiko.kernel.lower_cpu import CpuLowering\n"),
                    ("kernel", "from kumiko.plan import plan\n"),
                    ("region", "def f():\n    from kumiko.frontend import graph\n    from .. import compiler\n"),
                    ("poly", "from kumiko.region import ssa\nfrom kumiko import symbolic\n"),
                    ("render", "import kumiko.runtime.cpu\n")):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
        (pkg / d / "m.py").write_text(text)
    found = problems(imports(pkg))
    assert "up: kumiko.plan.m (plan, rank 6) imports kumiko.kernel.lower_cpu (kernel, rank 7)" in found
    assert "cycle: kernel <-> plan" in found
    assert "driver: kumiko.region.m (region) imports kumiko.frontend" in found
    assert "driver: kumiko.region.m (region) imports kumiko.compiler" in found     # a relative import
    assert "up: kumiko.poly.m (poly, rank 4) imports kumiko.region (region, rank 5)" in found
    assert "render: kumiko.render.m imports kumiko.runtime.cpu" in found
    assert not any("symbolic" in p for p in found)          # a leaf is below everything
    assert problems(imports(pkg), {("kumiko.plan.m", "kernel"), ("kumiko.kernel.m", "plan"),
                                   ("kumiko.region.m", "frontend"), ("kumiko.region.m", "face"),
                                   ("kumiko.poly.m", "region"), ("kumiko.render.m", "runtime")}) == []
